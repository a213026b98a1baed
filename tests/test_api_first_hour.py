"""What a new user hits in the first hour (issue 25): a non-streamed
generation stops within a step of its client's disconnect in every dialect
(a named context keeps what was generated), ``--request-timeout`` bounds a
request, an HTTP snapshot without a ref is kept under the context's name,
and the Python chat API continues a conversation exactly as the HTTP
``context`` field does."""
import time

import httpx
import pytest

import ctxengine

from api_server import module_server

TIMEOUT_S = 8
server = module_server("disconnect", "--request-timeout", str(TIMEOUT_S))
LONG = "List the numbers from 1 to 1000, separated by commas."  # greedy SmolLM2 counts for long
COUNTING = ", ".join(str(i) for i in range(1, 40)) + ","


@pytest.fixture(scope="module", autouse=True)
def loaded(server):
    """The model loaded before any client gives up (loading is not generating)."""
    r = server.post("/v1/completions", {"model": "smollm2", "prompt": "Hi", "max_tokens": 1})
    assert r.status_code == 200, r.text


def settled(server, wait: float = 1.0) -> float:
    """The sampled-token counter once it has stopped moving for ``wait`` seconds."""
    before = server.metric("ctx_sampled_tokens_total")
    for _ in range(20):
        time.sleep(wait)
        now = server.metric("ctx_sampled_tokens_total")
        if now == before:
            return now
        before = now
    raise AssertionError("the server is still sampling")


def given_up(server, path: str, body: dict) -> None:
    """Send ``body`` and hang up after 1.5 s, well before the reply could be done."""
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.url + path, json=body, timeout=httpx.Timeout(1.5, connect=5))


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"model": "smollm2", "prompt": COUNTING, "max_tokens": 3000, "temperature": 0}),
    ("/v1/chat/completions", {"model": "smollm2", "messages": [{"role": "user", "content": LONG}],
                              "max_tokens": 3000, "temperature": 0}),
    ("/v1/messages", {"model": "smollm2", "max_tokens": 3000, "messages": [{"role": "user", "content": LONG}],
                      "temperature": 0}),
    ("/api/generate", {"model": "smollm2", "prompt": COUNTING, "raw": True, "stream": False,
                       "options": {"num_predict": 3000, "temperature": 0}}),
    ("/api/chat", {"model": "smollm2", "messages": [{"role": "user", "content": LONG}], "stream": False,
                   "options": {"num_predict": 3000, "temperature": 0}}),
    ("/v1/responses", {"model": "smollm2", "input": LONG, "max_output_tokens": 3000, "temperature": 0}),
])
def test_a_non_streamed_generation_stops_when_its_client_goes(server, path, body):
    start = settled(server, 0.3)
    given_up(server, path, body)
    t = time.monotonic()
    stopped = settled(server, 1.0)
    assert stopped > start  # it did run
    assert time.monotonic() - t < 3  # and stopped at once: within the first settling second or so


def test_a_named_context_keeps_what_was_generated_before_the_disconnect(server):
    r = server.post("/v1/contexts", {"name": "gone", "model": "smollm2"})
    assert r.status_code == 201, r.text
    given_up(server, "/v1/chat/completions", {"model": "smollm2", "context": "gone", "max_tokens": 3000,
                                              "temperature": 0, "messages": [{"role": "user", "content": LONG}]})
    settled(server, 0.5)
    text = server.get("/v1/contexts/gone").json()["text"]
    reply = text.split("<|im_start|>assistant\n")[-1]
    assert reply.startswith("1, 2,") and reply.rstrip().endswith("<|im_end|>")  # kept, and the turn closed


def test_the_request_timeout_bounds_a_generation(server):
    t = time.monotonic()
    r = server.post("/v1/completions", {"model": "smollm2", "prompt": COUNTING, "max_tokens": 100000,
                                        "temperature": 0})
    took = time.monotonic() - t
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
    assert TIMEOUT_S - 0.5 < took < TIMEOUT_S + 5
    assert r.json()["usage"]["completion_tokens"] > 0


def test_a_snapshot_without_a_ref_is_kept_under_the_contexts_name(server):
    assert server.post("/v1/contexts", {"name": "demo", "model": "smollm2", "text": "The demo's text."}).status_code == 201
    snap = server.post("/v1/contexts/demo/snapshot", {}).json()
    assert snap["ref"] == "demo"
    assert server.post("/v1/contexts/demo/snapshot", {"ref": None}).json()["ref"] is None
    assert httpx.delete(server.url + "/v1/contexts/demo").status_code == 200
    back = server.post("/v1/contexts/demo/restore", {})
    assert back.status_code == 201, back.text
    assert back.json()["snapshot_id"] == snap["snapshot_id"]
    assert server.get("/v1/contexts/demo").json()["text"].endswith("The demo's text.")


def test_python_chat_equals_the_http_context_flow_token_for_token(server, smollm2_path):
    turns = ["Name a fruit.", "And a vegetable?", "Add food."]
    assert server.post("/v1/contexts", {"name": "talk", "model": "smollm2"}).status_code == 201
    http_replies = []
    for t in turns:
        r = server.post("/v1/chat/completions", {"model": "smollm2", "context": "talk", "max_tokens": 12,
                                                 "temperature": 0, "messages": [{"role": "user", "content": t}]})
        http_replies.append(r.json()["choices"][0]["message"]["content"])
    http_tokens = server.get("/v1/contexts/talk", params={"tokens": "true"}).json()["tokens"]
    model = ctxengine.load(smollm2_path)
    try:
        c = model.context("talk")
        replies = [c.chat(t, 12, temperature=0) for t in turns]
        assert replies == http_replies
        assert c.tokens == http_tokens
        assert c.text.count("<|im_start|>system") == 1  # one system prompt, at the start
    finally:
        model.close()
