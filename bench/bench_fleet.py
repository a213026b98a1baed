"""A fleet of hosts sharing contexts through Redis Cluster (issue 14).

    python bench/bench_fleet.py [--threads 2] [--json]

Starts a real 3-master, 3-replica Redis Cluster on loopback (tests/redis_cluster.py).
Two "hosts" are two stores with their own LMDB caches in front of the fleet,
sharing one loaded model (so both paths below find it loaded). Measured:
* continue on another host: host A prefills a 2,818-token context and
  publishes it; host B, whose cache is empty, restores it from the fleet and
  generates the first token, against re-prefilling the same tokens on B;
* bytes moved for a 100-token branch of a 2,000-token trunk the fleet holds:
  what the cluster's masters received and sent while B published the branch
  (Redis's own network counters, every command and reply), against the page
  records the branch does not share with the trunk (goal: within 1.05x).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]  # bench_transfer's helpers; the tests' Redis Cluster

from bench_contexts import MID as LONG, TRUNK, prompt_ids  # noqa: E402
from bench_transfer import BRANCH_TOKENS, OTHER, first_token, print_rows, timed  # noqa: E402


def net_bytes(cluster) -> int:
    """Bytes the masters received from and sent to clients so far (replication not counted)."""
    import redis

    total = 0
    for port in cluster.masters():
        info = redis.Redis(port=port).info("stats")
        # (total_net_* include the replication stream, which total_net_repl_* count alone)
        total += info["total_net_input_bytes"] - info["total_net_repl_input_bytes"]
        total += info["total_net_output_bytes"] - info["total_net_repl_output_bytes"]
    return total


def run(args) -> dict:
    import ctxengine as ce
    from redis_cluster import RedisCluster

    model = ce.load(args.model or "smollm2", threads=args.threads)
    ids = prompt_ids(model.tokenize, LONG)
    other = (model.tokenize(OTHER) * BRANCH_TOKENS)[:BRANCH_TOKENS]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cluster = RedisCluster(tmp / "redis")
        try:
            with ce.Store(tmp / "a", fleet=cluster.url, host_id="a") as a, \
                    ce.Store(tmp / "b", fleet=cluster.url, host_id="b") as b:
                long_ctx = model.context("long")
                t_prefill_a, _ = timed(lambda: long_ctx.append(ids))
                t_publish, _ = timed(lambda: long_ctx.snapshot(a, ref="long"))
                warm = model.context("warm")
                warm.append("Hello")
                first_token(warm)
                warm.delete()

                t0 = time.perf_counter()
                restored = model.restore(b, "long", name="on-b")
                t_restored = time.perf_counter() - t0
                tok_fleet = first_token(restored)
                t_fleet_first = time.perf_counter() - t0
                again = model.context("again")
                t0 = time.perf_counter()
                again.append(ids)
                tok_prefill = first_token(again)
                t_prefill_first = time.perf_counter() - t0
                assert tok_fleet == tok_prefill, "restored and re-prefilled contexts disagree"
                fetched = b.fleet.stats()
                out = {"tokens": LONG, "threads": args.threads, "prefill_on_a_s": round(t_prefill_a, 3),
                       "publish_s": round(t_publish, 3), "pages": fetched.pages_fetched,
                       "page_bytes": fetched.page_bytes_fetched,
                       "fleet_to_first_token_s": round(t_fleet_first, 3), "of_which_restore_s": round(t_restored, 3),
                       "prefill_to_first_token_s": round(t_prefill_first, 3),
                       "prefill_over_fleet": round(t_prefill_first / t_fleet_first, 1)}
                for c in (restored, again):
                    c.delete()

                trunk = long_ctx.fork("trunk")
                trunk.rewind(LONG - TRUNK)
                trunk.snapshot(a, ref="trunk")              # the fleet holds the trunk
                on_b = model.restore(b, "trunk", name="trunk-on-b")
                branch = on_b.fork("branch")
                branch.append(other)
                before, sent_before = net_bytes(cluster), b.fleet.stats().page_bytes_sent
                branch.snapshot(b, ref="branch")            # B publishes its branch
                moved = net_bytes(cluster) - before
                own = (set(b.get_manifest(b.resolve("branch")).page_keys)
                       - set(b.get_manifest(b.resolve("trunk")).page_keys))
                own_bytes = sum(len(b.get_page_record(k)) for k in own)
                out.update(branch_own_pages=len(own), branch_own_bytes=own_bytes,
                           branch_page_bytes_sent=b.fleet.stats().page_bytes_sent - sent_before,
                           branch_bytes_moved=moved, branch_moved_over_own=round(moved / own_bytes, 3))
        finally:
            cluster.stop()
    model.close()
    return out


def print_table(r: dict) -> None:
    mb = lambda n: f"{n / 1e6:.2f} MB"  # noqa: E731
    rows = [
        (f"publish {r['tokens']:,} tokens from A", f"{r['publish_s'] * 1000:.0f} ms", ""),
        ("fleet -> first token on B", f"{r['fleet_to_first_token_s'] * 1000:.0f} ms",
         f"restore {r['of_which_restore_s'] * 1000:.0f} ms ({r['pages']} pages, {mb(r['page_bytes'])} from Redis)"),
        ("re-prefill -> first token on B", f"{r['prefill_to_first_token_s']:.2f} s",
         f"{r['prefill_over_fleet']:.1f}x the fleet path"),
        (f"{BRANCH_TOKENS}-token branch of a {TRUNK:,} trunk the fleet has", f"{r['branch_moved_over_own']:.3f}x",
         f"{mb(r['branch_bytes_moved'])} through Redis for {r['branch_own_pages']} own pages "
         f"({mb(r['branch_own_bytes'])}); goal <= 1.05x"),
    ]
    print_rows(rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", default=None, help="model (default: the packaged SmolLM2)")
    p.add_argument("--threads", type=int, default=2, help="model threads (default 2)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    r = run(args)
    print(json.dumps(r, indent=2)) if args.json else print_table(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
