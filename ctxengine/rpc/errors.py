"""Errors across the wire: CtxError -> gRPC status on the server, status ->
RemoteError on the client. The one place that decides which code a failure gets.

Servicer methods are wrapped with :func:`guarded`: an error a user can act on
(a CtxError) becomes its status code with ``str(err)`` as the details; anything
else is a bug and reaches gRPC as INTERNAL (logged by grpc, never shown as a
traceback to the client).
"""
from __future__ import annotations

import functools
import inspect

import grpc

from ..errors import (CancelledError, ContextError, CorruptDataError, CtxError, InvalidNameError, ModelFileError,
                      ModelNotFoundError, RequestError, StoreError, TokenizerError, UnavailableError,
                      UnsupportedModelError, WeightMismatchError, WeightsNotServedError)

Code = grpc.StatusCode

# Most specific first: CorruptDataError and WeightMismatchError are StoreErrors.
_BY_CLASS: tuple[tuple[type[CtxError], grpc.StatusCode], ...] = (
    (InvalidNameError, Code.INVALID_ARGUMENT),
    (CancelledError, Code.CANCELLED),        # the client went away; the work stopped (a RequestError)
    (RequestError, Code.INVALID_ARGUMENT),
    (WeightMismatchError, Code.FAILED_PRECONDITION),
    (CorruptDataError, Code.DATA_LOSS),
    (UnavailableError, Code.UNAVAILABLE),    # the fleet is out of reach: try again shortly
    (WeightsNotServedError, Code.FAILED_PRECONDITION),  # a snapshot this host cannot restore
    (ModelNotFoundError, Code.NOT_FOUND),
    (UnsupportedModelError, Code.FAILED_PRECONDITION),
    (ModelFileError, Code.FAILED_PRECONDITION),
    (TokenizerError, Code.FAILED_PRECONDITION),
    (StoreError, Code.FAILED_PRECONDITION),
    (ContextError, Code.INVALID_ARGUMENT),
)
# ContextError and StoreError have no subclasses for these cases; their
# messages are worded consistently (state/table.py, store/store.py).
_BY_WORDING: tuple[tuple[type[CtxError], str, grpc.StatusCode], ...] = (
    (ContextError, "no context named", Code.NOT_FOUND),
    (ContextError, "already exists", Code.ALREADY_EXISTS),
    (ContextError, "page pool", Code.RESOURCE_EXHAUSTED),
    (ContextError, "context length", Code.RESOURCE_EXHAUSTED),
    (StoreError, "no ref or snapshot named", Code.NOT_FOUND),
    (StoreError, "no ref named", Code.NOT_FOUND),
    (StoreError, "is not in the store", Code.NOT_FOUND),
    (StoreError, "no such snapshot", Code.NOT_FOUND),
    (StoreError, "not a ref or snapshot id", Code.INVALID_ARGUMENT),
    (StoreError, "must be 64 hex digits", Code.INVALID_ARGUMENT),  # store/pages.py key_bytes
)


class Refused(CtxError):
    """A refusal whose status code the servicer chooses itself (limits, bad keys)."""

    def __init__(self, code: grpc.StatusCode, message: str):
        self.code = code
        super().__init__(message)


def status_for(err: CtxError) -> grpc.StatusCode:
    if isinstance(err, Refused):
        return err.code
    for cls, words, code in _BY_WORDING:
        if isinstance(err, cls) and not isinstance(err, (CorruptDataError, WeightMismatchError)) \
                and words in str(err):
            return code
    for cls, code in _BY_CLASS:
        if isinstance(err, cls):
            return code
    return Code.FAILED_PRECONDITION


def guarded(method):
    """Wrap a servicer method (unary or streaming) so CtxErrors become statuses."""
    if inspect.isgeneratorfunction(method):
        @functools.wraps(method)
        def stream(self, request, context):
            try:
                yield from method(self, request, context)
            except CtxError as err:
                context.abort(status_for(err), str(err))
        return stream

    @functools.wraps(method)
    def unary(self, request, context):
        try:
            return method(self, request, context)
        except CtxError as err:
            context.abort(status_for(err), str(err))
    return unary


class RemoteError(CtxError):
    """A call to a remote ctx server failed; ``code`` is its gRPC status."""

    def __init__(self, target: str, code: grpc.StatusCode, details: str):
        self.target = target
        self.code = code
        self.details = details
        super().__init__(f"{target}: {code.name}: {details}")


def remote_error(target: str, err: grpc.RpcError) -> RemoteError:
    code = err.code() if hasattr(err, "code") else Code.UNKNOWN
    details = (err.details() if hasattr(err, "details") else None) or str(err)
    if code == Code.UNAVAILABLE:
        details = f"cannot reach the server ({details})"
    return RemoteError(target, code, details)
