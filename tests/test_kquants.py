"""The K-quant kernels (Q2_K .. Q6_K, Q8_K weights) against Q8K activations.

Checks, as tests/test_kernels.py does for the blocks of 32:
  * every SIMD path gives the scalar path's bits, for any shape and tiling;
  * the scalar path gives exactly the bits of quant.h's canonical order,
    written independently in numpy below (canonical_matmul_k);
  * results agree with a float64 dequantize-then-dot reference;
  * Q8K quantization is ggml's quantize_row_q8_K, dequantization is gguf's.
Weights are random block bytes (every bit pattern a file can hold) with
random, tiny and huge f16 scales.
"""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as G
from gguf import quants

from ctxengine import _core
from simd_paths import EVERY_PATH
from test_kernels import AVAILABLE, activations, assert_same_bits, fma_f32, on_each_path

Q = _core.quant
KQUANTS = [G.Q2_K, G.Q3_K, G.Q4_K, G.Q5_K, G.Q6_K, G.Q8_K]
QK_K = 256

BLOCK = {
    G.Q2_K: np.dtype([("scales", "u1", 16), ("qs", "u1", 64), ("d", "<f2"), ("dmin", "<f2")]),
    G.Q3_K: np.dtype([("hmask", "u1", 32), ("qs", "u1", 64), ("scales", "u1", 12), ("d", "<f2")]),
    G.Q4_K: np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qs", "u1", 128)]),
    G.Q5_K: np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qh", "u1", 32), ("qs", "u1", 128)]),
    G.Q6_K: np.dtype([("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<f2")]),
    G.Q8_K: np.dtype([("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16)]),
}
Q8K = BLOCK[G.Q8_K]
E = np.arange(QK_K)


@pytest.fixture(autouse=True)
def restore_isa():
    before = _core.active_isa()
    yield
    _core.set_isa(before)


def kweights(t, n_out, n_in, rng, scale="normal"):
    """(n_out, row_bytes) random blocks. scale: "normal", "tiny" (f16 subnormals) or "huge" (up to 65504)."""
    nb = n_in // QK_K
    b = np.frombuffer(rng.bytes(n_out * nb * BLOCK[t].itemsize), BLOCK[t]).copy().reshape(n_out, nb)
    mags = {"normal": 10.0 ** rng.uniform(-4, -1, b.shape),
            "tiny": 2.0 ** rng.uniform(-24, -14, b.shape),
            "huge": np.where(rng.random(b.shape) < 0.5, 65504.0, 10.0 ** rng.uniform(2, 4.8, b.shape))}[scale]
    sign = np.where(rng.random(b.shape) < 0.5, -1.0, 1.0)
    b["d"] = (sign * mags).astype(BLOCK[t]["d"].base)
    if "dmin" in BLOCK[t].names:
        b["dmin"] = (mags * rng.uniform(0.1, 1, b.shape)).astype(np.float16)
    if t == G.Q8_K:  # bsums of a weight block are unused; keep them consistent anyway
        b["bsums"] = b["qs"].reshape(n_out, nb, 16, 16).astype(np.int64).sum(-1)
    return b.view(np.uint8).reshape(n_out, -1)


def k_parts(t, w, n_in):
    """Integer weights q (n_out, nb, 256), scales sc per 16 (n_out, nb, 16),
    mins m (per 16 for Q2_K, per 32 for Q4_K / Q5_K), d, dmin (float32), as quant.h defines them."""
    b = w.reshape(-1).view(BLOCK[t]).reshape(w.shape[0], n_in // QK_K)
    d = b["d"].astype(np.float32)
    dmin = b["dmin"].astype(np.float32) if "dmin" in BLOCK[t].names else np.zeros_like(d)
    m = np.zeros(b.shape + (16,), np.int64)
    if t in (G.Q2_K, G.Q3_K):
        q = (b["qs"][..., 32 * (E // 128) + E % 32] >> (2 * ((E % 128) // 32))) & 3
    if t == G.Q2_K:
        sc = b["scales"] & 0xF
        m = (b["scales"] >> 4).astype(np.int64)
    elif t == G.Q3_K:
        high = (b["hmask"][..., E % 32] >> (E // 32)) & 1
        q = q.astype(np.int64) - 4 * (1 - high)
        j = np.arange(16)
        s = b["scales"]
        low = np.where(j < 8, s[..., j % 8] & 0xF, s[..., j % 8] >> 4)
        sc = (low | (((s[..., 8 + j % 4] >> (2 * (j // 4))) & 3) << 4)).astype(np.int64) - 32
    elif t in (G.Q4_K, G.Q5_K):
        q = (b["qs"][..., 32 * (E // 64) + E % 32] >> (4 * ((E % 64) // 32))) & 0xF
        if t == G.Q5_K:
            q = q | (((b["qh"][..., E % 32] >> (E // 32)) & 1) << 4)
        s = b["scales"].astype(np.int64)
        j = np.arange(4)
        sc8 = np.concatenate([s[..., j] & 63, (s[..., j + 8] & 0xF) | ((s[..., j] >> 6) << 4)], -1)
        m[..., :8] = np.concatenate([s[..., j + 4] & 63, (s[..., j + 8] >> 4) | ((s[..., j + 4] >> 6) << 4)], -1)
        sc = np.repeat(sc8, 2, axis=-1)
    elif t == G.Q6_K:
        half, quarter, lane = E // 128, (E % 128) // 32, E % 32
        low = (b["ql"][..., 64 * half + 32 * (quarter & 1) + lane] >> (4 * (quarter >> 1))) & 0xF
        q = low | (((b["qh"][..., 32 * half + lane] >> (2 * quarter)) & 3) << 4)
        sc = b["scales"]
    else:
        q, sc = b["qs"], np.ones(b.shape + (16,), np.int64)
    return q.astype(np.int64), sc.astype(np.int64), m, d, dmin


def q8k_numpy(x):
    """ggml's quantize_row_q8_K in numpy (float32 arithmetic): structured (nb,) Q8K blocks."""
    xb = x.astype(np.float32).reshape(-1, QK_K)
    out = np.zeros(len(xb), Q8K)
    for i, row in enumerate(xb):
        k = int(np.argmax(np.abs(row)))  # the first largest |x|
        if row[k] == 0:
            continue
        iscale = np.float32(-127) / row[k]
        qs = np.minimum(127, np.rint(iscale * row)).astype(np.int8)
        out[i]["qs"] = qs
        out[i]["bsums"] = qs.reshape(16, 16).astype(np.int64).sum(-1)
        out[i]["d"] = np.float32(1) / iscale
    return out


def q8k_rows(x):
    return np.stack([np.frombuffer(Q.quantize_q8k(row), Q8K) for row in x])


def matmul(t, w, n_in, x):
    return Q.matmul(int(t), w.reshape(-1), n_in, w.shape[0], x)


def canonical_matmul_k(t, w, n_in, x):
    """quant.h's canonical K-quant order in numpy, (n_x, n_out)."""
    q, sc, m, d, dmin = k_parts(t, w, n_in)
    ya = q8k_rows(x)
    n_out, nb = d.shape
    yq = ya["qs"].astype(np.int64)  # (n_x, nb, 256)
    bs = ya["bsums"].astype(np.int64)  # (n_x, nb, 16)
    lane = (E % 32) // 4
    prod = (sc[..., E // 16] * q)[:, None] * yq[None]  # (n_out, n_x, nb, 256)
    isum = np.stack([prod[..., lane == ll].sum(-1) for ll in range(8)], -1)  # (n_out, n_x, nb, 8)
    L = np.arange(8)
    if t == G.Q6_K:
        isum -= 32 * (sc[:, None, :, 2 * L] * bs[None, :, :, 2 * L] + sc[:, None, :, 2 * L + 1] * bs[None, :, :, 2 * L + 1])
    if t == G.Q6_K:  # llama.cpp's x86 tiled gemm: one exact sum a super-block, then d_w, then fma with d_y
        acc1 = np.zeros((n_out, x.shape[0]), np.float32)
        for i in range(nb):
            acc1 = fma_f32(isum[:, :, i].sum(-1).astype(np.float32) * d[:, None, i], ya["d"][None, :, i], acc1)
        return np.ascontiguousarray(acc1.T)
    acc = np.zeros((n_out, x.shape[0], 8), np.float32)
    summ = np.zeros((n_out, x.shape[0]), np.float32)
    K = np.arange(4)
    if t == G.Q4_K:  # llama.cpp's x86 (repacked) order: a float step per 64 values
        pair = np.stack([prod[..., 64 * k:64 * k + 64].sum(-1) for k in range(4)], -1)  # (n_out, n_x, nb, 4)
        acc1 = np.zeros((n_out, x.shape[0]), np.float32)
        for i in range(nb):
            dd = d[:, None, i] * ya["d"][None, :, i]
            dm = dmin[:, None, i] * ya["d"][None, :, i]
            b8 = bs[None, :, i]
            mk = (m[:, None, i, 2 * K] * (b8[..., 4 * K] + b8[..., 4 * K + 1])
                  + m[:, None, i, 2 * K + 1] * (b8[..., 4 * K + 2] + b8[..., 4 * K + 3]))
            for k in range(4):
                acc1 = fma_f32(dd, pair[:, :, i, k].astype(np.float32), acc1)
                summ = fma_f32(dm, mk[..., k].astype(np.float32), summ)
        return np.ascontiguousarray((acc1 - summ).T)
    for i in range(nb):
        dd = ya["d"][None, :, i] * d[:, None, i]  # float32 products
        dm = -(ya["d"][None, :, i] * dmin[:, None, i])
        b8 = bs[None, :, i]
        if t == G.Q2_K:
            pm = m[:, None, i, 2 * L] * b8[..., 2 * L] + m[:, None, i, 2 * L + 1] * b8[..., 2 * L + 1]
            acc = fma_f32(np.broadcast_to(dm[..., None], acc.shape), pm.astype(np.float32), acc)
        acc = fma_f32(np.broadcast_to(dd[..., None], acc.shape), isum[:, :, i].astype(np.float32), acc)
        mk = (m[:, None, i, 2 * K] * (b8[..., 4 * K] + b8[..., 4 * K + 1])
              + m[:, None, i, 2 * K + 1] * (b8[..., 4 * K + 2] + b8[..., 4 * K + 3]))
        if t == G.Q5_K:
            summ = fma_f32(dm, mk.sum(-1).astype(np.float32), summ)
    for width in (4, 2, 1):
        acc = acc[..., :width] + acc[..., width:2 * width]
    dot = acc[..., 0]
    if t == G.Q5_K:
        dot = dot + summ
    return np.ascontiguousarray(dot.T)


def reference_k(t, w, n_in, x):
    """Float64 dequantize-then-dot of the kernel's operands, and the scale of its
    terms (sum of |terms|, with Q6_K's offset of 32 taken apart as the kernel does)."""
    q, sc, m, d, dmin = k_parts(t, w, n_in)
    ya = q8k_rows(x)
    yd = (ya["d"].astype(np.float64)[..., None] * ya["qs"]).reshape(x.shape[0], n_in)
    msub = m[..., E // 16] if t == G.Q2_K else m[..., E // 32]
    off = 32 if t == G.Q6_K else 0
    ds = d.astype(np.float64)[..., None] * sc[..., E // 16]
    mins = dmin.astype(np.float64)[..., None] * msub
    wd = (ds * (q - off) - mins).reshape(w.shape[0], n_in)
    size = (np.abs(ds) * (np.abs(q) + off) + np.abs(mins)).reshape(w.shape[0], n_in)
    return yd @ wd.T, np.abs(yd) @ size.T


def assert_close(got, ref, scale, rel=1e-5):
    err = np.abs(got.astype(np.float64) - ref)
    bound = rel * scale + 1e-30
    if not (err <= bound).all():
        i = np.unravel_index(np.argmax(err / bound), err.shape)
        pytest.fail(f"largest difference {err[i]:.3g} at {i} (bound {bound[i]:.3g}, got {got[i]!r}, reference {ref[i]!r})")


# ---------------------------------------------------------------------------

@pytest.mark.parametrize("t", KQUANTS, ids=lambda t: t.name)
def test_paths_bit_identical(t):
    """n_x around the tiles (up to 6 rows unpacked on the fly, more from a
    pre-unpacked row), n_out around the thread split."""
    rng = np.random.default_rng(int(t))
    for n_in in (256, 768):
        w = kweights(t, 11, n_in, rng)
        x = activations(15, n_in, rng)
        for n_out in (1, 2, 11):
            for n_x in (1, 2, 3, 4, 5, 6, 7, 9, 15):
                assert_same_bits(on_each_path(lambda: matmul(t, w[:n_out], n_in, x[:n_x])))


@pytest.mark.parametrize("scale", ["normal", "tiny", "huge"])
@pytest.mark.parametrize("t", KQUANTS, ids=lambda t: t.name)
def test_follows_the_canonical_order(t, scale):
    """Every path gives exactly the bits of quant.h's canonical order (numpy above)."""
    rng = np.random.default_rng(int(t) * 7 + len(scale))
    w = kweights(t, 5, 512, rng, scale)
    x = activations(7, 512, rng)
    x[1] = np.where(rng.random(512) < 0.5, -1.0, 1.0)  # every element quantizes to +-127
    x[2, 256:] *= 1e-30  # a block of tiny activations next to a normal one
    want = canonical_matmul_k(t, w, 512, x)
    assert np.isfinite(want).all()
    for path, got in on_each_path(lambda: matmul(t, w, 512, x)).items():
        differ = got.view(np.uint32) != want.view(np.uint32)
        assert not differ.any(), (path, np.argwhere(differ)[0], got[differ][0], want[differ][0])


@pytest.mark.parametrize("t", KQUANTS, ids=lambda t: t.name)
def test_matches_float64_reference(t):
    rng = np.random.default_rng(100 + int(t))
    for path in AVAILABLE:
        _core.set_isa(path)
        for n_in, n_out, n_x in ((256, 7, 3), (1024, 9, 8)):
            w = kweights(t, n_out, n_in, rng)
            x = activations(n_x, n_in, rng)
            ref, scale = reference_k(t, w, n_in, x)
            assert_close(matmul(t, w, n_in, x), ref, scale)


@pytest.mark.parametrize("t", KQUANTS, ids=lambda t: t.name)
def test_batch_and_row_range_invariance(t):
    rng = np.random.default_rng(11)
    w = kweights(t, 13, 512, rng)
    x = activations(11, 512, rng)
    for path in AVAILABLE:
        _core.set_isa(path)
        full = matmul(t, w, 512, x)
        for r0, r1 in ((0, 1), (4, 5), (2, 9), (1, 11)):
            np.testing.assert_array_equal(matmul(t, w, 512, x[r0:r1]).view(np.uint32), full[r0:r1].view(np.uint32))
        for o0, o1 in ((0, 1), (3, 10), (12, 13)):
            np.testing.assert_array_equal(matmul(t, w[o0:o1], 512, x).view(np.uint32), full[:, o0:o1].view(np.uint32))


@pytest.mark.parametrize("scale", ["normal", "tiny", "huge"])
@pytest.mark.parametrize("t", KQUANTS, ids=lambda t: t.name)
def test_many_rows_and_ragged_tiles(t, scale):
    """Prefill shapes: n_x 1 .. 40 (Q4_K and Q6_K take 16 weight rows a zmm, 8
    a ymm, from 4 activation rows on, 6 or 2 a pass, and the remainders), n_out
    below, at and past the 16-row tile, all against the canonical order."""
    rng = np.random.default_rng(int(t) * 13 + len(scale))
    n_in = 512
    w = kweights(t, 37, n_in, rng, scale)
    x = activations(40, n_in, rng)
    want = canonical_matmul_k(t, w, n_in, x)
    for n_out in (1, 5, 15, 16, 17, 37):
        for n_x in (1, 2, 5, 7, 8, 11, 12, 13, 19, 40):
            for path, got in on_each_path(lambda: matmul(t, w[:n_out], n_in, x[:n_x])).items():
                differ = got.view(np.uint32) != want[:n_x, :n_out].view(np.uint32)
                assert not differ.any(), (path, n_out, n_x, np.argwhere(differ)[0])


def split_matmul(t, w, n_in, x, ranges):
    """Y assembled from one call per output range, as Model::matmul's threads compute it."""
    n_out = w.shape[0]
    y = np.zeros((x.shape[0], n_out), np.float32)
    for o0, o1 in ranges:
        part = Q.matmul(int(t), w.reshape(-1), n_in, n_out, x, o0, o1)
        assert not part[:, :o0].any() and not part[:, o1:].any()
        y[:, o0:o1] = part[:, o0:o1]
    return y


@pytest.mark.parametrize("t", KQUANTS, ids=lambda t: t.name)
def test_thread_split_row_ranges(t):
    """Output ranges [o0, o1) as the pool hands them out: chunks of 16, a short
    last chunk, and a fused job's split that starts off the 16-row grid."""
    rng = np.random.default_rng(29 + int(t))
    n_in = 1024
    w = kweights(t, 45, n_in, rng)
    x = activations(64, n_in, rng)
    splits = ([(0, 16), (16, 32), (32, 45)], [(0, 3), (3, 19), (19, 35), (35, 45)], [(0, 45)], [(7, 8), (40, 45)])
    for n_x in (64, 9, 2):
        full = on_each_path(lambda: matmul(t, w, n_in, x[:n_x]))
        assert_same_bits(full)
        for ranges in splits:
            for path, got in on_each_path(lambda: split_matmul(t, w, n_in, x[:n_x], ranges)).items():
                cols = np.concatenate([np.arange(o0, o1) for o0, o1 in ranges])
                np.testing.assert_array_equal(got[:, cols].view(np.uint32), full["scalar"][:, cols].view(np.uint32),
                                              err_msg=f"{path} {ranges} n_x={n_x}")


@pytest.mark.parametrize("t", [G.Q2_K, G.Q3_K, G.Q4_K, G.Q5_K, G.Q6_K], ids=lambda t: t.name)
def test_dequantize_matches_gguf(t):
    rng = np.random.default_rng(5)
    w = kweights(t, 3, 512, rng)
    for row in w:
        got = Q.dequantize(int(t), row, 512)
        want = quants.dequantize(row, t).astype(np.float32).reshape(-1)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_dequantize_q8k():
    x = activations(1, 512, np.random.default_rng(2))[0]
    blocks = np.frombuffer(Q.quantize_q8k(x), Q8K)
    got = Q.dequantize(int(G.Q8_K), np.frombuffer(blocks.tobytes(), np.uint8), 512)
    np.testing.assert_array_equal(got, (blocks["d"][:, None] * blocks["qs"].astype(np.float32)).reshape(-1))


@pytest.mark.parametrize("path", EVERY_PATH)
def test_quantize_q8k_matches_ggml_definition(path):
    _core.set_isa(path)
    rng = np.random.default_rng(9)
    x = (rng.standard_normal(QK_K * 24) * np.repeat(10.0 ** rng.uniform(-20, 4, 24), QK_K)).astype(np.float32)
    x[:QK_K] = 0  # all zero: d = 0, bsums = 0
    x[QK_K:2 * QK_K] = rng.choice([-3.0, 3.0, 1.5, -1.5], QK_K)  # ties for the first largest |x|
    x[2 * QK_K + 7] = -50.0  # the largest |x| always quantizes to -127 (here with d > 0)
    x[3 * QK_K + 40] = 60.0
    x[3 * QK_K + 200] = -60.0  # two largest |x| of both signs: the first one sets the sign
    got = np.frombuffer(Q.quantize_q8k(x), Q8K)
    assert got.tobytes() == q8k_numpy(x).tobytes()
    assert got[0]["d"] == 0 and not got[0]["qs"].any() and not got[0]["bsums"].any()
    assert got[2]["qs"][7] == -127 and got[2]["d"] > 0
    assert got["qs"].min() >= -127


def test_kquant_rows_must_be_whole_super_blocks():
    with pytest.raises(ValueError, match="Q6_K rows need a multiple of 256 elements, got 640"):
        Q.matmul(int(G.Q6_K), np.zeros(210 * 3, np.uint8), 640, 1, np.zeros((1, 640), np.float32))
    with pytest.raises(ValueError, match="multiple of 256"):
        Q.quantize_q8k(np.zeros(128, np.float32))
