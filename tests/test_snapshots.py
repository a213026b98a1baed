"""Snapshot and restore of real SmolLM2 contexts through the LMDB store.

Prefill is the expensive part here, so contexts are small (a few pages of 16
tokens) and built once per module where tests can share them.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import blake3
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import ctxengine as ce
from ctxengine.engine.gguf_file import open_gguf
from ctxengine.engine.engine import Engine
from ctxengine.errors import ContextError, CorruptDataError, WeightMismatchError
from ctxengine.state.snapshots import take_snapshot
from ctxengine.store import Store

PROMPT = ("The quick brown fox jumps over the lazy dog. Snapshots keep a context alive across "
          "processes and machines, and a restored context goes on exactly where it had stopped.")
SAMPLING = dict(temperature=0.9, top_k=40, top_p=0.95)


@pytest.fixture(scope="module")
def model(smollm2_path):
    m = ce.load(smollm2_path, threads=2)
    yield m
    m.close()


@pytest.fixture(scope="module")
def base(model):
    """A context of a little over two pages (computed once; tests fork it)."""
    c = model.context("base")
    c.append(PROMPT)
    assert 32 < c.n_tokens < 48
    return c


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "store") as s:
        yield s


def page_hashes(ctx) -> list[str]:
    seq = ctx._seq
    return [blake3.blake3(seq.export_page(i)).hexdigest() for i in range(len(seq.pages))]


def texts(pieces) -> list[int]:
    return [p.token_id for p in pieces]


# -- continuing exactly -------------------------------------------------------------

def test_restored_context_generates_what_the_original_does(model, base, store):
    orig = base.fork()
    sid = orig.snapshot(store, ref="r")
    restored = model.restore(store, "r")
    assert restored.tokens == orig.tokens and restored.snapshot_id == sid
    # The last logits are recomputed by re-forwarding the last token: same bits.
    assert np.array_equal(restored._sync().view(np.uint32), orig._sync().view(np.uint32))
    a = texts(orig.generate(6, seed=11, **SAMPLING))
    b = texts(restored.generate(6, seed=11, **SAMPLING))
    assert a == b

    # Snapshot after sampling: with no seed both continue the stored RNG state.
    orig.snapshot(store, ref="r")
    again = model.restore(store, "r")
    assert again.sampler_state == orig.sampler_state
    a = texts(orig.generate(6, **SAMPLING))
    b = texts(again.generate(6, **SAMPLING))
    assert a == b
    for c in (orig, restored, again):
        c.delete()


def test_manifest_records_what_made_it(model, base, store):
    c = base.fork()
    c.labels["purpose"] = "test"
    sid = c.snapshot(store, ref="m", labels={"extra": "yes"})
    m = store.get_manifest(sid)
    assert m.weight_id == model.weight_id and m.model_name == model.name
    assert m.kv_dtype == "f16" and m.page_tokens == 16 and m.page_size == model.engine.pool.page_bytes
    assert m.token_ids == c.tokens and m.n_tokens == c.n_tokens
    assert m.page_keys == page_hashes(c)
    assert m.arch["n_layer"] == 30 and m.arch["kv_layout"] == 1
    assert m.labels == {"purpose": "test", "extra": "yes"}
    assert m.parent == base.snapshot_id  # a fork's first names its origin's last (None if never)
    # The next snapshot names this one as its parent, and so does a fork's.
    c.append([198])
    child = store.get_manifest(c.snapshot(store))
    assert child.parent == sid
    fork = c.fork()
    assert store.get_manifest(fork.snapshot(store)).parent == c.snapshot_id
    c.delete()
    fork.delete()


def test_snapshot_prefills_a_lagging_token_first(model, base, store):
    c = base.fork()
    list(c.generate(2, temperature=0.0))
    assert c.n_cached == c.n_tokens - 1  # the last sampled token has no KV yet
    m = store.get_manifest(c.snapshot(store))
    assert m.n_tokens == len(m.token_ids) == c.n_tokens
    c.delete()


def test_empty_context_round_trips(model, store):
    c = model.context()
    sid = c.snapshot(store, ref="empty")
    assert store.get_manifest(sid).page_keys == []
    r = model.restore(store, "empty")
    assert r.tokens == [] and r.n_cached == 0
    r.append("Hello")
    c.delete()
    r.delete()


# -- incremental and shared ----------------------------------------------------------

def test_incremental_snapshot_sends_only_new_pages(model, base, store):
    c = base.fork()
    n0 = c.n_tokens  # 2 full pages + a partial one
    first = take_snapshot(c, store, ref="inc")
    # (base's full pages may already be in the key cache from an earlier test)
    assert (first.n_pages, first.pages_sent) == (3, 3) and first.pages_hashed >= 1
    assert store.stats().n_pages == 3

    # Nothing changed: only the partial last page is hashed again; nothing is sent.
    same = take_snapshot(c, store, ref="inc")
    assert (same.pages_hashed, same.pages_sent) == (1, 0)

    # Fill the third page and start a fourth: two new pages; the full ones come from the cache.
    c.append(list(range(2000, 2000 + 48 - n0 + 3)))
    assert -(-c.n_tokens // 16) == 4
    more = take_snapshot(c, store, ref="inc")
    assert (more.n_pages, more.pages_hashed, more.pages_sent) == (4, 2, 2)
    assert more.bytes_sent == 2 * model.engine.pool.page_bytes
    assert store.stats().n_pages == 5  # the old partial page stays with the old snapshot
    assert store.get_manifest(more.snapshot_id).page_keys == page_hashes(c)
    c.delete()


def test_rewound_pages_are_hashed_again(model, base, store):
    # A rewind into a full page changes it; the cache must not hand out its old key.
    c = base.fork()
    c.snapshot(store)
    c.rewind(c.n_tokens - 20)          # back into the second page
    c.append(list(range(3000, 3016)))  # refill it differently
    m = store.get_manifest(c.snapshot(store))
    assert m.page_keys == page_hashes(c)
    r = model.restore(store, c.snapshot_id)
    assert page_hashes(r) == m.page_keys and r.tokens == c.tokens
    c.delete()
    r.delete()


def test_independently_computed_prefixes_share_pages(model, base, store):
    other = model.context()
    ids = base.tokens
    other.append(ids[:5])   # computed in other chunks than base was
    other.append(ids[5:])
    assert page_hashes(other) == page_hashes(base)
    take_snapshot(base, store, ref="a", record=False)
    second = take_snapshot(other, store, ref="b")
    assert second.pages_sent == 0
    st_ = store.stats()
    assert st_.n_pages == 3 and st_.n_manifests == 2 and st_.dedup_ratio == 2.0
    other.delete()


# -- refusals --------------------------------------------------------------------------

def test_page_altered_on_disk_is_named_on_restore(model, base, tmp_path):
    path = tmp_path / "store"
    small = model.context()
    small.append([100, 200, 300])
    with Store(path) as s:
        sid = base.snapshot(s, ref="big")
        small.snapshot(s, ref="small")
        keys = s.get_manifest(sid).page_keys
        record = s.get_page_record(keys[1])  # the page as stored (raw or zstd), found in the file below
    before = model.contexts.names()
    blob = (path / "data.mdb").read_bytes()
    needle = record[len(record) // 2: len(record) // 2 + 64]
    assert blob.count(needle) == 1
    at = blob.index(needle) + 10
    with open(path / "data.mdb", "r+b") as f:
        f.seek(at)
        f.write(bytes([blob[at] ^ 0x01]))
    with Store(path) as s:
        with pytest.raises(CorruptDataError, match=keys[1]):
            model.restore(s, "big")
        # Nothing else is affected: the other pages and the other snapshot are fine.
        assert s.get_page(keys[0]) and s.get_page(keys[2])
        r = model.restore(s, "small")
        assert r.tokens == small.tokens
        assert model.contexts.names() == before + [r.name]  # the failed restore left nothing
    small.delete()
    r.delete()


def test_restore_onto_other_weights_is_refused(model, base, store, smollm2_path, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # keep the copy's weight id out of ~/.cache
    sid = base.snapshot(store, ref="w")
    copy = tmp_path / "smollm2-altered.gguf"
    shutil.copyfile(smollm2_path, copy)
    with open_gguf(copy) as f:
        offset = f.tensors["output_norm.weight"].offset  # f32: a low mantissa bit is harmless
    with open(copy, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))
    other = ce.load(copy, threads=1)
    try:
        assert other.weight_id != model.weight_id
        with pytest.raises(WeightMismatchError) as err:
            other.restore(store, "w")
        msg = str(err.value)
        assert model.weight_id in msg and other.weight_id in msg and model.name in msg
        assert sid[:16] in msg
        assert other.contexts.names() == []
    finally:
        other.close()


def test_restore_name_clash_and_bad_names(model, base, store):
    base.snapshot(store, ref="n")
    with pytest.raises(ContextError, match="already exists"):
        model.restore(store, "n", name="base")
    with pytest.raises(ce.CtxError):
        model.restore(store, "n", name="../evil")
    with pytest.raises(ce.CtxError, match="no ref or snapshot"):
        model.restore(store, "missing")


# -- memory budget: eviction to the store ------------------------------------------------

def test_full_pool_evicts_idle_contexts_and_brings_them_back(model, base, store, smollm2_path):
    sid = base.snapshot(store, ref="trunk")
    expected = texts(base.fork("probe").generate(4, temperature=0.0))
    model.contexts.remove("probe")
    # A pool of 16 pages (the smallest): five 3-page contexts fit, a sixth does not.
    small = ce.Model(Engine(smollm2_path, threads=2, kv_budget=16 * model.engine.pool.page_bytes))
    try:
        pool = small.engine.pool
        assert pool.max_pages == 16
        cs = [small.restore(store, sid, name=f"c{i}") for i in range(5)]
        with pytest.raises(ContextError, match="pool is full"):
            small.restore(store, sid, name="c5")  # no store configured for eviction
        small.contexts.store = store
        cs.append(small.restore(store, sid, name="c5"))
        assert cs[0]._evicted is not None and small.contexts.n_evictions == 1
        assert "c0" in small.contexts.names()
        assert any(r.startswith("_evicted/") for r in store.refs())
        # Using the evicted context brings it back (evicting the next least recent).
        assert texts(cs[0].generate(4, temperature=0.0)) == expected
        assert cs[0]._evicted is None and cs[1]._evicted is not None
        assert pool.n_used <= pool.max_pages
        # Deleting an evicted context drops the ref that kept it from gc.
        cs[1].delete()
        assert not any(r.endswith("/c1") for r in store.refs())

        # A stream suspended mid-way may be evicted under it; it goes on the same.
        stream = cs[2].generate(4, temperature=0.0)
        got = [next(stream).token_id]
        for i in range(6, 9):
            cs.append(small.restore(store, sid, name=f"c{i}"))
        assert cs[2]._evicted is not None
        got += [p.token_id for p in stream]
        assert got == expected
    finally:
        small.close()
    assert not any(r.startswith("_evicted/") for r in store.refs())


# -- kill -9 in the middle of snapshots --------------------------------------------------

CHILD = textwrap.dedent("""
    import sys, ctxengine as ce
    model = ce.load(sys.argv[1], threads=1)
    store = ce.Store(sys.argv[2])
    c = model.context("k")
    c.append("Kill me while I write my snapshot, please")
    c.snapshot(store, ref="keep")
    print("READY", flush=True)
    i = 0
    while True:
        i += 1
        c.append([1000 + i % 500])
        f = c.fork()
        f.snapshot(store, ref=f"live{i % 3}", labels={"i": str(i)})
        f.delete()
