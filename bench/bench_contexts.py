"""Fork, snapshot and restore figures on SmolLM2 with an f16 KV (issue 3).

    python bench/bench_contexts.py [-m MODEL] [--threads N] [--json]

Everything is measured in this run, after a warm-up prefill (so the first
touch of the weights' pages is not counted):
* the prefill of a 2,818-token context, then its extension to 8,000 tokens;
* fork of a 2,000- and an 8,000-token context (goal < 1 ms, flat in length);
* full snapshot of the 2,818-token context (empty page-key cache, empty store),
  then an incremental one after 100 more tokens: time and bytes written;
* restore of the 2,818-token snapshot (every page read and verified; goal
  < 100 ms), the one-token re-forward that recomputes its logits on first
  use, and the ratio of that prefill to the restore;
* 10 branches of 100 tokens from a 2,000-token trunk, all snapshotted: store
  size relative to the trunk's alone (goal < 1.3x; one file per branch
  holding its whole KV, as slot files do, would be ~10x).

The 8,000-token prefill takes a minute or more on a small machine.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
        "combined a screw press with movable metal type. Books became cheaper, literacy spread, and "
        "ideas travelled faster than ever before across Europe and then the world. ")
LONG, MID, TRUNK = 8000, 2818, 2000
N_BRANCHES, BRANCH_TOKENS, MORE_TOKENS = 10, 100, 100


def prompt_ids(tokenize, n: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < n:
        ids += tokenize(TEXT)
    return ids[:n]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def long_context(model):
    """The 8,000-token context, and the seconds its first 2,818 tokens took to prefill."""
    ids = prompt_ids(model.tokenize, LONG)
    warm = model.context("warm-up")
    warm.append(ids[:64])  # maps the weights and fills the caches before anything is timed
    warm.delete()
    c = model.context("long")
    print(f"prefilling {LONG} tokens ...", file=sys.stderr)
    t_mid, _ = timed(lambda: c.append(ids[:MID]))
    c.append(ids[MID:])
    return c, t_mid


def prefix_of(long_ctx, n: int, name: str):
    """A context holding the first n tokens of long_ctx (a fork, rewound: no prefill)."""
    c = long_ctx.fork(name)
    c.rewind(c.n_tokens - n)
    return c


def fork_times(ctx, reps: int = 200) -> float:
    """Median seconds of Context.fork (the public call: name check, table entry, page table)."""
    samples = []
    for i in range(reps):
        dt, f = timed(lambda: ctx.fork(f"{ctx.name}-f{i}"))
        samples.append(dt)
        f.delete()
    return statistics.median(samples)


def snapshot_figures(model, mid, ids_more, store) -> dict:
    from ctxengine.state.page_keys import PageKeyCache
    from ctxengine.state.snapshots import take_snapshot

    # A first snapshot of a context nobody hashed yet: empty key cache, empty store.
    model.contexts.page_keys = PageKeyCache(model.engine)
    before = store.stats().stored_bytes
    t_full, full = timed(lambda: take_snapshot(mid, store))
    after_full = store.stats().stored_bytes
    mid.append(ids_more)
    t_inc, inc = timed(lambda: take_snapshot(mid, store))
    after_inc = store.stats().stored_bytes
    return {
        "full_snapshot_ms": ms(t_full), "full_snapshot_pages": full.pages_sent,
        "full_snapshot_raw_bytes": full.bytes_sent, "full_snapshot_stored_bytes": after_full - before,
        "incremental_snapshot_ms": ms(t_inc), "incremental_snapshot_pages": inc.pages_sent,
        "incremental_snapshot_pages_hashed": inc.pages_hashed,
        "incremental_snapshot_raw_bytes": inc.bytes_sent, "incremental_snapshot_stored_bytes": after_inc - after_full,
        "snapshot_id": full.snapshot_id,
    }


def restore_figures(model, store, sid: str, prefill_s: float, reps: int = 5) -> dict:
    restores, first_logits = [], []
    for i in range(reps):
        dt, c = timed(lambda: model.restore(store, sid, name=f"restored-{i}"))
        restores.append(dt)
        dl, _ = timed(c._sync)  # the one-token re-forward that recomputes its logits
        first_logits.append(dl)
        c.delete()
    t = statistics.median(restores)
    return {"restore_ms": ms(t), "restore_first_logits_ms": ms(statistics.median(first_logits)),
            "prefill_2818_s": round(prefill_s, 3), "prefill_over_restore": round(prefill_s / t, 1)}


def branch_figures(model, trunk, ids, store) -> dict:
    trunk.snapshot(store, ref="trunk")
    trunk_bytes = store.stats().stored_bytes
    vocab = model.config.n_vocab
    for b in range(N_BRANCHES):
        br = trunk.fork(f"branch-{b}")
        # Each branch continues differently (shifted ids), so its pages are its own.
        br.append([(t + 7919 * (b + 1)) % vocab for t in ids[:BRANCH_TOKENS]])
        br.snapshot(store, ref=f"branch-{b}")
        br.delete()
    st = store.stats()
    return {"trunk_stored_bytes": trunk_bytes, "all_stored_bytes": st.stored_bytes,
            "branches_over_trunk": round(st.stored_bytes / trunk_bytes, 3),
            "dedup_ratio": round(st.dedup_ratio, 2),
            "slot_files_over_trunk": round(N_BRANCHES * (TRUNK + BRANCH_TOKENS) / TRUNK, 2)}


def run(args) -> dict:
    import ctxengine as ce
    from ctxengine.bench.facts import machine_facts

    model = ce.load(args.model, threads=args.threads)
    long_ctx, prefill_s = long_context(model)
    ids = prompt_ids(model.tokenize, LONG)
    mid = prefix_of(long_ctx, MID, "mid")
    trunk = prefix_of(long_ctx, TRUNK, "trunk")
    out = {"machine": machine_facts(model.engine.threads),
           "model": model.name, "threads": model.engine.threads, "kv_dtype": model.engine.kv_dtype,
           "kv_bytes_per_token": model.engine.pool.page_bytes // model.engine.pool.page_tokens,
           "fork_2000_ms": ms(fork_times(trunk)), "fork_8000_ms": ms(fork_times(long_ctx))}
    with tempfile.TemporaryDirectory() as tmp:
        with ce.Store(Path(tmp) / "snap") as store:
            snap = snapshot_figures(model, mid, ids[:MORE_TOKENS], store)
            out.update(restore_figures(model, store, snap.pop("snapshot_id"), prefill_s))
            out.update(snap)
        with ce.Store(Path(tmp) / "branches") as store:
            out.update(branch_figures(model, trunk, ids, store))
    model.close()
    return out


def print_table(r: dict) -> None:
    mb = lambda n: f"{n / 1e6:.1f} MB"  # noqa: E731
    rows = [
        ("fork, 2,000 tokens", f"{r['fork_2000_ms']:.3f} ms", "goal < 1 ms"),
        ("fork, 8,000 tokens", f"{r['fork_8000_ms']:.3f} ms", "flat in length"),
        ("full snapshot, 2,818 tokens", f"{r['full_snapshot_ms']:.1f} ms",
         f"{r['full_snapshot_pages']} pages, {mb(r['full_snapshot_raw_bytes'])} raw, "
         f"{mb(r['full_snapshot_stored_bytes'])} stored"),
        ("incremental, +100 tokens", f"{r['incremental_snapshot_ms']:.1f} ms",
         f"{r['incremental_snapshot_pages']} pages ({r['incremental_snapshot_pages_hashed']} hashed), "
         f"{mb(r['incremental_snapshot_stored_bytes'])} stored"),
        ("restore, 2,818 tokens", f"{r['restore_ms']:.1f} ms", "every page verified; goal < 100 ms"),
        ("  + first logits (1-token re-forward)", f"{r['restore_first_logits_ms']:.1f} ms", ""),
        ("prefill, 2,818 tokens (this run)", f"{r['prefill_2818_s']:.2f} s",
         f"{r['prefill_over_restore']:.0f}x the restore"),
        ("10 branches x 100 on a 2,000 trunk", f"{r['branches_over_trunk']:.3f}x trunk",
         f"goal < 1.3x; slot files ~{r['slot_files_over_trunk']:.1f}x"),
    ]
    from ctxengine.bench.facts import describe_machine

    print(f"{r['model']}, {r['threads']} threads, {r['kv_dtype']} KV ({r['kv_bytes_per_token'] / 1e3:.1f} KB/token)")
    print(describe_machine(r["machine"]))
    w = max(len(a) for a, _, _ in rows)
    for a, b, c in rows:
        print(f"{a:<{w}}  {b:>14}  {c}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", default=None, help="model (default: packaged SmolLM2-135M-Instruct)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args()
    r = run(args)
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        print_table(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
