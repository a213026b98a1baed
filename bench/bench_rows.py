"""Few-row matmuls (a verified draft, batched decode) of builds of the native core, alternated.

    python bench/bench_rows.py OLD_core.so NEW_core.so [...] [--rounds 4] [--rows 2,3,4,8,10,12,16]

Prints, per weight shape and row count, the time of r activation rows over the time of one row,
each measured in the same process (so that a shared or throttled machine's state cancels: the
one-row kernel is the same in the builds compared), as the median over --rounds processes per
build, which build goes first rotating (facts.round_order); then each build's gain over the first.
One thread, the shapes of SmolLM2's FFN (Q4_1) and tied output (Q8_0), and Gemma 3's attn_v (Q8_0).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

SHAPES = (("Q4_1 576x1536", 3, 576, 1536), ("Q4_1 1536x576", 3, 1536, 576), ("Q8_0 640x256", 8, 640, 256),
          ("Q8_0 576x49152", 8, 576, 49152))


def child(core: str, rows: list[int]) -> dict[str, float]:
    """Time of r rows / time of 1 row for every shape and r, with this build."""
    import time

    from bench_batched import use_core

    use_core(core)
    import numpy as np
    from bench_kernels import random_weights

    from ctxengine import _core

    rng = np.random.default_rng(0)
    out = {}
    for name, t, n_in, n_out in SHAPES:
        w = random_weights(t, n_in, n_out, rng)
        xs = {r: rng.standard_normal((r, n_in)).astype(np.float32) for r in [1, *rows]}
        best = dict.fromkeys(xs, float("inf"))
        reps = 2 if n_out > 10_000 else 30
        for _ in range(12):  # row counts interleaved, best of 12
            for r, x in xs.items():
                start = time.perf_counter()
                for _ in range(reps):
                    _core.quant.matmul(t, w, n_in, n_out, x)
                best[r] = min(best[r], (time.perf_counter() - start) / reps)
        out.update({f"{name} r{r}": best[r] / best[1] for r in rows})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cores", nargs="*", help="_core .so files, the first the baseline")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--rows", default="2,3,4,8,10,12,16")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    if args.child:
        print(json.dumps(child(args.child, rows)))
        return 0
    if not args.cores:
        ap.error("name the builds to compare")
    from ctxengine.bench.facts import describe_machine, machine_facts, round_order

    print(describe_machine(machine_facts(1)))
    got: dict[str, dict[str, list[float]]] = {c: {} for c in args.cores}
    for i in range(args.rounds):
        for core in round_order(args.cores, i):
            out = subprocess.run([sys.executable, __file__, "--child", core, "--rows", args.rows],
                                 capture_output=True, text=True, check=True, cwd=Path(__file__).parent)
            for key, value in json.loads(out.stdout.splitlines()[-1]).items():
                got[core].setdefault(key, []).append(value)
    base = args.cores[0]
    print("time of r rows / time of 1 row, same process, one thread; median of the rounds (min-max)")
    for key in got[base]:
        cells = [f"{statistics.median(got[c][key]):5.2f} ({min(got[c][key]):.2f}-{max(got[c][key]):.2f})"
                 for c in args.cores]
        gains = [f"{statistics.median(got[base][key]) / statistics.median(got[c][key]):.2f}x" for c in args.cores[1:]]
        print(f"{key:<20}" + "  ".join(cells) + ("  gain " + " ".join(gains) if gains else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
