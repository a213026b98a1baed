"""Prefill, decode, batched decode and time to first token: ``ctx bench``'s measurements.

Like llama-bench's pp512 / tg128 plus aggregate decode at several concurrent
sequences. When `llama_cpp` is importable (here, or in the Python given as
``llama_python``), llama.cpp is measured on the same file and threads in the
same run (llama.py). ``bench`` returns one dict: prefill_tps, decode_tps,
batched_decode_tps (keyed by concurrency), ttft_ms, kv_dtype,
kv_bytes_per_token, machine (date, CPU model, SIMD flags, our SIMD path),
read_bandwidth (bytes/s, facts.py's probe), weight_bytes_per_token, and the
same timings under "llama.cpp" when measured (always with its default f16 KV,
plus its system_info). bench/bench_core.py imports these functions too.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ..errors import CtxError
from ..state.model import load
from .batched import Streams
from .facts import machine_facts, read_bandwidth, weight_bytes_per_token
from .llama import measure_llama, prompt_ids


def bench(path: Path, threads: int, *, reps: int = 3, kv: str = "f16", llama_python: str | None = None) -> dict:
    """Every figure ``ctx bench`` reports, ours and (when measurable) llama.cpp's, with the machine's facts."""
    results = {"model": path.name, "threads": threads, **measure_ours(path, threads, reps=reps, kv=kv)}
    llama = llama_cpp_results(path, threads, reps, llama_python)
    if llama is not None:
        results["llama.cpp"] = llama
    results["machine"] = machine_facts(threads)
    results["read_bandwidth"] = read_bandwidth(threads)  # bytes/s
    results["weight_bytes_per_token"] = weight_bytes_per_token(path)
    return results


def prefill_rate(eng, ids) -> float:
    """Tokens a second of one prompt into a fresh sequence (like llama-bench's pp)."""
    seq = eng.new_sequence()
    t0 = time.perf_counter()
    eng.forward(seq, ids)
    return len(ids) / (time.perf_counter() - t0)


def decode_rate(eng, seq, logits, n_gen: int) -> float:
    """Tokens a second of n_gen greedy single-token steps on seq, whose last logits are
    given (like llama-bench's tg)."""
    tok = int(np.argmax(logits))
    t0 = time.perf_counter()
    for _ in range(n_gen):
        tok = int(np.argmax(eng.forward(seq, [tok])))
    return n_gen / (time.perf_counter() - t0)


def measure_ours(path, threads: int, n_prompt: int = 512, n_gen: int = 128, reps: int = 3,
                 batches=(1, 4, 8), batch_prompt: int = 128, batch_gen: int = 64, kv: str = "f16",
                 context: int = 16) -> dict:
    """Prefill of n_prompt tokens, n_gen decode steps after a prompt of `context` tokens (16:
    like tg128; thousands: decode over a long KV), time to first token, batched decode."""
    model = load(path, threads=threads, kv=kv)
    eng = model.engine
    kv_bytes_per_token = eng.pool.page_bytes / eng.pool.page_tokens
    ids = prompt_ids(eng.tokenize, max(n_prompt, context))
    eng.forward(eng.new_sequence(), ids[:32])  # warm pages, scratch and caches
    pp, tg, ttft = [], [], []
    for _ in range(reps):
        pp.append(prefill_rate(eng, ids[:n_prompt]))
        seq = eng.new_sequence()
        tg.append(decode_rate(eng, seq, eng.forward(seq, ids[:context]), n_gen))
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
    each weight is read once per step (like llama-batched-bench; batched.py)."""
    return Streams(eng, n_seq, n_prompt).decode(n_seq, n_gen).wall


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
    module = Path(__file__).with_name("llama.py")
    try:
        done = subprocess.run([python, "-c", code, str(module), str(path), str(threads), str(reps)],
                              capture_output=True, text=True)
    except OSError as err:  # no such file, not executable: the caller named it, so it hears of it
        raise CtxError(f"cannot run {python} to measure llama.cpp: {err.strerror or err}") from None
    if done.returncode != 0:
        print(f"ctx bench: llama.cpp under {python} failed: {done.stderr.strip().splitlines()[-1:]}",
              file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])
