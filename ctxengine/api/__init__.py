"""HTTP face of ``ctx serve``: OpenAI, Anthropic, Ollama and contexts routes
on one port (docs/http-api.md). Each route translates its wire format to
calls of ``ctxengine.serving`` and back; this package imports only serving,
text and errors of ours (tests/test_layout.py).

    server.py      the app and how it runs (graceful SIGTERM); arguments.py its options
    openai.py  anthropic.py  ollama.py  contexts.py    one dialect each (contexts: over serving/sessions.py)
    responses.py  response_store.py   the Responses API, its turns kept as snapshots
    streaming.py   a generation (serving/generation.py) started, collected or streamed as HTTP
    options.py  fields.py  tools.py  structured.py   request fields read into serving's terms
    embeddings.py  the embedding routes' shared path
    ops.py  metrics.py  errors.py    health, metrics, API key, size limits, CORS, error shapes
    studio.py  studio_tree.py  static/studio/   the studio page at /studio and its JSON routes
"""
from __future__ import annotations

import argparse

from .arguments import add_http_arguments

__all__ = ["add_http_arguments", "serve_http"]


def serve_http(runtime, args: argparse.Namespace, on_ready=None) -> None:
    from .server import serve_http as serve

    serve(runtime, args, on_ready=on_ready)
