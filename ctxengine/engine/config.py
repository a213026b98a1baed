"""What a GGUF file asks of the forward pass, read from its header: the
shapes and options of ``native/models`` (``ModelConfig``), and whether the
engine can run the file at all (``unsupported_reason``), so the catalog can
list a file it cannot serve without loading its weights.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .._core import quant
from ..errors import ModelFileError, UnsupportedModelError
from .gguf_file import GGUFFile


# Architectures the llama-family forward pass covers (native/models/model.cpp).
SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "phi3")
# ggml type ids the kernels run: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
# Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K.
SUPPORTED_TYPES = frozenset(quant.supported_types())
# Rotary pairs (i, i + d/2) rather than llama's interleaved (2i, 2i + 1).
NEOX_ROPE_ARCHS = ("qwen2", "qwen3", "gemma3", "phi3")
# Gemma 3 without the pattern key: every 6th layer attends globally, the rest
# through the sliding window, whose layers rotate with base 10,000 (llama.cpp's
# defaults for the architecture).
GEMMA3_SWA_PATTERN = 6
GEMMA3_ROPE_BASE_SWA = 10000.0


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_ctx: int
    norm_eps: float
    rope_base: float
    rope_dim: int
    rope_neox: bool
    rope_scale: float = 1.0         # linear RoPE scaling (angles * rope_scale) of full-attention layers
    attn_scale: float = 0.0         # q.k scale; 0 means 1 / sqrt(head_dim)
    embd_scale: float = 1.0         # token embeddings times this (gemma: sqrt(n_embd))
    gelu_ffn: bool = False          # GeGLU instead of SwiGLU
    logit_softcap: float = 0.0      # c * tanh(logits / c) when > 0
    swa_window: int = 0             # sliding-window size of the layers marked in swa_layers; 0 = none
    swa_layers: tuple[int, ...] = ()
    rope_base_swa: float = 10000.0

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "ModelConfig":
        def need(suffix: str):
            value = f.arch_key(suffix)
            if value is None:
                raise ModelFileError(f"{f.path.name}: metadata lacks {f.arch}.{suffix}")
            return value

        n_embd = int(need("embedding_length"))
        n_head = int(need("attention.head_count"))
        n_layer = int(need("block_count"))
        head_dim = int(f.arch_key("attention.key_length", n_embd // n_head))
        if f.arch_key("attention.value_length", head_dim) != head_dim:
            raise UnsupportedModelError(f"{f.path.name}: K and V heads of different sizes are not supported")
        embd = f.tensors.get("token_embd.weight")
        if embd is None:
            raise ModelFileError(f"{f.path.name}: no token_embd.weight tensor")
        if "rope_factors_long.weight" in f.tensors:
            raise UnsupportedModelError(f"{f.path.name}: LongRoPE (rope_factors_long) is not supported yet")
        return cls(
            arch=f.arch,
            n_layer=n_layer,
            n_embd=n_embd,
            n_head=n_head,
            n_head_kv=int(f.arch_key("attention.head_count_kv", n_head)),
            head_dim=head_dim,
            n_ff=int(need("feed_forward_length")),
            n_vocab=int(embd.shape[1]),
            n_ctx=int(need("context_length")),
            norm_eps=float(need("attention.layer_norm_rms_epsilon")),
            rope_base=float(f.arch_key("rope.freq_base", 10000.0)),
            rope_dim=int(f.arch_key("rope.dimension_count", head_dim)),
            rope_neox=f.arch in NEOX_ROPE_ARCHS,
            rope_scale=_rope_scale(f),
            **(_gemma3_options(f, n_layer, n_embd, n_head, head_dim) if f.arch == "gemma3" else {}),
        )

    @property
    def kv_dim(self) -> int:
        return self.n_head_kv * self.head_dim


def _rope_scale(f: GGUFFile) -> float:
    """Linear RoPE scaling as a factor on the angles; llama3-style scaling comes
    as a rope_freqs tensor the core reads itself. Anything else is refused."""
    kind = f.arch_key("rope.scaling.type")
    factor = float(f.arch_key("rope.scaling.factor", 1.0) or 1.0)
    if kind in (None, "none") or (kind == "linear" and factor == 1.0):
        return 1.0
    if kind == "linear":
        return 1.0 / factor
    if kind == "llama3" and "rope_freqs.weight" in f.tensors:
        return 1.0
    raise UnsupportedModelError(f"{f.path.name}: RoPE scaling '{kind}' is not supported yet")


def _gemma3_options(f: GGUFFile, n_layer: int, n_embd: int, n_head: int, head_dim: int) -> dict:
    """Gemma 3's departures from llama (llama.cpp's gemma3 graph): scaled
    embeddings, GeGLU, q scaled by 1/sqrt(query_pre_attn_scalar), sliding-window
    layers in a fixed pattern with their own RoPE base."""
    # The 27B model scales q by 1/sqrt(n_embd / n_head); the others by 1/sqrt(head_dim).
    pre_attn = n_embd / n_head if n_layer == 62 else head_dim
    window = int(f.arch_key("attention.sliding_window", 0) or 0)
    pattern = f.arch_key("attention.sliding_window_pattern", GEMMA3_SWA_PATTERN)
    if isinstance(pattern, (list, tuple)):
        if len(pattern) != n_layer:
            raise ModelFileError(f"{f.path.name}: sliding_window_pattern has {len(pattern)} entries for {n_layer} layers")
        layers = tuple(int(bool(v)) for v in pattern)
    else:
        n = int(pattern)
        layers = tuple(int(n == 0 or i % n < n - 1) for i in range(n_layer))
    return dict(
        attn_scale=1.0 / math.sqrt(pre_attn),
        embd_scale=math.sqrt(n_embd),
        gelu_ffn=True,
        logit_softcap=float(f.arch_key("final_logit_softcapping", 0.0) or 0.0),
        swa_window=window,
        swa_layers=layers if window > 0 else (),
        rope_base_swa=float(f.arch_key("rope.freq_base_swa", GEMMA3_ROPE_BASE_SWA)),
    )


def unsupported_reason(f: GGUFFile) -> str | None:
    """Why the engine cannot run this file, from its header alone (None: it can).
    The catalog lists unservable files with this reason; a load raises it."""
    if f.arch not in SUPPORTED_ARCHS:
        return f"architecture '{f.arch}' is not supported (supported: {', '.join(SUPPORTED_ARCHS)})"
    bad = f.unsupported_tensors(SUPPORTED_TYPES)
    if bad:
        kinds = ", ".join(sorted({t.type_name for t in bad}))
        names = ", ".join(quant.dtype_name(t) for t in sorted(SUPPORTED_TYPES))
        return f"tensor type {kinds} is not supported yet (first: {bad[0].name}); supported: {names}"
    try:
        ModelConfig.from_gguf(f)
    except (UnsupportedModelError, ModelFileError) as err:
        return str(err).removeprefix(f"{f.path.name}: ")
    return None
