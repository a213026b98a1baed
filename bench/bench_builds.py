"""Prefill (or decode) of builds of the native core, alternated: before/after figures on a noisy machine.

    python bench/bench_builds.py OLD_core.so NEW_core.so [...] [-m smollm2|gemma3|PATH] [--rounds 3]
        [--prompts 4] [--prompt 512] [--threads 2] [--isa avx2] [--kv f16|q8|vq8]
        [--decode [--context 16] [--steps 24]] [--streams 16 [--steps 24]]

Keep a build aside before changing the code (`scripts/dev-build.sh && cp build/dev/_core*.so /tmp/old_core.so`),
then compare it with the new one. Each round runs every build in a fresh process, its `_core` loaded in place
of the installed one (as bench_batched.py --core does), which warms up and then times --prompts prompts of
--prompt tokens, each into an empty context; which build goes first rotates (facts.round_order). Printed: each
round's median per build, then each build's median of the rounds and its ratio to the first build's, round by
round. --decode times single-token steps instead: after a prompt of --context tokens (16, a short one; 4000,
decode over a long KV), --prompts runs of --steps steps each. --streams N times batched decode instead: N
sequences, each after its own 128-token prompt, decoding --steps tokens together (ctxengine/bench/batched.py's
Streams, aggregate tok/s), --prompts times from fresh forks.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path


def child(core: str, model: str, threads: int, n_prompt: int, prompts: int, isa: str | None,
          decode: bool = False, context: int = 16, kv: str = "f16", steps: int = 24, streams: int = 0) -> float:
    """The median prefill (decode, batched decode) tok/s of this build (run in its own process)."""
    from bench_batched import model_path, use_core

    use_core(core)
    from ctxengine import _core, load

    if isa:
        _core.set_isa(isa)
    from ctxengine.bench.speed import prefill_rate, prompt_ids

    m = load(model_path(model), threads=threads, kv=kv)
    eng = m.engine
    ids = prompt_ids(eng.tokenize, max(n_prompt, context))
    eng.forward(eng.new_sequence(), ids[:32])  # warm pages, scratch and caches
    if streams:
        from ctxengine.bench.batched import Streams

        together = Streams(eng, streams, 128)
        rates = [together.decode(streams, steps).wall for _ in range(prompts)]
    elif decode:
        rates = [decode_steps(eng, ids[:context], steps) for _ in range(prompts)]
    else:
        rates = [prefill_rate(eng, ids[:n_prompt]) for _ in range(prompts)]
    m.close()
    return statistics.median(rates)


def decode_steps(eng, prompt: list[int], steps: int = 24) -> float:
    """decode_rate of `steps` greedy steps after the prompt."""
    from ctxengine.bench.speed import decode_rate

    seq = eng.new_sequence()
    return decode_rate(eng, seq, eng.forward(seq, prompt), steps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cores", nargs="*", help="_core .so files, the first the baseline")
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--isa", choices=["scalar", "avx2", "avx512"], default=None, help="the path (default: the best)")
    ap.add_argument("--decode", action="store_true", help="time decode steps instead of prefill")
    ap.add_argument("--context", type=int, default=16, help="--decode: the tokens before the timed steps")
    ap.add_argument("--steps", type=int, default=24, help="--decode, --streams: the timed steps a run")
    ap.add_argument("--streams", type=int, default=0, help="time batched decode of this many streams instead")
    ap.add_argument("--kv", choices=["f16", "q8", "vq8"], default="f16", help="the KV dtype")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.model, args.threads, args.prompt, args.prompts, args.isa, args.decode,
                               args.context, args.kv, args.steps, args.streams)))
        return 0
    if not args.cores:
        ap.error("name at least one _core .so")
    from ctxengine.bench.facts import describe_machine, machine_facts, round_order

    print(describe_machine(machine_facts(args.threads)))
    what = f"decode after {args.context} tokens, runs of {args.steps} steps" if args.decode else \
        f"{args.prompt}-token prompts"
    if args.streams:
        what = f"{args.streams} streams after 128-token prompts, runs of {args.steps} steps"
    print(f"{args.model}: {what}, {args.threads} threads, {args.kv} KV, path {args.isa or 'the best'}, "
          f"median of {args.prompts} a round")
    got: dict[str, list[float]] = {c: [] for c in args.cores}
    for r in range(args.rounds):
        for core in round_order(args.cores, r):
            cmd = [sys.executable, __file__, "--child", core, "-m", args.model, "--threads", str(args.threads),
                   "--prompt", str(args.prompt), "--prompts", str(args.prompts), "--kv", args.kv]
            cmd += ["--isa", args.isa] if args.isa else []
            cmd += ["--decode", "--context", str(args.context)] if args.decode else []
            cmd += ["--steps", str(args.steps), "--streams", str(args.streams)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            got[core].append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"  round {r + 1}: " + "  ".join(f"{Path(c).name} {got[c][-1]:.0f}" for c in args.cores))
    base = got[args.cores[0]]
    for core, rates in got.items():
        ratios = [a / b for a, b in zip(rates, base)]
        print(f"{Path(core).name:>24}: {statistics.median(rates):7.0f} tok/s  {statistics.median(ratios):.2f}x "
              f"({min(ratios):.2f}-{max(ratios):.2f}) the first, round by round")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
