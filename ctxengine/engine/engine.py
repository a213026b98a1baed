"""The loaded engine: a GGUF's weights mapped into the native core, its page
pools, tokenizer, chat renderer, weight identity and scheduler, and
teacher-forced log-probabilities.

This is the engine layer: it knows tensors and tokens, not names, contexts
or snapshots (those live in ``ctxengine.state``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from numbers import Integral
from typing import Iterable, Mapping, Sequence

import numpy as np

from .. import _core
from ..errors import (ContextError, CtxError, ModelFileError, RequestError,
                      UnsupportedModelError)
from ..text.chat import ChatRenderer
from ..text.chat_template import ChatTemplate
from ..text.tokenizer import Tokenizer
from .config import ModelConfig, unsupported_reason
from .cpu import physical_cores
from .gguf_file import open_gguf
from .lora import NO_LORA, LoraAdapter, LoraSet, check_finite, load_adapter
from .scheduler import Reserve, Scheduler
from .speculation_stats import SpeculationStats
from .weights import cached_weight_id

# How KV pages store K and V (native/kv/page_pool.h, docs/design-notes.md):
# f16; q8: K and V as int8 with an f16 scale per 32 values; vq8: K f16, V int8.
KV_DTYPES = ("f16", "q8", "vq8")
PAGE_TOKENS = 16
DEFAULT_KV_BUDGET = 2 << 30  # bytes of KV pages a model may hold in memory
# Bytes of the weights' copies laid out for decode (products of 1-2 rows), the output
# matrix first: they cost their size in memory (native/models/model.cpp repack_weights).
DEFAULT_REPACK_BUDGET = 512 << 20
TRUNCATED_MODEL = ("the file was truncated or rewritten in place while it was loaded. Replace a loaded model by "
                   "writing a new file and renaming it over the old one (as `ctx pull` does), then load it again.")
MAX_THREADS = 512  # llama.cpp's GGML_MAX_N_THREADS: each is an OS thread of the core's pool


@dataclass(frozen=True)
class LogProbs:
    """Teacher-forced next-token distributions: row i follows ids[: i + 1]."""

    ids: list[int]
    top_ids: np.ndarray        # (n, k) int32, most likely first
    top_logprobs: np.ndarray   # (n, k) float32
    next_logprobs: np.ndarray  # (n - 1,) float32: log p(ids[i + 1] | ids[: i + 1])


class Engine:
    """Weights in the native core plus everything needed to turn text into logits.

    One per loaded file; ``Model.engine`` and ``Context.engine`` name it."""

    def __init__(self, path: str | Path, *, threads: int | None = None, kv: str = "f16",
                 n_ctx: int | None = None, kv_budget: int = DEFAULT_KV_BUDGET,
                 repack_budget: int | None = None):
        if kv not in KV_DTYPES:
            raise UnsupportedModelError(f"KV dtype '{kv}' is not available (choose from {', '.join(KV_DTYPES)})")
        if threads and (isinstance(threads, bool) or not isinstance(threads, Integral)  # 0 or None: one a core
                        or not 1 <= threads <= MAX_THREADS):
            raise RequestError(f"threads must be between 1 and {MAX_THREADS}, not {threads!r} "
                               "(an int; None or 0: one a physical core)", param="threads")
        if n_ctx is not None and (isinstance(n_ctx, bool) or not isinstance(n_ctx, Integral) or n_ctx < 1):
            raise RequestError(f"n_ctx must be a positive number of tokens, not {n_ctx!r}", param="n_ctx")
        if repack_budget is None:
            repack_budget = DEFAULT_REPACK_BUDGET
        if isinstance(repack_budget, bool) or not isinstance(repack_budget, Integral) or repack_budget < 0:
            raise RequestError(f"repack_budget must be a number of bytes >= 0, not {repack_budget!r}",
                               param="repack_budget")
        self.path = Path(path)
        self.repack_budget = int(repack_budget)
        self.file = open_gguf(self.path)
        f = self.file
        why = unsupported_reason(f)
        if why is not None:
            raise UnsupportedModelError(f"{self.path.name}: {why}")
        self.config = ModelConfig.from_gguf(f)
        if n_ctx is not None:  # at most the trained length: a draft model shorter than its target loads
            self.config = replace(self.config, n_ctx=min(int(n_ctx), self.config.n_ctx))
        self.kv_dtype = kv
        self.name = str(f.get("general.name") or self.path.stem)
        self.tokenizer = Tokenizer.from_file(f)
        try:
            self.chat_template = ChatTemplate.for_model(
                f.metadata, lambda i: self.tokenizer.token_bytes(i).decode("utf-8", "replace"))
        except CtxError as err:  # the file's template, or the tokens it names: say whose
            raise type(err)(f"{self.path.name}: {err}") from None
        self.chat = ChatRenderer(self.chat_template, self.tokenizer, self.name)
        self.weight_id = cached_weight_id(self.path)
        self.threads = int(threads) if threads else physical_cores()

        tensors = {t.name: (t.ggml_type, t.data.ctypes.data, t.shape[0], t.shape[1] if len(t.shape) > 1 else 1)
                   for t in f.tensors.values()}
        cfg = self.config
        try:
            repack = min(self.repack_budget, 1 << 62)  # past any memory; the core takes a size_t
            self._core = _core.Model({**asdict(cfg), "repack_budget": repack}, tensors, self.threads)
        except (ValueError, IndexError) as err:
            raise ModelFileError(f"{self.path.name}: {err}") from None
        except RuntimeError as err:  # the OS refused the threads (native/core/threads.cpp)
            raise CtxError(f"{self.path.name}: {err}") from None
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
        self.adapters: dict[str, LoraAdapter] = {}  # LoRA adapters by name (load_lora)
        self.closed = False  # set when close() begins: from then on every forward is refused
        # Every forward goes through one loop that batches concurrent callers into shared steps.
        self.scheduler = Scheduler(self._core, n_ctx=cfg.n_ctx, n_vocab=cfg.n_vocab, page_tokens=PAGE_TOKENS)
        self.draft: Engine | None = None  # a draft model with our vocabulary (state.model.load)
        self.speculative = True           # contexts draft by default (engine/speculative.py)
        self.speculation = SpeculationStats()  # every generation's drafts, for /metrics
        self._guarded = f.mappings()  # a SIGBUS in them (the file truncated) names the file (mapping_guard.cpp)
        for address, size, where in self._guarded:
            _core.guard_mapping(address, size, f"the model file {Path(where).absolute()}", TRUNCATED_MODEL)

    # -- tokens ---------------------------------------------------------------
    @property
    def repacked_bytes(self) -> int:
        """Bytes of the weights' copies laid out for decode (products of 1-2 rows), which the
        engine holds beside the mapped file (at most repack_budget)."""
        return self._core.repacked_bytes

    def checked_ids(self, ids: Iterable[int]) -> list[int]:
        """Token ids as ints, each in the vocabulary (a ContextError names the first that is
        not: ``b"hi"`` or ``[1.9]`` were taken as ids 104, 105 and 1)."""
        if isinstance(ids, (str, bytes, bytearray)) or not isinstance(ids, Iterable):
            raise ContextError(f"token ids must be a sequence of ints, not {type(ids).__name__}")
        ids, n_vocab = list(ids), self.config.n_vocab
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, Integral):
                raise ContextError(f"token id {i!r} is not an int")
            if not 0 <= i < n_vocab:
                raise ContextError(f"token id {i} is outside the vocabulary (0..{n_vocab - 1})")
        return [int(i) for i in ids]

    def tokenize(self, text: str, *, add_bos: bool = False, parse_special: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise RequestError(f"tokenize takes a str, not {type(text).__name__}", param="text")
        return self.tokenizer.encode(text, add_bos=add_bos, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(self.checked_ids(ids))

    # -- LoRA adapters ----------------------------------------------------------
    def load_lora(self, name: str, path: str | Path) -> LoraAdapter:
        """Load an adapter file under a name (engine/lora.py); a file that does not
        fit this model raises ModelFileError and nothing is kept."""
        if not isinstance(name, str) or not name or name in self.adapters:
            raise CtxError(f"LoRA adapter name {name!r} is empty or already taken")
        adapter = load_adapter(self._core, self.config.arch, path, name)
        self.adapters[name] = adapter
        return adapter

    def lora_set(self, scales: dict[str, float] | LoraSet | None) -> LoraSet:
        """{adapter name: scale} as the LoraSet a context runs with; unknown names raise."""
        if scales is None:
            return NO_LORA
        if isinstance(scales, LoraSet):
            return scales
        if not isinstance(scales, Mapping):
            raise ValueError(f"LoRA adapters are given as {{name: scale}}, not {type(scales).__name__}")
        unknown = [n for n in scales if n not in self.adapters]
        if unknown:
            have = ", ".join(sorted(self.adapters)) or "none"
            raise ValueError(f"unknown LoRA adapter {unknown[0]!r} (loaded: {have})")
        return LoraSet.of((self.adapters[n], s) for n, s in scales.items())

    # -- forward --------------------------------------------------------------
    def new_sequence(self) -> "_core.KVSeq":
        if self.trim_pool is None:
            return _core.KVSeq(self.pool)
        return _core.KVSeq(self.pool, self.trim_pool, self.config.swa_window, self.kept_layers)

    def forward(self, seq: "_core.KVSeq", tokens: Sequence[int], *, all_logits: bool = False,
                reserve: Reserve | None = None, lora: LoraSet = NO_LORA) -> np.ndarray:
        """Append tokens to seq's KV; logits of the last position (or of every new one).
        ``reserve(n_pages)``: called on this thread before the request is queued, to make
        room in the page pool (a context table's reserve_pages). ``lora``: the adapters the
        sequence runs with (always the same set for one sequence)."""
        toks = np.asarray(tokens, dtype=np.int32)
        rows = len(toks) if all_logits else 1
        logits = np.empty((rows, self.config.n_vocab), dtype=np.float32)
        self._submit(seq, toks, logits, all_logits, None, reserve, lora=lora.native())
        return logits if all_logits else logits[0]

    def verify(self, seq: "_core.KVSeq", tokens: Sequence[int], *,
               reserve: Reserve | None = None, lora: LoraSet = NO_LORA) -> np.ndarray:
        """Append a sampled token and the drafts after it; the logits after each (n, n_vocab).
        The scheduler runs these rows with the decode rows of its step."""
        toks = np.asarray(tokens, dtype=np.int32)
        logits = np.empty((len(toks), self.config.n_vocab), dtype=np.float32)
        self._submit(seq, toks, logits, True, None, reserve, lora=lora.native(), decode=True)
        return logits

    def forward_hidden(self, seq: "_core.KVSeq", tokens: Sequence[int], *,
                       reserve: Reserve | None = None, lora: LoraSet = NO_LORA) -> np.ndarray:
        """Append tokens; final normed hidden state of every new position (n, n_embd)."""
        toks = np.asarray(tokens, dtype=np.int32)
        hidden = np.empty((len(toks), self.config.n_embd), dtype=np.float32)
        self._submit(seq, toks, None, False, hidden, reserve, lora=lora.native())
        return hidden

    def check_open(self) -> None:
        """ContextError once ``close`` has begun: nothing of the model may run any more."""
        if self.closed:
            raise ContextError("the model is closed")

    def _submit(self, *args, **kwargs) -> None:
        self.check_open()
        try:
            self.scheduler.submit(*args, **kwargs)
        except RuntimeError:
            self.check_open()  # closed while this request waited: the scheduler refused it
            raise

    def logprobs(self, ids: Sequence[int], *, top: int = 40, chunk: int = 256,
                 lora: LoraSet = NO_LORA) -> LogProbs:
        """Teacher-forced top-k log-probabilities after every prefix of ids; ``top``: k, at
        least 1 (one above the vocabulary's size gives them all)."""
        if isinstance(top, bool) or not isinstance(top, Integral) or top < 1:
            raise RequestError(f"logprobs' top must be an int >= 1, not {top!r}", param="top")
        ids = self.checked_ids(ids)
        if not ids:
            raise ContextError("logprobs needs at least one token")
        if len(ids) > self.config.n_ctx:  # refused before the first chunk runs
            raise ContextError(f"logprobs of {len(ids)} tokens: the model's context length is {self.config.n_ctx}")
        top = min(int(top), self.config.n_vocab)
        seq = self.new_sequence()
        top_ids, top_lp, next_lp = [], [], []
        for start in range(0, len(ids), chunk):
            part = ids[start:start + chunk]
            logits = self.forward(seq, part, all_logits=True, lora=lora).astype(np.float64)
            check_finite(logits, lora)
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

    def stop(self) -> None:
        """Refuse every new forward (a ContextError) and wait for those in flight, queued or
        running on a caller's thread: the first half of ``close``, after which nothing reads
        the weights or writes a page."""
        self.closed = True  # first: a request the closing scheduler refuses then says why
        self.scheduler.close()

    def close(self) -> None:
        if getattr(self, "_core", None) is None:  # closed already (or never made)
            return
        self.stop()
        if self.draft is not None and self.draft is not self:
            self.draft.close()
        self._core = None
        for address, _, _ in self._guarded:
            _core.unguard_mapping(address)
        self.file.close()
