"""Snapshot transfer over gRPC between `ctx serve` processes on loopback (issue 4).

    python bench/bench_transfer.py [--threads N] [--json]

Three servers with their own stores (A holds the contexts; B and C receive).
Measured:
* push A -> B and pull B -> an empty local store of a 2,818-token snapshot:
  seconds and MB/s (serialized bytes of every message over the time of the
  whole transfer, weights check and manifest included);
* time from `pull` to the first generated token on the receiving host (pull
  into C's store, Restore on C, first token) against re-prefilling the same
  tokens on C (model loaded in both cases);
* bytes on the wire, counted on the socket by a TCP proxy, for pushing a
  100-token branch of a 2,000-token trunk that the receiver already has,
  against the branch's own page records (goal: within 1.2x).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]  # bench_contexts' prompt; the tests' server helpers

from bench_contexts import MID as LONG, TRUNK, prompt_ids  # noqa: E402

BRANCH_TOKENS = 100
OTHER = "Rivers carve valleys over millions of years, carrying sediment from mountains to the sea. "


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def first_token(ctx) -> int:
    stream = ctx.generate(max_tokens=1, temperature=0.0)
    piece = next(stream)
    stream.close()
    return piece.token_id


def run(args) -> dict:
    import ctxengine as ce
    from ctxengine.rpc import Remote
    from servers import ByteProxy, CtxServer

    model = ce.load(args.model)  # only to tokenize here
    ids = prompt_ids(model.tokenize, LONG)
    other = (model.tokenize(OTHER) * BRANCH_TOKENS)[:BRANCH_TOKENS]  # text the long context does not hold
    model.close()
    extra = ("-t", str(args.threads)) if args.threads else ()
    with tempfile.TemporaryDirectory() as tmp:
        servers = []
        try:
            for name in "abc":
                servers.append(CtxServer(Path(tmp) / name, *extra))
            a_srv, b_srv, c_srv = servers
            with Remote(a_srv.target) as a, Remote(b_srv.target) as b, Remote(c_srv.target) as c, \
                    ce.Store(a_srv.store) as store_a:
                long_ctx = a.create("long")
                t_prefill_a, _ = timed(lambda: long_ctx.append(ids))
                long_ctx.snapshot(ref="long")
                out = {"tokens": LONG, "prefill_on_a_s": round(t_prefill_a, 3)}

                push = b.push(store_a, "long")
                with ce.Store(Path(tmp) / "local") as local:
                    pull = b.pull("long", local)
                out.update(push_pages=push.pages_sent, push_page_bytes=push.page_bytes, push_s=round(push.seconds, 3),
                           push_mb_s=round(push.mb_per_s, 1), pull_s=round(pull.seconds, 3),
                           pull_mb_s=round(pull.mb_per_s, 1))

                warm = c.create("warm")  # load C's model first: both paths below find it loaded
                warm.append("Hello")
                first_token(warm)
                warm.delete()
                t0 = time.perf_counter()
                with ce.Store(c_srv.store) as store_c:
                    a.pull("long", store_c)
                t_pulled = time.perf_counter() - t0
                tok_pull = first_token(c.restore("long", name="long"))
                t_pull_first = time.perf_counter() - t0
                again = c.create("again")
                t0 = time.perf_counter()
                again.append(ids)
                tok_prefill = first_token(again)
                t_prefill_first = time.perf_counter() - t0
                assert tok_pull == tok_prefill, "restored and re-prefilled contexts disagree"
                out.update(pull_to_first_token_s=round(t_pull_first, 3), of_which_pull_s=round(t_pulled, 3),
                           prefill_to_first_token_s=round(t_prefill_first, 3),
                           prefill_over_pull=round(t_prefill_first / t_pull_first, 1))

                trunk = long_ctx.fork("trunk")
                trunk.rewind(LONG - TRUNK)
                trunk.snapshot(ref="trunk")
                b.push(store_a, "trunk")
                branch = trunk.fork("branch")
                branch.append(other)
                branch.snapshot(ref="branch")
                own = (set(store_a.get_manifest(store_a.resolve("branch")).page_keys)
                       - set(store_a.get_manifest(store_a.resolve("trunk")).page_keys))
                own_bytes = sum(len(store_a.get_page_record(k)) for k in own)
                proxy = ByteProxy(("127.0.0.1", b_srv.port))
                try:
                    with Remote(f"127.0.0.1:{proxy.port}") as via:
                        res = via.push(store_a, "branch")
                    socket_bytes = proxy.total
                finally:
                    proxy.close()
                out.update(branch_own_pages=len(own), branch_own_bytes=own_bytes, branch_pages_sent=res.pages_sent,
                           branch_wire_bytes=res.wire_bytes, branch_socket_bytes=socket_bytes,
                           branch_socket_over_own=round(socket_bytes / own_bytes, 3))
        finally:
            for s in servers:
                s.stop()
    return out


def print_table(r: dict) -> None:
    mb = lambda n: f"{n / 1e6:.2f} MB"  # noqa: E731
    rows = [
        (f"push, {r['tokens']:,} tokens", f"{r['push_mb_s']:.0f} MB/s",
         f"{r['push_s'] * 1000:.0f} ms; {r['push_pages']} pages, {mb(r['push_page_bytes'])}"),
        (f"pull, {r['tokens']:,} tokens", f"{r['pull_mb_s']:.0f} MB/s", f"{r['pull_s'] * 1000:.0f} ms"),
        ("pull -> first token on the receiver", f"{r['pull_to_first_token_s'] * 1000:.0f} ms",
         f"pull {r['of_which_pull_s'] * 1000:.0f} ms, then Restore and the first token"),
        ("re-prefill -> first token there", f"{r['prefill_to_first_token_s']:.2f} s",
         f"{r['prefill_over_pull']:.0f}x the pull"),
        (f"{BRANCH_TOKENS}-token branch of a {TRUNK:,} trunk the receiver has",
         f"{r['branch_socket_over_own']:.3f}x", f"{mb(r['branch_socket_bytes'])} on the socket for "
         f"{r['branch_own_pages']} own pages ({mb(r['branch_own_bytes'])}); goal < 1.2x"),
    ]
    print_rows(rows)


def print_rows(rows: list[tuple[str, str, str]]) -> None:
    """(what, figure, detail) rows, aligned."""
    w = max(len(a) for a, _, _ in rows)
    for a, b, c in rows:
        print(f"{a:<{w}}  {b:>10}  {c}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", default=None, help="model to tokenize with (the servers serve the packaged one)")
    p.add_argument("--threads", type=int, default=None, help="threads per server model")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    r = run(args)
    print(json.dumps(r, indent=2)) if args.json else print_table(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
