"""What docs/http-api.md says of 405s, of a request that names only a context,
of the default model, of a response's sampling and of the OpenAI seed, checked
on a real `ctx serve` whose default model is not the packaged SmolLM2 (Gemma 3,
given with -m) and which also serves SmolLM2 with an Ollama params layer."""
import re
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from api_server import anthropic_client, openai_client, running  # noqa: F401 (fixtures)
from ollama_layout import make_ollama_store

DOC = Path(__file__).resolve().parent.parent / "docs" / "http-api.md"
QUESTION = [{"role": "user", "content": "Name one colour of the rainbow."}]
TUNED = {"temperature": 0.5, "top_p": 0.6}  # the params layer of "tuned" (SmolLM2)


@pytest.fixture(scope="module")
def store(tmp_path_factory, smollm2_path):
    root = tmp_path_factory.mktemp("ollama-tuned")
    make_ollama_store(root, "tuned", smollm2_path, params=TUNED)
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory, store, gemma3_path):
    with running(tmp_path_factory.mktemp("s29"), "-m", str(gemma3_path), "--ollama-models", str(store),
                 "--threads", "2") as s:
        yield s


@pytest.fixture(scope="module")
def gemma(gemma3_path) -> str:
    """The name the -m file is served by: the default model."""
    return gemma3_path.name.removesuffix(".gguf")


def doc_text() -> str:
    return " ".join(DOC.read_text().split())


def documented_keys(shape: str) -> set[str]:
    """The field names in a shape the doc writes as `{"object": "context", "name", ...}`."""
    return set(re.findall(r'(?<!: )"([\w.]+)"', shape))


# -- 405s -----------------------------------------------------------------------------
ALLOWS = [("PUT", "/v1/models", "GET, HEAD"), ("POST", "/health", "GET, HEAD"), ("POST", "/api/tags", "GET, HEAD"),
          ("PUT", "/v1/contexts", "GET, POST"), ("PUT", "/v1/contexts/a", "GET, DELETE"),
          ("PUT", "/v1/responses/resp_x", "GET, DELETE"), ("GET", "/v1/chat/completions", "POST"),
          ("PATCH", "/lora-adapters", "GET, POST"), ("PUT", "/studio/index.html", "GET, HEAD")]


@pytest.mark.parametrize("method,path,allow", ALLOWS)
def test_a_405_allows_every_method_its_path_takes(server, method, path, allow):
    # Allow named the first route that matched the path only: HEAD for GET /v1/models
    # (its HEAD twin comes first), GET for /v1/contexts, which takes POST too
    r = httpx.request(method, server.url + path, timeout=30)
    assert r.status_code == 405 and r.headers["allow"] == allow
    for taken in allow.split(", "):  # each is taken: refused for its (empty) body, not found, but never a 405
        assert httpx.request(taken, server.url + path, timeout=30).status_code != 405, taken


# -- a context without a model, and the default model ----------------------------------
def test_a_request_naming_only_a_context_runs_on_the_contexts_model(server, openai_client, gemma):
    # It ran on the server's default model: "context 'notes' belongs to model 'smollm2', not '<gemma>'"
    assert server.post("/v1/contexts", {"name": "notes", "model": "smollm2"}).status_code == 201
    for route, body in [("/v1/chat/completions", {"messages": QUESTION}), ("/v1/completions", {"prompt": " Red,"})]:
        r = server.post(route, {"context": "notes", "max_tokens": 2, "temperature": 0, **body})
        assert r.status_code == 200 and r.json()["model"] == "smollm2", r.text
    assert server.get("/v1/contexts/notes").json()["n_tokens"] > 0
    # a model named is still checked against the context's, in every dialect
    with pytest.raises(openai.BadRequestError, match="context 'notes' belongs to model 'smollm2'"):
        openai_client.chat.completions.create(model=gemma, messages=QUESTION, max_tokens=2,
                                              extra_body={"context": "notes"})
    r = server.post("/api/chat", {"model": gemma, "context": "notes", "stream": False, "messages": QUESTION})
    assert r.status_code == 400 and "belongs to model 'smollm2'" in r.json()["error"]
    r = server.post("/v1/messages", {"context": "notes", "max_tokens": 2, "messages": QUESTION})
    assert r.status_code == 400 and "'model' is required" in r.json()["error"]["message"]  # Anthropic's rule


