"""Errors in each dialect's own shape, and clients that go away mid-stream."""
import json
import time

import httpx
import pytest

from api_server import module_server

MAX_BODY = 4096
CHAT = {"messages": [{"role": "user", "content": "Tell me a long story about the sea."}]}
# (route, a valid body, how the dialect shapes an error)
ROUTES = [
    ("/v1/chat/completions", {"model": "smollm2", "max_tokens": 2, **CHAT}, "openai"),
    ("/v1/messages", {"model": "smollm2", "max_tokens": 2, **CHAT}, "anthropic"),
    ("/api/chat", {"model": "smollm2", "stream": False, "options": {"num_predict": 2}, **CHAT}, "ollama"),
]


server = module_server("errors", "--max-body", str(MAX_BODY))


def message_of(r: httpx.Response, dialect: str) -> str:
    body = r.json()
    if dialect == "ollama":
        assert set(body) == {"error"} and isinstance(body["error"], str), body
        return body["error"]
    if dialect == "anthropic":
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        return body["error"]["message"]
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"]), body
    assert body["error"]["code"] is None or isinstance(body["error"]["code"], str), body  # as OpenAI's: no status
    return body["error"]["message"]


@pytest.mark.parametrize("route,body,dialect", ROUTES)
def test_valid_requests_succeed(server, route, body, dialect):
    assert server.post(route, body).status_code == 200


