"""KV cache dtypes side by side: bytes per token, what fits in 1 GiB, and speed
at a long context (issue 6).

    python bench/bench_kv.py [-m MODEL] [--threads 2] [--context 2000] [--gen 64] [--reps 3] [--json]

For each KV dtype (f16, q8, vq8): the bytes one token's KV takes in a page
(every layer, K and V, scales included), the longest context whose pages fit
in 1 GiB (whole pages of 16 tokens), the prefill speed of a --context-token
prompt, and the decode speed of --gen greedy tokens after it (median of
--reps runs, each on a fork of the prefilled context, so every run decodes at
the same depth; the dtypes take turns within each repetition).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

GIB = 1 << 30
DTYPES = ("f16", "q8", "vq8")


def prefilled(path, kv: str, threads: int, n_context: int):
    """(model, its engine's sequence holding n_context tokens, last logits, prefill tok/s)."""
    import ctxengine as ce
    from ctxengine.bench.llama import prompt_ids

    model = ce.load(path, threads=threads, kv=kv)
    eng = model.engine
    ids = prompt_ids(eng.tokenize, n_context)
    eng.forward(eng.new_sequence(), ids[:32])  # warm pages, scratch and caches
    trunk = eng.new_sequence()
    t0 = time.perf_counter()
    logits = eng.forward(trunk, ids)
    return model, trunk, logits, n_context / (time.perf_counter() - t0)


def measure(path, threads: int, n_context: int, n_gen: int, reps: int) -> list[dict]:
    # The dtypes take turns within each repetition, so a noisy neighbour slows them alike.
    from ctxengine.bench.speed import decode_rate

    runs = {kv: prefilled(path, kv, threads, n_context) for kv in DTYPES}
    rates: dict[str, list[float]] = {kv: [] for kv in DTYPES}
    for _ in range(reps):
        for kv, (model, trunk, logits, _) in runs.items():
            # on a fork of the trunk, so every run decodes at the same depth
            rates[kv].append(decode_rate(model.engine, trunk.fork(), logits, n_gen))
    rows = []
    for kv, (model, trunk, _, prefill) in runs.items():
        pool = model.engine.pool
        rows.append({"kv_dtype": kv, "page_bytes": pool.page_bytes,
                     "kv_bytes_per_token": pool.page_bytes / pool.page_tokens,
                     "max_context_1gib": GIB // pool.page_bytes * pool.page_tokens,
                     "prefill_tps": prefill, "decode_tps": statistics.median(rates[kv])})
        del trunk
        model.close()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=2000, help="tokens before decoding (default 2000)")
    ap.add_argument("--gen", type=int, default=64, help="tokens decoded per run (default 64)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from ctxengine.bench.facts import describe_machine, machine_facts
    from ctxengine.engine.registry import resolve_model

    path = resolve_model(args.model)
    machine = machine_facts(args.threads)
    rows = measure(path, args.threads, args.context, args.gen, args.reps)
    if args.json:
        print(json.dumps({"model": path.name, "threads": args.threads, "context": args.context, "rows": rows,
                          "machine": machine}, indent=1))
        return 0
    base = rows[0]
    print(f"{path.name}: {args.threads} threads; decode of {args.gen} tokens after a {args.context}-token "
          f"prompt, median of {args.reps}")
    print(describe_machine(machine) + f" at the start, {os.getloadavg()[0]:.1f} at the end")
    print(f"{'KV':<5} {'bytes/token':>11} {'tokens/B':>9} {'context in 1 GiB':>17} {'prefill tok/s':>14} "
          f"{'decode tok/s':>13}")
    for r in rows:
        print(f"{r['kv_dtype']:<5} {r['kv_bytes_per_token']:>11,.0f} {base['kv_bytes_per_token'] / r['kv_bytes_per_token']:>8.2f}x "
              f"{r['max_context_1gib']:>17,} {r['prefill_tps']:>14.1f} {r['decode_tps']:>13.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
