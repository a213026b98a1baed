"""A soak: one `ctx serve` under 16 concurrent clients for 10 minutes, mixed as
a server's traffic is (bench/soak_actions.py: chats streamed and not in the
OpenAI, Anthropic and Ollama dialects, clients disconnecting mid-stream, named
contexts created, forked, snapshotted, deleted and restored, Responses
continuations and branches, JSON-schema replies).

    python bench/soak.py [--minutes 10] [--clients 16] [--threads 2] [--every 30] [--json]

Every ``--every`` seconds a row: requests and errors so far, p50/p99 of the
single-request actions in that interval, and the server's memory from
/proc/PID/status: RSS, its anonymous part (the heap: what a leak grows) and
its file-backed part (mostly LMDB's map of the store, and the model's
weights). At the end: errors by kind, latency by action, anonymous memory
from the first row after warm-up to the last, and the store (``ctx store
stats``) at the start and after ``ctx gc`` once the server is stopped: every
action deletes what it made, so gc must bring the store back to its start.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import soak_actions  # noqa: E402
from bench_server import free_port, healthy, wait_until  # noqa: E402

CTX = [sys.executable, "-m", "ctxengine.cli.main"]
SINGLE = {"openai_chat", "anthropic_messages", "ollama_chat", "json_reply"}
STORE_FIELDS = ("n_manifests", "n_refs", "n_pages", "stored_bytes")


def child_env(root: Path) -> dict:
    """A child `ctx`'s environment: its own CTX_HOME, none of the user's token, store or Ollama models."""
    env = {k: v for k, v in os.environ.items() if k not in ("CTX_TOKEN", "CTX_STORE", "OLLAMA_MODELS")}
    return {**env, "CTX_HOME": str(root / "home")}


def memory(pid: int) -> dict[str, int]:
    """The process's VmRSS, RssAnon and RssFile in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024
    return out


def gauges(url: str) -> dict[str, float]:
    """KV pages in use and backed by memory, named contexts and cached prefixes, from the server's /metrics."""
    wanted = {"ctx_kv_pages_in_use": "kv_pages", "ctx_kv_pages_allocated": "kv_alloc", "ctx_contexts": "contexts",
              "ctx_prefix_cache_entries": "prefixes"}
    out = dict.fromkeys(wanted.values(), 0.0)
    for line in httpx.get(url + "/metrics", timeout=60).text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in wanted:
            out[wanted[name]] += float(line.rsplit(" ", 1)[1])
    return out


def store_stats(root: Path) -> dict:
    out = subprocess.run([*CTX, "store", "stats", "--json", "--store", str(root / "store")], capture_output=True,
                         text=True, env=child_env(root), check=True)
    return json.loads(out.stdout)