def test_a_context_must_be_made_before_a_request_names_it(openai_client):
    with pytest.raises(openai.NotFoundError, match="no context named 'later'"):
        openai_client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=2,
                                              extra_body={"context": "later"})
    assert "make it first with `POST /v1/contexts`" in doc_text()


def test_the_default_model_is_the_first_given_with_m(server, gemma):
    r = server.post("/v1/contexts", {"name": "plain"})
    assert r.status_code == 201 and r.json()["model"] == gemma
    for route, body in [("/v1/chat/completions", {"messages": QUESTION, "max_tokens": 1}),
                        ("/v1/responses", {"input": "Hi", "max_output_tokens": 1, "store": False})]:
        assert server.post(route, body).json()["model"] == gemma
    assert server.get("/v1/models").json()["data"][0]["id"] == gemma
    assert "the first `-m` model when there is one" in doc_text()


# -- the contexts API as documented ----------------------------------------------------
def test_the_context_object_and_a_delete_reply_are_as_documented(server):
    doc = DOC.read_text()
    card = re.search(r'A context is `(\{"object": "context",[^`]*\})`', doc).group(1)
    assert server.post("/v1/contexts", {"name": "doc", "model": "smollm2"}).status_code == 201
    listed = next(c for c in server.get("/v1/contexts").json()["data"] if c["name"] == "doc")
    assert set(listed) == documented_keys(card)  # "host" was not documented
    row = re.search(r"^\| `DELETE /v1/contexts/\{name\}` \| \| `(\{[^`]*\})` \|$", doc, re.M).group(1)
    r = httpx.delete(server.url + "/v1/contexts/doc", timeout=30)
    assert r.status_code == 200 and set(r.json()) == documented_keys(row)  # documented: {"deleted": true}
    assert r.json() == {"object": "context.deleted", "name": "doc", "deleted": True}


# -- a response's sampling --------------------------------------------------------------
@pytest.mark.parametrize("model,sent,used", [
    ("smollm2", {}, (0.8, 0.95)),  # the engine's defaults (OpenAI's 1 and 1 were reported)
    ("smollm2", {"temperature": 0.25}, (0.25, 0.95)),
    ("tuned", {}, (0.5, 0.6)),  # its params layer's
    ("tuned", {"top_p": 0.9}, (0.5, 0.9)),
])
def test_a_response_reports_the_sampling_it_ran_with(openai_client, model, sent, used):
    r = openai_client.responses.create(model=model, input="Hi", max_output_tokens=2, **sent)
    assert (r.temperature, r.top_p) == pytest.approx(used)
    stored = openai_client.responses.retrieve(r.id)
    assert (stored.temperature, stored.top_p) == pytest.approx(used)
    events = list(openai_client.responses.create(model=model, input="Hi", max_output_tokens=2, stream=True,
                                                 store=False, **sent))
    assert [(e.response.temperature, e.response.top_p) for e in (events[0], events[-1])] == [pytest.approx(used)] * 2


# -- the OpenAI seed --------------------------------------------------------------------
@pytest.mark.parametrize("seed,taken", [(2 ** 63 - 1, True), (-(2 ** 63), True), (2 ** 64 - 1, True),
                                        (2 ** 64, False), (-(2 ** 63) - 1, False)])
def test_the_openai_seed_is_a_64_bit_integer_signed_or_not(server, anthropic_client, seed, taken):
    # The doc said a signed 64-bit integer, and 2**63 to 2**64 - 1 were taken (on purpose:
    # clients that send unsigned seeds keep working); the doc now says what is taken.
    for route, body in [("/v1/completions", {"prompt": "Hi", "max_tokens": 1}),
                        ("/v1/responses", {"input": "Hi", "max_output_tokens": 1, "store": False})]:
        r = server.post(route, {"model": "smollm2", "seed": seed, **body})
        if taken:
            assert r.status_code == 200, r.text
        else:
            assert r.status_code == 400 and r.json()["error"]["param"] == "seed", r.text
    if not taken:
        with pytest.raises(anthropic.BadRequestError, match="'seed' must be a 64-bit integer"):
            anthropic_client.messages.create(model="smollm2", max_tokens=1, messages=QUESTION,
                                             extra_body={"seed": seed})
    assert "`seed` (a 64-bit integer, -2^63 to 2^64-1" in doc_text()
