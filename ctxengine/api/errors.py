"""Errors in each dialect's own shape, chosen by the route a request came to.

* OpenAI (``/v1/...`` but messages, and our own routes): ``{"error": {"message", "type", "param", "code"}}``
* Anthropic (``/v1/messages...``): ``{"type": "error", "error": {"type", "message"}}``
* Ollama (``/api/...`` and ``/``): ``{"error": "..."}``

Every error raised on purpose becomes an :class:`ApiError` with an HTTP
status; a CtxError from below maps to one by its class (unknown model 404,
refused input 400, a service we depend on out of reach or refusing 503 with
``Retry-After``, damaged stored data 500, ...). Anything else is a bug: 500,
logged with its traceback, shown to the client as one line. A 409 says
``x-should-retry: false``: the clients that retry a 409 would repeat a turn.
"""
from __future__ import annotations

import json
import logging

import math

from ..errors import (CancelledError, ContextError, CorruptDataError, CtxError, InvalidNameError, ModelFileError,
                      ModelNotFoundError, RefConflictError, RequestError, StorageError, StoreError, UnavailableError,
                      UnsupportedModelError, WeightMismatchError)

log = logging.getLogger("ctxengine.api")

OPENAI, ANTHROPIC, OLLAMA = "openai", "anthropic", "ollama"

# OpenAI's own: a 404 (an unknown model) is an invalid request; ``code`` is a string or null.
_OPENAI_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
                 409: "conflict_error", 413: "invalid_request_error", 500: "server_error",
                 503: "service_unavailable_error"}
_OPENAI_CODES = {401: "invalid_api_key", 404: "not_found", 413: "request_too_large", 503: "overloaded"}
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                    409: "invalid_request_error", 413: "request_too_large", 500: "api_error",
                    503: "overloaded_error"}
# The OpenAI and Anthropic clients retry a 409 unless told not to (x-should-retry), and a
# conflict's request is not idempotent: each retry would generate, and append, another turn.
_NOT_RETRIED = {409}
MAX_MESSAGE_CHARS = 4000  # an error quoting what it was given never sends megabytes of it back


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None,
                 retry_after_s: float | None = None, extra_headers: dict[str, str] | None = None):
        if len(message) > MAX_MESSAGE_CHARS:
            message = f"{message[:MAX_MESSAGE_CHARS]}... ({len(message) - MAX_MESSAGE_CHARS} more characters)"
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s  # sent as Retry-After (whole seconds, at least 1)
        self.extra_headers = extra_headers or {}  # a 405's Allow, say

    def headers(self) -> dict[str, str]:
        headers = dict(self.extra_headers)
        if self.status in _NOT_RETRIED:
            headers["x-should-retry"] = "false"
        if self.retry_after_s is not None:
            headers["retry-after"] = str(max(1, math.ceil(self.retry_after_s)))
        return headers


def dialect_of(path: str) -> str:
    if path == "/" or path.startswith("/api/"):
        return OLLAMA
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return ANTHROPIC
    return OPENAI


def status_of(err: CtxError) -> int:
    """The HTTP status of an error the engine, state or store raised on purpose."""
    if isinstance(err, CancelledError):
        return 499  # nginx's "client closed request": the work stopped because its client left
    if isinstance(err, ModelNotFoundError):
        return 404
    if isinstance(err, (WeightMismatchError, RefConflictError)):
        return 409
    # A fleet that holds damaged data (store/fleet_cluster.py's FleetCorrupt) or refuses a
    # command (FleetRefused, an UnavailableError) is the server's trouble, never a 400.
    if isinstance(err, CorruptDataError):
        return 500
    if isinstance(err, UnavailableError):
        return 503
    if isinstance(err, StorageError):
        return 507  # Insufficient Storage: the store's disk, as an eviction or a snapshot wrote to it
    if isinstance(err, StoreError) and str(err).startswith("no ref"):
        return 404
    if isinstance(err, ContextError) and str(err).startswith("no context named"):
        return 404
    if isinstance(err, ContextError) and "already exists" in str(err):
        return 409
    if isinstance(err, ModelFileError):
        return 500  # a file the operator pointed us at is broken: not the client's doing
    if isinstance(err, (UnsupportedModelError, InvalidNameError, ContextError, StoreError, CtxError)):
        return 400
    return 500


def as_api_error(err: BaseException) -> ApiError:
    if isinstance(err, ApiError):
        return err
    if isinstance(err, UnavailableError):
        return ApiError(503, str(err), retry_after_s=err.retry_after_s)
    if isinstance(err, CtxError):
        return ApiError(status_of(err), str(err), param=err.param if isinstance(err, RequestError) else None)
    log.error("internal error", exc_info=err)
    return ApiError(500, f"internal error: {type(err).__name__}: {err}")


def error_body(dialect: str, err: ApiError) -> dict:
    if dialect == OLLAMA:
        return {"error": err.message}
    if dialect == ANTHROPIC:
        other = "invalid_request_error" if err.status < 500 else "api_error"  # a 405, a 422: the client's
        return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(err.status, other), "message": err.message}}
    other = "invalid_request_error" if err.status < 500 else "server_error"
    return {"error": {"message": err.message, "type": _OPENAI_TYPES.get(err.status, other),
                      "param": err.param, "code": _OPENAI_CODES.get(err.status)}}


def error_response(dialect: str, err: ApiError):
    """The error as a response. Its JSON is ASCII (``error_bytes``): a message that repeats a
    client's string holding a lone surrogate is still sent (UTF-8 has no spelling for one)."""
    from starlette.responses import Response

    return Response(error_bytes(dialect, err), status_code=err.status, headers=err.headers(),
                    media_type="application/json")


def error_bytes(dialect: str, err: ApiError) -> bytes:
    return json.dumps(error_body(dialect, err)).encode()
