"""The HTTP app (every dialect's routes on one port) and how it is run.

``serve_http`` runs uvicorn in the calling thread until SIGINT or SIGTERM.
Shutdown is graceful: no new connections, requests in flight may finish for
``--shutdown-timeout`` seconds; a second before that runs out their
generations are stopped after the current token, so each reply (streamed or
not) still ends in its dialect's proper form, cut short; we then wait for
their threads before the caller closes the models.
"""
from __future__ import annotations

import asyncio
import contextlib
import signal
import threading

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.routing import Match

from ..errors import CtxError
from ..serving.exports import __version__
from ..serving.generation import Generations
from ..serving.pulls import Pulls
from . import anthropic, contexts, fleet, lora, ollama, ollama_store, openai, ops
from . import responses, studio
from .arguments import DEFAULT_MAX_BODY
from .errors import ApiError, as_api_error, dialect_of, error_response
from .metrics import Metrics
from .options import entry_sampling

# How long an idle keep-alive connection is held. Longer than the clients' own
# idle limits (httpx 5 s, aiohttp 15 s, Go's net/http 90 s), so it is the client
# that closes an idle connection, never the server at the moment a client sends
# its next request on it (which the client sees as a reset connection).
KEEP_ALIVE_S = 120


def build_app(runtime, *, api_key: str | None = None, max_body: int = DEFAULT_MAX_BODY,
              cors_origins: list[str] | tuple = (), request_timeout: float | None = None) -> FastAPI:
    metrics = Metrics(runtime)
    generations = Generations(runtime, metrics, request_timeout, entry_defaults=entry_sampling)
    app = FastAPI(title="ctx-engine", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.runtime = runtime
    app.state.metrics = metrics
    app.state.generations = generations
    app.include_router(ops.routes(runtime, metrics))
    app.include_router(openai.routes(runtime, generations, metrics))
    app.include_router(anthropic.routes(runtime, generations))
    app.include_router(ollama.routes(runtime, generations, metrics))
    app.state.pulls = Pulls(runtime)
    app.include_router(ollama_store.routes(runtime, app.state.pulls))
    app.include_router(contexts.routes(runtime))
    app.include_router(responses.routes(runtime, generations))
    app.include_router(fleet.routes(runtime))
    app.include_router(lora.routes(runtime))
    studio.mount(app, runtime)  # the page at /studio and its /v1/studio routes

    def reply(request: Request, err: ApiError):
        return error_response(dialect_of(request.url.path), err)

    @app.exception_handler(ApiError)
    @app.exception_handler(CtxError)
    async def refused(request: Request, err: Exception):
        return reply(request, as_api_error(err))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException):
        message = "no such route" if err.status_code == 404 else str(err.detail)
        headers = dict(err.headers or {})
        if err.status_code == 405:
            headers["Allow"] = _allowed(request, headers.get("Allow", ""))
        return reply(request, ApiError(err.status_code, f"{message}: {request.method} {request.url.path}",
                                       extra_headers=headers))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError):
        first = err.errors()[0] if err.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ()))
        return reply(request, ApiError(400, f"invalid {where}: {first.get('msg', 'bad request')}"))

    app.add_middleware(ops.Bugs)  # innermost: anything else is a 500 that keeps the connection
    app.add_middleware(ops.Guard, api_key=api_key, max_body=max_body, metrics=metrics, cors_origins=cors_origins)
    ops.add_cors(app, list(cors_origins))
    app.add_middleware(fleet.HostHeader, host_id=runtime.host_id)
    return app


