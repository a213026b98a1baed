"""Prefill with the AVX-512 prefill's two tile forms, alternated in one process.

    python bench/bench_tiles.py [-m MODEL] [--threads 2] [--rounds 4] [--prompt 512]

The zmm tiles hold two (weight row, activation row) pairs a register, the ymm
tiles one (native/kernels/quant/quant_prefill_avx512.cpp); both give the same
bits, and the engine picks one per CPU (zmm where 512-bit units are whole).
Each round prefills the prompt into a fresh context once with each form
(ctxengine._core.quant.set_prefill_tiles between them), so a load that comes
and goes falls on both. Prints the median tok/s of each and their ratio.
"""
from __future__ import annotations

import argparse
import statistics
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2", help="a .gguf path or a known name")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=512)
    args = ap.parse_args()
    import ctxengine as ce
    from ctxengine import _core
    from ctxengine.bench.facts import describe_machine, machine_facts

    if _core.active_isa() != "avx512":
        raise SystemExit(f"bench_tiles: the tile forms are the AVX-512 path's; this CPU runs {_core.active_isa()}")
    facts = machine_facts(args.threads)
    model = ce.load(args.model, threads=args.threads)
    ids = model.tokenize("The quick brown fox jumps over the lazy dog. " * (args.prompt // 8 + 1))[:args.prompt]
    chosen = _core.quant.prefill_tiles()
    rates: dict[str, list[float]] = {"ymm": [], "zmm": []}
    try:
        for r in range(args.rounds):
            for tiles in rates:
                _core.quant.set_prefill_tiles(tiles)
                ctx = model.context(f"tiles-{r}-{tiles}")
                t0 = time.perf_counter()
                ctx.append(ids)
                rates[tiles].append(len(ids) / (time.perf_counter() - t0))
                ctx.delete()
    finally:
        _core.quant.set_prefill_tiles(chosen)
    print(describe_machine(facts))
    print(f"{args.model}: prefill of {len(ids)} tokens, {args.threads} threads, {args.rounds} alternated rounds "
          f"(this CPU's choice: {chosen})")
    med = {k: statistics.median(v) for k, v in rates.items()}
    for tiles, v in rates.items():
        print(f"  {tiles}: {med[tiles]:7.1f} tok/s  ({min(v):.1f}-{max(v):.1f})")
    print(f"  zmm / ymm: {med['zmm'] / med['ymm']:.2f}x")
    model.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
