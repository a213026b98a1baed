"""The fleet over HTTP (docs/fleet.md): ``GET /v1/fleet`` lists the live hosts,
their models and the contexts they hold, and every response names the host
that served it in an ``X-Ctx-Host`` header (behind a load balancer, which
host answered is otherwise invisible)."""
from __future__ import annotations

import anyio.to_thread
from fastapi import APIRouter

from .errors import ApiError

HOST_HEADER = b"x-ctx-host"


def routes(runtime) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/fleet")
    async def fleet():
        if runtime.fleet is None:
            raise ApiError(404, "this server is not part of a fleet (ctx serve --fleet redis://...)")
        return await anyio.to_thread.run_sync(runtime.fleet.describe)

    return router


class HostHeader:
    """ASGI middleware adding ``X-Ctx-Host: <host id>`` to every response (streamed ones too)."""

    def __init__(self, app, *, host_id: str):
        self.app = app
        # Checked at start (store/names.py): printable ASCII, so the header says exactly what
        # /v1/fleet says, and h11 never refuses it (which dropped every response).
        self.value = host_id.encode("ascii")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def sending(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (HOST_HEADER, self.value)]
            await send(message)

        await self.app(scope, receive, sending)
