"""A context's residency (state/residency.py): LIVE, EVICTING, EVICTED, DELETED,
its asserted moves, and evictions written by the thread that needs the pages
while every other stream goes on (state/table.py, engine/scheduler.py)."""
import threading
import time

import pytest

import ctxengine as ce
from ctxengine.engine.engine import Engine
from ctxengine.errors import ContextError
from ctxengine import _core
from ctxengine.state import Residency
from ctxengine.state.budget import PageBudget
from ctxengine.state.residency import InvalidTransition, KVState
from ctxengine.store import Store

PROMPT = "The history of the printing press begins in the fifteenth century, in the workshops of Mainz. " * 3


class SlowStore(Store):
    """A real store whose eviction writes take ``delays`` seconds (one per write, in
    order), each write's thread and (start, end) times recorded."""

    def __init__(self, path):
        super().__init__(path)
        self.delays: list[float] = []
        self.writes: list[tuple[int, float, float]] = []
        self.writing = threading.Event()

    def snapshot(self, m, pages, ref=None):
        start = time.monotonic()
        if ref is not None and ref.startswith("_evicted/") and self.delays:
            self.writing.set()
            time.sleep(self.delays.pop(0))
        try:
            return super().snapshot(m, pages, ref=ref)
        finally:
            self.writes.append((threading.get_ident(), start, time.monotonic()))


@pytest.fixture
def store(tmp_path):
    with SlowStore(tmp_path / "store") as s:
        yield s


def small_model(path, page_bytes, pages: int, store) -> ce.Model:
    model = ce.Model(Engine(path, threads=2, kv_budget=pages * page_bytes))
    model.contexts.store = store
    return model


def filled(model, name: str, i: int, n: int = 40):
    """A context of n distinct tokens (three pages for n = 40)."""
    ids = model.tokenize(PROMPT * 4)[:n]
    c = model.context(name)
    c.append([(t + i) % model.config.n_vocab for t in ids])
    return c


def test_moves_are_asserted(smollm2_path, page_bytes, store):
    model = small_model(smollm2_path, page_bytes, 16, store)
    try:
        kv = KVState("k", model.engine.new_sequence())
        assert kv.state is Residency.LIVE
        for wrong in (lambda: kv.end_eviction("sid"), kv.abort_eviction, lambda: kv.restored(None)):
            with pytest.raises(InvalidTransition, match="'k': cannot go from LIVE"):
                wrong()
        kv.begin_eviction()
        with pytest.raises(InvalidTransition, match="from EVICTING to EVICTING"):
            kv.begin_eviction()
        with pytest.raises(InvalidTransition, match="changed while EVICTING"):
            kv.set_kv(None, None)
        kv.end_eviction("sid")
        assert (kv.state, kv.seq, kv.snapshot) == (Residency.EVICTED, None, "sid")
        with pytest.raises(InvalidTransition, match="from EVICTED to EVICTING"):
            kv.begin_eviction()
        kv.delete()
        with pytest.raises(InvalidTransition, match="from DELETED to LIVE"):
            kv.restored(model.engine.new_sequence())

        # A real context goes through them: evicted when another needs its pages,
        # read back on use, deleted.
        cs = [filled(model, f"c{i}", i) for i in range(6)]
        assert cs[0].residency is Residency.EVICTED and cs[0].page_ids() == []
        with cs[0].hold(resident=False):
            assert cs[0].residency is Residency.EVICTED
        with cs[0].hold() as c:
            assert c.residency is Residency.LIVE and c.n_cached == 40
        cs[0].delete()
        assert cs[0].residency is Residency.DELETED
        with pytest.raises(ContextError, match="was deleted"):
            with cs[0].hold():
                pass
    finally:
        model.close()


