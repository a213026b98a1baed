"""Aggregate batched decode, ours and llama.cpp's, on each model in one run.

    python bench/bench_batched.py [-m smollm2,gemma3] [--threads 2] [--streams 1,8,16]
        [--prompt 128] [--gen 64] [--branches 8] [--prefix 2000] [--rounds 3]
        [--llama-python /opt/llamavenv/bin/python] [--llama-rounds 1] [--core OLD/_core.so] [--isa avx2]

Streams: B sequences, each with its own 128-token prompt, decode one token a
step together (one native forward a step for all B; like llama-batched-bench's
aggregate decode). Branches: 8 sequences continuing one 2,000-token prefix,
as forks sharing the prefix's pages, and as unrelated contexts each holding
its own copy of the same KV bytes (same arithmetic, nothing shared).
ctxengine/bench/batched.py has the measurements.

Prompts are prefilled once; each round then decodes every kind once, in turn,
from fresh forks, so the kinds see the same load, in an order rotated each
round (facts.round_order). Medians and per-round ranges are printed, and each
ratio is taken within a round. The tokens must not
depend on the batch: a stream's tokens are the same at every B, and a
branch's the same shared or not (checked).

llama.cpp (llama-cpp-python, here or in the Python given by --llama-python, in
a child process) decodes the same sequences afterwards: streams as
ctxengine/bench/llama.py's measure_llama_batched, branches with the prefix
copied by llama_memory_seq_cp (shared) or prefilled once per sequence.

--core loads another build of ctxengine._core (a copy of an older one kept
aside) in place of the installed one, for before/after figures.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location('bench_llama', sys.argv[1])
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
import llama_cpp
a = json.loads(sys.argv[2])
m = llama_cpp.Llama(a['path'], n_threads=a['threads'], n_threads_batch=a['threads'], n_ctx=256, verbose=False)
streams = {str(b): [] for b in a['streams']}
for _ in range(a['rounds']):
    for b in a['streams']:
        streams[str(b)].append(mod.measure_llama_batched(m, a['threads'], b, a['prompt'], a['gen']))
del m
branches = (mod.measure_llama_branches(a['path'], a['threads'], a['branches'], a['prefix'], a['gen'])
            if a['branches'] else None)
print(json.dumps({'streams': streams, 'branches': branches}))
"""


