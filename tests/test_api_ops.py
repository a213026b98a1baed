"""Operations: the API key, /health, Prometheus /metrics, CORS when configured,
and a clean shutdown on SIGTERM with streams in flight."""
import json
import signal
import threading
import time

import anthropic
import httpx
import ollama
import openai
import pytest

from api_server import Server, module_server

KEY = "s3cret-key"
ORIGIN = "http://app.example"
BEARER = {"Authorization": f"Bearer {KEY}"}


server = module_server("ops", "--api-key", KEY, "--cors-origin", ORIGIN)


def test_health_needs_no_key(server):
    r = server.get("/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"


@pytest.mark.parametrize("path", ["/v1/models", "/api/tags", "/", "/metrics", "/v1/contexts"])
def test_every_other_route_needs_the_key(server, path):
    assert server.get(path).status_code == 401
    assert server.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert server.get(path, headers=BEARER).status_code == 200
    assert server.get(path, headers={"x-api-key": KEY}).status_code == 200


def test_refusals_are_in_the_dialect_of_the_route(server):
    refused = server.post("/v1/chat/completions", {}).json()["error"]  # as OpenAI's own 401
    assert (refused["type"], refused["code"]) == ("invalid_request_error", "invalid_api_key")
    assert server.post("/v1/messages", {}).json() == {
        "type": "error", "error": {"type": "authentication_error", "message": server.post(
            "/v1/messages", {}).json()["error"]["message"]}}
    assert "API key" in server.post("/api/chat", {}).json()["error"]


def test_clients_with_the_key(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0) as c:
        assert c.chat.completions.create(model="smollm2", max_tokens=2,
                                         messages=[{"role": "user", "content": "hi"}]).usage.completion_tokens == 2
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError):
            c.models.list()
    with anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0) as a:  # sends x-api-key
        assert a.messages.create(model="smollm2", max_tokens=2,
                                 messages=[{"role": "user", "content": "hi"}]).usage.output_tokens == 2
    with anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0) as a:
        with pytest.raises(anthropic.AuthenticationError):
            a.messages.create(model="smollm2", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    with ollama.Client(host=server.url, headers=BEARER) as o:
        assert o.generate(model="smollm2", prompt="hi", options={"num_predict": 2}).eval_count == 2
    with ollama.Client(host=server.url) as o:
        with pytest.raises(ollama.ResponseError) as e:
            o.list()
        assert e.value.status_code == 401


def test_metrics(server):
    server.post("/v1/chat/completions", {"model": "smollm2", "max_tokens": 5,
                                         "messages": [{"role": "user", "content": "Count to five."}]}, headers=BEARER)
    text = server.get("/metrics", headers=BEARER).text
    for name in ("ctx_http_requests_total", "ctx_prompt_tokens_total", "ctx_generated_tokens_total",
                 "ctx_prefill_seconds_total", "ctx_decode_seconds_total", "ctx_prefix_cache_hits_total",
                 "ctx_cached_prompt_tokens_total", "ctx_kv_pages_in_use", "ctx_models_loaded"):
        assert f"\n{name}" in text, name
    assert server.metric("ctx_generated_tokens_total", BEARER) >= 5
    assert server.metric("ctx_kv_pages_in_use", BEARER) > 0
    assert server.metric("ctx_decode_seconds_total", BEARER) > 0
    assert 'route="/v1/chat/completions",status="200"' in text and 'status="401"' in text


def test_cors_for_the_configured_origin_only(server):
    pre = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    ok = httpx.options(server.url + "/v1/chat/completions", headers={"Origin": ORIGIN, **pre})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ORIGIN
    other = httpx.options(server.url + "/v1/chat/completions", headers={"Origin": "http://evil.example", **pre})
    assert "access-control-allow-origin" not in other.headers
    r = server.get("/v1/models", headers={"Origin": ORIGIN, **BEARER})
    assert r.headers["access-control-allow-origin"] == ORIGIN


def test_writes_from_other_sites_are_refused(server):
    """A web page the user visits must not drive a local server: a browser's cross-site
    write (it carries Origin) is refused, before the key is even looked at; API clients send
    no Origin, and the server's own pages (the studio) and --cors-origin origins pass."""
    url = server.url + "/v1/chat/completions"
    evil = httpx.post(url, content=b'{"model": "smollm2"}', headers={"Origin": "http://evil.example",
                                                                      "Content-Type": "text/plain"})
    assert evil.status_code == 403 and "cross-site" in evil.json()["error"]["message"]
    assert httpx.post(url, json={}, headers={"Origin": "http://evil.example", **BEARER}).status_code == 403
    for headers in ({}, {"Origin": ORIGIN}, {"Origin": server.url}):
        assert httpx.post(url, json={}, headers={**headers, **BEARER}).status_code == 400  # reached the route
    assert server.get("/v1/models", headers={"Origin": "http://evil.example", **BEARER}).status_code == 200


def _stream(url: str, max_tokens: int, out: dict, started: threading.Event) -> None:
    body = {"model": "smollm2", "max_tokens": max_tokens, "temperature": 1.0, "seed": 3, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "Tell me a very long story."}]}
    events = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                started.set()
    out["events"] = events


