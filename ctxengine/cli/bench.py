"""``ctx bench [-m MODEL]``: prefill, decode, batched decode and time to first token.

Like llama-bench's pp512 / tg128 plus aggregate decode at several concurrent
sequences. When `llama_cpp` is importable (here, or in the Python given by
``--llama-python`` / ``$CTX_LLAMA_PYTHON``), llama.cpp is measured on the same
file and threads in the same run and the ratios are printed. ``--json``
prints one object: prefill_tps, decode_tps, batched_decode_tps (keyed by
concurrency), ttft_ms, kv_dtype, kv_bytes_per_token, machine (date, CPU model,
SIMD flags, our SIMD path), read_bandwidth (bytes/s, bench_facts' probe),
weight_bytes_per_token, and the same timings under "llama.cpp" when measured
(always with its default f16 KV, plus its system_info).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from .bench_facts import describe_decode, describe_machine, machine_facts, read_bandwidth, weight_bytes_per_token
from .bench_llama import measure_llama, prompt_ids
from .common import add_model_arguments


def measure_ours(path, threads: int, n_prompt: int = 512, n_gen: int = 128, reps: int = 3,
                 batches=(1, 4, 8), batch_prompt: int = 128, batch_gen: int = 64, kv: str = "f16") -> dict:
    import numpy as np

    from ..state.model import load

    model = load(path, threads=threads, kv=kv)
    eng = model.engine
    kv_bytes_per_token = eng.pool.page_bytes / eng.pool.page_tokens
    ids = prompt_ids(eng.tokenize, n_prompt)
    eng.forward(eng.new_sequence(), ids[:32])  # warm pages, scratch and caches
    pp, tg, ttft = [], [], []
    for _ in range(reps):
        seq = eng.new_sequence()
        t0 = time.perf_counter()
        eng.forward(seq, ids)
        pp.append(n_prompt / (time.perf_counter() - t0))
        seq = eng.new_sequence()
        logits = eng.forward(seq, ids[:16])
        t0 = time.perf_counter()
        for _ in range(n_gen):
            logits = eng.forward(seq, [int(np.argmax(logits))])
        tg.append(n_gen / (time.perf_counter() - t0))
        ctx = model.context(None)
        t0 = time.perf_counter()
        ctx.append(ids[:batch_prompt])
        next(iter(ctx.generate(1, temperature=0.0)))
        ttft.append((time.perf_counter() - t0) * 1e3)
        ctx.delete()
    batched = {str(b): measure_batched(eng, b, batch_prompt, batch_gen) for b in batches}
    model.close()
    return {"prefill_tps": statistics.median(pp), "decode_tps": statistics.median(tg),
            "batched_decode_tps": batched, "ttft_ms": statistics.median(ttft),
            "kv_dtype": kv, "kv_bytes_per_token": kv_bytes_per_token}


def measure_batched(eng, n_seq: int, n_prompt: int = 128, n_gen: int = 64) -> float:
    """Aggregate decode tok/s of n_seq sequences (own n_prompt-token prompts)
    decoding together, one native forward step per token for all of them, so
    each weight is read once per step (like llama-batched-bench)."""
    import numpy as np

    ids = prompt_ids(eng.tokenize, n_prompt + n_seq)
    seqs = [eng.new_sequence() for _ in range(n_seq)]
    last = [int(np.argmax(eng.forward(s, ids[k:k + n_prompt]))) for k, s in enumerate(seqs)]
    bufs = [np.empty((1, eng.config.n_vocab), np.float32) for _ in range(n_seq)]
    t0 = time.perf_counter()
    for _ in range(n_gen):
        eng._core.forward([(s, np.array([t], np.int32), buf, False, None) for s, t, buf in zip(seqs, last, bufs)])
        last = [int(np.argmax(buf[0])) for buf in bufs]
    return n_seq * n_gen / (time.perf_counter() - t0)


def llama_cpp_results(path, threads: int, reps: int, python: str | None) -> dict | None:
    """llama.cpp's figures, measured here or in another venv's Python; None if neither has it."""
    if python is None:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            return None
        return measure_llama(path, threads, reps=reps)
    # The other venv has no ctxengine: load the self-contained measuring module by path.
    code = ("import importlib.util, json, sys; "
            "spec = importlib.util.spec_from_file_location('bench_llama', sys.argv[1]); "
            "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod); "
            "print(json.dumps(mod.measure_llama(sys.argv[2], int(sys.argv[3]), reps=int(sys.argv[4]))))")
    module = Path(__file__).with_name("bench_llama.py")
    done = subprocess.run([python, "-c", code, str(module), str(path), str(threads), str(reps)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        print(f"ctx bench: llama.cpp under {python} failed: {done.stderr.strip().splitlines()[-1:]}",
              file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--reps", type=int, default=3, help="repetitions; medians are reported (default 3)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--llama-python", metavar="PY", default=os.environ.get("CTX_LLAMA_PYTHON"),
                   help="a Python with llama-cpp-python to measure llama.cpp in (default: $CTX_LLAMA_PYTHON, "
                        "else this one if it has llama_cpp)")


def main(args: argparse.Namespace) -> int:
    from ..engine.cpu import physical_cores
    from ..engine.registry import resolve_model

    path = resolve_model(args.model)
    threads = args.threads or physical_cores()
    results = {"model": path.name, "threads": threads, **measure_ours(path, threads, reps=args.reps, kv=args.kv)}
    llama = llama_cpp_results(path, threads, args.reps, args.llama_python)
    if llama is not None:
        results["llama.cpp"] = llama
    results["machine"] = machine_facts(threads)
    results["read_bandwidth"] = read_bandwidth(threads)  # bytes/s
    results["weight_bytes_per_token"] = weight_bytes_per_token(path)
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
        ratio = "" if theirs is None else f"  llama.cpp {theirs:8.1f}  ratio {ours / theirs if key != 'ttft_ms' else theirs / ours:5.2f}x"
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
