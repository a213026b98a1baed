"""``ctx bench [-m MODEL]``: prefill, decode, batched decode and time to first token.

Like llama-bench's pp512 / tg128 plus aggregate decode at several concurrent
sequences. When `llama_cpp` is importable, llama.cpp is measured on the same
file and threads in the same run and the ratios are printed. ``--json``
prints one object: prefill_tps, decode_tps, batched_decode_tps (keyed by
concurrency), ttft_ms, and the same under "llama.cpp" when measured.

This module imports neither the native core nor numpy at import time, so the
llama.cpp half can run in an environment that has only llama-cpp-python
(bench/bench_core.py does that).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from .common import add_model_arguments

TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
        "combined a screw press with movable metal type. Books became cheaper, literacy spread, and "
        "ideas travelled faster than ever before across Europe and then the world. ")


def prompt_ids(tokenize, n: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < n:
        ids += tokenize(TEXT)
    return ids[:n]


def measure_ours(path, threads: int, n_prompt: int = 512, n_gen: int = 128, reps: int = 3,
                 batches=(1, 4, 8), batch_prompt: int = 128, batch_gen: int = 64) -> dict:
    import numpy as np

    from ..model import load

    model = load(path, threads=threads)
    eng = model.engine
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
            "batched_decode_tps": batched, "ttft_ms": statistics.median(ttft)}


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


def measure_llama(path, threads: int, n_prompt: int = 512, n_gen: int = 128, reps: int = 3,
                  batch_prompt: int = 128) -> dict:
    import ctypes

    import llama_cpp
    import numpy as np

    m = llama_cpp.Llama(str(path), n_threads=threads, n_threads_batch=threads, n_batch=512, n_ubatch=512,
                        n_ctx=n_prompt + n_gen + 64, verbose=False)
    ids = prompt_ids(lambda t: m.tokenize(t.encode(), add_bos=False), n_prompt)
    n_vocab = m.n_vocab()

    def last_logits():
        ptr = llama_cpp.llama_get_logits_ith(m._ctx.ctx, -1)
        return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))

    m.reset()
    m.eval(ids[:32])
    pp, tg, ttft = [], [], []
    for _ in range(reps):
        m.reset()
        t0 = time.perf_counter()
        m.eval(ids)
        pp.append(n_prompt / (time.perf_counter() - t0))
        m.reset()
        m.eval(ids[:16])
        t0 = time.perf_counter()
        for _ in range(n_gen):
            m.eval([int(np.argmax(last_logits()))])
        tg.append(n_gen / (time.perf_counter() - t0))
        m.reset()
        t0 = time.perf_counter()
        m.eval(ids[:batch_prompt])
        int(np.argmax(last_logits()))
        ttft.append((time.perf_counter() - t0) * 1e3)
    return {"prefill_tps": statistics.median(pp), "decode_tps": statistics.median(tg),
            "ttft_ms": statistics.median(ttft)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--reps", type=int, default=3, help="repetitions; medians are reported (default 3)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def main(args: argparse.Namespace) -> int:
    from ..engine.cpu import physical_cores
    from ..engine.registry import resolve_model

    path = resolve_model(args.model)
    threads = args.threads or physical_cores()
    results = {"model": path.name, "threads": threads, **measure_ours(path, threads, reps=args.reps)}
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        pass
    else:
        results["llama.cpp"] = measure_llama(path, threads, reps=args.reps)
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    ref = results.get("llama.cpp", {})
    print(f"{path.name}, {threads} threads, medians of {args.reps}"
          + ("" if ref else "   (llama.cpp not importable: pip install llama-cpp-python to compare)"))
    rows = [("prefill 512 (tok/s)", "prefill_tps"), ("decode 128 (tok/s)", "decode_tps"),
            ("time to first token, 128-token prompt (ms)", "ttft_ms")]
    for label, key in rows:
        ours, theirs = results[key], ref.get(key)
        ratio = "" if theirs is None else f"  llama.cpp {theirs:8.1f}  ratio {ours / theirs if key != 'ttft_ms' else theirs / ours:5.2f}x"
        print(f"{label:<44} {ours:8.1f}{ratio}")
    for b, tps in results["batched_decode_tps"].items():
        print(f"{'aggregate decode, ' + b + ' sequences (tok/s)':<44} {tps:8.1f}")
    return 0
