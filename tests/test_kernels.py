"""The dot-product kernels of ctxengine._core.quant (native/kernels/quant/).

Two kinds of checks:
  * determinism: every SIMD path gives results bit-identical to the scalar
    path, whatever the shapes, and a result never depends on which other rows
    are computed with it (quant.h's canonical reduction orders);
  * numerics: results agree with a float64 numpy reference computed from the
    dequantized operands, and the formats match gguf / numpy.
"""
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as G
from gguf import quants
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ctxengine import _core

Q = _core.quant
from simd_paths import AVAILABLE, EVERY_PATH, HAS_AVX_VNNI

QUANTIZED = [G.Q4_0, G.Q4_1, G.Q5_0, G.Q5_1, G.Q8_0]  # blocks of 32, Q8A activations
FLOATS = [G.F32, G.F16, G.BF16]
ALL_TYPES = QUANTIZED + FLOATS

Q8A = np.dtype([("d", "<f4"), ("s", "<f4"), ("qs", "i1", 32)])
BLOCK = {
    G.Q4_0: np.dtype([("d", "<f2"), ("qs", "u1", 16)]),
    G.Q4_1: np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", 16)]),
    G.Q5_0: np.dtype([("d", "<f2"), ("qh", "<u4"), ("qs", "u1", 16)]),
    G.Q5_1: np.dtype([("d", "<f2"), ("m", "<f2"), ("qh", "<u4"), ("qs", "u1", 16)]),
    G.Q8_0: np.dtype([("d", "<f2"), ("qs", "i1", 32)]),
}
HAS_MIN = (G.Q4_1, G.Q5_1)


@pytest.fixture(autouse=True)
def restore_isa():
    before, tiles, vnni = _core.active_isa(), Q.prefill_tiles(), Q.avx2_vnni()
    yield
    _core.set_isa(before)
    Q.set_prefill_tiles(tiles)
    Q.set_avx2_vnni(vnni)


@pytest.fixture(params=EVERY_PATH)  # a path this CPU lacks is a counted skip
def isa(request):
    _core.set_isa(request.param)
    return request.param


def on_each_path(fn):
    """{path: fn()} for every path this CPU has; the AVX-512 path in both of
    its prefill tile forms ("avx512": ymm, "avx512/zmm"), whichever this CPU
    would pick, and the AVX2 path's prefill without AVX-VNNI ("avx2") and,
    where the CPU has it, with ("avx2/vnni")."""
    out = {}
    tiles, vnni = Q.prefill_tiles(), Q.avx2_vnni()
    for path in AVAILABLE:
        _core.set_isa(path)
        if path == "avx512":
            Q.set_prefill_tiles("ymm")
            out[path] = fn()
            Q.set_prefill_tiles("zmm")
            out["avx512/zmm"] = fn()
            Q.set_prefill_tiles(tiles)
        elif path == "avx2":
            Q.set_avx2_vnni(False)
            out[path] = fn()
            if HAS_AVX_VNNI:
                Q.set_avx2_vnni(True)
                out["avx2/vnni"] = fn()
            Q.set_avx2_vnni(vnni)
        else:
            out[path] = fn()
    return out


def assert_same_bits(results):
    ref = np.asarray(results["scalar"])
    for path, got in results.items():
        got = np.asarray(got)
        assert got.shape == ref.shape
        differ = ref.view(np.uint32) != got.view(np.uint32) if ref.dtype == np.float32 else ref != got
        if differ.any():
            where = tuple(np.argwhere(differ)[0])
            pytest.fail(f"{path} differs from scalar at {where}: {got[where]!r} vs {ref[where]!r} "
                        f"({int(differ.sum())} of {differ.size} differ)")


# ---------------------------------------------------------------------------
# Test data

