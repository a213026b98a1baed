"""Shared by the pull tests: the loopback Hub and registry serving the real
models, and a `ctx pull` child that can be killed halfway."""
from __future__ import annotations

import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from hub_servers import FakeHub, FakeRegistry
from ollama_layout import make_ollama_store
from servers import CTX, ctx_env

SMOL_REPO = "ctx-test/SmolLM2-135M-Instruct-GGUF"
SPLIT_REPO = "ctx-test/SmolLM2-135M-Instruct-split-GGUF"
GEMMA_REPO = "ctx-test/gemma-3-270m-it-GGUF"
TEMPLATE = "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}<|im_start|>user\n{{ .Prompt }}<|im_end|>\n<|im_start|>assistant\n"


def make_hub(smollm2: Path, gemma3: Path, split_parts: list[Path], readme: Path) -> FakeHub:
    return FakeHub({
        # Three quant names over one file: the name picks, the bytes need not differ.
        SMOL_REPO: {"SmolLM2-135M-Instruct-Q4_1.gguf": smollm2, "SmolLM2-135M-Instruct-Q4_K_M.gguf": smollm2,
                    "SmolLM2-135M-Instruct-Q4_K_S.gguf": smollm2, "README.md": readme},
        SPLIT_REPO: {p.name: p for p in split_parts},
        GEMMA_REPO: {"gemma-3-270m-it-Q4_K_M.gguf": gemma3},
    })


def make_registry(root: Path, smollm2: Path, gemma3: Path) -> FakeRegistry:
    make_ollama_store(root, "smollm2:135m", smollm2, template=TEMPLATE, system="You are terse.",
                      params={"stop": ["<|im_end|>"], "temperature": 0.2})
    make_ollama_store(root, "gemma3:270m", gemma3, params={"top_k": 64})
    make_ollama_store(root, "secret/model:1", smollm2)
    return FakeRegistry(root, private=("secret",))


def pull(*args: str, home: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([*CTX, "pull", *args], capture_output=True, text=True, env=ctx_env(home, **env),
                          timeout=300)


def kill_halfway(spec: str, partial_glob: str, where: Path, *, home: Path, env: dict, at: int) -> int:
    """Start `ctx pull spec`, SIGKILL it once a partial file under where holds `at`
    bytes; the partial's size when it died."""
    proc = subprocess.Popen([*CTX, "pull", spec], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=ctx_env(home, **env))
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            found = list(where.glob(partial_glob))
            if found and found[0].stat().st_size >= at:
                break
            time.sleep(0.02)
        assert proc.poll() is None, f"the pull ended before it could be killed: {proc.stderr.read()}"
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
    found = list(where.glob(partial_glob))
    assert len(found) == 1, found
    return found[0].stat().st_size


@contextmanager
def server_set(server, **settings):
    """A loopback server's settings (rate, ranges, break_at) changed for the block, then restored."""
    before = {k: getattr(server, k) for k in settings}
    for k, v in settings.items():
        setattr(server, k, v)
    try:
        yield server
    finally:
        for k, v in before.items():
            setattr(server, k, v)