@pytest.mark.parametrize("route,body,dialect", ROUTES)
def test_malformed_json_is_400(server, route, body, dialect):
    r = httpx.post(server.url + route, content=b'{"model": "smollm2", "messages": [', timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "malformed JSON" in message_of(r, dialect)
    r = httpx.post(server.url + route, content=b"[1, 2]", timeout=30)
    assert r.status_code == 400 and "JSON object" in message_of(r, dialect)


@pytest.mark.parametrize("route,body,dialect", ROUTES)
def test_unknown_model_is_404(server, route, body, dialect):
    r = server.post(route, {**body, "model": "no-such-model"})
    assert r.status_code == 404 and "no-such-model" in message_of(r, dialect)


@pytest.mark.parametrize("route,body,dialect", ROUTES)
def test_oversized_body_is_413(server, route, body, dialect):
    big = {**body, "messages": [{"role": "user", "content": "x" * (2 * MAX_BODY)}]}
    r = server.post(route, big)
    assert r.status_code == 413 and str(MAX_BODY) in message_of(r, dialect)
    # a chunked body (no Content-Length) is cut off as it is read
    data = json.dumps(big).encode()
    r = httpx.post(server.url + route, content=iter([data[i:i + 1000] for i in range(0, len(data), 1000)]),
                   timeout=30)
    assert r.status_code == 413 and str(MAX_BODY) in message_of(r, dialect)


@pytest.mark.parametrize("route,body,dialect", ROUTES)
def test_wrongly_typed_fields_are_400(server, route, body, dialect):
    r = server.post(route, {**body, "messages": "hello"})
    assert r.status_code == 400 and "messages" in message_of(r, dialect)


def test_a_bad_sampling_option_is_named_as_the_param(server):
    r = server.post("/v1/chat/completions", {**ROUTES[0][1], "temperature": -1})  # param was null
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"


def test_unknown_routes_in_the_dialect_of_their_path(server):
    r = server.get("/v1/nothing-here")
    assert r.status_code == 404 and "no such route" in message_of(r, "openai")
    r = server.post("/api/nothing-here", {})
    assert r.status_code == 404 and "no such route" in message_of(r, "ollama")
    r = server.get("/v1/chat/completions")
    assert r.status_code == 405 and r.headers["allow"] == "POST"  # HTTP requires it; it was dropped


@pytest.mark.parametrize("route,body,dialect", ROUTES)
def test_a_number_too_large_for_a_float_is_400_and_the_connection_lives_on(server, route, body, dialect):
    # an OverflowError: a 500, after which the server dropped the connection (the client's next
    # request on it failed too)
    field = {"openai": "temperature", "anthropic": "top_p", "ollama": "min_p"}[dialect]
    sent = {**body, "options": {**body["options"], field: "BIG"}} if dialect == "ollama" else {**body, field: "BIG"}
    raw = json.dumps(sent).replace('"BIG"', "1" + "0" * 400)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        r = client.post(route, content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400 and f"{field}' must be a finite number" in message_of(r, dialect)
        assert client.get("/health").status_code == 200


@pytest.mark.parametrize("route,body,dialect", ROUTES)
def test_a_refusal_that_repeats_a_lone_surrogate_is_still_the_refusal(server, route, body, dialect):
    # the error's JSON was encoded as UTF-8, which has no lone surrogate: a 500
    r = httpx.post(server.url + route, content=json.dumps({**body, "model": "m\ud800"}), timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 404 and "m\ud800" in message_of(r, dialect)


@pytest.mark.parametrize("options", [0, False, [], ""])
def test_ollama_options_must_be_an_object(server, options):
    # taken as {} (and with it any num_predict meant)
    r = server.post("/api/chat", {**ROUTES[2][1], "options": options})
    assert r.status_code == 400 and message_of(r, "ollama").startswith("options must be an object")


def test_cors_is_off_unless_configured(server):
    r = httpx.options(server.url + "/v1/models", headers={"Origin": "http://example.com",
                                                          "Access-Control-Request-Method": "GET"})
    assert "access-control-allow-origin" not in r.headers


def wait_for_metric(server, name: str, above: float, timeout: float = 30) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = server.metric(name)
        if value > above:
            return value
        time.sleep(0.1)
    pytest.fail(f"{name} stayed at {above}")


@pytest.mark.parametrize("route,body", [
    ("/v1/chat/completions", {"model": "smollm2", "max_tokens": 2000, "stream": True, **CHAT}),
    ("/v1/messages", {"model": "smollm2", "max_tokens": 2000, "stream": True, **CHAT}),
    ("/api/chat", {"model": "smollm2", "options": {"num_predict": 2000}, **CHAT}),
])
def test_a_client_going_away_stops_its_generation(server, route, body):
    generations = server.metric("ctx_generations_total")
    tokens = server.metric("ctx_generated_tokens_total")
    with httpx.stream("POST", server.url + route, json={**body, "temperature": 1.0, "seed": 7}, timeout=60) as r:
        assert r.status_code == 200
        next(r.iter_bytes())
    wait_for_metric(server, "ctx_generations_total", generations)
    assert server.metric("ctx_generated_tokens_total") - tokens < 200  # of up to 2000
    deadline = time.monotonic() + 10
    while server.metric("ctx_active_streams") != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.metric("ctx_active_streams") == 0


def test_a_stream_cut_on_a_named_context_releases_it(server):
    assert server.post("/v1/contexts", {"name": "cut"}).status_code == 201
    body = {"model": "smollm2", "max_tokens": 2000, "stream": True, "context": "cut", **CHAT}
    generations = server.metric("ctx_generations_total")
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        next(r.iter_bytes())
    wait_for_metric(server, "ctx_generations_total", generations)
    t = time.monotonic()
    r = server.post("/v1/chat/completions", {**body, "stream": False, "max_tokens": 3,
                                             "messages": [{"role": "user", "content": "Go on."}]})
    assert r.status_code == 200 and time.monotonic() - t < 20
    text = server.get("/v1/contexts/cut").json()["text"]
    assert text.count("<|im_start|>user") == 2  # the cut reply was kept and closed, then the next turn


@pytest.mark.parametrize("route,body,dialect", ROUTES)
def test_a_client_that_leaves_mid_body_is_no_server_error(server, route, body, dialect):
    # It was logged as an internal error with two tracebacks and counted as a 500.
    import socket
    from urllib.parse import urlsplit
    u = urlsplit(server.url)
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        s.sendall(f"POST {route} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  "Content-Length: 1000\r\n\r\n{\"model\": \"smol".encode())
    def counted(status: str) -> bool:
        return any(f'route="{route}"' in line and f'status="{status}"' in line and not line.endswith(" 0.0")
                   for line in server.get("/metrics").text.splitlines() if line.startswith("ctx_http_requests_total"))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not counted("499"):
        time.sleep(0.1)
    assert counted("499") and not counted("500")
    assert "ClientDisconnect" not in server.log()


@pytest.mark.parametrize("route,body,dialect", ROUTES)
def test_a_tool_whose_parameters_are_not_an_objects_schema_is_400(server, route, body, dialect):
    """Forced, such a tool's call ended "stop" with no call and no text (found by a probe)."""
    schema = {"type": "array", "items": {"type": "string"}}
    tool = ({"name": "f", "input_schema": schema} if dialect == "anthropic"
            else {"type": "function", "function": {"name": "f", "parameters": schema}})
    choice = {"type": "any"} if dialect == "anthropic" else "required"
    r = server.post(route, {**body, "tools": [tool], "tool_choice": choice})
    assert r.status_code == 400 and 'the schema of an object ("type": "object"), not of type "array"' in \
        message_of(r, dialect)


@pytest.mark.parametrize("strict", ["yes", 1, {}])
def test_a_functions_strict_that_is_no_boolean_is_400(server, strict):
    tool = {"type": "function", "function": {"name": "f", "strict": strict, "parameters": {"type": "object"}}}
    r = server.post("/v1/chat/completions", {**ROUTES[0][1], "tools": [tool]})
    assert r.status_code == 400 and "'tools[0].function.strict' must be a boolean" in message_of(r, "openai")
