"""Plain round-to-nearest K-quant quantizers in numpy (gguf has only the
dequantizers), for writing tiny synthetic models. They make valid blocks in
ggml's layouts, not llama.cpp's error-minimizing choice of scales: the tests
compare against the weights as stored, so any valid blocks will do."""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as G

QK_K = 256
E = np.arange(QK_K)


def _safe_div(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b != 0, a / np.where(b != 0, b, 1), 0.0)


def _f16(v):
    return np.asarray(v, np.float64).astype(np.float16)


def _scaled(x, sub, qmax, nscale):
    """Sub-blocks of `sub` with an unsigned range 0..qmax and a min: returns
    (d, dmin as f16 (nb,), integer scales and mins (nb, n_sub) in 0..nscale, q (nb, 256))."""
    xs = x.reshape(len(x), -1, sub)
    lo = np.minimum(xs.min(-1), 0)
    step = (xs.max(-1) - lo) / qmax
    d = _f16(step.max(-1) / nscale)
    dmin = _f16((-lo).max(-1) / nscale)
    sc = np.clip(np.rint(_safe_div(step, d.astype(np.float64)[:, None])), 0, nscale)
    mn = np.clip(np.rint(_safe_div(-lo, dmin.astype(np.float64)[:, None])), 0, nscale)
    scale = (d.astype(np.float64)[:, None] * sc)[..., None]
    shift = (dmin.astype(np.float64)[:, None] * mn)[..., None]
    q = np.clip(np.rint(_safe_div(xs + shift, scale)), 0, qmax)
    return d, dmin, sc.astype(np.int64), mn.astype(np.int64), q.reshape(len(x), QK_K).astype(np.int64)


def _symmetric(x, sub, qmin, qmax, smax):
    """Sub-blocks of `sub` with signed q in qmin..qmax and signed integer scales |sc| <= smax."""
    xs = x.reshape(len(x), -1, sub)
    step = np.take_along_axis(xs, np.abs(xs).argmax(-1)[..., None], -1)[..., 0] / qmin
    d = _f16(np.abs(step).max(-1) / smax)
    sc = np.clip(np.rint(_safe_div(step, d.astype(np.float64)[:, None])), -smax, smax)
    scale = (d.astype(np.float64)[:, None] * sc)[..., None]
    q = np.clip(np.rint(_safe_div(xs, scale)), qmin, qmax)
    return d, sc.astype(np.int64), q.reshape(len(x), QK_K).astype(np.int64)


def _pack_k4_scales(sc, mn):
    out = np.zeros((len(sc), 12), np.int64)
    for j in range(4):
        out[:, j] = sc[:, j] | ((sc[:, j + 4] >> 4) << 6)
        out[:, j + 4] = mn[:, j] | ((mn[:, j + 4] >> 4) << 6)
        out[:, j + 8] = (sc[:, j + 4] & 0xF) | ((mn[:, j + 4] & 0xF) << 4)
    return out


def _pack_bits(values, index, shift, n):
    """OR values << shift into n bytes at index (per block)."""
    out = np.zeros((len(values), n), np.int64)
    for e in range(QK_K):
        out[:, index[e]] |= values[:, e] << shift[e]
    return out


def _u8(*parts):
    return np.concatenate([np.ascontiguousarray(p).view(np.uint8).reshape(len(p), -1) for p in parts], axis=1)


def quantize_blocks(x: np.ndarray, t: G) -> np.ndarray:
    """(n, 256) float32 super-blocks -> (n, block bytes) uint8 of K-quant type t."""
    x = x.astype(np.float64)
    b = lambda v: v.astype(np.uint8)  # noqa: E731
    if t in (G.Q4_K, G.Q5_K):
        d, dmin, sc, mn, q = _scaled(x, 32, 15 if t == G.Q4_K else 31, 63)
        qs = _pack_bits(q & 0xF, 32 * (E // 64) + E % 32, 4 * ((E % 64) // 32), 128)
        if t == G.Q4_K:
            return _u8(d, dmin, b(_pack_k4_scales(sc, mn)), b(qs))
        qh = _pack_bits(q >> 4, E % 32, E // 32, 32)
        return _u8(d, dmin, b(_pack_k4_scales(sc, mn)), b(qh), b(qs))
    if t == G.Q2_K:
        d, dmin, sc, mn, q = _scaled(x, 16, 3, 15)
        qs = _pack_bits(q, 32 * (E // 128) + E % 32, 2 * ((E % 128) // 32), 64)
        return _u8(b(sc | (mn << 4)), b(qs), d, dmin)
    if t == G.Q3_K:
        d, sc, q = _symmetric(x, 16, -4, 3, 31)
        u = q + 4  # low 2 bits, and bit 2 as the hmask bit
        qs = _pack_bits(u & 3, 32 * (E // 128) + E % 32, 2 * ((E % 128) // 32), 64)
        hmask = _pack_bits(u >> 2, E % 32, E // 32, 32)
        s6 = sc + 32
        scales = np.zeros((len(x), 12), np.int64)
        for j in range(16):
            scales[:, j % 8] |= (s6[:, j] & 0xF) << (4 * (j // 8))
            scales[:, 8 + j % 4] |= (s6[:, j] >> 4) << (2 * (j // 4))
        return _u8(b(hmask), b(qs), b(scales), d)
    if t == G.Q6_K:
        d, sc, q = _symmetric(x, 16, -32, 31, 127)
        u = q + 32
        half, quarter, lane = E // 128, (E % 128) // 32, E % 32
        ql = _pack_bits(u & 0xF, 64 * half + 32 * (quarter & 1) + lane, 4 * (quarter >> 1), 128)
        qh = _pack_bits(u >> 4, 32 * half + lane, 2 * quarter, 64)
        return _u8(b(ql), b(qh), sc.astype(np.int8), d)
    if t == G.Q8_K:
        amax = np.abs(x).max(-1)
        d = (amax / 127).astype(np.float32)
        q = np.clip(np.rint(_safe_div(x, d.astype(np.float64)[:, None])), -127, 127).astype(np.int8)
        bsums = q.reshape(len(x), 16, 16).astype(np.int16).sum(-1).astype(np.int16)
        return _u8(d, q, bsums)
    raise ValueError(f"not a K-quant: {t.name}")


def quantize(w: np.ndarray, t: G) -> np.ndarray:
    """(n_out, n_in) floats, n_in % 256 == 0 -> (n_out, row bytes) uint8."""
    blocks = quantize_blocks(w.reshape(-1, QK_K), t)
    return blocks.reshape(w.shape[0], -1)


def dequantize(data: np.ndarray, t: G, n_in: int) -> np.ndarray:
    """(n_out, row bytes) -> (n_out, n_in) float32, through the engine's
    dequantize_row (tests/test_kquants.py holds it to gguf's bit for bit;
    gguf has no Q8_K dequantizer)."""
    from ctxengine import _core
    return np.stack([_core.quant.dequantize(int(t), row, n_in) for row in data])
