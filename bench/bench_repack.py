"""Decode with and without the weights' copies for decode (Engine's repack_budget,
native/models/model.cpp repack_weights): two engines in one process, alternated.

    python bench/bench_repack.py [-m MODEL] [--threads 2] [--rounds 12] [--gen 32] [--isa avx2]
                                 [--streams 1,2,3]

Each round decodes --gen greedy tokens after a 16-token prompt on both engines,
the order swapped every other round; the ratio is taken within each round and
its median and range printed, with each engine's median tokens/s and the bytes
of copies it holds. --streams: also N sequences with their own 64-token
prompts decoding together (ctxengine/bench/batched.py's Streams; aggregate
tokens/s), whose steps are products of N rows. The logits are the same bits
either way (tests/test_x8.py); the bench checks the tokens.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ctxengine import _core
from ctxengine.bench.batched import Streams
from ctxengine.bench.facts import describe_machine, machine_facts
from ctxengine.bench.llama import prompt_ids
from ctxengine.engine.engine import DEFAULT_REPACK_BUDGET, Engine
from ctxengine.state.model import resolve_model


def decode(eng: Engine, seq, logits, n: int) -> tuple[float, list[int]]:
    """Tokens a second of n greedy steps on seq, and the tokens."""
    tokens, t0 = [int(np.argmax(logits))], time.perf_counter()
    for _ in range(n):
        tokens.append(int(np.argmax(eng.forward(seq, [tokens[-1]]))))
    return n / (time.perf_counter() - t0), tokens


def report(rates: dict[int, list[float]], budgets, engines) -> None:
    for b, eng in engines.items():
        print(f"  copies {eng.repacked_bytes / 2**20:6.1f} MiB: {statistics.median(rates[b]):7.1f} tok/s "
              f"({min(rates[b]):.1f}-{max(rates[b]):.1f})")
    ratios = [y / x for x, y in zip(rates[budgets[0]], rates[budgets[1]])]
    print(f"  with / without: {statistics.median(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f} by round)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None, help="a .gguf path or a known name (default: packaged SmolLM2)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--isa", default=None, choices=["scalar", "avx2", "avx512"])
    ap.add_argument("--streams", default="", help="comma-separated stream counts to run as well")
    args = ap.parse_args()
    if args.isa:
        _core.set_isa(args.isa)
    path = resolve_model(args.model)
    budgets = (0, DEFAULT_REPACK_BUDGET)
    engines = {b: Engine(path, threads=args.threads, repack_budget=b) for b in budgets}
    print(describe_machine(machine_facts(args.threads)))
    print(f"{path.name}, {args.threads} threads, path {_core.active_isa()}; {args.gen} tokens after 16, "
          f"{args.rounds} rounds")
    starts = {}
    for b, eng in engines.items():
        seq = eng.new_sequence()
        starts[b] = (seq, eng.forward(seq, prompt_ids(eng.tokenize, 16)))
    rates: dict[int, list[float]] = {b: [] for b in budgets}
    for r in range(args.rounds):
        tokens = {}
        for b in (budgets if r % 2 == 0 else budgets[::-1]):
            seq, logits = starts[b]
            rate, tokens[b] = decode(engines[b], seq.fork(), logits, args.gen)
            rates[b].append(rate)
        if tokens[budgets[0]] != tokens[budgets[1]]:
            raise SystemExit("the copies changed the tokens")
    print(" one sequence:")
    report(rates, budgets, engines)
    counts = [int(n) for n in args.streams.split(",") if n]
    if counts:
        streams = {b: Streams(eng, max(counts), 64) for b, eng in engines.items()}
        for n in counts:
            rates = {b: [] for b in budgets}
            for r in range(args.rounds):
                tokens = {}
                for b in (budgets if r % 2 == 0 else budgets[::-1]):
                    got = streams[b].decode(n, args.gen)
                    rates[b].append(got.wall)
                    tokens[b] = got.tokens
                if tokens[budgets[0]] != tokens[budgets[1]]:
                    raise SystemExit("the copies changed the tokens")
            print(f" {n} streams, aggregate:")
            report(rates, budgets, engines)
    for eng in engines.values():
        eng.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
