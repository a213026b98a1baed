"""The named contexts of one model, and the memory budget of its page pool.

When the pool runs short of pages, the least recently used idle contexts are
written to the table's snapshot store (if it has one) and their pages
released; such an *evicted* context stays in the table and is read back
transparently the next time it is used. Without a store, running out of
pages is a ContextError.

Room is made by the thread that needs it, before its forward is queued
(``Context._sync`` → ``Engine.forward(reserve=)`` → ``Scheduler.submit``), never
by the scheduler's loop: an eviction's store write holds up the request that
needs the pages and no other stream. The victim is held (its lock, taken only
if free) and EVICTING while it is written (state/residency.py), so a use of it
waits for the write to end, then reads it back.
"""
from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING, Sequence

from ..engine.lora import NO_LORA, LoraSet
from ..errors import ContextError, StoreError
from ..store import page_key
from ..store.names import MAX_NAME_LEN, validate_name
from .context import Context
from .evicted import EVICTED_REF_PREFIX, owner_tag
from .budget import PageBudget, Promise
from .page_keys import PageKeyCache
from .residency import Residency
from .snapshots import check_compatible, load_sequence, snapshot, write_pages

if TYPE_CHECKING:
    from ..engine.engine import Engine
    from ..store import Store

# Refs that keep evicted contexts' snapshots from gc: one namespace per table
# (owning process + table number), so processes sharing a store never collide
# and gc can tell a dead process's refs (state/evicted.py).
_table_ids = itertools.count(1)
# While every other context is in use, a request short of pages waits this long at a
# time for pages promised to running requests to come back, before it looks again.
RELEASE_WAIT_S = 0.05


