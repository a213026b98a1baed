"""The tensors a model file must hold, and may: checked from the names alone, before
anything is built per layer, as llama.cpp's loader refuses a file whose tensors are not
the architecture's ("wrong number of tensors", "missing tensor").

A tensor the native model would not read (an unknown name, a block past
``block_count``) means the file is another model than the one its header describes,
and running it without that tensor gives wrong output with no error; a norm an
architecture needs, missing, the same. So both are a ModelFileError naming them.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from ..errors import ModelFileError

# What native/models/register_model.cpp reads: the model's own tensors, and each block's
# (and LongRoPE's factors, which config.py refuses by their name: not supported yet).
GLOBAL = frozenset({"token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight",
                    "rope_factors_long.weight", "rope_factors_short.weight"})
PER_BLOCK = frozenset({
    "attn_norm.weight", "attn_qkv.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
    "attn_output.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_q_norm.weight",
    "attn_k_norm.weight", "post_attention_norm.weight", "ffn_norm.weight", "post_ffw_norm.weight",
    "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"})
# Per block, what an architecture cannot run without (the rest the native build asks for itself).
REQUIRED = {
    "gemma3": ("attn_q_norm.weight", "attn_k_norm.weight", "post_attention_norm.weight", "post_ffw_norm.weight"),
    "qwen3": ("attn_q_norm.weight", "attn_k_norm.weight"),
    "qwen2": ("attn_q.bias", "attn_k.bias", "attn_v.bias"),
}
_BLOCK = re.compile(r"blk\.(0|[1-9][0-9]*)\.(.+)")
SHOWN = 4  # names an error lists


def check_tensor_names(file_name: str, arch: str, n_layer: int, names: Iterable[str]) -> None:
    """ModelFileError unless every tensor is one the model reads, every block below
    ``n_layer`` has tensors and none above, and each block has what ``arch`` requires."""
    blocks: dict[int, set[str]] = {}
    unknown = []
    for name in names:
        m = _BLOCK.fullmatch(name)
        if m is not None and m[2] in PER_BLOCK and int(m[1]) < n_layer:
            blocks.setdefault(int(m[1]), set()).add(m[2])
        elif name not in GLOBAL:
            unknown.append(name)
    if unknown:
        what = "is not a tensor" if len(unknown) == 1 else "are not tensors"
        raise ModelFileError(f"{file_name}: {_listed(unknown)} {what} of a {arch} model with {n_layer} blocks "
                             f"(another architecture, or a damaged file; llama.cpp refuses it too)")
    if len(blocks) != n_layer:
        missing = next(i for i in range(n_layer) if i not in blocks)  # len(blocks) < n_layer: found soon
        raise ModelFileError(f"{file_name}: {arch}.block_count is {n_layer}, and the file holds no tensor "
                             f"of block {missing}")
    for i in range(n_layer):
        lacking = [f"blk.{i}.{n}" for n in REQUIRED.get(arch, ()) if n not in blocks[i]]
        if lacking:
            raise ModelFileError(f"{file_name}: missing tensor {_listed(lacking)}, which a {arch} model needs")


def _listed(names: list[str]) -> str:
    shown = ", ".join(sorted(names)[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")
