"""The attention kernels of builds of the native core, alternated: a group of queries over one KV head.

    python bench/bench_attention.py [OLD_core.so NEW_core.so ...] [--isa avx2] [--rounds 3] [--seconds 0.5]

Each round runs every build in a fresh process, its `_core` loaded in place of the installed one (as
bench_batched.py --core does; no build named: the installed one), which times `_core.attn_group` on the
shapes decode and prefill give it: Gemma 3's 4 heads of one row (head size 256) over a 2,000-token global
layer and a 512-key window, two branches' 8 queries, SmolLM2's 3 heads (64) and a prompt's bundle of 12
queries over 512 keys. attn_group scores one page of K and takes the weighted sums of V over every key,
so the figure is mostly the weighted sums (g * n * hd multiply-adds). V lies in one array of n rows (the
model's pages are scattered; the order of the work is the same). Printed: each build's median G MAC/s per
shape over the rounds, and its ratio to the first build's.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

SHAPES = [(4, 2000, 256), (4, 512, 256), (8, 2000, 256), (3, 512, 64), (12, 512, 64)]  # (queries, keys, head size)


def child(core: str, isa: str | None, seconds: float) -> dict[str, float]:
    """G MAC/s of each shape with this build (run in its own process)."""
    import numpy as np

    if core:
        from bench_batched import use_core

        use_core(core)
    from ctxengine import _core

    if isa:
        _core.set_isa(isa)
    rng = np.random.default_rng(0)
    none8, none16 = np.zeros(0, np.int8), np.zeros(0, np.uint16)
    out = {}
    for g, n, hd in SHAPES:
        q = rng.standard_normal((g, hd)).astype(np.float32)
        kt = rng.standard_normal((hd, 16)).astype(np.float16).view(np.uint16)
        p = (rng.random((g, n)) / n).astype(np.float32)
        v = rng.standard_normal((n, hd)).astype(np.float16).view(np.uint16)
        run = lambda: _core.attn_group(q, kt, none8, none16, p, v, none8, none16, n, 1.0)  # noqa: E731
        for _ in range(3):
            run()
        calls, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            run()
            calls += 1
        out[f"g={g} n={n} hd={hd}"] = g * n * hd * calls / (time.perf_counter() - t0) / 1e9
    out["isa"] = _core.active_isa()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cores", nargs="*", help="_core .so files, the first the baseline (default: the installed one)")
    ap.add_argument("--isa", choices=["scalar", "avx2", "avx512"], default=None, help="the path (default: the best)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=0.5, help="timed per shape, build and round")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.isa, args.seconds)))
        return 0
    from ctxengine.bench.facts import describe_machine, machine_facts

    cores = args.cores or [""]
    print(describe_machine(machine_facts(1)))
    got: dict[str, list[dict]] = {c: [] for c in cores}
    for _ in range(args.rounds):
        for core in cores:
            cmd = [sys.executable, __file__, "--child", core, "--seconds", str(args.seconds)]
            cmd += ["--isa", args.isa] if args.isa else []
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            got[core].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"attn_group, 1 thread, G MAC/s, median of {args.rounds} alternated rounds; path {got[cores[0]][0]['isa']}")
    names = [k for k in got[cores[0]][0] if k != "isa"]
    print(f"{'build':>24} " + " ".join(f"{n:>18}" for n in names))
    base = {n: statistics.median(r[n] for r in got[cores[0]]) for n in names}
    for core in cores:
        med = {n: statistics.median(r[n] for r in got[core]) for n in names}
        cells = " ".join(f"{med[n]:7.1f} ({med[n] / base[n]:4.2f}x)".rjust(18) for n in names)
        print(f"{Path(core).name or 'installed':>24} {cells}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
