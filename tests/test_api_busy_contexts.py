"""A named context in use by a generation, over HTTP: reading it answers at once
(the event loop never waits for the context's lock), a request queued on it
whose client leaves before its turn appends nothing, a DELETE waits for the
generation as fork and rewind do; and the server's edges: bodies nested too
deep are a 400, HEAD answers where a load balancer checks."""
import json
import socket
import threading
import time

import httpx
import pytest

from api_server import module_server

server = module_server("busy")


def ask(name, text, n, **extra):
    return {"model": "smollm2", "context": name, "max_tokens": n, "temperature": 0,
            "messages": [{"role": "user", "content": text}], **extra}


class Paused:
    """A streamed turn on a context whose client reads one chunk, then stops
    reading: the generation holds the context until the stream is read out.
    Its end of turn is banned and it drafts nothing, so it runs for seconds."""

    def __init__(self, server, name):
        self.client = httpx.Client(timeout=120)
        no_end = {"0": -100, "1": -100, "2": -100}  # SmolLM2's <|endoftext|>, <|im_start|>, <|im_end|>
        self.stream = self.client.stream("POST", f"{server.url}/v1/chat/completions",
                                         json=ask(name, "Tell a long story about the sea.", 1000, stream=True,
                                                  logit_bias=no_end, speculative=False))
        self.response = self.stream.__enter__()
        self.lines = self.response.iter_lines()
        next(line for line in self.lines if line.startswith("data:"))  # it has begun

    def finish(self) -> str:
        rest = [line for line in self.lines if line.startswith("data:")]
        self.stream.__exit__(None, None, None)
        self.client.close()
        return rest[-1]


def test_reading_a_busy_context_answers_at_once(server):
    server.post("/v1/contexts", {"name": "read"})
    paused = Paused(server, "read")
    try:
        t = time.perf_counter()
        card = httpx.get(server.url + "/v1/contexts/read", timeout=10).json()
        listed = httpx.get(server.url + "/v1/contexts", timeout=10).json()["data"]
        assert time.perf_counter() - t < 5 and httpx.get(server.url + "/health", timeout=5).status_code == 200
        assert card["n_cached"] is None and card["n_tokens"] > 0  # in use: its KV is growing
        assert [c["n_cached"] for c in listed if c["name"] == "read"] == [None]
    finally:
        assert paused.finish() == "data: [DONE]"
    card = server.get("/v1/contexts/read").json()
    assert 0 < card["n_cached"] <= card["n_tokens"]  # idle again: read as it is


def test_a_request_whose_client_left_while_queued_appends_nothing(server):
    server.post("/v1/contexts", {"name": "queue"})
    paused = Paused(server, "queue")
    body = json.dumps(ask("queue", "GHOST never mind", 20)).encode()
    sock = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    time.sleep(1.0)  # queued behind the paused stream
    sock.close()
    time.sleep(1.0)
    paused.finish()
    time.sleep(2.0)  # the abandoned request takes the context's lock, and lets it go
    text = server.get("/v1/contexts/queue").json()["text"]
    assert "GHOST" not in text and text.count("<|im_start|>user") == 1
    r = server.post("/v1/chat/completions", ask("queue", "And then?", 4))
    assert r.status_code == 200 and server.get("/v1/contexts/queue").json()["text"].count("<|im_start|>user") == 2


def test_delete_waits_for_the_generation_on_the_context(server):
    server.post("/v1/contexts", {"name": "gone"})
    paused = Paused(server, "gone")
    done = {}
    deleter = threading.Thread(target=lambda: done.update(r=httpx.delete(server.url + "/v1/contexts/gone", timeout=60)))
    deleter.start()
    time.sleep(1.0)
    assert "r" not in done  # waiting for the stream
    last = paused.finish()
    deleter.join(30)
    assert last == "data: [DONE]" and done["r"].status_code == 200  # the stream ended as a reply, not an error
    assert server.get("/v1/contexts/gone").status_code == 404


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/messages", "/api/chat", "/v1/contexts",
                                   "/lora-adapters"])
def test_a_body_nested_too_deep_is_a_400(server, route):
    body = b'{"model": "smollm2", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    r = httpx.post(server.url + route, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "more than 128 deep" in r.text
    schema = '{"type": "string"}'
    for _ in range(200):
        schema = '{"type": "object", "properties": {"a": ' + schema + "}}"
    r = httpx.post(server.url + "/v1/chat/completions", headers={"content-type": "application/json"},
                   content=('{"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, '
                            '"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": '
                            + schema + "}}}").encode())
    assert r.status_code == 400 and "Traceback" not in server.log()


@pytest.mark.parametrize("path", ["/health", "/v1/models", "/api/tags", "/api/version", "/metrics", "/"])
def test_head_answers_where_get_does(server, path):
    head, get = httpx.head(server.url + path), httpx.get(server.url + path)
    assert head.status_code == get.status_code == 200 and head.content == b""


def test_a_prompt_that_cannot_fit_is_refused_before_it_is_tokenized(server):
    t = time.perf_counter()
    r = httpx.post(server.url + "/v1/completions", json={"model": "smollm2", "prompt": "x" * (4 << 20), "max_tokens": 1},
                   timeout=120)
    assert r.status_code == 400 and "the prompt is at least" in r.text and "the context length is" in r.text
    assert time.perf_counter() - t < 20  # tokenizing a 4 MB word took a minute of BPE


def test_text_that_cannot_fit_a_named_context_is_refused_before_it_is_tokenized(server):
    assert server.post("/v1/contexts", {"name": "roomy", "model": "smollm2"}).status_code == 201
    assert server.post("/v1/contexts/roomy/append", {"text": "Hello there."}).status_code == 200
    t = time.perf_counter()
    for path, body in (("/v1/contexts/roomy/append", {"text": "x" * (4 << 20)}),
                       ("/v1/chat/completions", {"model": "smollm2", "context": "roomy", "max_tokens": 1,
                                                 "messages": [{"role": "user", "content": "y" * (4 << 20)}]})):
        r = server.post(path, body)
        assert r.status_code == 400 and "would hold at least" in r.text, r.text
    assert time.perf_counter() - t < 30  # each would have been a minute of BPE
    assert server.get("/v1/contexts/roomy").json()["n_tokens"] < 10  # and nothing was added


def test_a_method_not_allowed_is_the_clients_error(server):
    r = httpx.delete(server.url + "/v1/models")
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.delete(server.url + "/v1/messages")
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
