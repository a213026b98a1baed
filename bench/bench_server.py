"""The HTTP server under load: time to first token and tokens/s for one
client and for N concurrent clients, and second-turn time to first token
with and without prefix reuse; llama.cpp's llama-server side by side when
there is one (same model, same threads, measured the same way).

    python bench/bench_server.py [-m MODEL.gguf] [--threads 2] [--clients 4] [--tokens 64]
                                 [--llama-server PATH] [--json]

Every figure comes from OpenAI-style streaming chat completions over HTTP
on loopback (``httpx``), greedy: time to first token is from sending the
request to the first content chunk; a client's tokens/s is its tokens after
the first over the time after the first; the aggregate is every client's
tokens over the wall time of the round. Prompts differ per client and per
round, so no round is served from another's cache. The second-turn figure
sends a long first turn (a ~1,000-token system prompt), then the whole
conversation again with one more user turn, as a stateless client does.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

LONG_SYSTEM = ("You are a careful assistant for a shipping company. " +
               " ".join(f"Rule {i}: parcels of class {i} travel by route {i % 7} unless the customer asks "
                        f"otherwise, and their labels carry code {1000 + i}." for i in range(40)))
TOPICS = ["the sea", "mountains", "the moon", "forests", "cities", "deserts", "rivers", "snow", "volcanoes",
          "islands", "caves", "storms", "glaciers", "meadows", "canyons", "lakes"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(ok, proc: subprocess.Popen, what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode} before it was ready")
        if ok():
            return
        time.sleep(0.2)
    raise SystemExit(f"{what} was not ready after {timeout:.0f}s")


def healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def start_ctx(model: str, threads: int, extra: list[str], home: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "ctxengine.cli.main", "serve", "--port", str(port), "--grpc-port", "0",
           "--no-ollama", "--threads", str(threads), "--store", str(home / "store"), "-m", model, *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, CTX_HOME=str(home), PYTHONSAFEPATH="1"))
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: healthy(url), proc, "ctx serve")
    return proc, url


def start_llama(binary: str, model: str, threads: int, clients: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
           "-tb", str(threads), "--parallel", str(clients), "-c", str(4096 * clients)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: healthy(url), proc, "llama-server")
    return proc, url


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stream_chat(url: str, messages: list[dict], max_tokens: int, model: str, extra: dict | None = None) -> dict:
    """One streamed chat completion: ttft, tokens, total time, reply text."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **(extra or {})}
    t0 = time.perf_counter()
    first = None
    pieces, usage = [], None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content")
                if text:
                    if first is None:
                        first = time.perf_counter()
                    pieces.append(text)
    end = time.perf_counter()
    n = usage["completion_tokens"] if usage else len(pieces)
    return {"ttft": (first or end) - t0, "tokens": n, "decode_s": end - (first or end), "wall": end - t0,
            "text": "".join(pieces), "usage": usage}


def round_of(url: str, n_clients: int, max_tokens: int, model: str, tag: str) -> dict:
    def client(i: int) -> dict:
        q = f"[{tag}-{i}] Write a long story about {TOPICS[i % len(TOPICS)]}."
        return stream_chat(url, [{"role": "user", "content": q}], max_tokens, model)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(n_clients) as pool:
        results = list(pool.map(client, range(n_clients)))
    wall = time.perf_counter() - t0
    return {"clients": n_clients, "ttft_ms": 1000 * statistics.median(r["ttft"] for r in results),
            "per_client_tok_s": statistics.median((r["tokens"] - 1) / r["decode_s"] for r in results if r["decode_s"]),
            "aggregate_tok_s": sum(r["tokens"] for r in results) / wall}