def weights(t, n_out, n_in, rng, raw=False):
    """(n_out, row_bytes) uint8 weights of type t. raw=True: random bytes with
    sane random scales (reaches values gguf's quantizer never makes, e.g. q8 = -128)."""
    if raw and t in QUANTIZED:
        blocks = np.frombuffer(rng.bytes(n_out * (n_in // 32) * BLOCK[t].itemsize), BLOCK[t]).copy()
        blocks["d"] = (rng.standard_normal(blocks.shape) * 0.02).astype(np.float16)
        if t in HAS_MIN:
            blocks["m"] = (rng.standard_normal(blocks.shape) * 0.1).astype(np.float16)
        return blocks.view(np.uint8).reshape(n_out, -1)
    w = rng.standard_normal((n_out, n_in)).astype(np.float32)
    w[:, ::7] *= 4  # some spread inside blocks
    return np.ascontiguousarray(quants.quantize(w, t)).view(np.uint8).reshape(n_out, -1)


def activations(n_x, n_in, rng):
    x = rng.standard_normal((n_x, n_in)).astype(np.float32)
    x[:, 3::11] *= 8
    if n_x > 1:
        x[-1, :32] = 0  # an all-zero block
    return x


def matmul(t, w, n_in, x):
    return Q.matmul(int(t), w.reshape(-1), n_in, w.shape[0], x)


def parse_blocks(t, w, n_in):
    """Float64 pieces of quantized weights: scale d and signed q (n_out, nb, 32), min m."""
    b = w.reshape(-1).view(BLOCK[t]).reshape(w.shape[0], n_in // 32)
    d = b["d"].astype(np.float64)
    m = b["m"].astype(np.float64) if t in HAS_MIN else np.zeros_like(d)
    if t == G.Q8_0:
        q = b["qs"].astype(np.float64)
    else:
        q = np.concatenate([b["qs"] & 0xF, b["qs"] >> 4], axis=-1).astype(np.float64)
        if t in (G.Q5_0, G.Q5_1):  # bit e of qh is bit 4 of element e
            q += ((b["qh"][..., None] >> np.arange(32, dtype=np.uint32)) & 1) * 16.0
        q -= {G.Q4_0: 8, G.Q5_0: 16}.get(t, 0)
    return d, q, m


def q8a_rows(x):
    """The Q8A blocks (structured array (n_x, nb)) the kernels see for x."""
    return np.stack([np.frombuffer(Q.quantize_q8a(row), Q8A) for row in x])


def reference(t, w, n_in, x):
    """Float64 reference and the scale of its terms (sum of |terms|) for tolerances."""
    if t in FLOATS:
        wf = quants.dequantize(w.reshape(-1), t).reshape(w.shape[0], n_in).astype(np.float64)
        xf = x.astype(np.float64)
        return xf @ wf.T, np.abs(xf) @ np.abs(wf).T
    # Integer types: dequantized W against dequantized Q8A activations, with
    # Q4_1's / Q5_1's min term through the block sums s that the kernel uses.
    d, q, m = parse_blocks(t, w, n_in)
    xa = q8a_rows(x)
    xq = xa["d"].astype(np.float64)[..., None] * xa["qs"]
    wd = (d[..., None] * q).reshape(w.shape[0], n_in)
    xd = xq.reshape(x.shape[0], n_in)
    s = xa["s"].astype(np.float64)
    ref = xd @ wd.T + s @ m.T
    scale = np.abs(xd) @ np.abs(wd).T + np.abs(s) @ np.abs(m).T
    return ref, scale


# fp32 accumulation over at most a few dozen sequential steps per lane: the
# error stays far below 1e-5 of the sum of |terms|.
REL_TOL = 1e-5


def assert_close(got, ref, scale):
    err = np.abs(got.astype(np.float64) - ref)
    bound = REL_TOL * scale + 1e-30
    if not (err <= bound).all():
        i = np.unravel_index(np.argmax(err / bound), err.shape)
        pytest.fail(f"largest difference {err[i]:.3g} at {i} (bound {bound[i]:.3g}, got {got[i]!r}, "
                    f"reference {ref[i]!r}); max |err| {err.max():.3g}")


# ---------------------------------------------------------------------------
# Matmul: bit-identical paths, any shape

# n_out / n_x around the SIMD tiles (AVX-512: decode slots of 2 weight rows, 8 rows a
# tile; prefill: pairs of activation rows, 4 x 4 tiles; AVX2: 4 x 1 and 2 x 2).
@pytest.mark.parametrize("n_in", [32, 64, 96, 576, 1536])  # nb = 1, 2, 3 (odd), 18, 48
@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_matmul_paths_bit_identical(t, n_in):
    rng = np.random.default_rng(n_in * 100 + int(t))
    w = weights(t, 33, n_in, rng)
    x = activations(17, n_in, rng)
    for n_out in (1, 2, 7, 8, 9, 16, 33):
        for n_x in (1, 2, 3, 4, 5, 6, 8, 9, 17):
            wo, xs = w[:n_out], x[:n_x]
            assert_same_bits(on_each_path(lambda: matmul(t, wo, n_in, xs)))


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_decode_output_ranges_bit_identical(t):
    # One activation row (decode) over a part of the output rows, as the model's threads split
    # them and chunk them (AVX2's Q8_0 decode takes groups of 4 rows and scales 8 blocks at a time).
    rng = np.random.default_rng(int(t) + 7)
    n_in, n_out = 11 * 32 if t not in QUANTIZED or GGML_QUANT_SIZES[t][0] == 32 else 512, 37
    w = weights(t, n_out, n_in, rng)
    x = activations(1, n_in, rng) * np.float32(1e-3)
    for o0, o1, chunk in ((0, n_out, 0), (3, 30, 0), (5, n_out, 3), (0, 9, 4)):
        assert_same_bits(on_each_path(lambda: Q.matmul(int(t), w.reshape(-1), n_in, n_out, x, o0, o1, chunk)))


def fma_f32(a, b, c):
    """fma(a, b, c) on float32 arrays, rounded once. The product is exact in
    float64 (24 + 24 bits); the float64 sum s and its exact error e (TwoSum) give
    a + b * c = s + e, and rounding s to float32 is the fma's rounding except
    when s is exactly halfway between two float32 and e != 0: then e decides."""
    p = a.astype(np.float64) * b.astype(np.float64)
    c = c.astype(np.float64)
    s = p + c
    v = s - p
    e = (p - (s - v)) + (c - v)
    r = s.astype(np.float32)
    tie = (s.view(np.uint64) & np.uint64((1 << 29) - 1)) == np.uint64(1 << 28)  # float32-normal range
    up = np.nextafter(s, np.inf).astype(np.float32)
    down = np.nextafter(s, -np.inf).astype(np.float32)
    return np.where(tie & (e > 0), up, np.where(tie & (e < 0), down, r))


def canonical_matmul_q(t, w, n_in, x):
    """quant.h's canonical order for the integer types, in numpy: 8 float32
    lanes, lane l of block b gets fma(f16(d_w) * d_x, isum(b, 4l..4l+3)), blocks
    in order; hsum8; Q4_1 adds its sequential min sum."""
    d, q, m = parse_blocks(t, w, n_in)  # (n_out, nb), (n_out, nb, 32), (n_out, nb)
    xa = q8a_rows(x)  # (n_x, nb)
    nb = n_in // 32
    wq = q.astype(np.int64).reshape(w.shape[0], 1, nb, 8, 4)
    xq = xa["qs"].astype(np.int64).reshape(1, x.shape[0], nb, 8, 4)
    isum = (wq * xq).sum(axis=-1).astype(np.float32)  # (n_out, n_x, nb, 8), exact
    scale = d.astype(np.float32)[:, None, :] * xa["d"][None, :, :]  # float32 product
    acc = np.zeros((w.shape[0], x.shape[0], 8), np.float32)
    for b in range(nb):
        acc = fma_f32(np.broadcast_to(scale[:, :, b, None], acc.shape), isum[:, :, b], acc)
    for width in (4, 2, 1):
        acc = acc[..., :width] + acc[..., width:2 * width]
    dot = acc[..., 0]
    if t in HAS_MIN:
        summ = np.zeros(dot.shape, np.float32)
        for b in range(nb):
            summ = fma_f32(np.broadcast_to(m.astype(np.float32)[:, b, None], summ.shape),
                           np.broadcast_to(xa["s"][None, :, b], summ.shape), summ)
        dot = dot + summ
    return np.ascontiguousarray(dot.T)  # (n_x, n_out) as the kernels give it


def test_fma_f32_rounds_once():
    one, eps = np.float32(1), np.float32(2.0**-24)
    # 1 + 2^-24 is a float32 tie; a tiny extra product term must break it upwards.
    got = fma_f32(np.array([eps, eps]), np.array([np.float32(1 + 2.0**-23), one]), np.array([one, one]))
    np.testing.assert_array_equal(got, np.array([1 + 2.0**-23, 1.0], np.float32))


@pytest.mark.parametrize("n_in", [32, 64, 96, 576])  # nb = 1, 2, 3, 18
@pytest.mark.parametrize("t", QUANTIZED, ids=lambda t: t.name)
def test_matmul_q_follows_the_canonical_order(t, n_in):
    """Every path gives exactly the bits of quant.h's canonical order (numpy above)."""
    rng = np.random.default_rng(n_in + 31 * int(t))
    for raw in (False, True):
        w = weights(t, 9, n_in, rng, raw=raw)
        x = activations(5, n_in, rng)
        want = canonical_matmul_q(t, w, n_in, x)
        results = on_each_path(lambda: matmul(t, w, n_in, x))
        for path, got in results.items():
            differ = got.view(np.uint32) != want.view(np.uint32)
            assert not differ.any(), (path, np.argwhere(differ)[0], got[differ][0], want[differ][0])


@pytest.mark.parametrize("t", QUANTIZED, ids=lambda t: t.name)
def test_matmul_paths_bit_identical_raw_blocks(t):
    """Random block bytes, incl. q8 = -128 and saturated activations (|xq| = 127)."""
    rng = np.random.default_rng(7)
    for n_in in (32, 96, 576):
        w = weights(t, 21, n_in, rng, raw=True)
        x = activations(6, n_in, rng)
        x[2] = np.where(rng.random(n_in) < 0.5, -1.0, 1.0)  # every element quantizes to +-127
        assert_same_bits(on_each_path(lambda: matmul(t, w, n_in, x)))


@pytest.mark.parametrize("t", QUANTIZED, ids=lambda t: t.name)
def test_matmul_extreme_integer_sums(t):
    """All weights at their most negative and all activations at +-127: the
    largest 4-sums the int8 paths must carry without saturating."""
    n_in = 96
    blocks = np.zeros((4, n_in // 32), BLOCK[t])
    blocks["d"] = 1.0
    blocks["qs"] = -128 if t == G.Q8_0 else 0  # Q4_*, Q5_*: value 0 (Q4_0: -8, Q5_0: -16)
    w = blocks.view(np.uint8).reshape(4, -1)
    x = np.stack([np.full(n_in, 1.0), np.full(n_in, -1.0), np.tile([1.0, -1.0], n_in // 2)]).astype(np.float32)
    results = on_each_path(lambda: matmul(t, w, n_in, x))
    assert_same_bits(results)
    ref, scale = reference(t, w, n_in, x)
    assert_close(results["scalar"], ref, scale)


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_matmul_matches_float64_reference(t, isa):
    rng = np.random.default_rng(int(t) + 1)
    for n_in, n_out, n_x in ((32, 5, 3), (96, 9, 4), (576, 33, 5), (1536, 7, 2)):
        w = weights(t, n_out, n_in, rng)
        x = activations(n_x, n_in, rng)
        ref, scale = reference(t, w, n_in, x)
        assert_close(matmul(t, w, n_in, x), ref, scale)


@pytest.mark.parametrize("t", [G.F32, G.F16, G.BF16], ids=lambda t: t.name)
def test_float_matmul_any_length(t):
    """Float rows need not be a multiple of 16 (the lane width): tails included."""
    rng = np.random.default_rng(3)
    for n_in in (1, 5, 15, 16, 17, 31, 33, 100):
        w = weights(t, 6, n_in, rng)
        x = activations(5, n_in, rng)
        results = on_each_path(lambda: matmul(t, w, n_in, x))
        assert_same_bits(results)
        ref, scale = reference(t, w, n_in, x)
        assert_close(results["scalar"], ref, scale)


# Prefill with weight tiles unpacked once: AVX-512 (n_x >= 16) tiles of 4
# weight rows, activation rows by groups of 16 in sub-tiles of 4 (ymm) or of
# 4 pairs of rows (zmm; odd row counts leave a half pair); AVX2
# (n_x >= 4) tiles of 2 rows, groups of 8, sub-tiles of 4. The model calls
# the kernels on sub-ranges o0..o1 of W (chunks of 16 rows per thread).
@pytest.mark.parametrize("n_in", [32, 96, 640])  # nb = 1, 3, 20
@pytest.mark.parametrize("t", QUANTIZED, ids=lambda t: t.name)
def test_matmul_q_prefill_tiles_and_chunks(t, n_in):
    rng = np.random.default_rng(n_in * 7 + int(t))
    w = weights(t, 37, n_in, rng, raw=True)
    x = activations(40, n_in, rng)
    x[5] = np.where(rng.random(n_in) < 0.5, -1.0, 1.0)  # saturated activations (+-127)
    want = canonical_matmul_q(t, w, n_in, x)
    for n_out in (1, 3, 4, 5, 17, 37):
        for n_x in (2, 7, 8, 9, 13, 16, 17, 18, 23, 25, 32, 33, 40):
            for chunk in (0, 16, 7):
                results = on_each_path(lambda: Q.matmul(int(t), w[:n_out].reshape(-1), n_in, n_out, x[:n_x], chunk=chunk))
                for path, got in results.items():
                    differ = got.view(np.uint32) != want[:n_x, :n_out].view(np.uint32)
                    assert not differ.any(), (path, n_out, n_x, chunk, np.argwhere(differ)[0])


# Batched decode (AVX-512, Q4_1 and Q8_0: quant_rows_avx512.cpp): every row
# count from 2 to 16 has its own tile (4, 2 or 1 weight rows), whose leftover
# weight rows go one by one; chunks of 8 blocks (nb = 18: two whole, one of 2).
# With the zmm tiles, Q8_0's 4 to 8 rows go to quant_avx512.cpp's register
# tiles instead (two pairs of rows a zmm; odd counts a half pair), and its 9
# to 16 to quant_rows_zmm_avx512.cpp (the same pairs, tiles of 2 weight rows).
# Q4_0, Q5_0 and Q5_1 take quant_avx512.cpp's register tiles below 9 rows (16
# without the zmm tiles), the prefill tiles from there: every count is checked.
@pytest.mark.parametrize("t", [G.Q4_1, G.Q8_0, G.Q4_0, G.Q5_0, G.Q5_1], ids=lambda t: t.name)
def test_matmul_q_batched_decode_rows(t):
    n_in = 576
    rng = np.random.default_rng(21 + int(t))
    w = weights(t, 11, n_in, rng, raw=True)
    x = activations(16, n_in, rng)
    assert_canonical_on_each_path(t, w, n_in, x, range(1, 17), ((11, 0), (11, 5), (1, 0)))


# Q8_0 with 17 to 32 rows (batched decode; on the ymm tiles' machines and on
# AVX2, the rows kernel as two groups of rows: quant_rows_avx512.cpp,
# quant_rows_avx2.cpp) runs by bands of weight rows that meet both groups:
# n_in 4096 makes a band 12 rows (AVX2: 14), so 29 rows are two whole bands
# and a part, and chunks of 5 start mid-band; 33 rows take the prefill tiles.
def test_matmul_q_batched_decode_groups_and_bands():
    t = G.Q8_0
    n_in = 4096
    rng = np.random.default_rng(23 + int(t))
    w = weights(t, 29, n_in, rng, raw=True)
    x = activations(33, n_in, rng)
    assert_canonical_on_each_path(t, w, n_in, x, (17, 24, 31, 32, 33), ((29, 0), (29, 5), (3, 0)))


def assert_canonical_on_each_path(t, w, n_in, x, row_counts, outs_and_chunks):
    """The first n_x rows of x by the first n_out rows of w, in chunks of weight rows, on every path: the
    canonical order's bits."""
    want = canonical_matmul_q(t, w, n_in, x)
    for n_x in row_counts:
        for n_out, chunk in outs_and_chunks:
            results = on_each_path(lambda: Q.matmul(int(t), w[:n_out].reshape(-1), n_in, n_out, x[:n_x], chunk=chunk))
            for path, got in results.items():
                differ = got.view(np.uint32) != want[:n_x, :n_out].view(np.uint32)
                assert not differ.any(), (path, n_out, n_x, chunk, np.argwhere(differ)[0])


@pytest.mark.parametrize("n_x", [2, 5, 11], ids=["two-rows", "batched-decode", "prefill"])
@pytest.mark.parametrize("t", QUANTIZED, ids=lambda t: t.name)
def test_matmul_q_prefill_extreme_integer_sums(t, n_x):
    """The extreme 4-sums through the batched decode and prefill paths: the
    bias taken back (on whichever side) must stay exact."""
    n_in = 96
    blocks = np.zeros((6, n_in // 32), BLOCK[t])
    blocks["d"] = 1.0
    blocks["qs"][0:2] = -128 if t == G.Q8_0 else 0  # most negative (Q4_0: -8, Q5_0: -16)
    blocks["qs"][2:4] = 127 if t == G.Q8_0 else 0xFF  # most positive (Q4_*: 15)
    if t in (G.Q5_0, G.Q5_1):
        blocks["qh"][2:4] = 0xFFFFFFFF  # Q5_*: 31
    w = blocks.view(np.uint8).reshape(6, -1)
    pattern = [np.full(n_in, 1.0), np.full(n_in, -1.0), np.tile([1.0, -1.0], n_in // 2)]
    x = np.stack([pattern[i % 3] for i in range(n_x)]).astype(np.float32)
    results = on_each_path(lambda: matmul(t, w, n_in, x))
    assert_same_bits(results)
    np.testing.assert_array_equal(results["scalar"].view(np.uint32), canonical_matmul_q(t, w, n_in, x).view(np.uint32))
    ref, scale = reference(t, w, n_in, x)
    assert_close(results["scalar"], ref, scale)


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_matmul_batch_and_row_range_invariance(t, isa):
    """A row's result is the same bits whatever other rows (activations or
    weights) are computed with it and wherever its weight range starts."""
    rng = np.random.default_rng(11)
    n_in = 96
    w = weights(t, 23, n_in, rng)
    x = activations(13, n_in, rng)
    full = matmul(t, w, n_in, x)
    for r0, r1 in ((0, 1), (5, 6), (3, 8), (1, 13), (12, 13)):
        np.testing.assert_array_equal(matmul(t, w, n_in, x[r0:r1]).view(np.uint32), full[r0:r1].view(np.uint32))
    for o0, o1 in ((0, 1), (1, 8), (3, 20), (5, 6), (22, 23), (7, 23)):
        np.testing.assert_array_equal(matmul(t, w[o0:o1], n_in, x).view(np.uint32), full[:, o0:o1].view(np.uint32))
    for chunk in (1, 3, 16):  # the kernel on sub-ranges o0..o1 of W, as the model's threads call it
        got = Q.matmul(int(t), w.reshape(-1), n_in, w.shape[0], x, chunk=chunk)
        np.testing.assert_array_equal(got.view(np.uint32), full.view(np.uint32))


def test_matmul_argument_checks():
    w = np.zeros((2, 20), np.uint8)
    x = np.zeros((1, 32), np.float32)
    with pytest.raises(ValueError, match="unsupported tensor type type 16"):
        Q.matmul(16, w.reshape(-1), 32, 2, x)  # IQ2_XXS
    with pytest.raises(ValueError, match="Q4_K rows need a multiple of 256"):
        Q.matmul(int(G.Q4_K), w.reshape(-1), 32, 2, x)
    with pytest.raises(ValueError, match="bytes"):
        Q.matmul(int(G.Q4_1), w.reshape(-1)[:-1], 32, 2, x)
    with pytest.raises(ValueError, match="shape"):
        Q.matmul(int(G.Q4_1), w.reshape(-1), 32, 2, np.zeros((1, 64), np.float32))
    with pytest.raises(ValueError, match="multiple of 32"):
        Q.matmul(int(G.Q4_1), w.reshape(-1), 40, 2, np.zeros((1, 40), np.float32))


# ---------------------------------------------------------------------------
# Formats

def test_type_table():
    assert Q.supported_types() == [0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 15, 30]
    assert [Q.dtype_name(t) for t in Q.supported_types()] == [
        "F32", "F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "BF16"]
    assert Q.dtype_name(16) == "type 16"
    # bytes of 256 elements, as gguf's table has them
    for t in Q.supported_types():
        block, size = GGML_QUANT_SIZES[G(t)]
        assert Q.row_bytes(t, 256) == 256 // block * size, G(t).name


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_dequantize_matches_gguf(t):
    rng = np.random.default_rng(5)
    for raw in (False, True):
        w = weights(t, 3, 96, rng, raw=raw)
        for row in w:
            got = Q.dequantize(int(t), row, 96)
            want = quants.dequantize(row, t).astype(np.float32).reshape(-1)
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def q8a_numpy(x):
    """quant.h's Q8A definition in numpy (float32 arithmetic, round half to even)."""
    xb = x.astype(np.float32).reshape(-1, 32)
    amax = np.abs(xb).max(axis=1)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    qs = np.rint(xb * inv[:, None]).astype(np.int32)
    out = np.zeros(len(xb), Q8A)
    out["qs"] = qs
    with np.errstate(over="ignore"):  # s = f16(...) is inf past 65504, as in ggml's Q8_1
        out["s"] = (d * qs.sum(axis=1).astype(np.float32)).astype(np.float16)
    out["d"] = d.astype(np.float16)
    return out.tobytes()


def test_quantize_q8a_fixed_cases():
    x = np.zeros(128, np.float32)
    x[32] = 127.0  # amax 127: x * id == x, so the ties below stay ties
    x[33:40] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5]
    x[64:96] = np.linspace(-3, 3, 32)
    x[96:128] = 1e-30  # d rounds to 0 in f16 while qs stay 127
    got = Q.quantize_q8a(x)
    assert got == q8a_numpy(x)
    blocks = np.frombuffer(got, Q8A)
    assert (blocks[0]["qs"] == 0).all() and blocks[0]["d"] == 0 and blocks[0]["s"] == 0  # all-zero block
    assert list(blocks[1]["qs"][:8]) == [127, 0, 2, 2, 0, -2, -2, 126]  # half to even
    assert blocks[3]["d"] == 0 and (blocks[3]["qs"] == 127).all()


# Magnitudes down to 2^-100 (8e-31): below about 4e-37 the contract's id = 127 / amax
# overflows to inf (no real activation block gets there; see quant.h).
Q8A_ELEMENTS = st.one_of(st.just(0.0), st.floats(2.0**-100, 1e4, width=32), st.floats(-1e4, -(2.0**-100), width=32))


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, st.sampled_from([32, 64, 160]), elements=Q8A_ELEMENTS))
def test_quantize_q8a_matches_numpy(x):
    assert Q.quantize_q8a(x) == q8a_numpy(x)


def test_quantize_q8a_random_scales():
    rng = np.random.default_rng(9)
    x = (rng.standard_normal(32 * 64) * np.repeat(10.0 ** rng.uniform(-8, 4, 64), 32)).astype(np.float32)
    assert Q.quantize_q8a(x) == q8a_numpy(x)


def test_quantize_q8a_paths_bit_identical():
    """The AVX2 and AVX-512 quantizers give the scalar bytes: zero blocks, ties
    (half to even), f16 underflow of d, saturated and tiny magnitudes, and
    scales over 12 decades."""
    rng = np.random.default_rng(10)
    x = (rng.standard_normal(32 * 200) * np.repeat(10.0 ** rng.uniform(-8, 4, 200), 32)).astype(np.float32)
    x[:32] = 0.0
    x[32], x[33:40] = 127.0, [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5]
    x[64:96] = 1e-30
    x[96:128] = np.where(rng.random(32) < 0.5, -1.0, 1.0)
    x[128:160] = -0.0
    results = on_each_path(lambda: np.frombuffer(Q.quantize_q8a(x), np.uint8))
    assert_same_bits(results)
    assert results["scalar"].tobytes() == q8a_numpy(x)


# ---------------------------------------------------------------------------
# Half floats

ALL_HALVES = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
HALF_NAN = (ALL_HALVES & 0x7C00 == 0x7C00) & (ALL_HALVES & 0x3FF != 0)


def test_f16_to_f32_exhaustive():
    got = Q.dequantize(int(G.F16), ALL_HALVES.view(np.uint8), 1 << 16).view(np.uint32)
    want = ALL_HALVES.view(np.float16).astype(np.float32).view(np.uint32)
    np.testing.assert_array_equal(got[~HALF_NAN], want[~HALF_NAN])
    # NaNs come back quiet with their payload, as F16C converts them
    np.testing.assert_array_equal(got[HALF_NAN], want[HALF_NAN] | 0x00400000)


def test_f16_round_trip_exhaustive(isa):
    as_f32 = Q.dequantize(int(G.F16), ALL_HALVES.view(np.uint8), 1 << 16)
    back = Q.f32_to_f16(as_f32)
    np.testing.assert_array_equal(back[~HALF_NAN], ALL_HALVES[~HALF_NAN])
    np.testing.assert_array_equal(back[HALF_NAN], ALL_HALVES[HALF_NAN] | 0x200)


def test_f16_widening_exhaustive_on_each_path():
    """Attention scores with q = [1] and scale 1 are exactly the f16 -> f32 conversion
    of every half (fma(1, h, 0) == h, but -0 becomes +0): checks each path's F16C
    use against the scalar bits and numpy."""
    kt = ALL_HALVES.reshape(1, -1)
    results = on_each_path(lambda: _core.attn_scores(np.ones(1, np.float32), kt, kt.shape[1], 1.0))
    assert_same_bits(results)
    want = ALL_HALVES.view(np.float16).astype(np.float32)
    want[want == 0] = 0.0
    np.testing.assert_array_equal(results["scalar"].view(np.uint32)[~HALF_NAN], want.view(np.uint32)[~HALF_NAN])
