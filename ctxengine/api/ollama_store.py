"""Ollama's store routes: ``/api/pull`` and ``/api/delete`` (serving/pulls.py).

``/api/pull`` streams NDJSON progress lines as Ollama's server does
(``{"status": "pulling manifest"}``, ``{"status": "pulling <12 hex>",
"digest", "total", "completed"}`` while each blob comes in, ``{"status":
"success"}`` last), or with ``"stream": false`` answers the last line alone.
A failure once the stream has begun is a last line ``{"error": "..."}``, as
Ollama's; before it, an HTTP error. The pull runs on a thread of its own;
a client that leaves stops it (the partial blob stays for a later pull).
``/api/delete`` answers 200 with no body, as Ollama's does.
"""
from __future__ import annotations

import queue
import threading

import anyio.to_thread
from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from ..serving.pulls import PullCancelled, check_pull, delete_model, pull_model
from .errors import OLLAMA, ApiError, as_api_error, error_body
from .fields import Fields, json_body
from .streaming import ndjson

_DONE = object()


def routes(runtime) -> APIRouter:
    router = APIRouter()

    @router.post("/api/pull")
    async def pull(request: Request):
        f = Fields(await json_body(request))
        name = _name(f)
        f.bool("insecure", False)  # accepted as Ollama's; a loopback registry is reached over http anyway
        check_pull(runtime, name)  # a bad name or no store to write: an HTTP error, before any line
        job = _Pull(runtime, name)
        if f.bool("stream", True):
            return StreamingResponse(job.lines(), media_type="application/x-ndjson")
        last: dict = {}
        async for event in job.events():
            last = event
        if "error" in last:
            raise last["error"]
        return last

    @router.delete("/api/delete")
    async def delete(request: Request):
        name = _name(Fields(await json_body(request)))
        await anyio.to_thread.run_sync(lambda: delete_model(runtime, name))
        return Response(status_code=200)

    return router


def _name(f: Fields) -> str:
    name = f.str("model", None) or f.str("name", None)
    if not name:
        raise ApiError(400, "'model' is required", param="model")
    return name


class _Pull:
    """One pull on a thread of its own, its progress read as it happens: dicts
    (``events``, the last one with an ApiError under "error" if it failed) or
    NDJSON lines (``lines``). Whoever reads it stopping stops the pull."""

    def __init__(self, runtime, name: str):
        self.queue: queue.Queue = queue.Queue()
        self.cancelled = threading.Event()
        threading.Thread(target=self._run, args=(runtime, name), name=f"pull {name}", daemon=True).start()

    def _run(self, runtime, name: str) -> None:
        try:
            pull_model(runtime, name, self.queue.put, self.cancelled)
        except PullCancelled:
            pass
        except BaseException as err:  # noqa: BLE001 - every failure reaches the client as its last line
            self.queue.put({"error": as_api_error(err)})
        finally:
            self.queue.put(_DONE)

    async def events(self):
        try:
            while (event := await anyio.to_thread.run_sync(self.queue.get, abandon_on_cancel=True)) is not _DONE:
                yield event
        finally:
            self.cancelled.set()  # the client left (or the pull ended): it stops at its next bytes

    async def lines(self):
        async for event in self.events():
            yield ndjson(error_body(OLLAMA, event["error"]) if "error" in event else event)
