"""Refuse weights that hold inf or NaN: what llama.cpp's opt-in ``check_tensors``
(ggml's ``ggml_validate_row_data``) checks, here always on.

A Q4_1 block whose f16 scale is inf, or an F32 norm weight that is NaN, loads
fine and then turns every logit into NaN or zero: an empty reply and no error.
So every tensor is checked once, when its file is first hashed for its weight
id (weights.py), which reads every page anyway; the id cache then records that
the file passed. Float tensors (F32, F16, BF16, F64) are checked element by
element; quantized ones by the float fields of each block: the f16 scale ``d``
(and min ``m`` or ``dmin``) of ggml's blocks (ggml-common.h, gguf/quants.py),
the f32 ``d`` of Q8_K. Quantized values are integers and cannot be non-finite.

A value is inf or NaN exactly when its exponent bits are all ones, so the check
masks the raw bits through numpy views of the mapped file (strided views for a
field of each block) and compares one maximum a chunk: no float conversion, no
Python loop over values: about 40 ms for Gemma 3 270M (253 MB) in the page cache,
25 ms more than its hashing alone, which leaves the file in the CPU's caches.
"""
from __future__ import annotations

from dataclasses import dataclass

import gguf
import numpy as np

from ..errors import ModelFileError, UnsupportedModelError
from .gguf_file import GGUFFile, TensorInfo

T = gguf.GGMLQuantizationType
CHUNK = 1 << 16   # values masked at a time: the scratch stays in the L2 cache


@dataclass(frozen=True)
class Bits:
    """A float format as raw bits: the unsigned type holding one value, and its exponent mask."""

    bits: str       # numpy dtype of the raw value ('<u2', '<u4', '<u8')
    exponent: int   # all ones in these bits: inf or NaN
    width: int      # bytes
    shift: int = 0  # bf16: the high half of an f32

    def decode(self, raw: int) -> float:
        """The value of raw bits, for the message."""
        width = self.width + self.shift // 8
        return float(np.array([raw << self.shift], f"<u{width}").view(f"<f{width}")[0])


F16 = Bits("<u2", 0x7C00, 2)
BF16 = Bits("<u2", 0x7F80, 2, shift=16)
F32 = Bits("<u4", 0x7F800000, 4)
F64 = Bits("<u8", 0x7FF0000000000000, 8)

# Tensors checked value by value.
ELEMENTWISE: dict[int, Bits] = {T.F32: F32, T.F16: F16, T.BF16: BF16, T.F64: F64}
# Tensors of integers: nothing in them can be inf or NaN.
NO_FLOATS = frozenset({T.I8, T.I16, T.I32, T.I64})
# Quantized blocks: (what the field is, its byte offset in the block, its format).
BLOCK_FIELDS: dict[int, tuple[tuple[str, int, Bits], ...]] = {
    T.Q4_0: (("scale (d)", 0, F16),),
    T.Q4_1: (("scale (d)", 0, F16), ("min (m)", 2, F16)),
    T.Q5_0: (("scale (d)", 0, F16),),
    T.Q5_1: (("scale (d)", 0, F16), ("min (m)", 2, F16)),
    T.Q8_0: (("scale (d)", 0, F16),),
    # K-quants: one super-block of 256 values; its d (and dmin) scale the 6- or 8-bit
    # integer sub-block scales. Q2_K and Q3_K keep them after the quants, Q6_K's d ends
    # its 210-byte block.
    T.Q2_K: (("scale (d)", 80, F16), ("min scale (dmin)", 82, F16)),
    T.Q3_K: (("scale (d)", 108, F16),),
    T.Q4_K: (("scale (d)", 0, F16), ("min scale (dmin)", 2, F16)),
    T.Q5_K: (("scale (d)", 0, F16), ("min scale (dmin)", 2, F16)),
    T.Q6_K: (("scale (d)", 208, F16),),
    T.Q8_K: (("scale (d)", 0, F32),),
}
CHECKED = frozenset(ELEMENTWISE) | NO_FLOATS | frozenset(BLOCK_FIELDS)


def first_non_finite(values: np.ndarray, fmt: Bits) -> int:
    """Index of the first inf or NaN among raw values (a 1-D view of fmt.bits), or -1."""
    mask = np.asarray(fmt.exponent, values.dtype)
    scratch = np.empty(min(CHUNK, len(values)), values.dtype)
    for start in range(0, len(values), CHUNK):
        chunk = values[start:start + CHUNK]
        masked = np.bitwise_and(chunk, mask, out=scratch[:len(chunk)])
        if masked.max() == mask:  # masked bits are never above the mask
            return start + int(np.flatnonzero(masked == mask)[0])
    return -1


def block_field(t: TensorInfo, offset: int, fmt: Bits) -> np.ndarray:
    """The raw bits of one field of every block of a tensor: a strided view, no copy."""
    block_bytes = gguf.GGML_QUANT_SIZES[T(t.ggml_type)][1]
    blocks = t.data.reshape(-1, block_bytes)
    return blocks[:, offset:offset + fmt.width].view(fmt.bits)[:, 0]


def check_finite_weights(f: GGUFFile) -> None:
    """Raise ModelFileError naming the file, tensor, block or element and value of the
    first inf or NaN in f's weights; UnsupportedModelError for a tensor of a type whose
    layout is not known here (never passed unchecked)."""
    for t in f.tensors.values():
        if t.ggml_type in NO_FLOATS:
            continue
        if t.ggml_type in ELEMENTWISE:
            fmt = ELEMENTWISE[t.ggml_type]
            at = first_non_finite(t.data.view(fmt.bits), fmt)
            if at >= 0:
                raise _corrupt(f, t, fmt.decode(int(t.data.view(fmt.bits)[at])), f"at element {at}", at)
            continue
        fields = BLOCK_FIELDS.get(t.ggml_type)
        if fields is None:
            raise UnsupportedModelError(f"{_file_of(f, t)}: tensor {t.name} has type {t.type_name}, whose "
                                        "values cannot be checked for inf or NaN (and the engine does not run)")
        for what, offset, fmt in fields:
            values = block_field(t, offset, fmt)
            at = first_non_finite(values, fmt)
            if at >= 0:
                block = gguf.GGML_QUANT_SIZES[T(t.ggml_type)][0]
                raise _corrupt(f, t, fmt.decode(int(values[at])), f"in the {what} of block {at}", at * block)


def _corrupt(f: GGUFFile, t: TensorInfo, value: float, where: str, element: int) -> ModelFileError:
    row = f" (row {element // t.shape[0]})" if len(t.shape) > 1 else ""
    return ModelFileError(f"{_file_of(f, t)}: tensor {t.name} holds a non-finite value ({value}) {where}{row}; "
                          "the file is corrupt")


def _file_of(f: GGUFFile, t: TensorInfo) -> str:
    """The name of the file (of a split model's parts) that holds the tensor."""
    for part in f.parts:
        if part.tensors.get(t.name) is t:
            return part.path.name
    return f.path.name
