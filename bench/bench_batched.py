"""Aggregate decode speed with B sequences decoding in one forward step.

    python bench/bench_batched.py [-m MODEL] [--threads 2] [--prompt 128] [--gen 64] [--batch 1,4,8]

Each sequence gets its own 128-token prompt, then all B decode one token per
step together (the native forward takes several sequences per step and reads
every weight once for all of them), like llama-batched-bench's aggregate
decode. This measures the batched kernels; scheduling many requests onto such
steps is issue 6's scheduler.
"""
from __future__ import annotations

import argparse
import statistics


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--batch", default="1,4,8")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()

    import ctxengine as ce
    from ctxengine.bench.speed import measure_batched

    eng = ce.load(args.model, threads=args.threads).engine
    print(f"{eng.name}: {args.threads} threads, {args.prompt}-token prompts, {args.gen} generated, median of {args.reps}")
    for b in [int(x) for x in args.batch.split(",")]:
        rates = [measure_batched(eng, b, args.prompt, args.gen) for _ in range(args.reps)]
        print(f"  {b} sequences: {statistics.median(rates):7.1f} tok/s aggregate")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
