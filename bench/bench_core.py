"""Prefill and decode speed, ours and llama.cpp's, side by side in one run.

    python bench/bench_core.py [-m MODEL] [--threads 1,2] [--reps 5]
        [--llama-python /path/to/venv/bin/python]

Prefill: a 512-token prompt into an empty context (like llama-bench pp512).
Decode: 128 single-token steps after a short prompt (like tg128).
Reports medians over --reps runs and the ratio ours / llama.cpp. llama.cpp is
measured when `llama_cpp` is importable here, or under --llama-python (a
separate venv with `pip install llama-cpp-python`), in the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ours(path: str, threads: int, n_prompt: int, n_gen: int, reps: int) -> dict:
    from ctxengine.cli.bench import measure_ours

    r = measure_ours(path, threads, n_prompt, n_gen, reps, batches=())
    return {k: r[k] for k in ("prefill_tps", "decode_tps")}


def llama(path: str, threads: int, n_prompt: int, n_gen: int, reps: int) -> dict:
    # llama.cpp's venv need not have ctxengine installed: its measuring module
    # is self-contained, so load it by path.
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_llama", os.path.join(REPO, "ctxengine", "cli", "bench_llama.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    r = mod.measure_llama(path, threads, n_prompt, n_gen, reps, batches=())
    return {k: r[k] for k in ("prefill_tps", "decode_tps")}


def llama_python(args) -> str | None:
    if args.llama_python:
        return args.llama_python
    try:
        import llama_cpp  # noqa: F401
        return sys.executable
    except ImportError:
        return os.environ.get("CTX_LLAMA_PYTHON")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--llama-python", default=None)
    ap.add_argument("--engine", choices=["ours", "llama"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.model is None:
        from ctxengine.engine.registry import resolve_model
        args.model = str(resolve_model(None))
    threads = [int(t) for t in args.threads.split(",")]

    if args.engine:  # one measurement, as a child process
        fn = ours if args.engine == "ours" else llama
        print(json.dumps({t: fn(args.model, t, args.prompt, args.gen, args.reps) for t in threads}))
        return 0

    def child(python: str, engine: str) -> dict:
        cmd = [python, os.path.abspath(__file__), "--engine", engine, "-m", args.model, "--threads", args.threads,
               "--prompt", str(args.prompt), "--gen", str(args.gen), "--reps", str(args.reps)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        return {int(k): v for k, v in json.loads(out.strip().splitlines()[-1]).items()}

    # Alternate the engines in separate processes so neither warms the other's caches.
    results = {"ours": child(sys.executable, "ours")}
    lp = llama_python(args)
    if lp:
        results["llama.cpp"] = child(lp, "llama")
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    print(f"model {os.path.basename(args.model)}; prompt {args.prompt}, gen {args.gen}, median of {args.reps}")
    print(f"{'threads':>7} {'metric':>12} {'ours':>10} {'llama.cpp':>10} {'ratio':>7}")
    for t in threads:
        for key in ("prefill_tps", "decode_tps"):
            a = results["ours"][t][key]
            b = results.get("llama.cpp", {}).get(t, {}).get(key)
            ratio = f"{a / b:6.2f}x" if b else "   n/a"
            bs = f"{b:10.1f}" if b else "       n/a"
            print(f"{t:>7} {key:>12} {a:10.1f} {bs} {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
