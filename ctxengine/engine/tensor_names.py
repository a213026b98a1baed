"""The tensors a model file must hold, and may: checked from the names alone, before
anything is built per layer, as llama.cpp's loader refuses a file whose tensors are not
the architecture's ("wrong number of tensors", "missing tensor").

A tensor the native model would not read (an unknown name, a block past
``block_count``) means the file is another model than the one its header describes,
and running it without that tensor gives wrong output with no error; a norm an
architecture needs, missing, the same. So both are a ModelFileError naming them,
which says llama.cpp refuses the file too only where its loader for that
architecture has no such tensor (LLAMACPP_READS lists those it has and we do not run).
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from ..errors import ModelFileError, UnsupportedModelError

# What native/models/register_model.cpp reads: the model's own tensors, and each block's
# (and LongRoPE's factors, which config.py refuses by their name: not supported yet).
GLOBAL = frozenset({"token_embd.weight", "output_norm.weight", "output.weight",
                    "rope_factors_long.weight", "rope_factors_short.weight"})
# Each of q, k and v may have a bias (or the fused attn_qkv one), each optional, for every
# architecture, as llama.cpp's create_tensor_qkv makes them (TENSOR_NOT_REQUIRED).
PER_BLOCK = frozenset({
    "attn_norm.weight", "attn_qkv.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
    "attn_output.weight", "attn_qkv.bias", "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_q_norm.weight",
    "attn_k_norm.weight", "post_attention_norm.weight", "ffn_norm.weight", "post_ffw_norm.weight",
    "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"})
# What only some architectures have in llama.cpp's loaders: llama's rope_freqs (llama3 RoPE
# factors) and its optional attention-output bias (wo_b); the others' loaders have neither.
GLOBAL_OF = {"llama": frozenset({"rope_freqs.weight"})}
PER_BLOCK_OF = {"llama": frozenset({"attn_output.bias"})}
# Tensors llama.cpp's loader reads for the architecture (so it runs the file) that the
# engine does not: refused as not supported, never as a damaged file.
LLAMACPP_READS = {
    "llama": frozenset({"ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"}),
    "qwen2": frozenset({"output.bias"}),
}
# Per block, what an architecture cannot run without (the rest the native build asks for itself).
REQUIRED = {
    "gemma3": ("attn_q_norm.weight", "attn_k_norm.weight", "post_attention_norm.weight", "post_ffw_norm.weight"),
    "qwen3": ("attn_q_norm.weight", "attn_k_norm.weight"),
}
_BLOCK = re.compile(r"blk\.(0|[1-9][0-9]*)\.(.+)")
SHOWN = 4  # names an error lists


def check_tensor_names(file_name: str, arch: str, n_layer: int, names: Iterable[str]) -> None:
    """ModelFileError unless every tensor is one the model reads, every block below
    ``n_layer`` has tensors and none above, and each block has what ``arch`` requires;
    UnsupportedModelError for a tensor llama.cpp reads for ``arch`` and the engine does not."""
    per_block = PER_BLOCK | PER_BLOCK_OF.get(arch, frozenset())
    global_ = GLOBAL | GLOBAL_OF.get(arch, frozenset())
    blocks: dict[int, set[str]] = {}
    unknown = []
    for name in names:
        m = _BLOCK.fullmatch(name)
        if m is not None and m[2] in per_block and int(m[1]) < n_layer:
            blocks.setdefault(int(m[1]), set()).add(m[2])
        elif name not in global_:
            unknown.append(name)
    if unknown:
        _refuse_unknown(file_name, arch, n_layer, unknown)
    if len(blocks) != n_layer:
        missing = next(i for i in range(n_layer) if i not in blocks)  # len(blocks) < n_layer: found soon
        raise ModelFileError(f"{file_name}: {arch}.block_count is {n_layer}, and the file holds no tensor "
                             f"of block {missing}")
    for i in range(n_layer):
        lacking = [f"blk.{i}.{n}" for n in REQUIRED.get(arch, ()) if n not in blocks[i]]
        if lacking:
            raise ModelFileError(f"{file_name}: missing tensor {_listed(lacking)}, which a {arch} model needs")
        _check_qkv_biases(file_name, i, blocks[i])


def _check_qkv_biases(file_name: str, i: int, block: set[str]) -> None:
    """attn_qkv.bias goes with the fused attn_qkv.weight (llama.cpp reads it only then), and
    the separate q/k/v biases with separate weights."""
    fused = "attn_qkv.weight" in block and "attn_q.weight" not in block
    if "attn_qkv.bias" in block and not fused:
        raise ModelFileError(f"{file_name}: blk.{i}.attn_qkv.bias is there without a fused blk.{i}.attn_qkv.weight "
                             "(a damaged file; llama.cpp refuses it too)")
    separate = sorted(f"blk.{i}.{n}" for n in ("attn_q.bias", "attn_k.bias", "attn_v.bias") if n in block)
    if fused and separate:
        raise UnsupportedModelError(f"{file_name}: {', '.join(separate)} beside a fused blk.{i}.attn_qkv.weight: "
                                    "separate q/k/v biases of fused weights are not supported")


def _refuse_unknown(file_name: str, arch: str, n_layer: int, unknown: list[str]) -> None:
    reads = LLAMACPP_READS.get(arch, frozenset())
    supported_by_llamacpp = [n for n in unknown if _kind(n, n_layer) in reads]
    if supported_by_llamacpp:
        them = "it" if len(supported_by_llamacpp) == 1 else "them"
        raise UnsupportedModelError(f"{file_name}: llama.cpp reads {_listed(supported_by_llamacpp)} in a {arch} "
                                    f"model, but the engine does not support {them} yet")
    what = "is not a tensor" if len(unknown) == 1 else "are not tensors"
    raise ModelFileError(f"{file_name}: {_listed(unknown)} {what} of a {arch} model with {n_layer} blocks "
                         f"(another architecture, or a damaged file; llama.cpp refuses it too)")


def _kind(name: str, n_layer: int) -> str:
    """A block tensor's name without its block (of a block the model has), else the name."""
    m = _BLOCK.fullmatch(name)
    return m[2] if m is not None and int(m[1]) < n_layer else name


def _listed(names: list[str]) -> str:
    shown = ", ".join(sorted(names)[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")
