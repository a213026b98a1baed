"""A real `ctx serve` on loopback, in a subprocess, for the HTTP tests.

Each test module shares one (a module-scoped fixture around ``running``);
the server's log is shown when it fails to start or exits uncleanly.
"""
from __future__ import annotations

import contextlib
import re
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest

import ctxengine
from servers import CtxServer

START_TIMEOUT_S = 120


class Server(CtxServer):
    """``ctx serve`` with HTTP on a free loopback port, gRPC off; CTX_HOME and store under ``home``."""

    def __init__(self, home: Path, *args: str):
        super().__init__(home, *args, http=True, timeout=START_TIMEOUT_S)

    def get(self, path: str, **kw) -> httpx.Response:
        return httpx.get(self.url + path, timeout=60, **kw)

    def post(self, path: str, body=None, **kw) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=120, **kw)

    def metric(self, name: str, headers: dict | None = None) -> float:
        """The sum of a metric's samples (every label set) in /metrics."""
        text = self.get("/metrics", headers=headers or {}).text
        return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


@contextlib.contextmanager
def running(home: Path, *args: str):
    server = Server(home, *args)
    try:
        yield server
    finally:
        server.stop()  # and insists on exit status 0 and no traceback in the log


def greedy_reply(model, *, messages: list[dict] | None = None, text: str | None = None, max_tokens: int = 16,
                 stop=(), **sampling) -> str:
    """What the engine itself generates, greedily, in this process: the reference
    a server's reply must equal (whatever it batched or took from cache).
    ``sampling``: further options for generate (e.g. logit_bias)."""
    ctx = model.context(None)
    try:
        ctx.append(model.chat_prompt(messages) if messages is not None else text, parse_special=True)
        return "".join(p.text for p in ctx.generate(max_tokens, temperature=0.0, stop=list(stop), **sampling))
    finally:
        ctx.delete()


# -- fixtures the test modules import ------------------------------------------------
def module_server(name: str, *args: str):
    """A module-scoped fixture: one server for the module's tests."""
    @pytest.fixture(scope="module")
    def server(tmp_path_factory):
        with running(tmp_path_factory.mktemp(name), *args) as s:
            yield s

    return server


@pytest.fixture(scope="module")
def model(smollm2_path):
    """The same model, loaded in the test process (the reference)."""
    m = ctxengine.load(smollm2_path)
    yield m
    m.close()


@pytest.fixture(scope="module")
def openai_client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def anthropic_client(server):
    with anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def ollama_client(server):
    with ollama.Client(host=server.url) as c:
        yield c
