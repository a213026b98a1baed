"""The gRPC server of ``ctx serve``: both services on one port, over one Runtime.

Loopback unless ``--host`` says otherwise; TLS with ``--tls-cert/--tls-key``;
a bearer token (``--token`` or ``$CTX_TOKEN``) on every call when set. Each
call runs on a pool thread, and the model's scheduler batches the forward
passes of concurrent calls, so many clients share one engine. A stream whose
client goes silent is ended after ``--rpc-idle-s`` (rpc/idle.py), and HTTP/2
keepalive finds peers that vanished, so neither holds a thread for good.
"""
from __future__ import annotations

import argparse
import ipaddress
import sys
from concurrent import futures
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from ..errors import CtxError
from .auth import TokenInterceptor, resolve_token
from .contexts import ContextServicer
from .idle import IdleLimit
from .snapshots import Limits, SnapshotServicer
from .v1 import context_pb2_grpc, snapshot_pb2_grpc

if TYPE_CHECKING:
    from ..serving.runtime import Runtime

# One pool thread for every call let in: a call past the limit is refused (RESOURCE_EXHAUSTED)
# at once, where with fewer threads it would queue behind streams that may sit idle for long.
MAX_CONCURRENT_RPCS = 128
MAX_WORKERS = MAX_CONCURRENT_RPCS
# HTTP/2 keepalive, so that a peer gone without a FIN (a machine powered off, a cable pulled, a NAT
# that forgot the flow) is found in under a minute, not after the kernel's hours, and its calls are
# cancelled: what they hold is freed. The ping policy lets well-behaved clients ping us too.
KEEPALIVE_OPTIONS = [
    ("grpc.keepalive_time_ms", 30_000),           # ping each connection after 30 s ...
    ("grpc.keepalive_timeout_ms", 20_000),        # ... and close it when no ack comes within 20 s
    ("grpc.keepalive_permit_without_calls", 1),   # idle connections too; and clients may ping those
    ("grpc.http2.max_pings_without_data", 0),     # go on pinging a connection whose streams are silent
    # A client's keepalive pings are welcome every 10 s (the shortest grpc-go and grpc-java allow);
    # one pinging faster is misbehaving, and told GOAWAY past 2 such pings (gRPC's default).
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 2),
]


class GrpcServer:
    """A started server: ``port`` is the bound port; ``stop(grace)`` ends it."""

    def __init__(self, server: grpc.Server, host: str, port: int, idle: IdleLimit | None = None):
        self._server = server
        self._idle = idle
        self.host = host
        self.port = port

    def stop(self, grace: float | None = None) -> None:
        """Refuse new calls, give those in flight ``grace`` seconds, then cancel them."""
        self._server.stop(grace).wait()
        if self._idle is not None:
            self._idle.close()

    def wait(self) -> None:
        self._server.wait_for_termination()


def start_grpc(runtime: "Runtime", args: argparse.Namespace) -> GrpcServer:
    """Start ContextService and SnapshotService on args.host:args.grpc_port."""
    limits = Limits(max_message_bytes=int(args.max_message_mb * (1 << 20)), max_pages=args.max_pages)
    token = resolve_token(args.token)
    options = [("grpc.max_receive_message_length", limits.max_message_bytes),
               ("grpc.max_send_message_length", limits.max_message_bytes),
               ("grpc.so_reuseport", 0), *KEEPALIVE_OPTIONS]
    idle = IdleLimit(args.rpc_idle_s) if args.rpc_idle_s else None  # 0: no limit
    interceptors = [*([TokenInterceptor(token)] if token else []), *([idle] if idle else [])]
    server = grpc.server(futures.ThreadPoolExecutor(MAX_WORKERS, thread_name_prefix="ctx-grpc"),
                         interceptors=interceptors, options=options, maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS)
    context_pb2_grpc.add_ContextServiceServicer_to_server(ContextServicer(runtime), server)
    snapshot_pb2_grpc.add_SnapshotServiceServicer_to_server(SnapshotServicer(runtime, limits), server)
    address = _address(args.host, args.grpc_port)
    try:
        if args.tls_cert or args.tls_key:
            port = server.add_secure_port(address, _credentials(args.tls_cert, args.tls_key))
        else:
            port = server.add_insecure_port(address)
            if not _is_loopback(args.host):
                print(f"ctx serve: warning: gRPC on {args.host} without TLS (--tls-cert/--tls-key): "
                      "calls and any token cross the network in clear", file=sys.stderr)
    except RuntimeError as err:
        raise CtxError(f"cannot listen for gRPC on {address}: {err}") from None
    if not port:
        raise CtxError(f"cannot listen for gRPC on {address} (in use?)")
    server.start()
    return GrpcServer(server, args.host, port, idle)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _credentials(cert: str | None, key: str | None) -> grpc.ServerCredentials:
    if not (cert and key):
        raise CtxError("TLS needs both --tls-cert and --tls-key")
    try:
        pair = (Path(key).read_bytes(), Path(cert).read_bytes())
    except OSError as err:
        raise CtxError(f"cannot read the TLS key or certificate: {err}") from None
    return grpc.ssl_server_credentials([pair])
