"""A loaded GGUF model: weights mapped into the native core, its tokenizer,
chat template and weight identity, and teacher-forced log-probabilities.

This is the engine layer: it knows tensors and tokens, not names, contexts
or snapshots (those live in ``ctxengine.state``).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from .. import _core
from ..errors import ModelFileError, UnsupportedModelError
from .chat import ChatTemplate
from .cpu import physical_cores
from .gguf_file import GGUFFile, open_gguf
from .scheduler import Scheduler
from .tokenizer import Tokenizer
from .weights import cached_weight_id

# Architectures the llama-family forward pass covers (native/models/model.cpp).
SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "phi3")
# ggml type ids the kernels run: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
# Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K.
SUPPORTED_TYPES = frozenset(_core.quant.supported_types())
# Rotary pairs (i, i + d/2) rather than llama's interleaved (2i, 2i + 1).
NEOX_ROPE_ARCHS = ("qwen2", "qwen3", "gemma3", "phi3")
# Gemma 3 without the pattern key: every 6th layer attends globally, the rest
# through the sliding window, whose layers rotate with base 10,000 (llama.cpp's
# defaults for the architecture).
GEMMA3_SWA_PATTERN = 6
GEMMA3_ROPE_BASE_SWA = 10000.0
# How KV pages store K and V (native/kv/page_pool.h, docs/design-notes.md):
# f16; q8: K and V as int8 with an f16 scale per 32 values; vq8: K f16, V int8.
KV_DTYPES = ("f16", "q8", "vq8")
PAGE_TOKENS = 16
DEFAULT_KV_BUDGET = 2 << 30  # bytes of KV pages a model may hold in memory


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
        names = ", ".join(_core.quant.dtype_name(t) for t in sorted(SUPPORTED_TYPES))
        return f"tensor type {kinds} is not supported yet (first: {bad[0].name}); supported: {names}"
    try:
        ModelConfig.from_gguf(f)
    except (UnsupportedModelError, ModelFileError) as err:
        return str(err).removeprefix(f"{f.path.name}: ")
    return None


@dataclass(frozen=True)
class LogProbs:
    """Teacher-forced next-token distributions: row i follows ids[: i + 1]."""

    ids: list[int]
    top_ids: np.ndarray        # (n, k) int32, most likely first
    top_logprobs: np.ndarray   # (n, k) float32
    next_logprobs: np.ndarray  # (n - 1,) float32: log p(ids[i + 1] | ids[: i + 1])


class LoadedModel:
    """Weights in the native core plus everything needed to turn text into logits."""

    def __init__(self, path: str | Path, *, threads: int | None = None, kv: str = "f16",
                 n_ctx: int | None = None, kv_budget: int = DEFAULT_KV_BUDGET):
        if kv not in KV_DTYPES:
            raise UnsupportedModelError(f"KV dtype '{kv}' is not available (choose from {', '.join(KV_DTYPES)})")
        self.path = Path(path)
        self.file = open_gguf(self.path)
        f = self.file
        why = unsupported_reason(f)
        if why is not None:
            raise UnsupportedModelError(f"{self.path.name}: {why}")
        self.config = ModelConfig.from_gguf(f)
        if n_ctx is not None:
            self.config = replace(self.config, n_ctx=min(int(n_ctx), self.config.n_ctx))
        self.kv_dtype = kv
        self.name = str(f.get("general.name") or self.path.stem)
        self.tokenizer = Tokenizer.from_metadata(f.metadata)
        self.chat_template = ChatTemplate.for_model(
            f.metadata, lambda i: self.tokenizer.token_bytes(i).decode("utf-8", "replace"))
        self.weight_id = cached_weight_id(self.path)
        self.threads = int(threads) if threads else physical_cores()
        if self.threads < 1:
            raise ValueError("threads must be at least 1")

        tensors = {t.name: (t.ggml_type, t.data.ctypes.data, t.shape[0], t.shape[1] if len(t.shape) > 1 else 1)
                   for t in f.tensors.values()}
        cfg = self.config
        try:
            self._core = _core.Model(asdict(cfg), tensors, self.threads)
        except (ValueError, IndexError) as err:
            raise ModelFileError(f"{self.path.name}: {err}") from None
        try:
            page_bytes = self._core.page_bytes(PAGE_TOKENS, kv)
        except ValueError as err:
            raise UnsupportedModelError(f"{self.path.name}: {err}") from None
        self.pool = _core.PagePool(cfg.n_layer, PAGE_TOKENS, cfg.kv_dim, kv, max(16, kv_budget // page_bytes))
        # Sliding-window models release the local layers of pages that fall
        # wholly outside every window; the full-attention layers of those pages
        # move to a pool of smaller pages (native/kv/page_pool.h SwaRelease).
        self.kept_layers = [i for i in range(cfg.n_layer) if not (cfg.swa_window and cfg.swa_layers[i])]
        self.trim_pool = None
        if cfg.swa_window and len(self.kept_layers) < cfg.n_layer:
            trim_bytes = page_bytes * len(self.kept_layers) // cfg.n_layer
            self.trim_pool = _core.PagePool(len(self.kept_layers), PAGE_TOKENS, cfg.kv_dim, kv,
                                            max(16, kv_budget // max(trim_bytes, 1)))
        # Every forward goes through one loop that batches concurrent callers into shared steps.
        self.scheduler = Scheduler(self._core, n_ctx=cfg.n_ctx, n_vocab=cfg.n_vocab)

    # -- tokens ---------------------------------------------------------------
    def tokenize(self, text: str, *, add_bos: bool = False, parse_special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_bos=add_bos, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    # -- forward --------------------------------------------------------------
    def new_sequence(self) -> "_core.KVSeq":
        if self.trim_pool is None:
            return _core.KVSeq(self.pool)
        return _core.KVSeq(self.pool, self.trim_pool, self.config.swa_window, self.kept_layers)

    def forward(self, seq: "_core.KVSeq", tokens: Sequence[int], *, all_logits: bool = False) -> np.ndarray:
        """Append tokens to seq's KV; logits of the last position (or of every new one)."""
        toks = np.asarray(tokens, dtype=np.int32)
        rows = len(toks) if all_logits else 1
        logits = np.empty((rows, self.config.n_vocab), dtype=np.float32)
        self.scheduler.submit(seq, toks, logits, all_logits, None)
        return logits if all_logits else logits[0]

    def forward_hidden(self, seq: "_core.KVSeq", tokens: Sequence[int]) -> np.ndarray:
        """Append tokens; final normed hidden state of every new position (n, n_embd)."""
        toks = np.asarray(tokens, dtype=np.int32)
        hidden = np.empty((len(toks), self.config.n_embd), dtype=np.float32)
        self.scheduler.submit(seq, toks, None, False, hidden)
        return hidden

    def logprobs(self, ids: Sequence[int], *, top: int = 40, chunk: int = 256) -> LogProbs:
        """Teacher-forced top-k log-probabilities after every prefix of ids."""
        ids = [int(i) for i in ids]
        if not ids:
            raise ValueError("logprobs needs at least one token")
        top = max(1, min(int(top), self.config.n_vocab))
        seq = self.new_sequence()
        top_ids, top_lp, next_lp = [], [], []
        for start in range(0, len(ids), chunk):
            part = ids[start:start + chunk]
            logits = self.forward(seq, part, all_logits=True).astype(np.float64)
            lse = np.logaddexp.reduce(logits, axis=1, keepdims=True)
            lp = logits - lse
            idx = np.argpartition(-lp, top - 1, axis=1)[:, :top]
            vals = np.take_along_axis(lp, idx, axis=1)
            order = np.lexsort((idx, -vals), axis=1)
            top_ids.append(np.take_along_axis(idx, order, axis=1).astype(np.int32))
            top_lp.append(np.take_along_axis(vals, order, axis=1).astype(np.float32))
            for i in range(len(part)):
                j = start + i + 1
                if j < len(ids):
                    next_lp.append(lp[i, ids[j]])
        return LogProbs(ids, np.concatenate(top_ids), np.concatenate(top_lp), np.asarray(next_lp, dtype=np.float32))

    def close(self) -> None:
        self.scheduler.close()
        self._core = None
        self.file.close()