# Every method a route here takes, in the order an Allow header lists them.
_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _allowed(request: Request, own: str) -> str:
    """A 405's Allow: every method some route takes at this path. Starlette's names the
    methods of the first route that matched the path alone (the HEAD twin of a GET route,
    GET /v1/contexts without its POST). Each method is tried on the app's routes as a
    request of its own, so routers FastAPI nests are asked too. ``own``: the header the
    405 came with, kept for one raised inside a mounted app (the studio's files: the
    mount takes any method, and only the app behind it knows)."""
    routes = request.app.router.routes
    base = {"type": "http", "path": request.scope["path"], "root_path": request.scope.get("root_path", "")}
    if any(route.matches({**base, "method": request.method})[0] is Match.FULL for route in routes):
        return own
    methods = [m for m in _METHODS if any(route.matches({**base, "method": m})[0] is Match.FULL for route in routes)]
    return ", ".join(methods) or own


def serve_http(runtime, args, on_ready=None) -> None:
    _raise_open_file_limit()
    app = build_app(runtime, api_key=args.api_key, max_body=args.max_body, cors_origins=args.cors_origin,
                    request_timeout=args.request_timeout)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                            lifespan="off", timeout_graceful_shutdown=args.shutdown_timeout,
                            timeout_keep_alive=KEEP_ALIVE_S, http=_head_timed(args.header_timeout))
    server = _Server(config, on_ready, on_shutdown=app.state.generations.cancel_all,
                     on_stopping=app.state.pulls.stop_all)
    try:
        server.run()
    except SystemExit:  # uvicorn's way of saying it could not start
        pass
    finally:
        app.state.generations.shutdown(timeout=args.shutdown_timeout)
    if not server.started:
        raise CtxError(f"cannot listen on {_url(args.host, args.port)} (is the port in use?)")


def _head_timed(timeout: float) -> type:
    """uvicorn's h11 protocol, with a deadline for a request's head: a connection must send a
    whole request line and headers within ``timeout`` seconds of opening, or of the first
    bytes of its next request. uvicorn's own timer runs only between a response and the next
    request's first byte, so a connection that never finished its headers (or never sent
    any) was held for good, and enough of them took every file descriptor: the server then
    answered no one."""
    from uvicorn.protocols.http.h11_impl import H11Protocol, h11

    class HeadTimed(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport):
            super().connection_made(transport)
            self._deadline = self.loop.call_later(timeout, self._late)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            head_pending = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
            if head_pending and self._deadline is None:
                self._deadline = self.loop.call_later(timeout, self._late)
            elif not head_pending:
                self._stop()

        def connection_lost(self, exc) -> None:
            self._stop()
            super().connection_lost(exc)

        def _stop(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _late(self) -> None:
            self._deadline = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return HeadTimed


def _raise_open_file_limit() -> None:
    """Every connection is a file descriptor: raise the soft limit (often 1,024) to the hard
    one, as Go's servers do (to 2**20 where the hard one is unlimited; the hard one stays)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1 << 20 if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            pass  # a container's own ceiling: keep what we have


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Server(uvicorn.Server):
    """uvicorn's Server, telling us when it listens and handing SIGTERM back to us.

    (uvicorn re-raises the signal that stopped it once it is done, which would
    kill the process before ``ctx serve`` closes its models and gRPC face.)"""

    def __init__(self, config: uvicorn.Config, on_ready, on_shutdown, on_stopping):
        super().__init__(config)
        self._on_ready = on_ready
        self._on_shutdown = on_shutdown
        self._on_stopping = on_stopping

    async def shutdown(self, sockets=None):
        # Pulls stop at once (their clients are told; the partials stay). A second before
        # uvicorn would cancel the requests still running, stop their generations instead:
        # each reply then ends normally, cut short ("length").
        self._on_stopping()
        grace = self.config.timeout_graceful_shutdown
        if grace is not None:
            asyncio.get_running_loop().call_later(max(0.0, grace - 1.0), self._on_shutdown)
        await super().shutdown(sockets=sockets)

    async def startup(self, sockets=None):
        await super().startup(sockets=sockets)
        if self.started and self._on_ready is not None:
            port = self.servers[0].sockets[0].getsockname()[1] if self.servers else self.config.port
            self._on_ready(_url(self.config.host, port))

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