def use_core(path: str) -> None:
    """Import this build of the native core as ctxengine._core (before ctxengine itself is imported)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ctxengine._core", path)
    core = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(core)
    sys.modules["ctxengine._core"] = core


def model_path(spec: str) -> Path:
    cached = Path.home() / ".cache" / "ctxengine-tests" / "gemma-3-270m-q4_k_m.gguf"
    if spec == "gemma3" and cached.exists():
        return cached  # where the tests keep it
    from ctxengine.engine.registry import resolve_model

    return Path(resolve_model(spec))


def spread(xs: list[float], fmt: str = "7.1f") -> str:
    tight = "." + fmt.split(".")[1]  # the range without the median's padding
    return f"{statistics.median(xs):{fmt}} ({min(xs):{tight}}-{max(xs):{tight}})"


def measure_ours(path: Path, args, streams: list[int]) -> dict:
    import ctxengine as ce
    from ctxengine.bench.batched import Branches, Streams
    from ctxengine.bench.facts import round_order

    model = ce.load(str(path), threads=args.threads)
    eng = model.engine
    st = Streams(eng, max(streams), args.prompt)
    br = Branches(eng, args.branches, args.prefix) if args.branches else None  # --branches 0: streams only
    st.decode(max(streams), 4)  # warm-up: scratch sized, pages touched
    if br:
        br.decode(True, 4)
    kinds = [str(b) for b in streams] + (["shared", "unrelated"] if br else [])
    wall: dict[str, list[float]] = {k: [] for k in kinds}
    cpu: dict[str, list[float]] = {k: [] for k in kinds}

    def record(kind: str, got) -> list[list[int]]:
        wall[kind].append(got.wall)
        cpu[kind].append(got.cpu)
        return got.tokens

    for rnd in range(args.rounds):
        toks = {}
        for kind in round_order(kinds, rnd):
            if kind in ("shared", "unrelated"):
                toks[kind] = record(kind, br.decode(kind == "shared", args.gen))
            else:
                toks[kind] = record(kind, st.decode(int(kind), args.gen))
        alone = toks[str(streams[0])][0]
        for b in streams[1:]:
            assert toks[str(b)][0] == alone, "a stream's tokens must not depend on how many share its steps"
        assert toks.get("shared") == toks.get("unrelated"), \
            "a branch's tokens must not depend on whether its pages are shared"
    model.close()
    return {"wall": wall, "cpu": cpu}


def measure_llama(path: Path, args, streams: list[int]) -> dict | None:
    module = Path(__file__).resolve().parents[1] / "ctxengine" / "bench" / "llama.py"
    a = {"path": str(path), "threads": args.threads, "streams": streams, "prompt": args.prompt, "gen": args.gen,
         "rounds": args.llama_rounds, "branches": args.branches, "prefix": args.prefix}
    if shutil.which(args.llama_python) is None:
        print(f"  llama.cpp skipped: no Python {args.llama_python} (--llama-python)", file=sys.stderr)
        return None
    done = subprocess.run([args.llama_python, "-c", CHILD, str(module), json.dumps(a)], capture_output=True, text=True)
    if done.returncode != 0:
        print(f"  llama.cpp failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(ours: dict, streams: list[int]) -> None:
    wall, cpu = ours["wall"], ours["cpu"]
    one = str(streams[0])

    def vs(rates: dict, kind: str, base: str) -> str:
        return f"{spread([x / y for x, y in zip(rates[kind], rates[base])], '.2f')}x"

    for b in map(str, streams):
        line = f"  {b:>2} streams: {spread(wall[b])} tok/s {'' if b == one else vs(wall, b, one) + ' 1 stream'}"
        print(line + f"  | per CPU-second {spread(cpu[b])} {'' if b == one else vs(cpu, b, one)}")
    if "shared" not in wall:
        return
    print(f"  branches shared:    {spread(wall['shared'])} tok/s {vs(wall, 'shared', 'unrelated')} unrelated"
          f"  | per CPU-second {spread(cpu['shared'])} {vs(cpu, 'shared', 'unrelated')}")
    print(f"  branches unrelated: {spread(wall['unrelated'])} tok/s"
          f"  | per CPU-second {spread(cpu['unrelated'])}")


def report_llama(ours: dict, llama: dict, streams: list[int]) -> None:
    wall = ours["wall"]
    for b in map(str, streams):
        lb = llama["streams"][b]
        ours_vs = statistics.median(wall[b]) / statistics.median(lb)
        print(f"  llama.cpp {b:>2} streams: {spread(lb)} tok/s (ours {ours_vs:.2f}x)")
    lb = llama.get("branches")
    if not lb or "shared" not in wall:
        return
    print(f"  llama.cpp branches: shared {lb['shared']:.1f}, unrelated {lb['unrelated']:.1f} tok/s "
          f"({lb['shared'] / lb['unrelated']:.2f}x; ours {statistics.median(wall['shared']) / lb['shared']:.2f}x "
          f"and {statistics.median(wall['unrelated']) / lb['unrelated']:.2f}x llama.cpp's)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--models", default="smollm2,gemma3")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--streams", default="1,8,16")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--branches", type=int, default=8)
    ap.add_argument("--prefix", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--llama-python", default="/opt/llamavenv/bin/python", help="'' to skip llama.cpp")
    ap.add_argument("--llama-rounds", type=int, default=1, help="llama.cpp's rounds (slow under load)")
    ap.add_argument("--core", default=None, help="a _core .so to use instead of the installed one")
    ap.add_argument("--isa", choices=["scalar", "avx2", "avx512"], default=None, help="the path (default: the best)")
    args = ap.parse_args()
    if args.core:
        use_core(args.core)
    if args.isa:
        from ctxengine import _core

        _core.set_isa(args.isa)

    from ctxengine.bench.facts import describe_machine, machine_facts

    streams = [int(x) for x in args.streams.split(",")]
    print(describe_machine(machine_facts(args.threads)) + (f"; core {args.core}" if args.core else "")
          + (f"; path forced: {args.isa}" if args.isa else ""))
    print(f"{args.threads} threads; streams: {args.prompt}-token prompts; branches: {args.branches} on a "
          f"{args.prefix}-token prefix; {args.gen} tokens decoded each; median (range) of {args.rounds} rounds")
    for spec in args.models.split(","):
        path = model_path(spec)
        ours = measure_ours(path, args, streams)
        print(f"{path.name}:")
        report(ours, streams)
        sys.stdout.flush()
        llama = measure_llama(path, args, streams) if args.llama_python else None
        if llama:
            report_llama(ours, llama, streams)
    with open("/proc/loadavg") as f:
        print(f"load average at the end: {f.read().split()[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