def second_turn(url: str, model: str, extra: dict | None = None, tag: str = "") -> dict:
    first = [{"role": "system", "content": f"{tag} {LONG_SYSTEM}"},
             {"role": "user", "content": "Which route does a class 12 parcel take?"}]
    r1 = stream_chat(url, first, 24, model, extra)
    second = first + [{"role": "assistant", "content": r1["text"]},
                      {"role": "user", "content": "And what code is on its label?"}]
    r2 = stream_chat(url, second, 8, model, extra)
    usage = r2["usage"] or {}
    return {"first_ttft_ms": 1000 * r1["ttft"], "second_ttft_ms": 1000 * r2["ttft"],
            "prompt_tokens": usage.get("prompt_tokens"),
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens")}


def measure(url: str, model: str, clients: int, tokens: int, rounds: int, name: str) -> dict:
    stream_chat(url, [{"role": "user", "content": "warm up"}], 4, model)
    out = {}
    for n in (1, clients):
        best = None
        for k in range(rounds):
            r = round_of(url, n, tokens, model, f"{name}-{n}-{k}")
            best = r if best is None or r["aggregate_tok_s"] > best["aggregate_tok_s"] else best
        out[f"{n}_clients"] = best
    return out


def find_llama_server(given: str | None) -> str | None:
    if given:
        return given if Path(given).is_file() else None
    for root in ("/opt/llamabuild",):
        if Path(root).is_dir():
            for p in sorted(Path(root).rglob("llama-server")):
                if p.is_file() and os.access(p, os.X_OK):
                    return str(p)
    return shutil.which("llama-server")


def default_model() -> str:
    from ctxengine.engine.registry import resolve_model

    return str(resolve_model(None))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None, help="a .gguf file (default: the packaged SmolLM2)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64, help="tokens each client generates")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per setting; the best is kept")
    ap.add_argument("--llama-server", default=None, help="llama.cpp's llama-server binary (default: look for it)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    model = args.model or default_model()
    name = Path(model).name[:-5] if model.endswith(".gguf") else Path(model).name
    report = {"model": Path(model).name, "threads": args.threads, "tokens": args.tokens, "cpus": os.cpu_count()}

    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_ctx(model, args.threads, [], Path(tmp))
        try:
            report["ctx"] = measure(url, name, args.clients, args.tokens, args.rounds, "ctx")
            report["ctx"]["second_turn"] = second_turn(url, name, tag="reuse")
        finally:
            stop(proc)
        proc, url = start_ctx(model, args.threads, ["--prefix-cache", "0"], Path(tmp))
        try:
            report["ctx"]["second_turn_no_reuse"] = second_turn(url, name, tag="noreuse")
        finally:
            stop(proc)

    binary = find_llama_server(args.llama_server)
    if binary is None:
        report["llama_server"] = "not measured: no llama-server binary found (pass --llama-server PATH)"
    else:
        proc, url = start_llama(binary, model, args.threads, args.clients)
        try:
            report["llama_server"] = measure(url, name, args.clients, args.tokens, args.rounds, "llama")
            report["llama_server"]["second_turn"] = second_turn(url, name, tag="reuse")
            report["llama_server"]["second_turn_no_reuse"] = second_turn(url, name, {"cache_prompt": False},
                                                                         tag="noreuse")
        finally:
            stop(proc)

    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report, args.clients)
    return 0


def print_table(report: dict, clients: int) -> None:
    print(f"{report['model']}, {report['threads']} threads, {report['tokens']} tokens per client, "
          f"{report['cpus']} CPUs")
    servers = [("ctx serve", report["ctx"])]
    if isinstance(report["llama_server"], dict):
        servers.append(("llama-server", report["llama_server"]))
    print(f"{'':14}{'clients':>8}{'TTFT ms':>10}{'tok/s/client':>14}{'tok/s total':>13}")
    for label, r in servers:
        for n in (1, clients):
            x = r[f"{n}_clients"]
            print(f"{label:14}{n:>8}{x['ttft_ms']:>10.1f}{x['per_client_tok_s']:>14.1f}{x['aggregate_tok_s']:>13.1f}")
    for label, r in servers:
        a, b = r["second_turn"], r["second_turn_no_reuse"]
        print(f"{label}: second-turn TTFT {a['second_ttft_ms']:.1f} ms with prefix reuse "
              f"({a['cached_tokens']} of {a['prompt_tokens']} prompt tokens cached), "
              f"{b['second_ttft_ms']:.1f} ms without")
    if not isinstance(report["llama_server"], dict):
        print(f"llama-server: {report['llama_server']}")


if __name__ == "__main__":
    sys.exit(main())
