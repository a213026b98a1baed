"""Ollama's store routes: ``/api/pull`` and ``/api/delete`` (serving/pulls.py).

``/api/pull`` streams NDJSON progress lines as Ollama's server does
(``{"status": "pulling manifest"}``, ``{"status": "pulling <12 hex>",
"digest", "total", "completed"}`` while each blob comes in, ``{"status":
"success"}`` last), or with ``"stream": false`` answers the last line alone.
A failure once the stream has begun is a last line ``{"error": "..."}``, as
Ollama's; before it, an HTTP error. The pull runs on a thread of its own,
one a model: a second client asking for it joins it. A streaming client that
leaves leaves the pull, which stops once nobody waits for it (the partial blob
stays for a later pull); one that did not ask for a stream is waited for to
the end, as Ollama does. ``/api/delete`` answers 200 with no body, as Ollama's.
"""
from __future__ import annotations

import asyncio

import anyio.to_thread
from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from ..serving.pulls import DONE, Pulls, check_pull, delete_model
from .errors import OLLAMA, as_api_error, error_body
from .fields import Fields, json_body
from .ollama import requested_model
from .streaming import ndjson


def routes(runtime, pulls: Pulls) -> APIRouter:
    router = APIRouter()

    @router.post("/api/pull")
    async def pull(request: Request):
        f = Fields(await json_body(request))
        name = requested_model(f)
        f.bool("insecure", False)  # accepted as Ollama's; a loopback registry is reached over http anyway
        check_pull(runtime, name)  # a bad name or no store to write: an HTTP error, before any line
        if f.bool("stream", True):
            return StreamingResponse(_lines(pulls, name), media_type="application/x-ndjson")
        last: dict = {}
        async for event in _events(pulls, name):  # a client that stops waiting does not stop it (as Ollama)
            last = event
        if "error" in last:
            raise as_api_error(last["error"])
        return last

    @router.delete("/api/delete")
    async def delete(request: Request):
        name = requested_model(Fields(await json_body(request)))
        await anyio.to_thread.run_sync(lambda: delete_model(runtime, name))
        return Response(status_code=200)

    return router


async def _events(pulls: Pulls, name: str):
    """A pull's events as they happen (serving/pulls.py), handed over from its thread
    without holding a worker thread while it waits; the client leaving leaves the pull."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()

    def tell(event) -> None:
        try:
            loop.call_soon_threadsafe(events.put_nowait, event)
        except RuntimeError:
            pass  # the server's loop has closed

    ticket = pulls.join(name, tell)
    try:
        while (event := await events.get()) is not DONE:
            yield event
    finally:
        ticket.leave()


async def _lines(pulls: Pulls, name: str):
    async for event in _events(pulls, name):
        yield ndjson(error_body(OLLAMA, as_api_error(event["error"])) if "error" in event else event)