class Tally:
    """What the clients did, shared between them and the reporter."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests = 0
        self.errors: Counter[str] = Counter()
        self.examples: dict[str, str] = {}
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.window: list[float] = []   # single-request latencies since the last row

    def done(self, action: str, n: int, seconds: float) -> None:
        with self.lock:
            self.requests += n
            self.latency[action].append(seconds)
            if action in SINGLE:
                self.window.append(seconds)

    def failed(self, action: str, err: BaseException) -> None:
        kind = f"{action}: {soak_actions.error_kind(err)}"
        with self.lock:
            self.requests += 1
            self.errors[kind] += 1
            self.examples.setdefault(kind, str(err).splitlines()[0][:300] if str(err) else "")


def client_loop(url: str, model: str, cid: int, seed: int, until: float, tally: Tally) -> None:
    c = soak_actions.Client(url, model, cid, seed)
    try:
        while time.monotonic() < until:
            action = soak_actions.pick(c)
            t0 = time.monotonic()
            try:
                n = action(c)
            except Exception as err:  # every failure is counted by kind, none stops the soak
                tally.failed(action.__name__, err)
            else:
                tally.done(action.__name__, n, time.monotonic() - t0)
    finally:
        c.close()


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def report_row(t: float, tally: Tally, pid: int, url: str) -> dict:
    with tally.lock:
        window, tally.window = tally.window, []
        row = {"t_s": round(t), "requests": tally.requests, "errors": sum(tally.errors.values())}
    row.update(p50_s=percentile(window, 0.5), p99_s=percentile(window, 0.99), **memory(pid), **gauges(url))
    return row


def print_row(row: dict) -> None:
    mb = 1 << 20
    print(f"{row['t_s']:6d} {row['requests']:9d} {row['errors']:7d} {row['p50_s']:7.2f} {row['p99_s']:7.2f} "
          f"{row['VmRSS'] / mb:8.0f} {row['RssAnon'] / mb:8.0f} {row['RssFile'] / mb:8.0f} "
          f"{row['kv_pages']:8.0f} {row['kv_alloc']:8.0f} {row['contexts']:8.0f} {row['prefixes']:8.0f}", flush=True)


def start_server(root: Path, threads: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(root / "serve.log", "w") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen([*CTX, "serve", "--port", str(port), "--grpc-port", "0", "--no-ollama",
                                 "--store", str(root / "store"), "-t", str(threads)],
                                stdout=subprocess.DEVNULL, stderr=log, env=child_env(root))
    wait_until(lambda: healthy(url), proc, "ctx serve")
    return proc, url


def soak(root: Path, *, seconds: float, clients: int, threads: int, every: float, warmup: float,
         model: str = "smollm2", seed: int = 0, quiet: bool = False) -> dict:
    """Run the soak; the summary (rows, errors, latencies, memory, store before and after gc)."""
    proc, url = start_server(root, threads)
    try:
        httpx.post(url + "/v1/chat/completions", timeout=300, json={  # loads the model before the clock starts
            "model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi."}]}).raise_for_status()
        before = store_stats(root)
        tally, rows = Tally(), []
        start = time.monotonic()
        until = start + seconds
        workers = [threading.Thread(target=client_loop, args=(url, model, i, seed, until, tally), daemon=True)
                   for i in range(clients)]
        for w in workers:
            w.start()
        if not quiet:
            print("   t_s  requests  errors  p50_s   p99_s   rss_MB  anon_MB  file_MB kv_pages kv_alloc contexts prefixes")
        while any(w.is_alive() for w in workers):
            next_row = start + every * (len(rows) + 1)
            while time.monotonic() < next_row and any(w.is_alive() for w in workers):
                time.sleep(0.2)
            rows.append(report_row(time.monotonic() - start, tally, proc.pid, url))
            if not quiet:
                print_row(rows[-1])
        for w in workers:
            w.join()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    subprocess.run([*CTX, "gc", "--grace", "0", "--store", str(root / "store")], check=True, capture_output=True,
                   env=child_env(root))
    after = store_stats(root)
    return summary(rows, tally, warmup, before, after)


def summary(rows: list[dict], tally: Tally, warmup: float, before: dict, after: dict) -> dict:
    warm = next((r for r in rows if r["t_s"] >= warmup), rows[0])
    last = rows[-1]
    return {
        "requests": tally.requests, "errors": dict(tally.errors), "error_examples": tally.examples, "rows": rows,
        "latency_s": {a: {"n": len(xs), "p50": percentile(xs, 0.5), "p99": percentile(xs, 0.99),
                          "mean": statistics.fmean(xs)} for a, xs in sorted(tally.latency.items())},
        "anon_after_warmup": warm["RssAnon"], "anon_end": last["RssAnon"],
        "anon_change": last["RssAnon"] / warm["RssAnon"] - 1,
        "anon_max_after_warmup": max(r["RssAnon"] for r in rows if r["t_s"] >= warm["t_s"]),
        "store_before": {k: before[k] for k in STORE_FIELDS}, "store_after_gc": {k: after[k] for k in STORE_FIELDS},
        "store_file_bytes": after["file_bytes"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--every", type=float, default=30, help="seconds between rows")
    ap.add_argument("--warmup", type=float, default=60, help="seconds before anonymous memory is the baseline")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ctx-soak-") as tmp:
        s = soak(Path(tmp), seconds=args.minutes * 60, clients=args.clients, threads=args.threads,
                 every=args.every, warmup=args.warmup, quiet=args.json)
    if args.json:
        print(json.dumps(s, indent=1))
        return 0
    mb = 1 << 20
    print(f"\n{s['requests']} requests, {sum(s['errors'].values())} errors")
    for kind, n in sorted(s["errors"].items()):
        print(f"  {n:5d}  {kind}: {s['error_examples'][kind]}")
    for action, lat in s["latency_s"].items():
        print(f"  {action:22s} n={lat['n']:5d}  p50 {lat['p50']:.2f} s  p99 {lat['p99']:.2f} s")
    print(f"anonymous memory: {s['anon_after_warmup'] / mb:.0f} MB after warm-up, {s['anon_end'] / mb:.0f} MB "
          f"at the end ({s['anon_change']:+.1%}; max {s['anon_max_after_warmup'] / mb:.0f} MB)")
    print(f"store before: {s['store_before']}\nstore after gc: {s['store_after_gc']}  "
          f"(file {s['store_file_bytes'] / mb:.0f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
