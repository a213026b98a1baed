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
