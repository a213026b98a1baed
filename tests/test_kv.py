"""The native page pool and page tables: refcounts, fork, copy-on-write."""
import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ctxengine import _core

PT = 4  # small pages make boundaries frequent


def make_pool(max_pages=64):
    return _core.PagePool(n_layer=2, page_tokens=PT, kv_dim=8, kv_dtype="f16", max_pages=max_pages)


def test_fork_shares_pages_and_costs_no_copies():
    pool = make_pool()
    seq = _core.KVSeq(pool)
    for _ in range(3):
        seq.append_page(p := pool.import_page(bytes([7]) * pool.page_bytes), PT)
        pool.release(p)
    child = seq.fork()
    assert child.pages == seq.pages
    assert all(pool.refcount(p) == 2 for p in seq.pages)
    assert pool.n_used == 3
    del child
    assert all(pool.refcount(p) == 1 for p in seq.pages)


def test_truncate_zeroes_the_tail_and_copies_shared_pages():
    pool = make_pool()
    seq = _core.KVSeq(pool)
    page = pool.import_page(bytes(range(1, 256)) * (pool.page_bytes // 255) + bytes(range(1, 1 + pool.page_bytes % 255)))
    seq.append_page(page, PT)
    pool.release(page)
    child = seq.fork()
    child.truncate(PT - 1)
    assert child.pages != seq.pages, "a shared page is copied before it is changed"
    assert seq.export_page(0) == bytes(range(1, 256)) * (pool.page_bytes // 255) + bytes(range(1, 1 + pool.page_bytes % 255))
    raw = np.frombuffer(child.export_page(0), np.uint16).reshape(2, 2, 8 * PT)
    k = raw[:, 0].reshape(2, 8, PT)   # [layer][kv_dim][slot]
    v = raw[:, 1].reshape(2, PT, 8)   # [layer][slot][kv_dim]
    assert not k[:, :, PT - 1].any() and not v[:, PT - 1].any()
    assert k[:, :, : PT - 1].all() and v[:, : PT - 1].all()


def stamped(pool, value):
    """A new page filled with one byte value (refcount 1: the caller releases it)."""
    return pool.import_page(bytes([value]) * pool.page_bytes)


def two_pages_forked():
    """A pool of 3 pages, a sequence of two whole stamped pages (1, 2), and a fork sharing them."""
    pool = make_pool(max_pages=3)
    seq = _core.KVSeq(pool)
    for v in (1, 2):
        seq.append_page(p := stamped(pool, v), PT)
        pool.release(p)
    return pool, seq, seq.fork()


def test_a_truncate_refused_for_a_full_pool_changes_nothing():
    # The token count was cut before the copy of the shared last page failed: the page
    # table then claimed fewer tokens, its last page neither copied nor zeroed.
    pool, seq, child = two_pages_forked()
    full = stamped(pool, 3)  # the pool's last page
    before = [child.export_page(i) for i in range(2)]
    with pytest.raises(Exception, match="full"):
        child.truncate(PT + 2)
    assert (child.n_tokens, child.pages, [child.export_page(i) for i in range(2)]) == (2 * PT, seq.pages, before)
    assert [pool.refcount(p) for p in seq.pages] == [2, 2] and pool.n_used == 3
    assert child.pages_to_truncate(PT + 2) == 1 and child.pages_to_truncate(PT) == 0  # room to make first
    child.truncate(PT)  # on a page boundary: no copy, so no page needed
    assert child.n_tokens == PT and pool.refcount(seq.pages[1]) == 1
    pool.release(full)


def test_a_truncate_copies_into_a_page_it_drops_when_it_can():
    # A dropped page no one else holds takes the copy: a full pool is no obstacle.
    pool, seq, child = two_pages_forked()
    child.append_page(p := stamped(pool, 3), PT)  # its own: the pool is full
    pool.release(p)
    assert child.pages_to_truncate(PT + 2) == 0
    child.truncate(PT + 2)
    assert child.n_tokens == PT + 2 and child.pages[0] == seq.pages[0] and child.pages[1] == p
    assert seq.export_page(1) == bytes([2]) * pool.page_bytes, "the shared page is never written"
    tail = np.frombuffer(child.export_page(1), np.uint16).reshape(2, 2, 8 * PT)
    assert not tail[:, 0].reshape(2, 8, PT)[:, :, 2:].any() and tail[:, 0].reshape(2, 8, PT)[:, :, :2].all()
    assert [pool.refcount(q) for q in seq.pages] == [2, 1] and pool.n_used == 3


def test_pool_full_is_an_error_not_a_crash():
    pool = make_pool(max_pages=2)
    a, b = pool.import_page(bytes(pool.page_bytes)), pool.import_page(bytes(pool.page_bytes))
    with pytest.raises(Exception, match="full"):
        pool.import_page(bytes(pool.page_bytes))
    pool.release(a)
    pool.release(b)
    with pytest.raises(Exception, match="double free"):
        pool.release(b)


class PageTableMachine(RuleBasedStateMachine):
    """Random fork / append / truncate / free never leaks or double-frees a
    page, and every sequence reads back exactly its own tokens' bytes."""

    def __init__(self):
        super().__init__()
        self.pool = make_pool(max_pages=512)
        self.seqs = []     # (KVSeq, model: list of token values)
        self.counter = 0

    def page_of(self, values):
        """Bytes of one page holding `values` (token stamps), zero beyond, in
        the page layout: per layer K as [kv_dim][slot], then V as [slot][kv_dim]."""
        layers = []
        for _ in range(2):
            k = np.zeros((8, PT), np.uint16)
            v = np.zeros((PT, 8), np.uint16)
            for slot, val in enumerate(values):
                k[:, slot] = val
                v[slot, :] = val
            layers += [k.tobytes(), v.tobytes()]
        return b"".join(layers)

    @rule()
    def new(self):
        if len(self.seqs) < 8:
            self.seqs.append((_core.KVSeq(self.pool), []))

    @precondition(lambda self: self.seqs)
    @rule(i=st.integers(0, 7), n=st.integers(1, 9))
    def append(self, i, n):
        # Emulate a forward step: whole pages through import/append_page when
        # aligned, else rebuild the tail page (truncate + append_page).
        seq, vals = self.seqs[i % len(self.seqs)]
        new = [(self.counter + k) % 250 + 1 for k in range(n)]
        self.counter += n
        vals.extend(new)
        keep = (len(vals) - n) // PT * PT
        seq.truncate(keep)
        for start in range(keep, len(vals), PT):
            chunk = vals[start:start + PT]
            page = self.pool.import_page(self.page_of(chunk))
            seq.append_page(page, len(chunk))
            self.pool.release(page)

    @precondition(lambda self: self.seqs)
    @rule(i=st.integers(0, 7))
    def fork(self, i):
        if len(self.seqs) < 8:
            seq, vals = self.seqs[i % len(self.seqs)]
            self.seqs.append((seq.fork(), list(vals)))

    @precondition(lambda self: self.seqs)
    @rule(i=st.integers(0, 7), k=st.integers(0, 12))
    def rewind(self, i, k):
        seq, vals = self.seqs[i % len(self.seqs)]
        k = min(k, len(vals))
        seq.truncate(len(vals) - k)
        del vals[len(vals) - k:]

    @precondition(lambda self: self.seqs)
    @rule(i=st.integers(0, 7))
    def free(self, i):
        self.seqs.pop(i % len(self.seqs))

    @invariant()
    def contents_and_counts(self):
        refs = {}
        for seq, vals in self.seqs:
            assert seq.n_tokens == len(vals)
            assert len(seq.pages) == (len(vals) + PT - 1) // PT
            for j, page in enumerate(seq.pages):
                refs[page] = refs.get(page, 0) + 1
                assert seq.export_page(j) == self.page_of(vals[j * PT:(j + 1) * PT])
        for page, n in refs.items():
            assert self.pool.refcount(page) == n
        assert self.pool.n_used == len(refs), "no page leaks"


TestPageTable = PageTableMachine.TestCase
TestPageTable.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
