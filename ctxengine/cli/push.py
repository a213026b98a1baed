"""``ctx push REF HOST[:PORT]``: send a snapshot to another host's ``ctx serve``.

The host first says which pages it lacks (and refuses a snapshot of weights
it does not serve, before any page moves); only those are sent, and the
manifest and ref are written there last, so a push that is cut off leaves no
half snapshot and running it again sends only what is still missing.

A ref that exists on the receiving side moves only forward: to a snapshot that
descends from the one it points at. Anything else is refused (the ref is left
as it is) unless ``--force``; ``--as NAME`` pushes under another name.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict


# A server's PutPages call carries at most 64 MiB (rpc/snapshots.py Limits), and a call may pass
# its chunk by a page: half of that leaves room.
MAX_CHUNK_MB = 32

def add_remote_arguments(p: argparse.ArgumentParser) -> None:
    """Options of every verb that talks to a remote host (push, remote pull)."""
    p.add_argument("--store", metavar="DIR", default=None,
                   help="local snapshot store (default: $CTX_STORE, else the XDG data dir)")
    p.add_argument("--as", dest="as_ref", metavar="REF", default=None,
                   help="ref to set on the receiving side (default: the same name)")
    p.add_argument("--force", action="store_true",
                   help="move that ref even where the snapshot does not descend from the one it points at")
    p.add_argument("--token", default=None, help="bearer token for the host (default: $CTX_TOKEN)")
    p.add_argument("--tls", action="store_true", help="connect over TLS, trusting the system's CAs")
    p.add_argument("--tls-ca", metavar="FILE", default=None, help="connect over TLS, trusting this PEM CA")
    p.add_argument("--chunk-mb", type=float, default=8.0, metavar="MB",
                   help="page records per call (default 8; a cut-off transfer keeps the calls that ended)")
    p.add_argument("--json", action="store_true", help="print the transfer's figures as JSON")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("ref", help="a ref, snapshot id or id prefix in the local store")
    p.add_argument("host", metavar="HOST[:PORT]", help="the receiving ctx serve (gRPC port default 11436)")
    add_remote_arguments(p)


def connect(args: argparse.Namespace, host: str):
    from ..rpc.client import Remote

    return Remote(host, token=args.token, tls=args.tls_ca or args.tls)


def chunk_bytes(args: argparse.Namespace) -> int:
    from ..errors import CtxError

    if not 0 < args.chunk_mb <= MAX_CHUNK_MB:  # False for NaN; inf was an OverflowError's traceback
        raise CtxError(f"--chunk-mb must be more than 0 and at most {MAX_CHUNK_MB} (a server takes at most "
                       f"64 MiB a call), not {args.chunk_mb:g}")
    return max(1, int(args.chunk_mb * (1 << 20)))


def report(verb: str, result, args: argparse.Namespace, where: str) -> None:
    if args.json:
        print(json.dumps({**asdict(result), "mb_per_s": round(result.mb_per_s, 1)}, sort_keys=True))
        return
    ref = f" as {result.ref}" if result.ref else ""
    moved = "sent" if verb == "pushed" else "fetched"
    print(f"{verb} {result.snapshot_id[:12]}{ref} {where}: {result.pages_sent} pages {moved}, "
          f"{result.pages_skipped} already there; {result.page_bytes:,} bytes of pages, "
          f"{result.wire_bytes:,} on the wire, {result.seconds:.2f} s ({result.mb_per_s:.1f} MB/s)")


def main(args: argparse.Namespace) -> int:
    from .contexts import open_store, progress_bar

    chunk = chunk_bytes(args)  # the arguments are refused before the store is looked for
    with connect(args, args.host) as remote, open_store(args, existing=True) as store:
        with progress_bar(f"push {args.ref}") as progress:
            result = remote.push(store, args.ref, as_ref=args.as_ref, force=args.force, chunk_bytes=chunk,
                                 progress=progress)
    report("pushed", result, args, f"to {remote.target}")
    return 0
