"""What a Redis master's death costs a fleet host: the time from SIGKILL to the
first snapshot published again (issue 20).

    python bench/bench_failover.py [--runs 3] [--json]

Each run starts a real 3-master, 3-replica Redis Cluster on loopback
(tests/redis_cluster.py, cluster-node-timeout 2000 ms), and a store in front
of it publishing a snapshot of a growing SmolLM2 context in a loop (each with
new pages, its own ref, acknowledged by a replica). The master that owns the
ref being written next is SIGKILLed; measured: the time from the kill to the
first publish that completes afterwards (``store.fleet.holds``: on the fleet,
ref and all), and to the promotion the cluster itself reports. Nothing may go
local-only: the host waits out the failover and uses the promoted replica.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the tests' Redis Cluster

TEXT = "Tide pools hold anemones, crabs and small fish between the rocks. "


def one_run(model, root: Path) -> dict:
    import ctxengine as ce
    from redis_cluster import RedisCluster

    cluster = RedisCluster(root / "redis")
    try:
        with ce.Store(root / "store", fleet=cluster.url, host_id="bench") as store:
            ctx = model.context(f"failover-{root.name}")
            ids = model.tokenize(TEXT)
            ctx.append(ids * 4)
            done: list[tuple[float, str, bool]] = []   # (when it completed, ref, published)
            stop = threading.Event()

            def publish():
                i = 0
                while not stop.is_set():
                    ctx.append(ids[i % len(ids):][:9])
                    ref = f"f/{i}"
                    sid = ctx.snapshot(store, ref=ref)
                    done.append((time.monotonic(), ref, store.fleet.holds(sid, ref)))
                    i += 1

            worker = threading.Thread(target=publish)
            worker.start()
            while len(done) < 3:
                time.sleep(0.01)
            victim = cluster.master_of(f"ctx:r:{{f/{len(done) + 1}}}")
            killed = time.monotonic()
            cluster.kill(victim)
            cluster.wait_failover(victim, timeout=60)
            promoted = time.monotonic()
            while not any(t > promoted for t, _, _ in done):
                time.sleep(0.01)
            stop.set()
            worker.join()
            after = [(t, ok) for t, _, ok in done if t > killed]
            first = next(t for t, ok in after if ok)
            return {"kill_to_publish_s": first - killed, "kill_to_promotion_seen_s": promoted - killed,
                    "local_only": sum(not ok for _, ok in after), "retries": store.fleet.stats().retries}
    finally:
        cluster.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import ctxengine as ce

    model = ce.load("smollm2", threads=args.threads)
    runs = []
    try:
        for i in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="ctx-failover-") as tmp:
                runs.append(one_run(model, Path(tmp)))
            if not args.json:
                print(json.dumps(runs[-1]), flush=True)
    finally:
        model.close()
    out = {"runs": runs, "median_kill_to_publish_s": statistics.median(r["kill_to_publish_s"] for r in runs),
           "median_kill_to_promotion_seen_s": statistics.median(r["kill_to_promotion_seen_s"] for r in runs)}
    print(json.dumps(out, indent=1) if args.json else
          f"median: kill -> first publish {out['median_kill_to_publish_s']:.2f} s, "
          f"kill -> promotion seen {out['median_kill_to_promotion_seen_s']:.2f} s, "
          f"local-only publishes {sum(r['local_only'] for r in runs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
