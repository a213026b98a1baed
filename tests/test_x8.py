"""Weights repacked 8 rows to a group for one-row products (quant.h repack_x8):
the layout as documented, every path's product over it bit for bit the product
over the rows, and a model's logits the same with the copies as without them."""
import numpy as np
import pytest

import ctxengine as ce
from ctxengine import _core
from ctxengine.engine.catalog import ModelCatalog
from ctxengine.engine.engine import Engine
from ctxengine.errors import RequestError
from ctxengine.serving.runtime import Runtime
from simd_paths import AVAILABLE

Q = _core.quant
# ggml type: (block bytes, its fields (offset, bytes) in the order the group keeps them: d, m, qh, qs)
TYPES = {2: (18, [(0, 2), (2, 16)]),                  # Q4_0: d, qs
         3: (20, [(0, 2), (2, 2), (4, 16)]),          # Q4_1: d, m, qs
         6: (22, [(0, 2), (2, 4), (6, 16)]),          # Q5_0: d, qh, qs
         7: (24, [(0, 2), (2, 2), (4, 4), (8, 16)]),  # Q5_1: d, m, qh, qs
         8: (34, [(0, 2), (2, 32)])}                  # Q8_0: d, qs


def random_rows(rng, t, n_in, n_out):
    """Random blocks whose f16 fields (d, m) are finite (the exponent never all ones)."""
    bb, fields = TYPES[t]
    w = rng.integers(0, 256, n_out * (n_in // 32) * bb, dtype=np.uint8).reshape(n_out, n_in // 32, bb)
    halves = [f for f in fields[:2] if f[1] == 2]
    for at, _ in halves:
        w[:, :, at + 1] &= 0x3F  # |value| < 2
    return w.ravel()


def repack_numpy(t, w, n_in, n_out):
    """quant.h's layout, spelled out: groups of 8 rows; per group and block, each field of
    the 8 rows in turn; the last group padded with zero rows."""
    bb, fields = TYPES[t]
    nb, groups = n_in // 32, -(-n_out // 8)
    rows = np.zeros((groups * 8, nb, bb), np.uint8)
    rows[:n_out] = w.reshape(n_out, nb, bb)
    g = rows.reshape(groups, 8, nb, bb).transpose(0, 2, 1, 3)  # (group, block, row, bytes)
    return np.concatenate([g[..., at:at + n].reshape(groups, nb, 8 * n) for at, n in fields], axis=2).ravel()


@pytest.mark.parametrize("t", sorted(TYPES))
@pytest.mark.parametrize("n_in,n_out", [(64, 8), (640, 37), (2048, 5)])
def test_the_layout_is_the_documented_one(t, n_in, n_out):
    w = random_rows(np.random.default_rng(n_out + t), t, n_in, n_out)
    P = Q.repack_x8(t, w, n_in, n_out)
    assert P.nbytes == -(-n_out // 8) * 8 * Q.row_bytes(t, n_in)
    assert P.tobytes() == repack_numpy(t, w, n_in, n_out).tobytes()


@pytest.fixture
def each_path():
    """The paths this CPU runs (simd_paths.AVAILABLE), the chosen one restored after."""
    before = _core.active_isa()
    yield AVAILABLE
    _core.set_isa(before)


@pytest.mark.parametrize("t", sorted(TYPES))
@pytest.mark.parametrize("n_in,n_out", [(640, 1000), (64, 37), (576, 200), (32, 9)])
def test_products_over_the_copy_equal_the_rows_on_every_path(each_path, t, n_in, n_out):
    rng = np.random.default_rng(n_in + n_out + t)
    w = random_rows(rng, t, n_in, n_out)
    P = Q.repack_x8(t, w, n_in, n_out)
    ranges = [(0, n_out, 0), (3, n_out - 5, 0), (5, n_out, 7), (0, n_out, 16), (1, n_out, 3), (8, 8, 0)]
    for isa in each_path:
        _core.set_isa(isa)
        for n_x in (1, 2, 17):
            x = (rng.standard_normal((n_x, n_in)) * rng.uniform(0.01, 50)).astype(np.float32)
            x[:, :32] = 0  # a block of zeros: d = 0
            for o0, o1, chunk in ranges:
                o1 = max(o0, o1)
                rows = Q.matmul(t, w, n_in, n_out, x, o0, o1, chunk)
                copy = Q.matmul(t, w, n_in, n_out, x, o0, o1, chunk, x8=P)
                assert copy.tobytes() == rows.tobytes(), (isa, n_x, o0, o1, chunk)


def test_types_without_the_layout_and_copies_of_the_wrong_size_are_refused():
    w = random_rows(np.random.default_rng(0), 8, 64, 16)
    x = np.ones((1, 64), np.float32)
    with pytest.raises(ValueError, match="x8 has"):
        Q.matmul(8, w, 64, 16, x, x8=np.zeros(10, np.uint8))
    with pytest.raises(ValueError, match="no repacked layout"):
        Q.repack_x8(12, np.zeros(144 * 16, np.uint8), 256, 16)  # Q4_K
    with pytest.raises(ValueError, match="no repacked layout"):
        Q.matmul(0, np.zeros(16 * 64 * 4, np.uint8), 64, 16, x, x8=Q.repack_x8(8, w, 64, 16))  # F32


def output_bytes(eng):
    return eng.config.n_vocab * eng.config.n_embd // 32 * 34  # both models' output matrices are Q8_0


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
def test_the_copies_keep_within_their_budget_the_output_matrix_first(which, smollm2_path, gemma3_path):
    path = smollm2_path if which == "smollm2" else gemma3_path
    sizes = {}
    for budget in (0, 100 << 20, 2 << 30):
        eng = Engine(path, threads=1, repack_budget=budget)
        sizes[budget], out = eng._core.repacked_bytes, output_bytes(eng)
        eng.close()
        assert sizes[budget] <= budget
    assert sizes[0] == 0
    assert sizes[100 << 20] >= (out if out <= 100 << 20 else 0)
    assert sizes[2 << 30] > out  # every layer too: Q4_1 (SmolLM2), Q5_0 and Q8_0 (Gemma 3)


def test_load_and_the_server_pass_the_budget_on(smollm2_path):
    for budget, some in ((None, True), (0, False), (10**30, True)):
        model = ce.load(smollm2_path, threads=1, repack_budget=budget)
        assert (model.engine.repacked_bytes > 0) == some, budget
        model.close()
    for budget in (0, None):  # a served model's memory counts its copies
        runtime = Runtime(ModelCatalog.build([str(smollm2_path)], packaged=False), threads=1, repack_budget=budget)
        try:
            engine, entry = runtime.model().engine, runtime.resolve(None)
            assert (engine.repacked_bytes > 0) == (budget is None)
            pages = engine.pool.n_allocated * engine.pool.page_bytes
            assert runtime._loaded[entry.name].memory_bytes == entry.size + engine.repacked_bytes + pages
        finally:
            runtime.close()


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1"])
def test_a_budget_that_is_not_bytes_is_refused(smollm2_path, bad):
    with pytest.raises(RequestError, match="repack_budget"):
        Engine(smollm2_path, threads=1, repack_budget=bad)


def greedy_logits(eng, n_prompt=40, n_gen=12):
    ids = eng.tokenize("The lighthouse keeper counted the ships that passed in the night, one by one, " * 3)
    seq = eng.new_sequence()
    rows = [eng.forward(seq, ids[:n_prompt])]
    for _ in range(n_gen):
        rows.append(eng.forward(seq, [int(np.argmax(rows[-1]))]))
    return [r.tobytes() for r in rows]


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
def test_model_logits_are_the_same_with_the_copies(which, smollm2_path, gemma3_path, each_path):
    path = smollm2_path if which == "smollm2" else gemma3_path
    for isa in each_path[-2:]:  # the CPU's own path and the one below it
        _core.set_isa(isa)
        want = None
        for threads in (1, 2):
            for budget in (0, 2 << 30):
                eng = Engine(path, threads=threads, repack_budget=budget)
                assert (eng._core.repacked_bytes > 0) == (budget > 0)
                got = greedy_logits(eng)
                eng.close()
                want = want or got
                assert got == want, (isa, threads, budget)
