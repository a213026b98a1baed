"""The forward pass's own exp (softmax, SiLU): every SIMD path bit-identical
to scalar, and close to the true exp."""
import numpy as np
import pytest

from ctxengine import _core

from simd_paths import EVERY_PATH


@pytest.fixture
def restore_isa():
    prior = _core.active_isa()
    yield
    _core.set_isa(prior)


def inputs():
    rng = np.random.default_rng(7)
    edge = np.array([0.0, -0.0, 1e-30, -1e-30, 88.0, 88.3, 89.0, -87.0, -87.5, -100.0, -1e4, 0.5, -0.5], np.float32)
    return [edge] + [rng.normal(0, s, n).astype(np.float32) for s, n in ((1, 1), (4, 15), (10, 16), (30, 17), (3, 1000))]


def test_exp_matches_numpy_closely():
    x = np.linspace(-87, 88, 200001, dtype=np.float32)
    y, _ = _core.exp_shift_sum(x, 0.0)
    ref = np.exp(x.astype(np.float64))
    rel = np.abs(y - ref) / ref
    print(f"max relative error {rel.max():.3g}")
    assert rel.max() < 4e-7


@pytest.mark.parametrize("isa", EVERY_PATH)
def test_paths_are_bit_identical(isa, restore_isa):
    for x in inputs():
        _core.set_isa("scalar")
        ref_y, ref_sum = _core.exp_shift_sum(x, 1.5)
        ref_silu = _core.silu_mul(x, x[::-1].copy())
        _core.set_isa(isa)
        y, s = _core.exp_shift_sum(x, 1.5)
        assert np.array_equal(y.view(np.uint32), ref_y.view(np.uint32))
        assert np.float32(s).view(np.uint32) == np.float32(ref_sum).view(np.uint32)
        assert np.array_equal(_core.silu_mul(x, x[::-1].copy()).view(np.uint32), ref_silu.view(np.uint32))


@pytest.mark.parametrize("isa", EVERY_PATH)
def test_gelu_paths_are_bit_identical(isa, restore_isa):
    # Every f16 value (the table's whole domain: NaN, inf, subnormals), the
    # +-10 cut-offs and values between f16 steps, at lengths with ragged tails.
    every_f16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    edges = np.array([-10.0, 10.0, np.nextafter(-10.0, 0), np.nextafter(10.0, 0), -10.001, 10.001,
                      65520.0, -65520.0, 1e-8, np.nan, np.inf, -np.inf], np.float32)
    for x in [every_f16, edges] + inputs():
        u = np.linspace(-2, 2, x.size, dtype=np.float32)
        _core.set_isa("scalar")
        ref = _core.gelu_mul(x, u)
        _core.set_isa(isa)
        assert np.array_equal(_core.gelu_mul(x, u).view(np.uint32), ref.view(np.uint32))


def test_gelu_values():
    x = np.linspace(-12, 12, 4801, dtype=np.float32)
    y = _core.gelu_mul(x, np.ones_like(x)).astype(np.float64)
    ref = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x.astype(np.float64) ** 3)))
    # f16 in and out of the table: 2^-11 relative, plus the input's rounding
    # to f16 (steps up to 2^-7 below 10) times the slope (at most about 1.13).
    inside = np.abs(x) < 10
    bound = 2.0 ** -11 * np.abs(ref) + 1.13 * 2.0 ** -8 * np.maximum(np.abs(x), 2.0 ** -6) / 8
    err = np.abs(y - ref)
    print(f"largest error {err[inside].max():.3g}")
    assert np.all(err[inside] <= bound[inside])
    assert np.array_equal(y[x >= 10], x[x >= 10]) and np.all(y[x <= -10] == 0)


def test_silu_values():
    g = np.linspace(-20, 20, 4001, dtype=np.float32)
    u = np.full_like(g, 2.0)
    ref = g.astype(np.float64) / (1 + np.exp(-g.astype(np.float64))) * 2
    np.testing.assert_allclose(_core.silu_mul(g, u), ref, rtol=2e-6, atol=1e-30)


@pytest.mark.parametrize("isa", EVERY_PATH)
@pytest.mark.parametrize("hd,stride,n", [(64, 16, 16), (64, 16, 5), (16, 16, 1), (256, 16, 13), (8, 32, 31)])
def test_attention_scores_paths_bit_identical(isa, hd, stride, n, restore_isa):
    rng = np.random.default_rng(hd * 100 + n)
    q = rng.standard_normal(hd).astype(np.float32)
    kt = rng.standard_normal((hd, stride)).astype(np.float16)
    _core.set_isa("scalar")
    ref = _core.attn_scores(q, kt.view(np.uint16), n, 0.125)
    _core.set_isa(isa)
    got = _core.attn_scores(q, kt.view(np.uint16), n, 0.125)
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))
    exact = (kt[:, :n].astype(np.float64).T @ q.astype(np.float64)) * 0.125
    np.testing.assert_allclose(got, exact, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("isa", EVERY_PATH)
@pytest.mark.parametrize("n,hd", [(1, 64), (16, 64), (13, 256), (40, 48), (7, 20)])
def test_attention_weighted_sum_paths_bit_identical(isa, n, hd, restore_isa):
    rng = np.random.default_rng(n * 1000 + hd)
    scores = (3 * rng.standard_normal(n)).astype(np.float32)
    v = rng.standard_normal((n, hd)).astype(np.float16)
    out = rng.standard_normal(hd).astype(np.float32)
    _core.set_isa("scalar")
    ref, ref_max = _core.attn_softmax_v(scores, v.view(np.uint16), out)
    _core.set_isa(isa)
    got, got_max = _core.attn_softmax_v(scores, v.view(np.uint16), out)
    assert got_max == ref_max == scores.max()
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))
    w = np.exp(scores.astype(np.float64) - scores.max())
    exact = (w / w.sum()) @ v.astype(np.float64)  # out is overwritten: it only gives the head size
    np.testing.assert_allclose(got, exact, rtol=2e-3, atol=2e-3)


