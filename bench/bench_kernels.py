"""Matmul kernel throughput on Gemma 3 270M's shapes (Q4_K_M file) and SmolLM2-135M's
(Q4_1), per ISA path.

    python bench/bench_kernels.py [--rows 1,4,16,64] [--threads 1,2] [--isa avx512] [--seconds 0.3]

GOP/s counts 2 * n_in * n_out * rows operations (a multiply and an add per
weight per activation row) per second of ctxengine._core.quant.matmul, which
includes quantizing the activation rows (Q8A or Q8K). With 2 threads the
weight rows are split in two halves, each matmul in its own Python thread
(the binding releases the GIL), as the model's thread pool splits them.
--clock cpu (the default) divides by the process's CPU time per thread
instead of wall time: on a machine shared with other work it measures the
kernel, not the time slices it was given (--clock wall for the plain figure).
Weights are random blocks with sane scales; the speed does not depend on values.
"""
from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ctxengine import _core

Q = _core.quant
# (name, ggml type, n_in, n_out): the matmuls of one Gemma 3 270M layer and the tied output,
# then SmolLM2's.
SHAPES = [
    ("attn_q  Q5_0", 6, 640, 1024),
    ("ffn_up  Q5_0", 6, 640, 2048),
    ("attn_v  Q8_0", 8, 640, 256),
    ("attn_o  Q4_K", 12, 1024, 640),
    ("ffn_dn  Q4_K", 12, 2048, 640),
    ("ffn_dn  Q6_K", 14, 2048, 640),
    ("output  Q8_0", 8, 640, 262144),
    ("output  x8", 8, 640, 262144),  # the same with its one-row copy (quant.h repack_x8), as the model runs it
    # SmolLM2-135M Q4_1: the FFN's up / gate and down projections.
    ("smol_up Q4_1", 3, 576, 1536),
    ("smol_dn Q4_1", 3, 1536, 576),
    ("smol_up x8", 3, 576, 1536),  # with their one-row copies
    ("smol_dn x8", 3, 1536, 576),
]


def random_weights(t: int, n_in: int, n_out: int, rng) -> np.ndarray:
    w = rng.integers(0, 256, n_out * Q.row_bytes(t, n_in), dtype=np.uint8)
    # Scales are the block's leading (or trailing) halves; any finite values do,
    # so overwrite every 16-bit word that could be a scale with a small half float.
    words = w.view(np.uint16)
    words[:] = np.where(words & 0x7C00 == 0x7C00, 0x2000, words)  # no Inf / NaN halves
    return w


POOL = ThreadPoolExecutor(2)


def run(t, w, n_in, n_out, x, threads, x8=None):
    if threads == 1:
        return Q.matmul(t, w, n_in, n_out, x, x8=x8)
    half = n_out // 2
    return list(POOL.map(lambda r: Q.matmul(t, w, n_in, n_out, x, r[0], r[1], x8=x8), [(0, half), (half, n_out)]))


def gops(t, n_in, n_out, rows, threads, seconds, rng, clock="cpu", x8=False) -> float:
    w = random_weights(t, n_in, n_out, rng)
    P = Q.repack_x8(t, w, n_in, n_out) if x8 else None
    x = rng.standard_normal((rows, n_in)).astype(np.float32)
    run(t, w, n_in, n_out, x, threads, P)  # warm up (and page the weights in)
    now = (lambda: time.process_time() / threads) if clock == "cpu" else time.perf_counter
    n, start = 0, now()
    while True:
        run(t, w, n_in, n_out, x, threads, P)
        n += 1
        elapsed = now() - start
        if elapsed >= seconds:
            return 2.0 * n_in * n_out * rows * n / elapsed / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,2,4,8,16,32,64")
    ap.add_argument("--threads", default="1,2", help="1 and/or 2")
    ap.add_argument("--isa", default=_core.detect_isa(), choices=["scalar", "avx2", "avx512"])
    ap.add_argument("--seconds", type=float, default=0.3)
    ap.add_argument("--clock", default="cpu", choices=["cpu", "wall"])
    ap.add_argument("--only", default="", help="comma-separated substrings of shape names to run")
    ap.add_argument("--tiles", default=Q.prefill_tiles(),
                    help="the AVX-512 prefill's tile forms to run, alternated: ymm and/or zmm (same bits; "
                         "default: the one this CPU gets)")
    args = ap.parse_args()
    _core.set_isa(args.isa)
    rows = [int(r) for r in args.rows.split(",")]
    rng = np.random.default_rng(0)
    tiles = args.tiles.split(",")
    print(f"ISA path: {args.isa}; AVX-512 prefill tiles: {', '.join(tiles)}; "
          f"GOP/s (2 * n_in * n_out * rows / s, {args.clock} clock)")
    print(f"{'shape':<14}{'n_in':>6}{'n_out':>8}{'thr':>4}{'tiles':>6}" + "".join(f"{'r=' + str(r):>8}" for r in rows))
    for name, t, n_in, n_out in SHAPES:
        if args.only and not any(s in name for s in args.only.split(",")):
            continue
        for threads, tile in ((int(s), tile) for s in args.threads.split(",") for tile in tiles):
            Q.set_prefill_tiles(tile)
            cells = []
            for r in rows:
                if n_out > 100_000 and r > 32:  # the output matmul runs for decode rows only (one a sequence)
                    cells.append(f"{'-':>8}")
                    continue
                rate = gops(t, n_in, n_out, r, threads, args.seconds, rng, args.clock, x8=name.endswith(" x8"))
                cells.append(f"{rate:8.1f}")
            print(f"{name:<14}{n_in:>6}{n_out:>8}{threads:>4}{tile:>6}" + "".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
