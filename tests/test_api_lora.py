"""LoRA adapters through `ctx serve --lora`: chosen per request by the real
openai client (and on the Anthropic and Ollama routes), listed and rescaled
at /lora-adapters as llama-server's, bad requests refused with the server up."""
import openai
import pytest

import ctxengine
from api_server import running
from conftest import read_metadata
from lora_files import smollm2_lora

QUESTION = [{"role": "user", "content": "Name a large animal."}]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, smollm2_path):
    d = tmp_path_factory.mktemp("adapters")
    meta = read_metadata(smollm2_path)
    return {"tuned": smollm2_lora(d / "tuned.gguf", meta, strength=5.0),
            "other": smollm2_lora(d / "other.gguf", meta, rank=8, strength=5.0, seed=7)}


@pytest.fixture(scope="module")
def server(tmp_path_factory, adapters):
    missing = tmp_path_factory.mktemp("missing") / "gone.gguf"
    missing.write_bytes(b"not a gguf")  # not an adapter: skipped, with its reason kept (a missing file is refused)
    copy = missing.with_name("copy.gguf")  # the same bytes as "tuned": skipped too, not listed
    copy.write_bytes(adapters["tuned"].read_bytes())
    args = ("--lora", f"tuned={adapters['tuned']}:0", "--lora", f"other={adapters['other']}:0",
            "--lora", f"gone={missing}", "--lora", f"copy={copy}:0.5")
    with running(tmp_path_factory.mktemp("lora"), *args) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def model(smollm2_path, adapters):
    m = ctxengine.load(smollm2_path, lora=adapters)
    yield m
    m.close()


def greedy(model, lora=None, n=12):
    ctx = model.context(None, lora=lora)
    try:
        ctx.append(model.chat_prompt(QUESTION), parse_special=True)
        return "".join(p.text for p in ctx.generate(n, temperature=0.0))
    finally:
        ctx.delete()


def chat(client, lora=None):
    extra = {} if lora is None else {"lora": lora}
    r = client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=12, temperature=0,
                                       extra_body=extra)
    return r.choices[0].message.content


def test_openai_client_picks_an_adapter_per_request(client, model):
    base, tuned = greedy(model), greedy(model, {"tuned": 1.0})
    both = greedy(model, {"tuned": 0.5, "other": 1.0})
    assert len({base, tuned, both}) == 3
    assert chat(client) == base  # both adapters are at scale 0 by default
    assert chat(client, [{"name": "tuned", "scale": 1.0}]) == tuned
    assert chat(client, [{"id": 0, "scale": 0.5}, {"id": 1, "scale": 1.0}]) == both
    assert chat(client, []) == base


def test_lora_adapters_listed_and_rescaled(server, client, model, adapters):
    listed = server.get("/lora-adapters").json()
    assert [(a["id"], a["name"], a["scale"]) for a in listed] == [(0, "tuned", 0.0), (1, "other", 0.0)]
    assert listed[0]["path"] == str(adapters["tuned"]) and listed[0]["ranks"] == [16]
    assert listed[0]["blake3"] == model.adapters["tuned"].id
    try:
        r = server.post("/lora-adapters", [{"id": 0, "scale": 1.0}])
        assert r.status_code == 200 and [a["scale"] for a in r.json()] == [1.0, 0.0]
        assert chat(client) == greedy(model, {"tuned": 1.0})
        # An unload and a reload (keep_alive 0, then a request) once put the start-up scales back.
        r = server.post("/api/generate", {"model": "smollm2", "prompt": "", "keep_alive": 0})
        assert r.json()["done_reason"] == "unload" and server.get("/api/ps").json()["models"] == []
        assert [a["scale"] for a in server.get("/lora-adapters").json()] == [1.0, 0.0]
        assert chat(client) == greedy(model, {"tuned": 1.0})
    finally:
        server.post("/lora-adapters", [])