def kv_arrays(rng, kv: str, hd: int, n: int, copies: int = 1):
    """One page of K (f16 or q8) and V for `copies` queries' own pages ((n, hd) or (copies, n, hd))."""
    shape = (n, hd) if copies == 1 else (copies, n, hd)
    kt = rng.standard_normal((hd, 16)).astype(np.float16).view(np.uint16)
    v = rng.standard_normal(shape).astype(np.float16).view(np.uint16)
    kq = rng.integers(-127, 128, (hd, 16), dtype=np.int8)
    ks = (rng.random((hd // 32, 16)) * 0.02).astype(np.float16).view(np.uint16)
    vq = rng.integers(-127, 128, shape, dtype=np.int8)
    vs = (rng.random(shape[:-1] + (hd // 32,)) * 0.02).astype(np.float16).view(np.uint16)
    if kv == "f16":  # (every hd here is a multiple of 32, as q8 pages need)
        return kt, np.zeros(0, np.int8), np.zeros(0, np.uint16), v, np.zeros(0, np.int8), np.zeros(0, np.uint16)
    return np.zeros(0, np.uint16), kq, ks, np.zeros(0, np.uint16), vq, vs


def bits_equal(a, b) -> bool:
    return np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))


@pytest.mark.parametrize("isa", EVERY_PATH)
@pytest.mark.parametrize("kv", ["f16", "q8"])
@pytest.mark.parametrize("hd,n", [(64, 16), (64, 5), (256, 13), (256, 37), (96, 1), (128, 48)])
def test_grouped_heads_equal_each_head_alone(isa, kv, hd, n, restore_isa):
    # Up to 16 queries (grouped-query heads, of one row or several) go through
    # K and V in one pass; each must get the bits it gets alone, on every
    # path, as on scalar.
    rng = np.random.default_rng(hd * 1000 + n)
    kt, kq, ks, v, vq, vs = kv_arrays(rng, kv, hd, n)

    def run(q, p):
        return _core.attn_group(q, kt, kq, ks, p, v, vq, vs, n, 0.0625)

    for g in (1, 2, 3, 4, 5, 6, 8, 12, 15, 16):  # each register blocking of the weighted sums (16 / g chunks a pass)
        q = rng.standard_normal((g, hd)).astype(np.float32)
        p = rng.random((g, n)).astype(np.float16).astype(np.float32)
        _core.set_isa("scalar")
        ref_s, ref_o = run(q, p)
        _core.set_isa(isa)
        got_s, got_o = run(q, p)
        assert bits_equal(got_s, ref_s) and bits_equal(got_o, ref_o), g
        for h in range(g):
            alone_s, alone_o = run(q[h:h + 1].copy(), p[h:h + 1].copy())
            assert bits_equal(alone_s[0], got_s[h]) and bits_equal(alone_o[0], got_o[h]), (g, h)


@pytest.mark.parametrize("isa", EVERY_PATH)
@pytest.mark.parametrize("kv", ["f16", "q8"])
@pytest.mark.parametrize("hd,n", [(64, 16), (64, 45), (256, 37), (128, 80), (64, 700), (256, 530), (64, 2100)])
def test_grouped_queries_with_own_keys_equal_each_alone(isa, kv, hd, n, restore_isa):
    # Queries of a group may see different numbers of keys (the rows of one
    # prompt) and read their own pages after a shared prefix (branches over
    # copy-on-write pages): each query's weighted sum of V must be the one it
    # gets alone over exactly its own keys, bit for bit, on every path, with
    # the pages taken as from memory or as in cache (hot: longer runs of pages,
    # several at 2,100 keys).
    rng = np.random.default_rng(hd * 7 + n)
    n_pages = (n + 15) // 16
    for g, shared in ((2, 0), (5, n_pages), (8, 1), (16, n_pages - 1), (12, 2)):
        kt, kq, ks, v, vq, vs = kv_arrays(rng, kv, hd, n, copies=g)
        q = rng.standard_normal((g, hd)).astype(np.float32)
        p = rng.random((g, n)).astype(np.float16).astype(np.float32)
        counts = rng.integers(max(1, 16 * min(shared, n_pages) - 15), n + 1, g).astype(np.int32)
        _core.set_isa(isa)
        _, got = _core.attn_group(q, kt, kq, ks, p, v, vq, vs, n, 0.0625, counts=counts, shared=shared)
        _, got_hot = _core.attn_group(q, kt, kq, ks, p, v, vq, vs, n, 0.0625, counts=counts, shared=shared, hot=True)
        assert bits_equal(got_hot, got), (g, shared)
        for h in range(g):
            # query h's V: the shared pages from V[0], its own after them, cut at its count
            src = np.where(np.arange(n) < 16 * shared, 0, h)
            c = int(counts[h])
            own = [a[src, np.arange(n)][:c].copy() if a.size else a for a in (v, vq, vs)]
            for path in ("scalar", isa):
                _core.set_isa(path)
                _, alone = _core.attn_group(q[h:h + 1].copy(), kt, kq, ks, p[h:h + 1, :c].copy(), *own, c, 0.0625)
                assert bits_equal(alone[0], got[h]), (g, shared, h, c, path)


def rmsnorm_reference(x, w, eps):
    """llama.cpp's RMS norm: each row's float squares summed in a double, columns in order."""
    ss = np.zeros(x.shape[0])
    for i in range(x.shape[1]):  # one column at a time for every row: each row's sum in index order
        ss += (x[:, i] * x[:, i]).astype(np.float64)
    mean = (ss / x.shape[1]).astype(np.float32)
    scale = np.float32(1) / np.sqrt(mean + np.float32(eps))
    return (x * scale[:, None]) * w


@pytest.mark.parametrize("isa", EVERY_PATH)
@pytest.mark.parametrize("n_rows,n", [(1, 64), (2, 7), (3, 576), (4, 256), (8, 640), (9, 643), (17, 1536), (16, 8)])
def test_rmsnorm_rows_follow_llama_cpp_on_every_path(isa, n_rows, n, restore_isa):
    # The SIMD paths take rows 8 at a time, one double lane each (a short last
    # group repeats its last row); 1 or 2 rows and the columns past a multiple
    # of 8 sum alone. Each row must come out as the reference's, bit for bit.
    rng = np.random.default_rng(n_rows * 1000 + n)
    x = (rng.standard_normal((n_rows, n)) * rng.choice([1e-3, 1.0, 50.0], (n_rows, 1))).astype(np.float32)
    x[0, : min(n, 5)] = [0.0, -0.0, 1e-30, 3e4, -7.5][: min(n, 5)]
    w = rng.standard_normal(n).astype(np.float32)
    _core.set_isa(isa)
    got = _core.rmsnorm_rows(x, w, 1e-6)
    assert bits_equal(got, rmsnorm_reference(x, w, 1e-6))
    for r in range(n_rows):  # a row alone gets the same bits as in its group
        assert bits_equal(_core.rmsnorm_rows(x[r:r + 1], w, 1e-6)[0], got[r]), r


@pytest.mark.parametrize("isa", EVERY_PATH)
@pytest.mark.parametrize("neox", [True, False])
def test_rope_paths_bit_identical(isa, neox, restore_isa):
    rng = np.random.default_rng(11)
    for n_heads, hd, half in [(4, 256, 128), (9, 64, 32), (1, 64, 16), (3, 40, 20), (2, 14, 5), (1, 2, 1), (2, 96, 33)]:
        v = rng.standard_normal((n_heads, hd)).astype(np.float32)
        v[0, :min(4, hd)] = [0.0, -0.0, 1e-38, -1e-38][:min(4, hd)]  # signed zeros and subnormal products
        angle = rng.uniform(-50, 50, half)
        cs = np.concatenate([np.cos(angle), np.sin(angle)]).astype(np.float32)
        cs[:1] = 0.0
        _core.set_isa("scalar")
        ref = _core.rope(v, cs, neox)
        _core.set_isa(isa)
        got = _core.rope(v, cs, neox)
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), (n_heads, hd, half)


def test_rope_rotates_pairs():
    rng = np.random.default_rng(12)
    v = rng.standard_normal((2, 64)).astype(np.float32)
    angle = rng.uniform(-3, 3, 24)
    cs = np.concatenate([np.cos(angle), np.sin(angle)]).astype(np.float32)
    c, s = cs[:24].astype(np.float64), cs[24:].astype(np.float64)
    for neox, (a, b) in ((True, (np.arange(24), np.arange(24) + 24)), (False, (np.arange(24) * 2, np.arange(24) * 2 + 1))):
        got = _core.rope(v, cs, neox).astype(np.float64)
        x0, x1 = v[:, a].astype(np.float64), v[:, b].astype(np.float64)
        np.testing.assert_allclose(got[:, a], x0 * c - x1 * s, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got[:, b], x0 * s + x1 * c, rtol=1e-6, atol=1e-6)
        untouched = np.setdiff1d(np.arange(64), np.concatenate([a, b]))
        assert np.array_equal(got[:, untouched], v[:, untouched])
