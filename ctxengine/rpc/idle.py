"""The idle limit of gRPC calls (``ctx serve --rpc-idle-s``).

A stream whose client goes silent keeps what its call holds: a PutPages its put
slot and pool thread, a GetPages or Generate its pool thread, blocked in gRPC's
send while flow control waits for a reader (and a Generate its context's lock).
grpc's sync server has no limit of its own, so one thread watches every
call. A call is idle only while it waits on its client: for its next request
message (a unary call's one request too), or for a response message to be
taken (a send not yet done).
Never while the server works: a slow model, a PutPages waiting for a put slot,
a Generate queued for its context. A call idle for the limit is ended with
DEADLINE_EXCEEDED naming the limit; its handler returns at once, and its
thread, slot and lock go with it.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from .errors import Code, Refused

log = logging.getLogger(__name__)


class _Clock:
    """One call's silence: since when it has waited on its client (None: it does not)."""

    __slots__ = ("context", "since", "what", "reason")

    def __init__(self, context: grpc.ServicerContext):
        self.context = context
        self.since: float | None = None
        self.what = ""
        self.reason: str | None = None  # set once the watchdog has ended the call

    def waiting(self, what: str) -> None:
        """From now the call waits on its client (``what``: "send" or "take" a message)."""
        self.what = what
        self.since = time.monotonic()

    def answered(self) -> None:
        self.since = None

    def idle_for(self, now: float) -> float:
        since = self.since  # read once: the call's thread changes it as it goes
        return 0.0 if since is None else now - since


class IdleLimit(grpc.ServerInterceptor):
    """Ends every call that waits ``limit_s`` on its client; one watchdog thread."""

    def __init__(self, limit_s: float):
        self.limit_s = limit_s
        self._clocks: set[_Clock] = set()  # the calls running now (at most the server's 128)
        self._changed = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None  # started by the first call

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify()
            thread = self._thread
        if thread is not None:
            thread.join()

    @property
    def n_watched(self) -> int:
        """The calls running now: each is forgotten when it ends."""
        with self._changed:
            return len(self._clocks)

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None:
            return None  # unknown method: gRPC answers UNIMPLEMENTED
        # Every call's requests are read on its clock, a unary call's one request too: grpcio
        # would wait for that in a pool thread, without limit, before any code of ours runs.
        if handler.request_streaming:
            behavior = handler.stream_stream if handler.response_streaming else handler.stream_unary
        else:
            behavior = _one_request(handler.unary_stream if handler.response_streaming else handler.unary_unary,
                                    details.method)
        limited = self._limited(behavior, handler.response_streaming)
        kw = dict(request_deserializer=handler.request_deserializer,
                  response_serializer=handler.response_serializer)
        if handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(limited, **kw)
        return grpc.stream_unary_rpc_method_handler(limited, **kw)

    def _limited(self, behavior: Callable, responses: bool) -> Callable:
        """``behavior`` (request-streaming) with its requests, and its responses if they stream, on a clock."""

        def call(requests, context):
            clock = self._start(context)
            response = behavior(_Requests(requests, clock), context)
            return _responses(response, clock) if responses else response

        return call

    def _start(self, context: grpc.ServicerContext) -> _Clock:
        clock = _Clock(context)
        with self._changed:
            self._clocks.add(clock)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="ctx-grpc-idle", daemon=True)
                self._thread.start()
            elif len(self._clocks) == 1:
                self._changed.notify()  # the watchdog sleeps without a timeout while no call runs
        if not context.add_callback(lambda: self._forget(clock)):  # when the call ends, however it ends
            self._forget(clock)  # it has ended already
        return clock

    def _forget(self, clock: _Clock) -> None:
        with self._changed:
            self._clocks.discard(clock)

    def _watch(self) -> None:
        while True:
            with self._changed:
                if self._closed:
                    return
                now = time.monotonic()
                idle = [c for c in self._clocks if c.idle_for(now) >= self.limit_s]
                self._clocks.difference_update(idle)
                if not idle:
                    self._changed.wait(self._next_check(now))
                    continue
            for clock in idle:  # outside the lock: cancelling runs grpc's callbacks, and they take it
                self._end(clock)

    def _next_check(self, now: float) -> float | None:
        """Seconds until the first call can be idle for the limit. One that starts waiting
        later reaches it later still, so nothing needs to wake the watchdog early."""
        starts = [s for s in (c.since for c in self._clocks) if s is not None]
        if starts:
            return max(0.0, min(starts) + self.limit_s - now)
        return self.limit_s if self._clocks else None

    def _end(self, clock: _Clock) -> None:
        clock.reason = (f"the client did not {clock.what} a message for {self.limit_s:g} s: ended by the "
                        "server's idle limit (ctx serve --rpc-idle-s)")
        try:
            _cancel(clock.context, clock.reason)
        except Exception:  # one call that cannot be ended must not stop the watch over the others
            log.exception("cannot end an idle gRPC call")


def _cancel(context: grpc.ServicerContext, details: str) -> None:
    """End a call from outside its handler with DEADLINE_EXCEEDED and ``details``.

    The sync API's ``context.cancel()`` ends it as CANCELLED, without a word why, and
    ``abort`` works only in the handler's own thread (blocked here). grpcio's call
    underneath (cygrpc ``Call.cancel``) takes a status: on the server, gRPC core sends it
    as the call's trailers. Private, so tests/test_rpc_idle.py checks the status the
    client sees, and an older or newer grpcio without it still ends the call.
    """
    call = getattr(getattr(context, "_rpc_event", None), "call", None)
    try:
        call.cancel(Code.DEADLINE_EXCEEDED.value[0], details)
    except (AttributeError, TypeError):
        context.cancel()


def _one_request(behavior: Callable, method: str) -> Callable:
    """A unary-request ``behavior`` as a request-streaming one: its one request read from the stream."""

    def call(requests, context):
        try:
            request = next(requests, None)
        except Refused as err:  # idle before its request came: as rpc/errors.py's guarded answers
            context.abort(err.code, str(err))
        if request is None:  # as grpcio answers a unary call without its request
            context.abort(Code.UNIMPLEMENTED, f'"{method}" requires exactly one request message.')
        return behavior(request, context)

    return call


class _Requests:
    """A call's request stream, its clock running while the call waits for the next message."""

    def __init__(self, requests: Iterator, clock: _Clock):
        self._requests = requests
        self._clock = clock

    def __iter__(self) -> _Requests:
        return self

    def __next__(self):
        self._clock.waiting("send")
        try:
            return next(self._requests)
        except (StopIteration, grpc.RpcError):
            # Ended by the watchdog, the stream may look finished: never let a handler take
            # the pages it has as all there are (PutPages would store them).
            if self._clock.reason is not None:
                raise Refused(Code.DEADLINE_EXCEEDED, self._clock.reason) from None
            raise
        finally:
            self._clock.answered()


def _responses(responses: Iterator, clock: _Clock) -> Iterator:
    """A call's response stream, its clock running while gRPC waits for the client to take one
    (the next is asked for only once the last is sent); the handler's own work is never timed."""
    try:
        for response in responses:
            clock.waiting("take")
            yield response
            clock.answered()
    finally:
        close = getattr(responses, "close", None)
        if close is not None:
            close()  # here, in the call's thread: a Generate lets go of its context's lock
