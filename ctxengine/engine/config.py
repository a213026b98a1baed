"""What a GGUF file asks of the forward pass, read from its header: the
shapes and options of ``native/models`` (``ModelConfig``), and whether the
engine can run the file at all (``unsupported_reason``), so the catalog can
list a file it cannot serve without loading its weights.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .._core import quant
from ..errors import ModelFileError, UnsupportedModelError
from .gguf_cursor import UnreadStrings
from .gguf_file import GGUFFile
from .tensor_names import check_tensor_names


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
# The core holds dimensions (and products such as n_head * head_dim) in C ints,
# and its floats are float32: larger values are refused here, not wrapped there.
INT_MAX = 2**31 - 1
FLOAT32_MAX = 3.4028234663852886e38
# Architectures whose llama.cpp graph rotates whole heads: rope.dimension_count must be the
# head size, or llama.cpp stops, as said here. phi3 and gemma3 rotate the first
# rope.dimension_count dims of a head, which the engine does as well.
WHOLE_HEAD_ROPE_ARCHS = {
    "llama": "llama.cpp refuses it too: invalid n_rot",
    "qwen2": "llama.cpp aborts on it: GGML_ASSERT(n_embd_head == n_rot)",
    "qwen3": "llama.cpp aborts on it: GGML_ASSERT(n_embd_head == n_rot)",
}
# Keys llama.cpp also reads as one value a layer (get_key_or_arr); we run one value for all.
PER_LAYER_KEYS = ("attention.head_count", "attention.head_count_kv", "feed_forward_length")
_NEEDED = object()  # the default of a key the file must have


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
        """Every value is checked for its GGUF type and range (as llama.cpp refuses a key of
        the wrong type): a bad one is a ModelFileError naming the key, never a Python error."""
        n_embd = _int_key(f, "embedding_length")
        n_head = _int_key(f, "attention.head_count")
        n_layer = _int_key(f, "block_count")
        # Before anything is built per layer (a block_count of 2**31 - 1 once built a tuple that large).
        check_tensor_names(f.path.name, f.arch, n_layer, f.tensors)
        head_dim = _int_key(f, "attention.key_length", n_embd // n_head)
        if head_dim < 1:  # no key_length, and fewer embedding dims than heads
            raise ModelFileError(f"{f.path.name}: {f.arch}.embedding_length {n_embd} is smaller than "
                                 f"{f.arch}.attention.head_count {n_head}")
        if _int_key(f, "attention.value_length", head_dim) != head_dim:
            raise UnsupportedModelError(f"{f.path.name}: K and V heads of different sizes are not supported")
        n_head_kv = _int_key(f, "attention.head_count_kv", n_head)
        if max(n_head, n_head_kv) * head_dim > INT_MAX:
            raise ModelFileError(f"{f.path.name}: {max(n_head, n_head_kv)} heads of {head_dim} dimensions "
                                 f"are more than {INT_MAX} values a token")
        rope_dim = _int_key(f, "rope.dimension_count", head_dim)
        if f.arch in WHOLE_HEAD_ROPE_ARCHS and rope_dim != head_dim:
            raise ModelFileError(f"{f.path.name}: {f.arch}.rope.dimension_count is {rope_dim}, but a {f.arch} model "
                                 f"rotates whole heads of {head_dim} dimensions ({WHOLE_HEAD_ROPE_ARCHS[f.arch]})")
        if "rope_factors_long.weight" in f.tensors:
            raise UnsupportedModelError(f"{f.path.name}: LongRoPE (rope_factors_long) is not supported yet")
        return cls(
            arch=f.arch,
            n_layer=n_layer,
            n_embd=n_embd,
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_ff=_int_key(f, "feed_forward_length"),
            n_vocab=_vocabulary_size(f),
            n_ctx=_int_key(f, "context_length"),
            norm_eps=_float_key(f, "attention.layer_norm_rms_epsilon", sign=">= 0"),
            rope_base=_float_key(f, "rope.freq_base", 10000.0, sign="> 0"),
            rope_dim=rope_dim,
            rope_neox=f.arch in NEOX_ROPE_ARCHS,
            rope_scale=_rope_scale(f),
            **(_gemma3_options(f, n_layer, n_embd, n_head, head_dim) if f.arch == "gemma3" else {}),
        )

    @property
    def kv_dim(self) -> int:
        return self.n_head_kv * self.head_dim


def _key(f: GGUFFile, suffix: str, default: Any) -> Any:
    value = f.arch_key(suffix, default)
    if value is _NEEDED:
        raise ModelFileError(f"{f.path.name}: metadata lacks {f.arch}.{suffix}")
    return value


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _int_key(f: GGUFFile, suffix: str, default: Any = _NEEDED, *, least: int = 1) -> int:
    """An integer hyperparameter from ``least`` to INT_MAX. A float, a bool or a string
    is refused, not rounded or parsed: a file that spells a count so is broken."""
    value = _key(f, suffix, default)
    if type(value) is int and least <= value <= INT_MAX:
        return value
    if isinstance(value, list) and suffix in PER_LAYER_KEYS:
        raise UnsupportedModelError(f"{f.path.name}: {f.arch}.{suffix} is given per layer ({_shown(value)}), "
                                    "which is not supported")
    raise ModelFileError(f"{f.path.name}: {f.arch}.{suffix} is {_shown(value)}, "
                         f"not an integer from {least} to {INT_MAX}")


def _float_key(f: GGUFFile, suffix: str, default: Any = _NEEDED, *, sign: str = "") -> float:
    """A real hyperparameter, finite in float32 (what the core computes with); ``sign``
    "> 0" or ">= 0" where any other value makes every logit NaN (a RoPE base of 0, a
    negative norm epsilon): the file is refused at load, naming the key."""
    value = _key(f, suffix, default)
    if type(value) in (int, float) and abs(value) <= FLOAT32_MAX:  # NaN compares false too
        if sign == "> 0" and value <= 0 or sign == ">= 0" and value < 0:
            raise ModelFileError(f"{f.path.name}: {f.arch}.{suffix} is {_shown(value)}, not a number {sign}")
        return float(value)
    raise ModelFileError(f"{f.path.name}: {f.arch}.{suffix} is {_shown(value)}, not a finite number")


def _vocabulary_size(f: GGUFFile) -> int:
    """The rows of token_embd.weight, which must be the tokenizer's token count: an id the
    tokenizer makes must have an embedding and a logit, and every logit a text (llama.cpp
    builds token_embd as {n_embd, n_vocab} with the tokenizer's n_vocab, and refuses the rest)."""
    embd = f.tensors.get("token_embd.weight")
    if embd is None:
        raise ModelFileError(f"{f.path.name}: no token_embd.weight tensor")
    if len(embd.shape) < 2 or any(d != 1 for d in embd.shape[2:]) or embd.shape[1] > INT_MAX:
        raise ModelFileError(f"{f.path.name}: token_embd.weight has shape {list(embd.shape)}, "
                             "not [n_embd, n_vocab]")
    n_vocab = embd.shape[1]
    tokens = f.get("tokenizer.ggml.tokens")  # missing or malformed: the tokenizer says so
    if isinstance(tokens, (list, UnreadStrings)) and len(tokens) != n_vocab:
        raise ModelFileError(f"{f.path.name}: the tokenizer has {len(tokens)} tokens (tokenizer.ggml.tokens) "
                             f"but token_embd.weight has {n_vocab} rows: the vocabularies must match")
    return n_vocab


def _rope_scale(f: GGUFFile) -> float:
    """Linear RoPE scaling as a factor on the angles; llama3-style scaling comes
    as a rope_freqs tensor the core reads itself. Anything else is refused."""
    kind = f.arch_key("rope.scaling.type")
    if kind is not None and not isinstance(kind, str):
        raise ModelFileError(f"{f.path.name}: {f.arch}.rope.scaling.type is {_shown(kind)}, not a string")
    factor = _float_key(f, "rope.scaling.factor", 1.0) or 1.0  # 0 means none, as in llama.cpp
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
    window = _int_key(f, "attention.sliding_window", 0, least=0)
    layers = _sliding_layers(f, n_layer)
    if window > 0 and all(layers):
        # The engine keeps the global layers of pages that leave the window; with none
        # it would keep nothing (llama.cpp's gemma3 always has global layers, too).
        key = f"{f.arch}.attention.sliding_window_pattern"
        pattern = f.get(key)
        why = (f"{key} is {_shown(pattern)}" if pattern is not None else
               f"without {key}, every {GEMMA3_SWA_PATTERN}th layer is global")
        raise UnsupportedModelError(
            f"{f.path.name}: all {n_layer} layers attend through the sliding window ({why}); "
            "a model without a global-attention layer is not supported")
    return dict(
        attn_scale=1.0 / math.sqrt(pre_attn),
        embd_scale=math.sqrt(n_embd),
        gelu_ffn=True,
        logit_softcap=_float_key(f, "final_logit_softcapping", 0.0),
        swa_window=window,
        swa_layers=layers if window > 0 else (),
        rope_base_swa=_float_key(f, "rope.freq_base_swa", GEMMA3_ROPE_BASE_SWA, sign="> 0"),
    )


def _sliding_layers(f: GGUFFile, n_layer: int) -> tuple[int, ...]:
    """1 for each sliding-window layer: the pattern is a flag a layer, or n (every
    n-th layer global; 0: none is)."""
    key = f"{f.arch}.attention.sliding_window_pattern"
    pattern = f.get(key, GEMMA3_SWA_PATTERN)
    if isinstance(pattern, list):
        if len(pattern) != n_layer:
            raise ModelFileError(f"{f.path.name}: sliding_window_pattern has {len(pattern)} entries "
                                 f"for {n_layer} layers")
        if not all(type(v) in (bool, int) for v in pattern):
            raise ModelFileError(f"{f.path.name}: {key} is {_shown(pattern)}, not an array of booleans")
        return tuple(int(bool(v)) for v in pattern)
    n = _int_key(f, "attention.sliding_window_pattern", GEMMA3_SWA_PATTERN, least=0)
    return tuple(int(n == 0 or i % n < n - 1) for i in range(n_layer))


def unsupported_reason(f: GGUFFile) -> str | None:
    """Why the engine cannot run this file, from its header alone (None: it can).
    The catalog lists unservable files with this reason; a load raises it.
    A malformed file raises its ModelFileError (the catalog lists that too), so that
    a load says the file is broken rather than unsupported."""
    if f.arch not in SUPPORTED_ARCHS:
        return f"architecture '{f.arch}' is not supported (supported: {', '.join(SUPPORTED_ARCHS)})"
    bad = f.unsupported_tensors(SUPPORTED_TYPES)
    if bad:
        kinds = ", ".join(sorted({t.type_name for t in bad}))
        names = ", ".join(quant.dtype_name(t) for t in sorted(SUPPORTED_TYPES))
        return f"tensor type {kinds} is not supported yet (first: {bad[0].name}); supported: {names}"
    try:
        ModelConfig.from_gguf(f)
    except UnsupportedModelError as err:
        return str(err).removeprefix(f"{f.path.name}: ")
    for t in f.tensors.values():
        if any(d != 1 for d in t.shape[2:]):  # the kernels read a matrix's first two dimensions only
            raise ModelFileError(f"{f.path.name}: tensor {t.name} has shape {list(t.shape)}; "
                                 "the engine's weights have at most two dimensions")
    return None
