"""Sliding-window release (gemma3): pages wholly outside every window keep only
their full-attention layers, and nothing a context does can tell the
difference: prefill, chunking, forks, rewinds, snapshots and restores all give
the bits a sequence that never released anything gives."""
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import ctxengine as ce
from ctxengine import _core
from ctxengine.engine.engine import Engine
from ctxengine.errors import CorruptDataError
from tiny_models import TinyConfig, make_weights, write_gguf

WINDOW = 20
PT = 16
CFG = TinyConfig(arch="gemma3", n_layer=4, swa_window=WINDOW, swa_pattern=2, n_ctx=512)
rng = np.random.default_rng(7)
TOKENS = [int(t) for t in rng.integers(0, 256, 200)]


@pytest.fixture(scope="module")
def gemma_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("swa") / "tiny-gemma3.gguf"
    write_gguf(path, CFG, make_weights(CFG))
    return path


@pytest.fixture(scope="module")
def engine(gemma_file):
    m = Engine(gemma_file, threads=2)
    yield m
    m.close()


def release_target(n: int) -> int:
    """Pages wholly before the window of the next query, less one page of slack."""
    return max(0, n - WINDOW + 1 - PT) // PT


def pools_return_to(engine, used: int, trimmed: int) -> bool:
    """Whether the pools' pages in use come back to these counts (the scheduler's
    thread lets go of the last step's sequences a moment after their callers)."""
    deadline = time.monotonic() + 5
    while (engine.pool.n_used, engine.trim_pool.n_used) != (used, trimmed) and time.monotonic() < deadline:
        time.sleep(0.01)
    return (engine.pool.n_used, engine.trim_pool.n_used) == (used, trimmed)


