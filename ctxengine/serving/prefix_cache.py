"""Prefix reuse without asking: the contexts of recent requests, kept so that
a later request sharing a prefix with one of them prefills only what is new.

A request that names no context gets a fresh internal context (a name under
``_prefix/``, which the runtime treats as the server's own) by ``acquire``:
the cached context whose tokens share the longest prefix with the prompt is
forked (O(pages), copy-on-write) and cut back to that common length, so the
caller appends just the rest. When the request ends, ``release`` keeps the
context (prompt plus reply) as an entry for the next request: the second
turn of a chat sent as a plain stateless request finds the first turn's
pages here.

Because the kernels are deterministic, the KV of a cached prefix is
bit-identical to recomputing it, so output with reuse equals output without.
Entries are keyed by the LoRA adapters and scales their KV was computed with
as well as by tokens: a request only ever reuses KV of its own adapter set.

Bounds: at most ``max_entries`` entries, least recently used dropped first,
and entries are dropped while the model's page pool is more than
``max_pool_fraction`` full (the cache only ever uses pages nobody asked us
to keep). An entry whose tokens are a prefix of a newer entry's is dropped:
the newer one serves every request the older could.
"""
from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..engine.lora import NO_LORA, LoraSet
from ..errors import CtxError

if TYPE_CHECKING:
    from ..state.model import Model
    from ..state.context import Context

NAME_PREFIX = "_prefix/"
DEFAULT_MAX_ENTRIES = 32
DEFAULT_MAX_POOL_FRACTION = 0.5


@dataclass
class PrefixStats:
    lookups: int = 0
    hits: int = 0            # lookups that reused at least one token
    prompt_tokens: int = 0   # over every lookup
    cached_tokens: int = 0   # of those, how many came from the cache


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two int arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class PrefixCache:
    def __init__(self, model: "Model", *, max_entries: int = DEFAULT_MAX_ENTRIES,
                 max_pool_fraction: float = DEFAULT_MAX_POOL_FRACTION):
        if max_entries < 1:
            raise ValueError("a prefix cache needs room for at least one entry")
        self.model = model
        self.max_entries = max_entries
        self.max_pool_fraction = max_pool_fraction
        self.stats = PrefixStats()
        # name -> (tokens, the adapter set's key); oldest first
        self._entries: OrderedDict[str, tuple[np.ndarray, tuple]] = OrderedDict()
        self._lock = threading.Lock()
        self._names = itertools.count(1)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    # -- one request's life ----------------------------------------------------------
    def acquire(self, prompt: Sequence[int], lora: LoraSet = NO_LORA) -> tuple["Context", int]:
        """A new internal context, running with the adapters ``lora``, holding the
        longest cached prefix of ``prompt`` made with them, and that prefix's length
        (at most len(prompt) - 1: the last token is always run, for its logits).
        The caller appends ``prompt[n:]``, generates, and hands it to ``release``."""
        want = np.asarray(prompt, dtype=np.int64)
        table = self.model.contexts
        name = f"{NAME_PREFIX}{next(self._names)}"
        with self._lock:
            self.stats.lookups += 1
            self.stats.prompt_tokens += len(want)
            for src_name, n in self._candidates(want, lora.key):
                try:
                    src = table.get(src_name)
                    # Only tokens whose KV is computed count as cached (an entry
                    # evicted to the store comes back here).
                    n = min(n, src.n_cached, len(want) - 1)
                    if not src.shares_kv_at(n):
                        continue  # a sliding window released that prefix's KV
                    ctx = src.fork(name, n_tokens=n)
                except CtxError:
                    # Gone with its model, unreadable, or no room for the page its fork copies
                    # (the pool full of contexts in use): dropped, its pages with it (the entry
                    # was left in the table, holding them, and no later trim could find it).
                    self._drop(src_name)
                    continue
                ctx.sampler_state = None  # a new request starts its own RNG, as without the cache
                self._entries.move_to_end(src_name)
                if n > 0:
                    self.stats.hits += 1
                    self.stats.cached_tokens += n
                return ctx, n
        return table.adopt(name, self.model.engine.new_sequence(), (), lora=lora), 0

    def release(self, ctx: "Context", *, keep: bool = True) -> None:
        """The request is over: keep its context for later requests, or drop it."""
        tokens = np.asarray(ctx.tokens, dtype=np.int64)
        if not keep or len(tokens) == 0:
            self._delete(ctx.name)
            return
        key = ctx.lora.key
        with self._lock:
            for name, (old, old_key) in list(self._entries.items()):
                if old_key == key and len(old) <= len(tokens) and common_prefix(old, tokens) == len(old):
                    self._drop(name)  # the new entry serves every request this one could
            self._entries[ctx.name] = (tokens, key)
            self._trim()

    def clear(self) -> None:
        with self._lock:
            for name in list(self._entries):
                self._drop(name)

    # -- internals ---------------------------------------------------------------------
    def _candidates(self, want: np.ndarray, key: tuple) -> list[tuple[str, int]]:
        """Entries of this adapter set sharing a prefix with ``want``, longest first."""
        found = [(name, common_prefix(tokens, want)) for name, (tokens, k) in self._entries.items() if k == key]
        return sorted((f for f in found if f[1] > 0), key=lambda f: -f[1])

    def _trim(self) -> None:
        pool = self.model.engine.pool
        while self._entries and (len(self._entries) > self.max_entries
                                 or pool.n_used > pool.max_pages * self.max_pool_fraction):
            self._drop(next(iter(self._entries)))

    def _drop(self, name: str) -> None:
        self._entries.pop(name, None)
        self._delete(name)

    def _delete(self, name: str) -> None:
        try:
            self.model.contexts.remove(name)
        except CtxError:
            pass  # already gone (its model was closed)
