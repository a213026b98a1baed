"""Write a real model as a split GGUF set with the `gguf` package's writer
(GGUFWriter(split_max_tensors=...), as convert_hf_to_gguf.py splits):
``PREFIX-00001-of-0000N.gguf``..., the first part holding every metadata key,
each part its own ``split.*`` keys. The model is read with ctxengine's reader
(gguf.GGUFReader takes ~25 s over SmolLM2's vocabulary on a shared machine);
the split files are written by code that shares nothing with the reader that
must join them.
"""
from __future__ import annotations

import logging
from pathlib import Path

import gguf
import numpy as np

from ctxengine.engine.gguf_file import open_gguf

VT = gguf.GGUFValueType


def _value_type(value) -> VT:
    if isinstance(value, bool):
        return VT.BOOL
    if isinstance(value, int):
        return VT.INT32 if -2**31 <= value < 2**31 else VT.INT64
    if isinstance(value, float):
        return VT.FLOAT32
    if isinstance(value, str):
        return VT.STRING
    return VT.ARRAY


def write_split(src: Path, out_dir: Path, prefix: str, parts: int) -> list[Path]:
    """Split the GGUF at src into `parts` files under out_dir; returns them in order."""
    logging.getLogger("gguf.gguf_writer").setLevel(logging.WARNING)
    with open_gguf(src) as f:
        tensors = list(f.tensors.values())
        writer = gguf.GGUFWriter(out_dir / f"{prefix}.gguf", f.arch, split_max_tensors=-(-len(tensors) // parts))
        for key, value in f.metadata.items():
            if key in ("general.architecture", "general.alignment"):
                continue  # the writer adds these itself
            vtype = _value_type(value)
            sub = _value_type(value[0]) if vtype == VT.ARRAY and value else None
            if isinstance(value, str):
                value = value.encode("utf-8", "surrogateescape")
            elif sub == VT.STRING:
                value = [v.encode("utf-8", "surrogateescape") for v in value]
            writer.add_key_value(key, value, vtype, sub_type=sub)
        for t in tensors:
            # The shape in numpy order, in elements (a non-uint8 dtype tells the writer so).
            writer.add_tensor_info(t.name, t.shape[::-1], np.dtype(np.float32), t.nbytes,
                                   gguf.GGMLQuantizationType(t.ggml_type))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in tensors:
            writer.write_tensor_data(t.data)
        writer.close()
    return [out_dir / f"{prefix}-{i:05d}-of-{parts:05d}.gguf" for i in range(1, parts + 1)]