class ContextTable:
    def __init__(self, engine: "Engine", store: "Store | None" = None):
        self.engine = engine
        self.store = store  # where idle contexts go when the page pool is full
        self.page_keys = PageKeyCache(engine)
        self.budget = PageBudget(engine.pool)  # pages promised to requests not yet run
        self.n_evictions = 0
        self._evict_ns = f"{EVICTED_REF_PREFIX}/{owner_tag()}-{next(_table_ids)}"
        self._contexts: dict[str, Context] = {}
        self._lock = threading.Lock()
        self._counter = itertools.count(1)
        self._clock = itertools.count()
        self._last_use: dict[str, int] = {}

    def names(self) -> list[str]:
        with self._lock:
            return list(self._contexts)

    def get(self, name: str) -> Context:
        with self._lock:
            try:
                return self._contexts[name]
            except KeyError:
                raise ContextError(f"no context named '{name}'") from None

    def __contains__(self, name: str) -> bool:
        with self._lock:
            return name in self._contexts

    def open(self, name: str | None = None, lora: LoraSet | None = None) -> Context:
        """The context with this name, created empty if it does not exist. ``lora``:
        the adapters a new one runs with; an existing one must already run with
        them (ContextError otherwise: a context's adapters never change)."""
        with self._lock:
            ctx = self._contexts.get(name) if name is not None else None
        if ctx is not None:
            if lora is not None and lora != ctx.lora:
                raise ContextError(f"context '{name}' runs with {ctx.lora.describe()}; its adapters cannot "
                                   f"change to {lora.describe()} (open a new context for them)")
            return ctx
        return self.adopt(name, self.engine.new_sequence(), (), lora=lora or NO_LORA)

    def adopt(self, name: str | None, seq, tokens: Sequence[int], **state) -> Context:
        """Register a new context around an existing page table."""
        with self._lock:
            if name is None:
                name = self._fresh_name()
            validate_name(name, what="context")
            if name in self._contexts:
                raise ContextError(f"a context named '{name}' already exists")
            ctx = Context(self, name, seq, tokens, **state)
            self._contexts[name] = ctx
            self._last_use[name] = next(self._clock)
            return ctx

    def restore(self, store: "Store", ref_or_id: str, name: str | None = None,
                lora: LoraSet | None = None) -> Context:
        """A new live context holding a stored snapshot (a ref, an id or an id prefix).

        Refuses (WeightMismatchError) a snapshot made by other weights, or with
        other LoRA adapters or scales than ``lora`` (None: those it records, which
        must be loaded), before reading any page; every page is verified against
        its key.
        """
        if name is not None:
            validate_name(name, "context")
            if name in self:
                raise ContextError(f"a context named '{name}' already exists")
        sid = store.resolve(ref_or_id)
        m = store.get_manifest(sid)
        lora = check_compatible(m, sid, self.engine, lora)
        seq = load_sequence(self, store, m, sid)
        sampler_state = dict(m.sampler_state)
        grammar = sampler_state.pop("grammar", None)
        return self.adopt(name, seq, m.token_ids, labels=m.labels,
                          sampler_state=sampler_state or None, snapshot_id=sid, constraint=grammar, lora=lora)

    def snapshot(self, ctx: Context, store: "Store", ref: str | None = None,
                 labels: dict[str, str] | None = None) -> str:
        """Write ``ctx`` to ``store`` (only the pages it lacks); the snapshot id (``Context.snapshot``)."""
        return snapshot(ctx, store, ref=ref, labels=labels)

    def remove(self, name: str, only: Context | None = None) -> None:
        """Delete the context named ``name``; with ``only``, only if it is that one (a
        handle of a deleted context must not delete a new one that took its name)."""
        with self._lock:
            ctx = self._contexts.get(name)
            if ctx is None or (only is not None and ctx is not only):
                gone = "" if only is None else (" (it was deleted)" if ctx is None else
                                                " (it was deleted; the context of that name is another one)")
                raise ContextError(f"no context named '{name}'{gone}")
            del self._contexts[name]
            self._last_use.pop(name, None)
        pages, evicted = ctx._kv.delete()  # after an eviction being written, if one is
        if evicted is not None:
            self._drop_evicted_ref(ctx)  # its own: a new context of this name has another
        self.page_keys.forget_unused(pages)  # give back what only the key cache still held

    def others(self, ctx: Context) -> list[Context]:
        """Every context but ctx (speculation drafts from its relatives among them)."""
        with self._lock:
            return [c for c in self._contexts.values() if c is not ctx]

    def touch(self, ctx: Context) -> None:
        with self._lock:
            if ctx.name in self._contexts:
                self._last_use[ctx.name] = next(self._clock)

    def _fresh_name(self) -> str:
        while True:
            name = f"ctx-{next(self._counter)}"
            if name not in self._contexts:
                return name

    # -- the page budget ----------------------------------------------------------
    def reserve_pages(self, n: int, keep: Context | None = None) -> Promise:
        """Hold ``n`` pages for a request, freeing them first if need be: those only the
        key cache holds, then by evicting least recently used idle contexts (never
        ``keep``), on the calling thread (the one that needs them, never the scheduler's).
        Release the promise once the pages are taken (the scheduler does, for a forward)."""
        pool = self.engine.pool
        if n > pool.max_pages:
            raise ContextError(f"{n} KV pages are needed but the page pool holds only {pool.max_pages}")
        pruned = False
        while (promise := self.budget.promise(n)) is None:
            if not pruned:
                pruned = True
                self.page_keys.prune()
            elif (victim := self._idle_victim(keep)) is not None:
                try:
                    self._evict(victim)
                finally:
                    victim._lock.release()
            elif not self.budget.wait_for_release(RELEASE_WAIT_S):  # others' requests will give back theirs
                how = ("every other context is in use" if self.store is not None else
                       "delete contexts, or set model.contexts.store to a Store so idle ones can be evicted to it")
                raise ContextError(f"the KV page pool is full ({pool.n_used} of {pool.max_pages} pages in use, "
                                   f"{n} needed); {how}")
        return promise

    def _idle_victim(self, keep: Context | None) -> Context | None:
        """The least recently used resident context other than ``keep``, locked; None if none."""
        if self.store is None:
            return None
        with self._lock:
            order = sorted(self._contexts.values(), key=lambda c: self._last_use.get(c.name, 0))
        for ctx in order:
            seq = ctx._kv.seq
            if ctx is keep or seq is None or not seq.pages:
                continue
            # Another thread is using it: not idle. (A stream of this thread
            # that is suspended may be evicted: its next step brings it back.)
            if ctx._lock.acquire(blocking=False):
                if ctx.residency is Residency.LIVE:
                    return ctx
                ctx._lock.release()
        return None

    def _evict(self, ctx: Context) -> None:
        """Write ``ctx`` to the store as it is and release its pages (caller holds its lock)."""
        if ctx._speculation is not None:  # its generation is paused (this thread's): drop its drafts
            ctx._speculation.settle()
        seq = ctx._kv.begin_eviction()
        try:
            result = write_pages(ctx, seq, self.store, ref=self._evicted_ref(ctx), labels=ctx.labels)
        except BaseException:
            ctx._kv.abort_eviction()
            raise
        del seq  # the context's page table is the last one: ending the eviction lets its pages go
        pages = ctx._kv.end_eviction(result.snapshot_id)
        self.page_keys.forget_unused(pages)  # the cache may be the last holder of its full pages
        self.n_evictions += 1

    def bring_back(self, ctx: Context) -> None:
        """Read an evicted context back from the store (caller holds its lock); its
        logits are recomputed on first use, bit-identical."""
        sid = ctx._kv.snapshot
        ctx._kv.restored(load_sequence(self, self.store, self.store.get_manifest(sid), sid))
        self._drop_evicted_ref(ctx)
        self.touch(ctx)

    def _evicted_ref(self, ctx: Context) -> str:
        """The ref that keeps ctx's evicted snapshot from gc: ctx's alone (numbered by its serial),
        so a context deleted while its eviction is written never drops a newer namesake's."""
        ref = f"{self._evict_ns}/{ctx._kv.serial}/{ctx.name}"
        if len(ref) > MAX_NAME_LEN:  # long context names: a digest keeps the ref valid
            ref = f"{self._evict_ns}/{ctx._kv.serial}/{page_key(ctx.name.encode())[:40]}"
        return ref

    def _drop_evicted_ref(self, ctx: Context) -> None:
        try:
            self.store.delete_ref(self._evicted_ref(ctx))
        except StoreError:
            pass  # already gone: only its gc protection is lost, and it is no longer needed
