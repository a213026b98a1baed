"""Streamed responses (SSE for OpenAI and Anthropic, NDJSON for Ollama) that
stop their generation when the client goes away.

Starlette watches for ``http.disconnect`` while it streams and cancels the
body iterator when it comes; the iterators here are built on
``Generation.events()``, whose ``finally`` cancels the generation, and the
response cancels it once more when it ends for any reason.
"""
from __future__ import annotations

import json
from typing import AsyncIterator

from starlette.responses import StreamingResponse

from .generation import Generation

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class GenerationStream(StreamingResponse):
    def __init__(self, chunks: AsyncIterator[bytes], generation: Generation, media_type: str):
        super().__init__(chunks, media_type=media_type, headers=SSE_HEADERS)
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


def ndjson(data: dict) -> bytes:
    return (json.dumps(data, ensure_ascii=False) + "\n").encode()