def test_anthropic_and_ollama_routes_take_lora(server, model):
    tuned = greedy(model, {"tuned": 1.0})
    body = {"model": "smollm2", "messages": QUESTION, "max_tokens": 12, "temperature": 0,
            "lora": [{"name": "tuned", "scale": 1.0}]}
    r = server.post("/v1/messages", body)
    assert r.status_code == 200 and r.json()["content"][0]["text"] == tuned
    body = {"model": "smollm2", "messages": QUESTION, "stream": False, "lora": [{"name": "tuned", "scale": 1.0}],
            "options": {"temperature": 0, "num_predict": 12}}
    r = server.post("/api/chat", body)
    assert r.status_code == 200 and r.json()["message"]["content"] == tuned


@pytest.mark.parametrize("lora,message", [
    ([{"name": "nope", "scale": 1.0}], "unknown LoRA adapter 'nope'"),
    ([{"name": "gone", "scale": 1.0}], r"unknown LoRA adapter 'gone' \(.*gone.gguf.*\); loaded: tuned, other"),
    ([{"id": 5, "scale": 1.0}], "invalid adapter id 5"),
    ([{"name": "tuned", "scale": "NaN"}], "must be a number"),
    ({"tuned": 1.0}, "'lora' must be a list"),
    ([{"name": "copy", "scale": 1.0}], r"unknown LoRA adapter 'copy' \(.*the same file as adapter 'tuned'\)"),
    ([{"name": ["tuned"], "scale": 1.0}], r"lora\[0\]\.name must be a string"),
    ([{"id": 1, "name": "tuned"}], "name different adapters"),
    ([{"id": 0, "scale": 1.0}, {"name": "tuned", "scale": 0.5}], r"lora\[1\]: adapter 0 \('tuned'\) is already listed"),
    ([{"id": 0, "scale": 10**400}], "must be a finite number"),
    ([{"id": 0, "scale": 1e39}], "must be a finite number"),
    ([{"id": 0, "scale": "0.5"}], "must be a number"),
    ([{"id": 0, "scale": True}], "must be a number"),
])
def test_bad_lora_is_a_400_and_the_server_stays_up(client, model, lora, message):
    with pytest.raises(openai.BadRequestError, match=message):
        chat(client, lora)
    assert chat(client) == greedy(model)


def test_responses_route_takes_lora_and_its_chain_keeps_it(client, model):
    tuned = greedy(model, {"tuned": 1.0})
    first = client.responses.create(model="smollm2", input=QUESTION, max_output_tokens=12, temperature=0,
                                    extra_body={"lora": [{"name": "tuned", "scale": 1.0}]})
    assert first.output_text == tuned != greedy(model)
    with pytest.raises(openai.BadRequestError, match="cannot change its adapters .*asks for no adapters"):
        client.responses.create(model="smollm2", input="And another?", previous_response_id=first.id,
                                max_output_tokens=4, extra_body={"lora": []})
    with pytest.raises(openai.BadRequestError, match="unknown LoRA adapter 'nope'"):
        client.responses.create(model="smollm2", input=QUESTION, max_output_tokens=4,
                                extra_body={"lora": [{"name": "nope"}]})


def test_embeddings_run_under_the_requests_adapters(server, client):
    # They ran on the base model whatever the request asked: an unknown adapter was a 200,
    # and an Ollama model's own ADAPTER layers were left out of its embeddings.
    def embedding(lora=None):
        extra = {} if lora is None else {"lora": lora}
        return client.embeddings.create(model="smollm2", input="A large animal.", extra_body=extra).data[0].embedding

    tuned = [{"name": "tuned", "scale": 1.0}]
    base = embedding()
    assert embedding(tuned) != base and embedding([]) == base
    r = server.post("/api/embed", {"model": "smollm2", "input": "A large animal.", "lora": tuned})
    assert r.status_code == 200 and r.json()["embeddings"][0] == pytest.approx(embedding(tuned), abs=1e-6)
    try:
        server.post("/lora-adapters", [{"id": 0, "scale": 1.0}])
        assert embedding() == embedding(tuned)  # the default scales, as a generation's
    finally:
        server.post("/lora-adapters", [])
    with pytest.raises(openai.BadRequestError, match="unknown LoRA adapter 'nope'"):
        embedding([{"name": "nope"}])
    r = server.post("/api/embeddings", {"model": "smollm2", "prompt": "A large animal.", "lora": [{"name": "nope"}]})
    assert r.status_code == 400 and "unknown LoRA adapter 'nope'" in r.json()["error"]
