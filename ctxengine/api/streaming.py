"""A generation (serving/generation.py) as the HTTP face serves it: its
start and its whole reply with failures as ApiErrors (each dialect shapes
them, api/errors.py), and streamed replies: one :class:`Writer` per dialect
turns the generation's events (serving/events.py) into its wire chunks, SSE
for OpenAI and Anthropic, NDJSON for Ollama, and the same writer shapes the
reply that is not streamed.

Starlette watches for ``http.disconnect`` while it streams and cancels the
body iterator when it comes; the iterator here is built on
``Generation.events()``, whose ``finally`` cancels the generation, and the
response cancels it once more when it ends for any reason.
"""
from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, AsyncIterator, Iterable

from starlette.responses import StreamingResponse

from ..serving.events import Failed, Finished, Text
from .errors import ApiError, as_api_error

if TYPE_CHECKING:
    from starlette.requests import Request

    from ..serving.generation import Generation, GenerationRequest, Generations

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def started(generations: "Generations", request: "GenerationRequest", client: "Request") -> "Generation":
    """A running generation whose prompt is prefilled; an ApiError if it was refused.
    ``client``'s request going away first (while it waits its turn on a busy context,
    say) abandons it: it then never touches the context it was queued on."""
    start = asyncio.ensure_future(generations.start(request))
    watch = asyncio.ensure_future(until_disconnect(client))
    try:
        await asyncio.wait({start, watch}, return_when=asyncio.FIRST_COMPLETED)
        if not start.done():
            raise ApiError(499, "the client closed the request before its reply began")
        return start.result()
    except ApiError:
        raise
    except Exception as err:
        raise as_api_error(err) from None
    finally:
        watch.cancel()
        if not start.done():  # the client left, or this request was cancelled: the generation is abandoned
            start.cancel()


async def collected(gen: "Generation", client: "Request") -> Finished:
    """The whole reply (its text and calls are in Finished); an ApiError if it
    failed. ``client``'s request going away (a non-streamed reply nobody waits
    for) stops the generation after the current token."""
    watch = asyncio.ensure_future(_watch(gen, client))
    try:
        return await gen.collect()
    except Exception as err:
        raise as_api_error(err) from None
    finally:
        watch.cancel()


async def _watch(gen: "Generation", client: "Request") -> None:
    await until_disconnect(client)
    gen.cancel()


async def until_disconnect(client: "Request") -> None:
    # The body is read, so the next ASGI message is the disconnect (streams
    # have starlette's own watch: GenerationStream).
    while (await client.receive())["type"] != "http.disconnect":
        pass


class Writer:
    """One dialect's wire chunks for one generation's events, in order:
    ``head()``, ``text()`` per Text, then ``finish()`` or ``error()``."""

    media_type = "text/event-stream"

    def head(self) -> Iterable[bytes]:
        return ()

    def text(self, text: str) -> Iterable[bytes]:
        raise NotImplementedError

    async def finish(self, fin: Finished) -> Iterable[bytes]:
        raise NotImplementedError

    def error(self, err: ApiError) -> Iterable[bytes]:
        raise NotImplementedError

    def close(self) -> None:
        """The stream ended, however it ended (a client gone mid-reply too)."""


async def written(gen: "Generation", writer: Writer) -> AsyncIterator[bytes]:
    """The chunks ``writer`` makes of ``gen``'s events."""
    try:
        for chunk in writer.head():
            yield chunk
        async for event in gen.events():
            if isinstance(event, Text):
                chunks = writer.text(event.text)
            elif isinstance(event, Failed):
                chunks = writer.error(as_api_error(event.error))
            else:
                chunks = await writer.finish(event)
            for chunk in chunks:
                yield chunk
    finally:
        writer.close()


class GenerationStream(StreamingResponse):
    def __init__(self, generation: "Generation", writer: Writer):
        super().__init__(written(generation, writer), media_type=writer.media_type, headers=SSE_HEADERS)
        self._generation = generation

    async def __call__(self, scope, receive, send) -> None:
        metrics = self._generation.metrics
        if metrics is not None:
            metrics.active_streams.inc()
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._generation.cancel()
            if metrics is not None:
                metrics.active_streams.dec()


def sse(data: dict | str, event: str | None = None) -> bytes:
    """One server-sent event (``data`` a JSON object, or a literal like ``[DONE]``)."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


# Characters that clients reading lines the way str.splitlines does (httpx's iter_lines,
# which the ollama package uses) take for line breaks: escaped, as Go's encoding/json
# escapes U+2028 and U+2029, so a reply holding one stays one line.
# (json.dumps escapes the C0 ones, \x1c-\x1e included.)
_LINE_BREAKS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


def ndjson(data: dict) -> bytes:
    """One line of a newline-delimited JSON stream (Ollama's)."""
    return (json.dumps(data, ensure_ascii=False).translate(_LINE_BREAKS) + "\n").encode()
