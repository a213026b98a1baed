"""Faults in the KV memory of contexts, each reproduced in a full page pool:
a truncate's copy-on-write page taken without room made for it (a raw pool
error instead of an eviction, or a ContextError), a refused rewind that changed
the context anyway, and two evictions of one name sharing the ref that keeps
their snapshots from gc (state/context.py, state/residency.py, state/table.py)."""
import threading

import numpy as np
import pytest

import ctxengine as ce
from ctxengine.engine.engine import Engine
from ctxengine.errors import ContextError
from ctxengine.serving.prefix_cache import PrefixCache
from ctxengine.state import Residency
from ctxengine.store import Store

PROMPT = "The history of the printing press begins in the fifteenth century, in the workshops of Mainz. " * 12


@pytest.fixture
def small(smollm2_path, page_bytes):
    """A model of a 16-page pool (no store: nothing can be evicted unless a test sets one)."""
    model = ce.Model(Engine(smollm2_path, threads=2, kv_budget=16 * page_bytes))
    yield model
    model.close()


def ids(model, i: int, n: int) -> list[int]:
    """n distinct tokens (variant i)."""
    return [(t + 7 * i) % model.config.n_vocab for t in model.tokenize(PROMPT)[:n]]


def filled(model, name: str, i: int, n: int = 40):
    c = model.context(name)
    c.append(ids(model, i, n))
    return c


def greedy(c, n: int = 6) -> list[int]:
    return [p.token_id for p in c.generate(max_tokens=n, temperature=0.0, speculative=False)]


def expected(model, i: int, n: int) -> list[int]:
    """What a context of ids(i, n) generates, computed in the same pool, then deleted."""
    c = filled(model, "reference", i, n)
    try:
        return greedy(c)
    finally:
        c.delete()


def shared_and_full(model):
    """a (40 tokens: its third page partly filled), its fork b sharing every page, and
    idle contexts that fill the rest of the 16-page pool."""
    a = filled(model, "a", 1)
    b = a.fork("b")
    filled(model, "fill", 2, 13 * 16)
    assert model.engine.pool.n_used == model.engine.pool.max_pages
    return a, b


def test_a_truncate_in_a_full_pool_evicts_idle_contexts_for_its_copy(small, tmp_path):
    # The copy-on-write page of a shared last page was taken without room made:
    # "ValueError: KV page pool is full" where an idle context could be evicted.
    want37, want40 = expected(small, 1, 37), expected(small, 1, 40)
    with Store(tmp_path / "store") as store:
        small.contexts.store = store
        a, b = shared_and_full(small)
        a.rewind(3)
        branch = b.fork("branch", n_tokens=37)
        assert small.contexts.get("fill").residency is Residency.EVICTED
        assert greedy(a) == want37 and greedy(branch) == want37 and greedy(b) == want40


def test_a_restored_context_makes_room_to_recompute_its_logits(small, tmp_path):
    # Its first generate() re-forwards its last token: a truncate into a full page the
    # page-key cache holds, so a copy, taken from a pool full of idle contexts.
    want = expected(small, 0, 64)
    with Store(tmp_path / "store") as store:
        small.contexts.store = store
        cs = [filled(small, f"c{i}", i, 64) for i in range(5)]  # 4 full pages each: 20 > 16
        assert cs[0].residency is Residency.EVICTED
        assert greedy(cs[0]) == want
        sid = cs[1].snapshot(store)  # evicted too: read back, logits recomputed, written
        assert store.get_manifest(sid).n_tokens == 64


def test_the_prefix_cache_forks_a_cached_prefix_in_a_full_pool(small, tmp_path):
    # POST /v1/completions answered 500: acquire's fork at a mid-page prefix took its copy
    # from a pool full of idle named contexts.
    prompt = ids(small, 3, 40)
    want = expected(small, 3, 40)
    with Store(tmp_path / "store") as store:
        small.contexts.store = store
        cache = PrefixCache(small)
        ctx, n = cache.acquire(prompt)
        ctx.append(prompt[n:])
        cache.release(ctx)
        filled(small, "fill", 4, 13 * 16)
        assert small.engine.pool.n_used == small.engine.pool.max_pages
        ctx, n = cache.acquire(prompt[:37] + [5, 6, 7])
        assert n == 37
        ctx.append(prompt[37:])  # the same tokens as the cached entry's: the same reply
        assert greedy(ctx) == want


