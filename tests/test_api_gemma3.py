"""Gemma 3 270M (Q4_K_M, sliding-window attention) served from an Ollama-layout
store, by name, to the real `ollama` and `openai` clients: the reply equals the
engine's own greedy reply, and a second turn reuses the first one's KV."""
import json

import pytest

import ctxengine as ce
from api_server import greedy_reply, running
from ollama_layout import make_ollama_store

QUESTION = [{"role": "user", "content": "Name one colour of the rainbow."}]


@pytest.fixture(scope="module")
def store(tmp_path_factory, gemma3_path):
    root = tmp_path_factory.mktemp("ollama-gemma")
    make_ollama_store(root, "gemma3:270m", gemma3_path)
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory, store):
    with running(tmp_path_factory.mktemp("gemma-home"), "--ollama-models", str(store), "--threads", "2") as s:
        yield s


@pytest.fixture(scope="module")
def gemma(gemma3_path):
    m = ce.load(gemma3_path, threads=2)
    yield m
    m.close()


@pytest.fixture(scope="module")
def ollama_client(server):
    import ollama

    with ollama.Client(host=server.url) as c:
        yield c


def test_listed_with_its_family_and_quantization(ollama_client):
    models = {m.model: m for m in ollama_client.list().models}
    d = models["gemma3:270m"].details
    assert (d.family, d.quantization_level) == ("gemma3", "Q4_K_M")


def test_ollama_chat_equals_the_engines_greedy_reply(ollama_client, gemma):
    want = greedy_reply(gemma, messages=QUESTION, max_tokens=12)
    r = ollama_client.chat(model="gemma3:270m", messages=QUESTION, options={"temperature": 0, "num_predict": 12})
    assert want.strip() and r.message.content == want


def test_openai_second_turn_reuses_the_first(server, gemma):
    import openai

    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as client:
        _second_turn(client, gemma)


def _second_turn(client, gemma):
    first = client.chat.completions.create(model="gemma3:270m", messages=QUESTION, max_tokens=8, temperature=0)
    turn2 = QUESTION + [{"role": "assistant", "content": first.choices[0].message.content},
                        {"role": "user", "content": "And another?"}]
    second = client.chat.completions.create(model="gemma3:270m", messages=turn2, max_tokens=8, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens > first.usage.prompt_tokens // 2
    assert second.choices[0].message.content == greedy_reply(gemma, messages=turn2, max_tokens=8)


def test_embeddings_past_the_sliding_window(server, gemma):
    """An input longer than the 512-token window, whose early KV the window released: the
    vector is the mean over every token, as in one pass here (543 tokens and more were a 500:
    cleaning up stepped back past the released KV). And empty text is refused as for SmolLM2
    (it was embedded as the BOS alone)."""
    import numpy as np

    text = "The sliding window forgets what came before. " * 80  # ~720 tokens
    r = server.post("/v1/embeddings", {"model": "gemma3:270m", "input": [text, "Short."]})
    assert r.status_code == 200, r.text
    ids = gemma.tokenizer.with_bos(gemma.tokenize(text))
    assert len(ids) > 600 and r.json()["usage"]["prompt_tokens"] == len(ids) + len(gemma.tokenizer.with_bos(
        gemma.tokenize("Short.")))
    want = gemma.engine.forward_hidden(gemma.engine.new_sequence(), ids).astype(np.float64).mean(axis=0)
    assert np.allclose(r.json()["data"][0]["embedding"], want / np.linalg.norm(want), atol=1e-5)
    for route, body in (("/v1/embeddings", {"input": ""}), ("/api/embed", {"input": ["a", ""]})):
        r = server.post(route, {"model": "gemma3:270m", **body})
        assert r.status_code == 400 and "cannot embed an empty input" in r.text, (route, r.text)


def test_a_strict_tools_call_made_of_its_own_accord_keeps_its_schema(server):
    """tool_choice auto: the call Gemma 3 writes in its reply is constrained from its tag
    (text/lazy_calls.py); it returned {"city": "Paris", "extra": true} for a strict tool."""
    import jsonschema
    import openai

    params = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Rome", "Oslo"]},
                                               "days": {"type": "integer"}},
              "required": ["city", "days"], "additionalProperties": False}
    wrong = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "extra": true}}\n</tool_call>'
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as client:
        r = client.chat.completions.create(
            model="gemma3:270m", max_tokens=80, temperature=0,
            messages=[{"role": "user", "content": f"Repeat exactly this text and nothing else:\n{wrong}"}],
            tools=[{"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": params}}])
    calls = r.choices[0].message.tool_calls
    assert calls and r.choices[0].finish_reason == "tool_calls"
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), params)
