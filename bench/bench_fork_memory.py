"""KV memory of branches on Gemma 3: full and released pages they add.

    python bench/bench_fork_memory.py [--branches 8] [--prefix 2000] [--gen 256] [--core OLD/_core.so]

Prefills a --prefix-token prompt, forks --branches sequences from it and
decodes --gen greedy tokens on all of them together (bench_batched.py's
branches: ctxengine/bench/batched.py's Branches and decode_together), then prints the pages the branches added to the page pool and
to the sliding-window trim pool (released pages), and their MiB. --core
loads another build of ctxengine._core, for before/after figures.
"""
from __future__ import annotations

import argparse
import sys

from bench_batched import model_path, use_core


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--branches", type=int, default=8)
    ap.add_argument("--prefix", type=int, default=2000)
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--core", default=None, help="a _core .so to use instead of the installed one")
    args = ap.parse_args()
    if args.core:
        use_core(args.core)
    from ctxengine.bench.batched import Branches, decode_together
    from ctxengine.engine.engine import Engine

    eng = Engine(model_path("gemma3"), threads=2)
    branches = Branches(eng, args.branches, args.prefix)
    full0, trim0 = eng.pool.n_used, eng.trim_pool.n_used
    seqs = [branches.prefix.fork() for _ in branches.first]
    decode_together(eng, list(seqs), branches.first, args.gen)  # it lets go of its list; seqs holds them still
    full, trim = eng.pool.n_used - full0, eng.trim_pool.n_used - trim0
    mib = lambda n, pool: n * pool.page_bytes / 2**20  # noqa: E731
    print(f"{args.branches} branches x {args.gen} tokens on a {args.prefix}-token prefix ({args.core or 'this build'}): "
          f"full pages +{full} ({mib(full, eng.pool):.1f} MiB), released pages +{trim} "
          f"({mib(trim, eng.trim_pool):.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