def test_sigterm_finishes_short_streams_and_cuts_long_ones(tmp_path):
    # 6 s of grace: on a loaded 2-core machine a 40-token stream can need more than 3.
    server = Server(tmp_path, "--shutdown-timeout", "6")
    streams = {}
    threads = []
    for name, n in (("short", 40), ("long", 5000)):
        started = threading.Event()
        streams[name] = {}
        t = threading.Thread(target=_stream, args=(server.url, n, streams[name], started))
        t.start()
        threads.append(t)
        assert started.wait(60)
    t0 = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(30) == 0, server.log()
    assert time.monotonic() - t0 < 15
    for t in threads:
        t.join(10)
    server.stop()
    assert "Traceback" not in server.log(), server.log()
    for name in ("short", "long"):
        events = streams[name]["events"]
        assert events[-1] == "[DONE]", (name, events[-3:])
        finish = [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-2]]
        assert finish[-1] in ("length", "stop") and all(f is None for f in finish[:-1])
    # the short one ran to its end within the grace period; the long one was cut before its 5000 tokens
    short, long = (json.loads(streams[n]["events"][-2])["usage"]["completion_tokens"] for n in ("short", "long"))
    assert short == 40 or finish_of(streams["short"]) == "stop"
    assert finish_of(streams["long"]) == "length" and 0 < long < 5000


def finish_of(stream: dict) -> str:
    return json.loads(stream["events"][-3])["choices"][0]["finish_reason"]


def test_a_bug_is_a_500_in_the_routes_shape_and_goes_no_further(caplog):
    """ops.Bugs answers what no handler took. FastAPI's catch-all handler answered and raised
    again, and the server then dropped the connection (a kept-alive or pipelined request
    after it failed too); here nothing leaves the app but the reply."""
    from starlette.testclient import TestClient

    from ctxengine.api.ops import Bugs

    async def broken(scope, receive, send):
        raise RuntimeError("a bug")

    client = TestClient(Bugs(broken))  # it raises what the app lets through
    r = client.post("/api/chat", json={})
    assert r.status_code == 500 and r.json() == {"error": "internal error: RuntimeError: a bug"}
    assert client.get("/v1/models").json()["error"]["type"] == "server_error"
    assert "a bug" in caplog.text  # its traceback is logged


def test_a_connection_that_never_sends_a_whole_request_head_is_closed(tmp_path):
    """--header-timeout: a connection that sends nothing, or a head a byte at a time, is
    closed once the time is up (uvicorn timed only idle kept-alive connections: such
    connections were held for good, and enough of them took every file descriptor)."""
    import socket
    from urllib.parse import urlsplit

    from api_server import running

    with running(tmp_path, "--header-timeout", "1") as server:
        address = urlsplit(server.url)
        opened = [socket.create_connection((address.hostname, address.port), timeout=10) for _ in range(3)]
        silent, partial, trickle = opened
        partial.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        t = time.monotonic()
        with pytest.raises(OSError):  # cut while it trickles
            for byte in b"GET /health HTTP/1.1\r\nHost: x\r\n":
                trickle.sendall(bytes([byte]))
                time.sleep(0.2)
        assert time.monotonic() - t < 5
        assert silent.recv(100) == b"" and partial.recv(100) == b""
        with httpx.Client(base_url=server.url) as client:  # whole requests are untouched, idle ones kept
            assert client.get("/health").status_code == 200
            time.sleep(1.5)
            assert client.get("/health").status_code == 200
        for s in opened:
            s.close()
