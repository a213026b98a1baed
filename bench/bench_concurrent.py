"""Aggregate speed of N Python threads generating at once through the public API.

    python bench/bench_concurrent.py [-m MODEL] [--threads 2] [--clients 8] [--gen 64]

Each client has its own context and prompt and calls ``generate``; the model's
scheduler batches their forward steps together. Compared with the same work
done one client after another; the tokens must be identical either way.
"""
from __future__ import annotations

import argparse
import threading
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--gen", type=int, default=64)
    args = ap.parse_args()

    import ctxengine as ce

    model = ce.load(args.model, threads=args.threads)
    prompts = [f"Story number {i}: once upon a time, in a land of {w}," for i, w in
               enumerate(["mountains", "rivers", "deserts", "forests", "islands", "cities", "caves", "plains"] * 4)]
    prompts = prompts[: args.clients]

    def run(i, out):
        c = model.context(None)
        c.append(prompts[i])
        out[i] = [p.token_id for p in c.generate(args.gen, temperature=0.0) if p.token_id is not None]
        c.delete()

    seq_out = [None] * args.clients
    t0 = time.perf_counter()
    for i in range(args.clients):
        run(i, seq_out)
    t_seq = time.perf_counter() - t0
    par_out = [None] * args.clients
    steps0 = model.engine.scheduler.steps
    threads = [threading.Thread(target=run, args=(i, par_out)) for i in range(args.clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    t_par = time.perf_counter() - t0
    n = sum(len(o) for o in par_out)
    assert par_out == seq_out, "concurrent generation must give the same tokens"
    print(f"{args.clients} clients x {args.gen} tokens, {args.threads} threads")
    print(f"  one after another: {n / t_seq:7.1f} tok/s")
    print(f"  all at once:       {n / t_par:7.1f} tok/s  ({t_seq / t_par:.2f}x; "
          f"{model.engine.scheduler.steps - steps0} shared steps for {n + args.clients} forward requests; tokens identical)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
