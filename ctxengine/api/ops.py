"""Operations: ``/health``, ``/metrics``, the API key, request size limits, CORS.

:class:`Guard` is plain ASGI middleware (it must not buffer streamed
responses): it refuses a missing or wrong API key on every route but
``/health`` and the studio's static files (``Authorization: Bearer KEY`` or
``x-api-key: KEY``), refuses a body over the size limit (413, by Content-Length up front, or while
a chunked body is read), refuses writes a browser sends from another site (403: a web page the
user visits must not drive a local server; API clients send no Origin), and counts requests by
route and status. :class:`Bugs`, inside it, answers what no handler took.
"""
from __future__ import annotations

import hmac
import time

from fastapi import APIRouter, FastAPI, Request
from starlette.responses import JSONResponse, Response

from .errors import ApiError, as_api_error, dialect_of, error_response

OPEN_PATHS = frozenset({"/health"})
STUDIO_PAGE = "/studio"  # the studio's static files hold no data; the page asks for the key itself


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class Guard:
    def __init__(self, app, *, api_key: str | None, max_body: int, metrics, cors_origins=()):
        self.app = app
        self.cors_origins = frozenset(cors_origins)
        self.api_key = api_key.encode() if api_key else None
        self.max_body = max_body
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        status = {"code": 500}

        async def sending(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            refusal = self._refusal(scope)
            if refusal is not None:
                await error_response(dialect_of(path), refusal)(scope, receive, sending)
                return
            await self.app(scope, self._limited(receive), sending)
        finally:
            route = scope.get("route")
            label = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.labels(label, scope["method"], str(status["code"])).inc()

    def _refusal(self, scope) -> ApiError | None:
        headers = {k.decode("latin-1").lower(): v for k, v in scope["headers"]}
        origin = headers.get("origin")
        if origin is not None and scope["method"] not in SAFE_METHODS and not self._same_or_allowed(origin, headers):
            return ApiError(403, f"a cross-site request from {origin.decode('latin-1')} is refused "
                                 f"(allow its origin with --cors-origin)")
        if self.api_key is not None and not _open(scope["path"]):
            given = headers.get("x-api-key")
            auth = headers.get("authorization", b"")
            if given is None and auth[:7].lower() == b"bearer ":
                given = auth[7:].strip()
            if given is None or not hmac.compare_digest(given, self.api_key):
                return ApiError(401, "a valid API key is required (Authorization: Bearer KEY, or x-api-key: KEY)")
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            return _too_large(self.max_body)
        return None

    def _same_or_allowed(self, origin: bytes, headers: dict) -> bool:
        """The page that sent it is this server's own (the studio), or an origin --cors-origin allows."""
        text = origin.decode("latin-1")
        if "*" in self.cors_origins or text in self.cors_origins:
            return True
        host = headers.get("host", b"").decode("latin-1")
        return bool(host) and text.split("://", 1)[-1] == host

    def _limited(self, receive):
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    raise _too_large(self.max_body)
            return message

        return limited


class Bugs:
    """Whatever a route raises that no handler takes (a bug) is a 500 in the route's dialect,
    its traceback logged. Here, not as FastAPI's catch-all handler, which answers and then
    raises again, so that the server dropped the connection: the client's next request on
    it, pipelined or kept alive, failed too. A reply already begun can only be cut."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def sending(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as err:  # noqa: BLE001 - a bug, answered and logged (as_api_error)
            if started:
                raise
            await error_response(dialect_of(scope["path"]), as_api_error(err))(scope, receive, send)


def _open(path: str) -> bool:
    return path in OPEN_PATHS or path == STUDIO_PAGE or path.startswith(STUDIO_PAGE + "/")


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is larger than the limit of {limit} bytes (--max-body)")


def add_cors(app: FastAPI, origins: list[str]) -> None:
    """CORS for these origins ("*": any); without any, no CORS headers are sent."""
    if not origins:
        return
    from starlette.middleware.cors import CORSMiddleware

    app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["*"], allow_headers=["*"],
                       allow_credentials="*" not in origins)


def routes(runtime, metrics) -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    @router.head("/health")  # a load balancer's check: the headers alone
    async def health():
        return JSONResponse({"status": "ok", "uptime_s": round(time.time() - runtime.started_at, 3),
                             "models_loaded": len(runtime.loaded())})

    @router.get("/metrics")
    @router.head("/metrics")  # a load balancer's check: the headers alone
    async def prometheus(request: Request):
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return router