def test_room_is_promised_until_the_request_gives_it_back():
    pool = _core.PagePool(2, 16, 64, "f16", 16)
    budget = PageBudget(pool)
    assert not budget.wait_for_release(10)  # nothing promised: nothing to wait for
    a = budget.promise(10)
    assert a is not None and budget.promised == 10
    assert budget.promise(7) is None  # free, but promised to a
    page = pool.import_page(bytes(pool.page_bytes))  # a takes one of its pages
    assert budget.promise(6) is None and budget.promise(5) is not None  # counted twice until a is done
    a.release()
    a.release()  # once only
    assert budget.promised == 0 and budget.promise(15) is not None  # dropped, hence given back
    pool.release(page)
    waiter = threading.Thread(target=lambda: (time.sleep(0.2), held.release()))
    held = budget.promise(16)
    waiter.start()
    t0 = time.monotonic()
    assert budget.wait_for_release(30) and time.monotonic() - t0 < 10
    waiter.join()
    assert budget.promised == 0


def stamps_in(stamps: list[float], start: float, end: float) -> tuple[int, float]:
    """How many stamps fall in [start, end], and the longest wait for a next one
    inside it (from the last before it, if any)."""
    inside = [t for t in stamps if start <= t <= end]
    before = [t for t in stamps if t < start][-1:]
    points = before + inside + [end]
    return len(inside), max(b - a for a, b in zip(points, points[1:]))


def test_a_stream_keeps_its_pace_while_an_eviction_is_written(smollm2_path, page_bytes, store):
    """The thread that needs pages writes the eviction; the scheduler's loop, and the
    stream decoding on it, never wait for the store."""
    delay = 1.5
    model = small_model(smollm2_path, page_bytes, 40, store)
    try:
        stream = model.context("stream")
        stream.append(PROMPT[:60])
        idle = [filled(model, f"idle{i}", i) for i in range(8)]  # 24 pages
        stamps: list[float] = []
        stop = threading.Event()

        def decode():
            for _ in stream.generate(300, temperature=0.0, speculative=False):
                stamps.append(time.monotonic())
                if stop.is_set():
                    return

        t = threading.Thread(target=decode)
        t.start()
        while len(stamps) < 5:
            time.sleep(0.01)
        store.delays = [delay]
        model.context("big").append(model.tokenize(PROMPT * 5)[:250])  # 16 pages: more than the 15 free
        store.delays = []
        time.sleep(0.3)
        stop.set()
        t.join()

        assert any(c.residency is Residency.EVICTED for c in idle)
        me = threading.get_ident()
        windows = [(s, e) for who, s, e in store.writes if who == me and e - s >= delay]
        assert windows, "no eviction was written by the thread that needed the pages"
        for start, end in windows:
            n, longest = stamps_in(stamps, start, end)
            assert n >= 3 and longest < delay / 2, (n, longest)
    finally:
        model.close()


def test_a_use_or_a_delete_during_an_eviction_waits_for_it(smollm2_path, page_bytes, store):
    model = small_model(smollm2_path, page_bytes, 16, store)
    try:
        probe = filled(model, "probe", 0)
        expected = [p.token_id for p in probe.generate(4, temperature=0.0)]
        probe.delete()
        cs = [filled(model, f"c{i}", i) for i in range(5)]  # 15 of 16 pages

        def evict(victim_delay: float) -> threading.Thread:
            """Start a context one page larger than the pool has free: the LRU one is evicted."""
            store.writing.clear()
            store.delays = [victim_delay]
            n = 16 * (model.engine.pool.max_pages - model.engine.pool.n_used) + 8
            t = threading.Thread(target=lambda: filled(model, f"n{len(store.writes)}", 9, n))
            t.start()
            assert store.writing.wait(30)
            return t

        t = evict(1.0)
        assert cs[0].residency is Residency.EVICTING
        got = [p.token_id for p in cs[0].generate(4, temperature=0.0)]  # waits, then reads it back
        done = time.monotonic()
        t.join()
        assert got == expected and cs[0].residency is Residency.LIVE
        assert done >= store.writes[0][2]

        live = [model.contexts.get(n) for n in model.contexts.names()]
        victim = min((c for c in live if c.residency is Residency.LIVE), key=lambda c: model.contexts._last_use[c.name])
        t = evict(1.0)
        assert victim.residency is Residency.EVICTING
        victim.delete()  # waits for the write to end, then drops its eviction ref
        t.join()
        assert victim.residency is Residency.DELETED
        assert not any(r.endswith("/" + victim.name) for r in store.refs())
    finally:
        model.close()
