"""``ctx bench [-m MODEL]``: prefill, decode, batched decode and time to first token,
side by side with llama.cpp when it is importable; the measuring is
ctxengine/bench/speed.py's. ``--json`` prints its dict as one object.
"""
from __future__ import annotations

import argparse
import json
import os

from .common import add_model_arguments

# The tests' name for it (tests/llamacpp.py, README.md) first, then bench/*.py's (which ctx bench read alone).
LLAMA_PYTHON_VARS = ("CTX_LLAMACPP_PYTHON", "CTX_LLAMA_PYTHON")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--reps", type=repetitions, default=3, help="repetitions; medians are reported (default 3)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--llama-python", metavar="PY", default=None,
                   help="a Python with llama-cpp-python to measure llama.cpp in (default: $CTX_LLAMACPP_PYTHON, "
                        "as the tests read it, else $CTX_LLAMA_PYTHON, as bench/*.py read it; else this one "
                        "if it has llama_cpp)")


def repetitions(text: str) -> int:
    """``--reps``: at least one, for there to be a median (argparse names the option when this raises)."""
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {n}")
    return n


def llama_python(given: str | None) -> str | None:
    """The interpreter to measure llama.cpp in, checked before any measuring starts: a path
    or name that runs nothing is the user's to hear of in one line, naming where it came from."""
    import shutil

    from ..errors import CtxError

    where = "--llama-python"
    if given is None:
        where, given = next(((f"${var}", os.environ[var]) for var in LLAMA_PYTHON_VARS if os.environ.get(var)),
                            (None, None))
    if given is None:
        return None
    found = shutil.which(given)
    if found is None:
        if os.sep not in given:
            why = "no such command on $PATH"
        else:
            why = "not an executable file" if os.path.exists(given) else "no such file"
        raise CtxError(f"{where} {given}: {why} (it should name a Python that has llama-cpp-python)")
    return found


def main(args: argparse.Namespace) -> int:
    from ..bench.facts import describe_decode, describe_machine
    from ..bench.speed import bench
    from ..engine.cpu import physical_cores
    from ..engine.registry import resolve_model

    python = llama_python(args.llama_python)
    path = resolve_model(args.model)
    threads = args.threads or physical_cores()
    results = bench(path, threads, reps=args.reps, kv=args.kv, llama_python=python)
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    ref = results.get("llama.cpp", {})
    print(f"{path.name}, {threads} threads, {args.kv} KV ({results['kv_bytes_per_token'] / 1e3:.1f} KB/token), "
          f"medians of {args.reps}"
          + ("" if ref else "   (llama.cpp not importable: pip install llama-cpp-python to compare)"))
    print(describe_machine(results["machine"]))
    if ref:
        print(f"llama.cpp system info: {ref['system_info']}")
    rows = [("prefill 512 (tok/s)", "prefill_tps"), ("decode 128 (tok/s)", "decode_tps"),
            ("time to first token, 128-token prompt (ms)", "ttft_ms")]
    for label, key in rows:
        ours, theirs = results[key], ref.get(key)
        faster = None if theirs is None else ours / theirs if key != "ttft_ms" else theirs / ours
        ratio = "" if theirs is None else f"  llama.cpp {theirs:8.1f}  ratio {faster:5.2f}x"
        print(f"{label:<44} {ours:8.1f}{ratio}")
    for b, tps in results["batched_decode_tps"].items():
        theirs = ref.get("batched_decode_tps", {}).get(b)
        ratio = "" if theirs is None else f"  llama.cpp {theirs:8.1f}  ratio {tps / theirs:5.2f}x"
        print(f"{'aggregate decode, ' + b + ' sequences (tok/s)':<44} {tps:8.1f}{ratio}")
    bw = results["read_bandwidth"]
    print(f"memory read probe, {threads} threads: {bw / 1e9:.1f} GB/s; decode read rate against it:")
    for engine, r in (("ours", results), ("llama.cpp", ref)):
        if r:
            print("  " + describe_decode(engine, r["decode_tps"], results["weight_bytes_per_token"], bw))
    return 0