""")


def check_consistent(store: Store) -> None:
    """Every ref names a stored manifest whose pages are all present and verify."""
    for name, sid in store.refs().items():
        m = store.get_manifest(sid)
        store.get_pages(list(dict.fromkeys(m.page_keys)))
    for sid in store.snapshots():
        m = store.get_manifest(sid)
        assert not store.missing_pages(m.page_keys), f"snapshot {sid} names missing pages"


def test_sigkill_mid_snapshot_leaves_the_store_consistent(model, smollm2_path, tmp_path):
    path = tmp_path / "store"
    keep = None
    for delay in (0.3, 0.9):
        with subprocess.Popen([sys.executable, "-c", CHILD, str(smollm2_path), str(path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
            try:
                assert p.stdout.readline().strip() == "READY", p.stderr.read()
                time.sleep(delay)
            finally:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()
        with Store(path) as s:
            check_consistent(s)
            if keep is None:
                keep = s.resolve("keep")
            # "keep" moved only when the second child re-snapshotted the same state.
            r = model.restore(s, "keep")
            assert r.tokens == model.tokenize("Kill me while I write my snapshot, please")
            r.delete()
            assert any(n.startswith("live") for n in s.refs())


# -- property: random programs never lose a ref'd snapshot ---------------------------------

OPS = st.sampled_from(["fork", "append", "snapshot", "restore", "delete", "rm", "gc"])


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_random_programs_keep_every_reachable_snapshot(model, base, data):
    with tempfile.TemporaryDirectory() as tmp, Store(tmp) as store:
        live = [base.fork()]
        expected: dict[str, tuple[str, list[int], list[str]]] = {}  # ref -> (sid, tokens, page keys)
        for _ in range(data.draw(st.integers(4, 12), label="steps")):
            op = data.draw(OPS, label="op")
            ref = data.draw(st.sampled_from(["r0", "r1", "r2"]), label="ref")
            if op in ("fork", "append", "snapshot", "delete") and not live:
                op = "restore" if expected else "gc"
            if op == "fork":
                live.append(data.draw(st.sampled_from(live)).fork())
            elif op == "append":
                c = data.draw(st.sampled_from(live))
                c.append(data.draw(st.lists(st.integers(0, 49151), min_size=1, max_size=2), label="ids"))
            elif op == "snapshot":
                c = data.draw(st.sampled_from(live))
                sid = c.snapshot(store, ref=ref)
                expected[ref] = (sid, c.tokens, page_hashes(c))
            elif op == "restore" and ref in expected:
                sid, tokens, keys = expected[ref]
                r = model.restore(store, ref)
                assert r.snapshot_id == sid and r.tokens == tokens and page_hashes(r) == keys
                live.append(r)
            elif op == "delete":
                live.pop(data.draw(st.integers(0, len(live) - 1))).delete()
            elif op == "rm" and ref in expected:
                store.delete_ref(ref)
                del expected[ref]
            elif op == "gc":
                store.gc(grace=0)
            check_consistent(store)
        store.gc(grace=0)
        for ref, (sid, tokens, keys) in expected.items():
            assert store.resolve(ref) == sid
            r = model.restore(store, ref)
            assert r.tokens == tokens and page_hashes(r) == keys
            r.delete()
        for c in live:
            c.delete()


def test_a_snapshot_or_fork_between_two_pieces_goes_on_as_the_original(model, base, store):
    """Made while a generation is paused, they carried the RNG of the generation
    before (or none: a fresh random seed each restore), so they went elsewhere."""
    c = base.fork()
    pieces = c.generate(40, seed=1234, **SAMPLING)
    head = [next(pieces).token_id for _ in range(15)]
    sid = c.snapshot(store, "mid")
    fork = c.fork()
    tail = texts(pieces)
    assert len(head) == 15 and tail
    for other in (fork, model.restore(store, "mid"), model.restore(store, sid)):
        assert texts(other.generate(len(tail), **SAMPLING)) == tail
        other.delete()
    c.delete()
