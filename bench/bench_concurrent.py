"""Aggregate speed of N Python threads generating at once through the public API.

    python bench/bench_concurrent.py [-m MODEL] [--threads 2] [--clients 8] [--gen 64]

Each client has its own context and prompt and calls ``generate``; the model's
scheduler batches their forward steps together. Compared with the same work
done one client after another, after a warm-up of both; the tokens must be
identical either way, and the forward rows the scheduler ran (its history:
decode rows and prompt tokens per step) the same.
"""
from __future__ import annotations

import argparse
import threading
import time


def rows(sched) -> tuple[int, int, int, int]:
    """(steps, decode rows, prompt tokens, steps with a decode row) since its history was cleared."""
    hist = list(sched.history)
    if len(hist) == sched.history.maxlen:
        raise SystemExit("the scheduler's history overflowed: use fewer clients or tokens")
    return len(hist), sum(d for d, _ in hist), sum(p for _, p in hist), sum(1 for d, _ in hist if d)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--gen", type=int, default=64)
    args = ap.parse_args()

    import ctxengine as ce
    from ctxengine.bench.facts import describe_machine, machine_facts

    model = ce.load(args.model, threads=args.threads)
    prompts = [f"Story number {i}: once upon a time, in a land of {w}," for i, w in
               enumerate(["mountains", "rivers", "deserts", "forests", "islands", "cities", "caves", "plains"] * 4)]
    prompts = prompts[: args.clients]

    def run(i, out, n_gen=args.gen):
        c = model.context(None)
        c.append(prompts[i])
        # Plain decoding: this measures batching (speculation drafts differently alone and in a crowd).
        out[i] = [p.token_id for p in c.generate(n_gen, temperature=0.0, speculative=False)
                  if p.token_id is not None]
        c.delete()

    def at_once(out, n_gen=args.gen):
        threads = [threading.Thread(target=run, args=(i, out, n_gen)) for i in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    # Warm up both ways (weights mapped, caches filled, the scheduler's loop thread
    # started) before anything is timed; then each way once, timed.
    sched = model.engine.scheduler
    run(0, [None] * args.clients, 4)
    at_once([None] * args.clients, 4)

    seq_out = [None] * args.clients
    sched.history.clear()
    t0 = time.perf_counter()
    for i in range(args.clients):
        run(i, seq_out)
    t_seq = time.perf_counter() - t0
    seq_steps = rows(sched)
    par_out = [None] * args.clients
    sched.history.clear()
    t0 = time.perf_counter()
    at_once(par_out)
    t_par = time.perf_counter() - t0
    par_steps = rows(sched)
    n = sum(len(o) for o in par_out)
    assert par_out == seq_out, "concurrent generation must give the same tokens"
    assert par_steps[1:3] == seq_steps[1:3], "both ways must run the same rows"
    print(f"{args.clients} clients x {args.gen} tokens, {args.threads} threads")
    print(describe_machine(machine_facts(args.threads)))
    print(f"  one after another: {n / t_seq:7.1f} tok/s  ({seq_steps[0]} steps)")
    print(f"  all at once:       {n / t_par:7.1f} tok/s  ({t_seq / t_par:.2f}x; {par_steps[0]} shared steps; tokens identical)")
    print(f"  either way the steps ran {par_steps[1]} decode rows and {par_steps[2]} prompt tokens "
          f"(scheduler history); at once, {par_steps[1] / max(1, par_steps[3]):.1f} decode rows a step "
          f"in the {par_steps[3]} steps that decoded")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
