"""A connection to a ``ctx serve`` gRPC face: where it is, how to authenticate,
and its three kinds of call, each turning a failure into a RemoteError.
Remote (rpc/client.py) speaks the services over it; rpc/transfer.py moves
snapshots over it.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import grpc

from ..errors import CtxError
from .auth import metadata, resolve_token
from .errors import remote_error
from .v1 import context_pb2_grpc, snapshot_pb2_grpc

DEFAULT_PORT = 11436
MAX_PORT = 65535
MAX_MESSAGE_BYTES = 64 << 20


def parse_target(text: str, default_port: int = DEFAULT_PORT) -> str:
    """``HOST[:PORT]`` (``[v6]:PORT`` for IPv6) -> the ``host:port`` gRPC dials."""
    text = text.strip()
    if not text:
        raise CtxError("empty host")
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
        host = f"[{host}]"
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = (f"[{text}]" if ":" in text else text), ""
    if port and not (port.isascii() and port.isdigit()):
        raise CtxError(f"bad port in {text!r}")
    if port and not 1 <= int(port) <= MAX_PORT:  # gRPC would dial the port modulo 65536
        raise CtxError(f"port {int(port)} in {text!r} is out of range (1 to {MAX_PORT})")
    return f"{host}:{port or default_port}"


class Channel:
    def __init__(self, target: str, *, token: str | None = None, tls: bool | str | os.PathLike = False,
                 timeout: float | None = None):
        """``tls``: False (plaintext), True (system roots) or a PEM CA certificate file;
        ``token``: a bearer token (default $CTX_TOKEN); ``timeout``: seconds per unary call."""
        self.target = parse_target(target)
        self.timeout = timeout
        self._metadata = metadata(resolve_token(token))
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   # A server gone without a FIN ends a push or pull within a minute, not after
                   # the kernel's hours: a ping after 30 s quiet, the connection closed when 20 s
                   # bring no answer (the server allows a client's pings every 10 s: rpc/server.py).
                   ("grpc.keepalive_time_ms", 30_000), ("grpc.keepalive_timeout_ms", 20_000)]
        if tls:
            try:
                roots = None if tls is True else Path(tls).read_bytes()
            except OSError as err:
                raise CtxError(f"cannot read the TLS CA certificate: {err}") from None
            self._channel = grpc.secure_channel(self.target, grpc.ssl_channel_credentials(roots), options)
        else:
            self._channel = grpc.insecure_channel(self.target, options)
        self._stubs = {"contexts": context_pb2_grpc.ContextServiceStub(self._channel),
                       "snapshots": snapshot_pb2_grpc.SnapshotServiceStub(self._channel)}

    def close(self) -> None:
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.target!r})"

    # -- calls (RemoteError on failure) -------------------------------------------------
    def unary(self, service: str, method: str, request):
        try:
            return getattr(self._stubs[service], method)(request, metadata=self._metadata, timeout=self.timeout)
        except grpc.RpcError as err:
            raise remote_error(self.target, err) from None

    def client_stream(self, service: str, method: str, requests: Iterable, on_response=None):
        """A client-streaming call: send ``requests``; return the one response."""
        try:
            response = getattr(self._stubs[service], method)(iter(requests), metadata=self._metadata)
        except grpc.RpcError as err:
            raise remote_error(self.target, err) from None
        return on_response(response) if on_response else response

    def stream(self, service: str, method: str, request) -> Iterator:
        """A server-streaming call's responses; cancelled if the caller stops reading."""
        call = getattr(self._stubs[service], method)(request, metadata=self._metadata)
        try:
            yield from call
        except grpc.RpcError as err:
            raise remote_error(self.target, err) from None
        finally:
            call.cancel()  # a no-op once the stream has ended
