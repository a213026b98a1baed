"""Bearer-token authentication for the gRPC face.

A server started with a token (``--token`` or ``$CTX_TOKEN``) requires the
metadata ``authorization: Bearer <token>`` on every call and answers
UNAUTHENTICATED otherwise, before the call reaches a servicer. The compare is
constant-time, so the answer's timing says nothing about the token.
"""
from __future__ import annotations

import hmac
import os

import grpc

TOKEN_ENV = "CTX_TOKEN"
HEADER = "authorization"


def resolve_token(token: str | None) -> str | None:
    """The token given, else $CTX_TOKEN, else None (no authentication)."""
    if token is None:
        token = os.environ.get(TOKEN_ENV)
    return token or None


def metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata a client sends for ``token`` (none without one)."""
    return ((HEADER, f"Bearer {token}"),) if token else ()


class TokenInterceptor(grpc.ServerInterceptor):
    def __init__(self, token: str):
        self._expected = f"Bearer {token}".encode()

    def intercept_service(self, continuation, details):
        given = dict(details.invocation_metadata or ()).get(HEADER)
        if given is not None and hmac.compare_digest(given.encode(), self._expected):
            return continuation(details)
        handler = continuation(details)
        if handler is None:
            return None  # unknown method: gRPC answers UNIMPLEMENTED
        why = "missing bearer token" if given is None else "wrong bearer token"
        return _refusal(handler, why)


def _refusal(handler: grpc.RpcMethodHandler, why: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that refuses the call."""

    def refuse(_request, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{why} (send 'authorization: Bearer <token>')")

    kw = dict(request_deserializer=handler.request_deserializer,
              response_serializer=handler.response_serializer)
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, **kw)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, **kw)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse, **kw)
    return grpc.unary_unary_rpc_method_handler(refuse, **kw)