def test_a_prefix_entry_that_cannot_be_forked_is_dropped_with_its_pages(small):
    # Without room for its fork's copy, the entry left the cache but not the table: its
    # pages were held for good. Dropped, they make room for the request itself.
    prompt = ids(small, 3, 40)
    cache = PrefixCache(small)
    ctx, _ = cache.acquire(prompt)
    ctx.append(prompt)
    cache.release(ctx)
    entry = ctx.name
    filled(small, "fill", 4, 13 * 16)  # a client's context: never evicted (no store)
    ctx, n = cache.acquire(prompt[:37] + [5, 6, 7])
    assert n == 0 and entry not in small.contexts and len(cache) == 0
    ctx.append(prompt[:37] + [5, 6, 7])
    assert ctx.n_cached == 40


def state(c) -> tuple:
    logits = c._last_logits
    return c.tokens, c.n_cached, c.page_ids(), None if logits is None else logits.tobytes()


def test_a_refused_rewind_or_fork_changes_nothing(small):
    # No store: no room can be made. rewind() dropped the tokens, then the native
    # truncate set the KV's length before its copy failed, and the old logits stayed:
    # the next reply began from the 40-token logits on a 37-token KV.
    want40 = expected(small, 1, 40)
    a, b = shared_and_full(small)
    before, names = state(a), small.contexts.names()
    for refused in (lambda: a.rewind(3), lambda: a.fork("c", n_tokens=37), lambda: b.fork("c", n_tokens=37)):
        with pytest.raises(ContextError, match="page pool is full"):
            refused()
        assert state(a) == before and small.contexts.names() == names
    small.contexts.get("fill").delete()
    assert greedy(a) == want40


def test_a_restored_context_without_room_for_its_logits_is_refused_unchanged(small, tmp_path):
    want = expected(small, 0, 64)
    with Store(tmp_path / "store") as store:
        filled(small, "src", 0, 64).snapshot(store, ref="src")
        small.contexts.get("src").delete()
        r = small.restore(store, "src", name="r")  # its full pages are pinned by the key cache
        filled(small, "fill", 2, 12 * 16)
        before = state(r)
        with pytest.raises(ContextError, match="page pool is full"):
            greedy(r)
        assert state(r) == before and before[1] == 64
        small.contexts.get("fill").delete()
        assert greedy(r) == want


class GatedStore(Store):
    """A real store whose first eviction write waits until the test opens ``gate``."""

    def __init__(self, path):
        super().__init__(path)
        self.gate, self.writing = threading.Event(), threading.Event()
        self._held = 1

    def snapshot(self, m, pages, ref=None):
        if ref is not None and ref.startswith("_evicted/") and self._held:
            self._held = 0
            self.writing.set()
            assert self.gate.wait(120)
        return super().snapshot(m, pages, ref=ref)


def test_a_new_context_of_an_evicted_ones_name_keeps_its_own_eviction_ref(smollm2_path, page_bytes, tmp_path):
    # Both evictions of "X" wrote one ref; the old one's write landed last and its delete
    # then dropped it: gc removed the new X's snapshot, and the new X was lost.
    model = ce.Model(Engine(smollm2_path, threads=2, kv_budget=32 * page_bytes))
    store = GatedStore(tmp_path / "store")
    try:
        want = expected(model, 2, 40)
        model.contexts.store = store
        old = filled(model, "X", 1)
        ys = [filled(model, f"y{i}", 10 + i) for i in range(8)]  # 27 of 32 pages
        t1 = threading.Thread(target=lambda: filled(model, "t1", 50, 96))  # 6 pages: evicts the old X
        t1.start()
        assert store.writing.wait(60) and old.residency is Residency.EVICTING
        t2 = threading.Thread(target=old.delete)  # waits for the write to end
        t2.start()
        while "X" in model.contexts:
            t2.join(0.01)
        new = filled(model, "X", 2)
        for y in ys:
            y.append([100])  # the new X is now the least recently used
        filled(model, "z", 60, 96)  # evicts the new X, while the old one's write still waits
        assert new.residency is Residency.EVICTED and old.residency is Residency.EVICTING
        store.gate.set()
        t1.join()
        t2.join()
        assert old.residency is Residency.DELETED
        assert new._evicted in store.refs().values()
        store.gc()
        assert greedy(new) == want
    finally:
        store.gate.set()
        model.close()
        store.close()
