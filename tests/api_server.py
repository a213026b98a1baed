"""A real `ctx serve` on loopback, in a subprocess, for the HTTP tests.

Each test module shares one (a module-scoped fixture around ``running``);
the server's stderr is kept and shown when it fails to start.
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest

import ctxengine

READY = "ctx serve: HTTP on"
START_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, home: Path, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, CTX_HOME=str(home), PYTHONSAFEPATH="1")
        env.pop("OLLAMA_MODELS", None)
        cmd = [sys.executable, "-m", "ctxengine.cli.main", "serve", "--port", str(self.port), "--grpc-port", "0",
               "--store", str(home / "store"), *args]
        if "--ollama-models" not in args:
            cmd.append("--no-ollama")  # the machine's own Ollama models are not the tests' business
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.stderr: list[str] = []
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._ready.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop(timeout=5)
                pytest.fail(f"ctx serve did not start (rc {self.proc.poll()}):\n{self.log}")

    def _read_stderr(self) -> None:
        for line in self.proc.stderr:
            self.stderr.append(line)
            if line.startswith(READY):
                self._ready.set()

    @property
    def log(self) -> str:
        return "".join(self.stderr)

    def get(self, path: str, **kw) -> httpx.Response:
        return httpx.get(self.url + path, timeout=60, **kw)

    def post(self, path: str, body=None, **kw) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=120, **kw)

    def metric(self, name: str, headers: dict | None = None) -> float:
        """The sum of a metric's samples (every label set) in /metrics."""
        text = self.get("/metrics", headers=headers or {}).text
        return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(10)
        self.proc.stderr.close()
        return self.proc.returncode


@contextlib.contextmanager
def running(home: Path, *args: str):
    server = Server(home, *args)
    try:
        yield server
    finally:
        rc = server.stop()
        assert rc == 0, f"ctx serve exited with {rc}:\n{server.log}"
        assert "Traceback" not in server.log, server.log


def greedy_reply(model, *, messages: list[dict] | None = None, text: str | None = None, max_tokens: int = 16,
                 stop=()) -> str:
    """What the engine itself generates, greedily, in this process: the reference
    a server's reply must equal (whatever it batched or took from cache)."""
    ctx = model.context(None)
    try:
        ctx.append(model.chat_prompt(messages) if messages is not None else text, parse_special=True)
        return "".join(p.text for p in ctx.generate(max_tokens, temperature=0.0, stop=list(stop)))
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
