"""Named contexts made with LoRA adapters over HTTP (``POST /v1/contexts`` with
a ``lora`` field) and over gRPC (``CreateRequest.lora``), against a real
`ctx serve --lora` on loopback: the context runs with them for life, its
snapshots record them, and bad fields are refused with nothing made."""
import math

import grpc
import httpx
import openai
import pytest

from api_server import running
from ctxengine.rpc import Remote, RemoteError
from servers import CtxServer
from test_api_lora import QUESTION, adapters, greedy, model  # noqa: F401 (its fixtures, shared)

TUNED = [{"name": "tuned", "scale": 1.0}]


def lora_args(adapters) -> tuple[str, ...]:
    return "--lora", f"tuned={adapters['tuned']}:0", "--lora", f"other={adapters['other']}:0"


@pytest.fixture(scope="module")
def server(tmp_path_factory, adapters):
    with running(tmp_path_factory.mktemp("lora-contexts"), *lora_args(adapters)) as s:
        yield s


def continue_chat(server, name: str) -> str:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as client:
        r = client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=12, temperature=0,
                                           extra_body={"context": name})
    return r.choices[0].message.content


def test_a_context_made_with_an_adapter_runs_with_it(server, model):
    r = server.post("/v1/contexts", {"name": "tuned-chat", "lora": TUNED})
    assert r.status_code == 201, r.text
    card = r.json()
    assert card["lora"] == [{"name": "tuned", "blake3": model.adapters["tuned"].id, "scale": 1.0}]
    assert continue_chat(server, "tuned-chat") == greedy(model, {"tuned": 1.0})
    plain = server.post("/v1/contexts", {"name": "plain-chat", "lora": []}).json()
    assert plain["lora"] == []
    assert continue_chat(server, "plain-chat") == greedy(model)
    assert server.get("/v1/contexts/tuned-chat").json()["lora"] == card["lora"]


def test_its_snapshot_records_the_adapters(server, model):
    lora = [{"id": 0, "scale": 0.5}, {"name": "other", "scale": 1.5}]
    made = server.post("/v1/contexts", {"name": "kept", "lora": lora, "text": "Hello"}).json()
    assert sorted((u["name"], u["scale"]) for u in made["lora"]) == [("other", 1.5), ("tuned", 0.5)]
    assert server.post("/v1/contexts/kept/snapshot", {}).status_code == 200
    assert httpx.delete(f"{server.url}/v1/contexts/kept", timeout=60).status_code == 200
    back = server.post("/v1/contexts/kept/restore", {})
    assert back.status_code == 201, back.text
    assert back.json()["lora"] == made["lora"]


def test_without_the_field_a_context_takes_the_default_scales(server, model):
    try:
        assert server.post("/lora-adapters", [{"name": "tuned", "scale": 1.0}]).status_code == 200
        card = server.post("/v1/contexts", {"name": "defaults"}).json()
        assert [(u["name"], u["scale"]) for u in card["lora"]] == [("tuned", 1.0)]
    finally:
        server.post("/lora-adapters", [])
    assert continue_chat(server, "defaults") == greedy(model, {"tuned": 1.0})  # for its whole life


@pytest.mark.parametrize("lora,message", [
    ([{"name": "nope", "scale": 1.0}], "unknown LoRA adapter 'nope'; loaded: tuned, other"),
    ([{"id": 2, "scale": 1.0}], "invalid adapter id 2"),
    ([{"name": "tuned", "scale": "NaN"}], "must be a number"),
    ([{"name": "tuned", "scale": 1e39}], "must be a finite number"),  # beyond float32
    ([{"name": "tuned", "scale": "x"}], "must be a number"),
    ({"tuned": 1.0}, "'lora' must be a list"),
])
def test_a_bad_lora_field_is_a_400_and_makes_nothing(server, model, lora, message):
    r = server.post("/v1/contexts", {"name": "refused", "lora": lora, "text": "Hello"})
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]["message"] and r.json()["error"]["param"] == "lora"
    assert server.get("/v1/contexts/refused").status_code == 404
    assert server.get("/health").status_code == 200


def test_grpc_create_takes_adapters(tmp_path_factory, adapters, model):
    server = CtxServer(tmp_path_factory.mktemp("lora-grpc"), *lora_args(adapters))
    try:
        with Remote(server.target) as remote:
            c = remote.create("g", lora={"tuned": 1.0})
            assert c.lora == {"tuned": 1.0}
            c.append(model.chat_prompt(QUESTION), parse_special=True)
            assert "".join(p.text for p in c.generate(12, temperature=0.0)) == greedy(model, {"tuned": 1.0})
            assert remote.create("none", lora={}).lora == {} and remote.create("default").lora == {}
            with pytest.raises(RemoteError, match="unknown LoRA adapter 'nope'") as err:
                remote.create("bad", lora={"nope": 1.0})
            assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(RemoteError, match="finite") as err:
                remote.create("bad", lora={"tuned": math.nan})
            assert "bad" not in {x.name for x in remote.contexts()}
    finally:
        server.stop()