def test_release_target_and_pools(engine):
    assert engine.kept_layers == [1, 3] and engine.trim_pool.page_bytes * 2 == engine.pool.page_bytes
    used, trimmed = engine.pool.n_used, engine.trim_pool.n_used
    seq = engine.new_sequence()
    engine.forward(seq, TOKENS)
    n_pages = -(-len(TOKENS) // PT)
    assert seq.n_released == release_target(len(TOKENS)) == seq.release_target(len(TOKENS)) == 10
    assert engine.trim_pool.n_used - trimmed == 10
    assert engine.pool.n_used - used == n_pages - 10  # the local layers of 10 pages are gone
    assert len(seq.export_page(0)) == engine.trim_pool.page_bytes
    assert len(seq.export_page(n_pages - 1)) == engine.pool.page_bytes
    del seq
    assert (engine.pool.n_used, engine.trim_pool.n_used) == (used, trimmed)


def test_released_pages_change_no_bits(engine):
    """Against a page table that never releases, at once, token by token and in chunks."""
    keep_all = _core.KVSeq(engine.pool)
    ref = engine.forward(keep_all, TOKENS, all_logits=True)
    at_once = engine.forward(engine.new_sequence(), TOKENS, all_logits=True)
    np.testing.assert_array_equal(at_once, ref)
    seq = engine.new_sequence()
    rows, i = [], 0
    for size in (1, 7, 30, 3, 64, 1, 50, 44):
        rows.append(engine.forward(seq, TOKENS[i:i + size], all_logits=True))
        i += size
    assert i == len(TOKENS) and seq.n_released == 10
    np.testing.assert_array_equal(np.concatenate(rows), ref)
    # The released pages hold exactly the kept layers of the full pages.
    lb = engine.pool.page_bytes // CFG.n_layer
    full, released = keep_all.export_page(2), seq.export_page(2)
    assert released == full[1 * lb:2 * lb] + full[3 * lb:4 * lb]


def test_forks_share_the_pages_they_release(engine):
    """Branches of one conversation release the same pages as they advance:
    the first to release a page makes its copy, the others take it (one copy,
    one page for the attention to read), and each still gets the bits of a
    sequence of its own."""
    prefix, more = TOKENS[:96], TOKENS[96:156]  # the prefix: 6 full pages, the first 3 released
    base = engine.new_sequence()
    engine.forward(base, prefix)
    used, trimmed = engine.pool.n_used, engine.trim_pool.n_used
    branches = [base.fork() for _ in range(4)]
    got = [engine.forward(b, more[:k] + more[k + 1:], all_logits=True) for k, b in enumerate(branches)]
    n_rel = release_target(len(prefix) + len(more) - 1)
    assert (base.n_released, n_rel) == (3, 7)
    for b in branches:  # pages 3-5 are the prefix's, released once; page 6 is each branch's own
        assert b.n_released == n_rel and b.pages[:6] == branches[0].pages[:6]
    assert len({b.pages[6] for b in branches}) == 4
    assert engine.trim_pool.n_used - trimmed == 3 + 4
    for k, g in enumerate(got):
        alone = engine.new_sequence()
        want = engine.forward(alone, prefix + more[:k] + more[k + 1:], all_logits=True)[len(prefix):]
        np.testing.assert_array_equal(g, want)
    del branches, b, alone
    assert pools_return_to(engine, used, trimmed)


def test_a_page_written_again_after_a_fork_released_it_gets_its_own_copy(engine):
    """Fork b keeps a page that fork a released; b steps back into it and writes
    other tokens there; when b releases it in turn it must copy its own bytes,
    not take a's copy of what the page held before."""
    a = engine.new_sequence()
    engine.forward(a, TOKENS[:48])  # pages 0-2 full, shared with the fork
    b = a.fork()
    engine.forward(a, TOKENS[48:100])  # a releases pages 0-3: 0-2 still held by b too
    assert a.n_released == 4 and b.n_released == 0
    b.truncate(40)  # b alone holds page 2 now, and writes into it again
    other = [int(t) for t in rng.integers(0, 256, 60)]
    got = engine.forward(b, other, all_logits=True)
    assert b.n_released == 4 and b.pages[:2] == a.pages[:2] and b.pages[2] != a.pages[2]
    want = engine.forward(engine.new_sequence(), TOKENS[:40] + other, all_logits=True)[40:]
    np.testing.assert_array_equal(got, want)
    # and both continue as sequences of their own would
    tail = TOKENS[100:130]
    np.testing.assert_array_equal(engine.forward(b, tail, all_logits=True),
                                  engine.forward(engine.new_sequence(), TOKENS[:40] + other + tail,
                                                 all_logits=True)[100:])
    np.testing.assert_array_equal(engine.forward(a, tail, all_logits=True),
                                  engine.forward(engine.new_sequence(), TOKENS[:130], all_logits=True)[100:])


def test_fork_rewind_and_truncate(gemma_file):
    model = ce.load(gemma_file, threads=2)
    a = model.context("a")
    a.append(TOKENS)
    a_next = [p.token_id for p in a.generate(max_tokens=8, temperature=0.0)]
    b = model.context("b")
    b.append(TOKENS)
    # Stepping back a few tokens reuses the KV; far back the window's KV is gone:
    # the fork recomputes its prefix, bit-identically.
    assert b.shares_kv_at(len(TOKENS) - 5) and not b.shares_kv_at(100)
    near = b.fork("near", n_tokens=len(TOKENS) - 5)
    far = b.fork("far", n_tokens=100)
    fresh = model.context("fresh")
    fresh.append(TOKENS[:100])
    np.testing.assert_array_equal(far._sync(), fresh._sync())
    near.append(TOKENS[-5:])
    assert [p.token_id for p in near.generate(max_tokens=8, temperature=0.0)] == a_next
    b.rewind(150)  # to 50 tokens: far behind the released pages, so prefilled again
    fresh50 = model.context("fresh50")
    fresh50.append(TOKENS[:50])
    np.testing.assert_array_equal(b._sync(), fresh50._sync())
    b.append(TOKENS[50:])
    assert [p.token_id for p in b.generate(max_tokens=8, temperature=0.0)] == a_next


def test_snapshot_restore_continues_bit_identically(gemma_file, tmp_path):
    model = ce.load(gemma_file, threads=2)
    store = ce.Store(tmp_path / "store")
    c = model.context("c")
    c.append(TOKENS)
    c.snapshot(store, ref="c")
    m = store.get_manifest(store.resolve("c"))
    assert m.format_version == 2 and m.released_pages == 10 and m.arch["swa_kept_layers"] == [1, 3]
    want = [p.token_id for p in c.generate(max_tokens=12, temperature=0.0)]
    r = model.restore(store, "c", name="r")
    assert r._seq.n_released == 10
    assert [p.token_id for p in r.generate(max_tokens=12, temperature=0.0)] == want
    # In another process too: the same bits from the store alone.
    code = textwrap.dedent(f"""
        import ctxengine as ce
        m = ce.load({str(gemma_file)!r}, threads=1)
        r = m.restore(ce.Store({str(tmp_path / "store")!r}), "c")
        print(",".join(str(p.token_id) for p in r.generate(max_tokens=12, temperature=0.0)))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ",".join(map(str, want))


def test_manifest_claiming_too_many_released_pages_is_refused(gemma_file, tmp_path):
    model = ce.load(gemma_file, threads=1)
    store = ce.Store(tmp_path / "store")
    c = model.context("c")
    c.append(TOKENS[:30])
    sid = c.snapshot(store)
    m = store.get_manifest(sid)
    assert m.format_version == 1 and m.released_pages == 0  # nothing to release at 30 tokens
    m.released_pages = 3
    m.format_version = 2
    with pytest.raises(CorruptDataError, match="released pages"):
        from ctxengine.state.snapshots import check_compatible

        check_compatible(m, sid, model.engine)
