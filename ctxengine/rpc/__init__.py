"""gRPC face of ``ctx serve`` (ContextService, SnapshotService) and its client.

    from ctxengine.rpc import Remote
    with Remote("hostb:11436", token=...) as b:
        b.push(store, "main")                     # sends only the pages b lacks
        c = b.restore("main", name="main")        # a live context on host b
        for piece in c.generate(max_tokens=16, temperature=0.0):
            print(piece.text, end="")

Protocol: proto/ctxengine/v1/*.proto, docs/grpc.md.
"""
from __future__ import annotations

import argparse
import math


def add_grpc_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--token", default=None, help="bearer token required on every gRPC call (default: $CTX_TOKEN)")
    p.add_argument("--tls-cert", metavar="FILE", default=None, help="serve gRPC over TLS with this PEM certificate")
    p.add_argument("--tls-key", metavar="FILE", default=None, help="the PEM private key of --tls-cert")
    p.add_argument("--max-message-mb", type=_positive_mb, default=16.0, metavar="MB",
                   help="largest gRPC message accepted or sent (default 16; a KV page must fit)")
    p.add_argument("--max-pages", type=_positive_int, default=65536, metavar="N",
                   help="most page keys in one request or snapshot (default 65536)")
    p.add_argument("--rpc-idle-s", type=_idle_seconds, default=60.0, metavar="SECONDS",
                   help="end a call whose client sends or takes no message for this long, freeing what it "
                        "holds (default 60; 0: no limit)")


def _positive_mb(text: str) -> float:
    """A finite size > 0 that is at least one byte: 0 would fail every call, a negative or
    infinite one would lift the limit, and nan cannot be compared."""
    try:
        mb = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(mb) or int(mb * (1 << 20)) < 1 or mb * (1 << 20) >= 1 << 31:
        raise argparse.ArgumentTypeError(f"must be a size in MB above 0 and below 2048, not {text!r}")
    return mb


def _idle_seconds(text: str) -> float:
    """A finite number of seconds >= 0 (0: no limit); a negative or nan one would end
    every stream at once or never, and infinity is spelled 0."""
    try:
        s = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= s < math.inf:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0 (0: no limit), not {text!r}")
    return s


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text!r}")
    return n


def start_grpc(runtime, args: argparse.Namespace):
    from .server import start_grpc as start

    return start(runtime, args)


def __getattr__(name: str):
    if name in ("Remote", "RemoteContext"):
        from . import client

        return getattr(client, name)
    if name in ("TransferResult", "RemoteError"):
        from . import errors, transfer

        return getattr(transfer if name == "TransferResult" else errors, name)
    raise AttributeError(f"module 'ctxengine.rpc' has no attribute {name!r}")
