"""Prefill and decode speed, ours and llama.cpp's, alternated in one run.

    python bench/bench_core.py [-m MODEL] [--threads 1,2] [--rounds 5] [--prompt 512] [--gen 128] [--context 16]
        [--llama-python /path/to/venv/bin/python] [--ik-python /path/to/venv/bin/python] [--isa avx2]
        [--no-avx-vnni] [--json]

Prefill: a 512-token prompt into an empty context (like llama-bench pp512).
Decode: 128 single-token steps after a short prompt (like tg128), or after
--context tokens (thousands: decode over a long KV, each engine's K and V
read every step; the read rate printed then counts the weights alone).

Each round measures, for every thread count, ours, then llama.cpp, then
ik_llama.cpp, then this machine's memory read bandwidth
(ctxengine.bench.facts.read_bandwidth), each engine in a fresh process that warms up
before it measures; the rounds alternate (ours, llama.cpp, ik_llama.cpp, ours,
...) so a load that comes and goes on a shared machine falls on all of them,
and which engine opens a round rotates (facts.round_order).
Medians over the rounds are reported, with their spread, and ratios only
between figures of this run. llama.cpp is measured when `llama_cpp` is
importable here, or under --llama-python / $CTX_LLAMA_PYTHON (a venv with
`pip install llama-cpp-python`; it needs no ctxengine); ik_llama.cpp likewise
when `ik_llama_cpp` is importable here, or under --ik-python / $CTX_IK_PYTHON
(`pip install ik-llama-cpp-python`; bench/bench_ik.py runs it with its
run-time repacking and flash attention).

Printed with the figures: the date, CPU model and SIMD flags, the SIMD path
each engine ran (ours: ctxengine._core.active_isa(); the peers: their system
info), the thread count, and the read rate decode reached (bytes of weights
per token x tokens/s) as a fraction of the bandwidth probe.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYS = ("prefill_tps", "decode_tps")


def ours(path: str, threads: int, n_prompt: int, n_gen: int, context: int, isa: str | None = None,
         vnni: bool = True) -> dict:
    from ctxengine import _core
    from ctxengine.bench.speed import measure_ours

    if isa:
        _core.set_isa(isa)  # e.g. the AVX2 path on an AVX-512 machine
    if not vnni:
        _core.quant.set_avx2_vnni(False)  # the AVX2 path's prefill as on a CPU without AVX-VNNI

    r = measure_ours(path, threads, n_prompt, n_gen, reps=1, batches=(), context=context)  # warms up first
    path_name = _core.active_isa()
    if path_name == "avx2" and _core.quant.avx2_vnni():
        path_name += "+avx_vnni"
    return {**{k: r[k] for k in KEYS}, "isa": path_name}


def llama(path: str, threads: int, n_prompt: int, n_gen: int, context: int) -> dict:
    # llama.cpp's venv need not have ctxengine installed: its measuring module
    # is self-contained, so load it by path.
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_llama", os.path.join(REPO, "ctxengine", "bench", "llama.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    r = mod.measure_llama(path, threads, n_prompt, n_gen, reps=1, batches=(), context=context)
    return {**{k: r[k] for k in KEYS}, "isa": r["system_info"]}


def ik(path: str, threads: int, n_prompt: int, n_gen: int, context: int) -> dict:
    # Loaded by path, like llama.cpp's: ik_llama.cpp's venv need not have ctxengine.
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_ik", os.path.join(REPO, "bench", "bench_ik.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    r = mod.measure_ik(path, threads, n_prompt, n_gen, context=context)
    return {**{k: r[k] for k in KEYS}, "isa": r["system_info"]}


# engine name -> (child --engine value, the module a venv must import, its --flag's attribute, env var)
PEERS = {"llama.cpp": ("llama", "llama_cpp", "llama_python", "CTX_LLAMA_PYTHON"),
         "ik_llama.cpp": ("ik", "ik_llama_cpp", "ik_python", "CTX_IK_PYTHON")}


def peer_python(args, name: str) -> str | None:
    """The Python that runs peer `name`: its flag, this one when it imports the peer, or its env var."""
    _, module, attr, env = PEERS[name]
    if getattr(args, attr):
        return getattr(args, attr)
    import importlib.util

    return sys.executable if importlib.util.find_spec(module) else os.environ.get(env)


def run_rounds(args, threads: list[int], peers: dict[str, str]) -> dict:
    """{engine: {threads: [per-round result]}} and {"bandwidth": {threads: [bytes/s]}}."""
    from ctxengine.bench.facts import read_bandwidth, round_order

    def child(python: str, engine: str, t: int) -> dict:
        cmd = [python, os.path.abspath(__file__), "--engine", engine, "-m", args.model, "--threads", str(t),
               "--prompt", str(args.prompt), "--gen", str(args.gen), "--context", str(args.context)]
        cmd += ["--isa", args.isa] if args.isa else []
        cmd += ["--no-avx-vnni"] if args.no_avx_vnni and engine == "ours" else []
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"bench_core: {engine} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    engines = [("ours", sys.executable, "ours")] + [(name, py, PEERS[name][0]) for name, py in peers.items()]
    out: dict = {name: {t: [] for t in threads} for name, _, _ in engines}
    out["bandwidth"] = {t: [] for t in threads}
    for r in range(args.rounds):
        for t in threads:
            for name, python, engine in round_order(engines, r):
                out[name][t].append(child(python, engine, t))
            out["bandwidth"][t].append(read_bandwidth(t, reps=3))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    return out


def summarize(runs: dict, threads: list[int]) -> dict:
    """Medians (and min, max) per engine, thread count and metric."""
    summary: dict = {}
    for engine, by_t in runs.items():
        if engine == "bandwidth":
            continue
        summary[engine] = {t: {k: spread([r[k] for r in rs]) for k in KEYS} | {"isa": rs[0]["isa"]}
                           for t, rs in by_t.items()}
    summary["bandwidth"] = {t: spread(v) for t, v in runs["bandwidth"].items()}
    # Each round's ours / peer: neighbours in time share the machine's load.
    summary["ratio"] = {peer: {t: {k: spread([a[k] / b[k] for a, b in zip(runs["ours"][t], runs[peer][t])])
                                   for k in KEYS} for t in threads}
                        for peer in PEERS if peer in runs}
    return summary


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def print_report(args, s: dict, threads: list[int], weight_bytes: int, facts: dict) -> None:
    from ctxengine.bench.facts import describe_decode, describe_machine

    print(f"model {os.path.basename(args.model)} ({weight_bytes / 1e6:.1f} MB of weights read per decode token); "
          f"prompt {args.prompt}, gen {args.gen} after {args.context} tokens; "
          f"medians of {args.rounds} alternated rounds (min-max)")
    print(describe_machine(facts) + f" at the start, {facts['load_average_after'][0]:.1f} at the end")
    print(f"our path: {s['ours'][threads[0]]['isa']}")
    for peer in s["ratio"]:
        print(f"{peer} system info: {s[peer][threads[0]]['isa']}")
    cell = lambda m: f"{m['median']:.1f} ({m['min']:.0f}-{m['max']:.0f})"  # noqa: E731
    print(f"{'threads':>7} {'metric':>12} {'ours':>20} {'peer':>13} {'peer (tok/s)':>20} {'ratio of medians':>16} "
          f"{'rounds ratios':>20}")
    for t in threads:
        for key in KEYS:
            a = s["ours"][t][key]
            if not s["ratio"]:
                print(f"{t:>7} {key:>12} {cell(a):>20} {'none':>13}")
            for peer, ratios in s["ratio"].items():
                b, r = s[peer][t][key], ratios[t][key]
                print(f"{t:>7} {key:>12} {cell(a):>20} {peer:>13} {cell(b):>20} {a['median'] / b['median']:15.2f}x "
                      f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})")
    for t in threads:
        bw = s["bandwidth"][t]
        print(f"memory read probe, {t} threads: {bw['median'] / 1e9:.1f} GB/s "
              f"({bw['min'] / 1e9:.1f}-{bw['max'] / 1e9:.1f}); decode read rate against it:")
        for engine in ("ours", *PEERS):
            if engine in s:
                print("  " + describe_decode(engine, s[engine][t]["decode_tps"]["median"], weight_bytes, bw["median"]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None, help="a .gguf path or a known name (default: packaged SmolLM2)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--context", type=int, default=16, help="the tokens before the timed decode steps")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--llama-python", default=None)
    ap.add_argument("--ik-python", default=None, help="a Python with ik-llama-cpp-python (module ik_llama_cpp)")
    ap.add_argument("--isa", default=None, choices=["scalar", "avx2", "avx512"], help="our path (default: the best)")
    ap.add_argument("--no-avx-vnni", action="store_true",
                    help="our AVX2 path's prefill without AVX-VNNI, as on a CPU that lacks it")
    ap.add_argument("--engine", choices=["ours", "llama", "ik"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]

    if args.engine:  # one measurement, in a child process (llama.cpp's may lack ctxengine)
        mine = lambda *a: ours(*a, isa=args.isa, vnni=not args.no_avx_vnni)  # noqa: E731
        fn = {"ours": mine, "llama": llama, "ik": ik}[args.engine]
        print(json.dumps(fn(args.model, threads[0], args.prompt, args.gen, args.context)))
        return 0

    from ctxengine.bench.facts import machine_facts, weight_bytes_per_token
    from ctxengine.engine.registry import resolve_model

    args.model = str(resolve_model(args.model))
    weight_bytes = weight_bytes_per_token(args.model)
    facts = machine_facts(threads[-1])  # the date and load average the run starts at
    facts.pop("threads")  # each figure says its own
    peers = {name: py for name in PEERS if (py := peer_python(args, name))}
    s = summarize(run_rounds(args, threads, peers), threads)
    facts["isa"] = s["ours"][threads[0]]["isa"]  # the path the measuring processes ran
    facts["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        print(json.dumps({"model": os.path.basename(args.model), "weight_bytes_per_token": weight_bytes,
                          "decode_context": args.context,
                          "machine": facts, **s}, indent=1))
        return 0
    print_report(args, s, threads, weight_bytes, facts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
