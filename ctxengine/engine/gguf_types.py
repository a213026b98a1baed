"""The GGUF format's two type tables, written out: the metadata value types, and the
ggml tensor types with their block sizes.

From the ``gguf`` package until now, whose import brings numpy, its writer and a
YAML parser with it (50-70 ms on a 2-core machine) for a few dozen numbers that
every ``ctx pull``, catalog scan and servability check read. The package stays
the reference: tests/test_gguf_types.py holds these tables equal to its own, and a
tensor type this table lacks (a newer ggml's) is looked up there before a file is
refused for it.
"""
from __future__ import annotations

import enum


class ValueType(enum.IntEnum):
    """A metadata value's type id (gguf.md: ``gguf_metadata_value_type``)."""
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# ggml type id -> (name, elements per block, bytes per block). Ids 4, 5, 31-33 and
# 36-38 were types ggml has since removed; no file may use them.
TENSOR_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}


def tensor_type(type_id: int) -> tuple[str, int, int] | None:
    """(name, elements per block, bytes per block) of a ggml type id, or None for an id
    neither this table nor the installed ``gguf`` package knows."""
    known = TENSOR_TYPES.get(type_id)
    if known is not None:
        return known
    import gguf  # a type newer than this table: the package may know it

    try:
        t = gguf.GGMLQuantizationType(type_id)
        block, block_bytes = gguf.GGML_QUANT_SIZES[t]
    except (ValueError, KeyError):
        return None
    return t.name, block, block_bytes
