"""Contexts over HTTP (our extension): the /v1/contexts routes and the
`context` field of chat, messages and generate requests."""
import anthropic
import httpx
import openai
import pytest

from api_server import module_server
from api_server import model, openai_client  # noqa: F401 (fixtures)

server = module_server("contexts")


def test_create_get_list_delete(server, model):
    r = server.post("/v1/contexts", {"name": "notes", "system": "You keep notes.", "labels": {"owner": "test"}})
    assert r.status_code == 201, r.text
    card = r.json()
    system = model.chat_prompt([{"role": "system", "content": "You keep notes."}], add_generation_prompt=False)
    assert card["n_tokens"] == len(model.tokenize(system, parse_special=True))
    assert card["model"] == "smollm2" and card["weight_id"] == model.weight_id
    assert card["labels"] == {"owner": "test"}
    got = server.get("/v1/contexts/notes", params={"tokens": "true"}).json()
    assert got["text"] == system and got["tokens"] == model.tokenize(system, parse_special=True)
    assert "notes" in [c["name"] for c in server.get("/v1/contexts").json()["data"]]
    assert server.post("/v1/contexts", {"name": "notes"}).status_code == 409
    d = httpx.delete(f"{server.url}/v1/contexts/notes")
    assert d.status_code == 200 and d.json()["deleted"] is True
    assert server.get("/v1/contexts/notes").status_code == 404
    assert httpx.delete(f"{server.url}/v1/contexts/notes").status_code == 404


def test_chat_continues_a_named_context_prefilling_only_new_tokens(server, openai_client, model):
    server.post("/v1/contexts", {"name": "chat", "system": "You are brief."})
    r1 = openai_client.chat.completions.create(model="smollm2", max_tokens=12, temperature=0,
                                        messages=[{"role": "user", "content": "Name a colour."}],
                                        extra_body={"context": "chat"})
    before = server.get("/v1/contexts/chat").json()
    r2 = openai_client.chat.completions.create(model="smollm2", max_tokens=12, temperature=0,
                                        messages=[{"role": "user", "content": "Another one."}],
                                        extra_body={"context": "chat"})
    # everything the context held was reused; only the new turn was prefilled
    assert r2.usage.prompt_tokens_details.cached_tokens >= before["n_tokens"] - 1
    new_turn = model.chat_prompt([{"role": "system", "content": "x"}, {"role": "user", "content": "Another one."}])
    new_turn = new_turn[len(model.chat_prompt([{"role": "system", "content": "x"}], add_generation_prompt=False)):]
    assert r2.usage.prompt_tokens == before["n_tokens"] + len(model.tokenize(new_turn, parse_special=True))
    text = server.get("/v1/contexts/chat").json()["text"]
    # the context holds the whole conversation as the chat template writes it
    reply1, reply2 = r1.choices[0].message.content, r2.choices[0].message.content
    assert text.startswith(model.chat_prompt([{"role": "system", "content": "You are brief."}],
                                             add_generation_prompt=False))
    assert f"<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n{reply1}" in text
    assert f"<|im_start|>user\nAnother one.<|im_end|>\n<|im_start|>assistant\n{reply2}" in text
    assert text.endswith("<|im_end|>\n")  # the reply's turn is closed


def test_anthropic_and_ollama_requests_continue_contexts_too(server, model):
    server.post("/v1/contexts", {"name": "multi"})
    with anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0) as a:
        r = a.messages.create(model="smollm2", max_tokens=6, messages=[{"role": "user", "content": "Hi."}],
                              extra_body={"context": "multi", "temperature": 0})
    n = server.get("/v1/contexts/multi").json()["n_tokens"]
    assert r.usage.output_tokens == 6 and n > 6
    o = server.post("/api/chat", {"model": "smollm2", "stream": False, "context": "multi",
                                  "messages": [{"role": "user", "content": "Bye."}],
                                  "options": {"temperature": 0, "num_predict": 4}}).json()
    assert o["prompt_cached_count"] >= n - 1
    g = server.post("/api/generate", {"model": "smollm2", "stream": False, "context": "multi", "prompt": "Again.",
                                      "options": {"temperature": 0, "num_predict": 4}}).json()
    assert g["eval_count"] == 4
    after = server.get("/v1/contexts/multi", params={"tokens": "true"}).json()
    assert g["context"] == after["tokens"]
    assert after["text"].count("<|im_start|>user") == 3


def test_turns_appended_continue_the_context_as_a_chat_request_would(server, openai_client):
    # append rendered its turns as a whole new conversation: SmolLM2's template put its
    # default system turn in the middle of the context, after the context's own system turn.
    for name in ("appended", "chatted"):
        assert server.post("/v1/contexts", {"name": name, "system": "You are a pirate."}).status_code == 201
    user = [{"role": "user", "content": "Hi"}]
    assert server.post("/v1/contexts/appended/append", {"messages": user, "generation_prompt": True}).status_code == 200
    openai_client.chat.completions.create(model="smollm2", max_tokens=1, messages=user, extra_body={"context": "chatted"})
    appended = server.get("/v1/contexts/appended").json()["text"]
    assert appended.count("<|im_start|>system") == 1
    assert server.get("/v1/contexts/chatted").json()["text"].startswith(appended)
    # A chat request with no new messages generates from what the context holds (a 500): here
    # the reply the context opened, with nothing added before it.
    held = server.get("/v1/contexts/appended").json()["n_tokens"]
    r = openai_client.chat.completions.create(model="smollm2", max_tokens=4, temperature=0, messages=[],
                                              extra_body={"context": "appended"})
    assert r.choices[0].message.content and r.usage.prompt_tokens == held


def test_a_system_prompt_the_template_shows_only_with_a_user_turn_is_refused_alone(gemma3_path):
    # Gemma's template folds the system prompt into the first user turn: sent alone to
    # POST /v1/contexts it rendered nothing, and the context went on without it (a 201).
    import ctxengine as ce
    from ctxengine.engine.model_source import CatalogEntry
    from ctxengine.errors import RequestError
    from ctxengine.serving.prompts import Prompt, continuation_text, turns_text
    gemma = ce.load(gemma3_path)
    entry = CatalogEntry(gemma.name, gemma.path, "file")
    system = [{"role": "system", "content": "You are a pirate."}]
    with pytest.raises(RequestError, match="chat template drops these turns"):
        turns_text(gemma, entry, system, [], generation_prompt=False)
    text = turns_text(gemma, entry, system + [{"role": "user", "content": "Hi"}], [], generation_prompt=False)
    assert "You are a pirate." in text and "Hi" in text
    held = gemma.tokenize(text, parse_special=True)
    with pytest.raises(RequestError, match="drops these turns"):  # nor mid-conversation
        turns_text(gemma, entry, system, held, generation_prompt=False)
    with pytest.raises(RequestError, match="drops these turns"):  # nor as a chat request naming a context
        continuation_text(gemma, entry, Prompt(messages=system), held)
    gemma.close()


def test_fork_snapshot_restore(server):
    server.post("/v1/contexts", {"name": "base", "text": "The capital of France is"})
    fork = server.post("/v1/contexts/base/fork", {"name": "base-fork"})
    assert fork.status_code == 201 and fork.json()["n_tokens"] == server.get("/v1/contexts/base").json()["n_tokens"]
    server.post("/v1/contexts/base-fork/append", {"text": " Paris"})
    assert server.get("/v1/contexts/base-fork").json()["text"] == "The capital of France is Paris"
    assert server.get("/v1/contexts/base").json()["text"] == "The capital of France is"  # copy-on-write
    snap = server.post("/v1/contexts/base-fork/snapshot", {"ref": "saved-fork"}).json()
    assert len(snap["snapshot_id"]) == 64 and snap["pages_sent"] >= 1
    httpx.delete(f"{server.url}/v1/contexts/base-fork")
    restored = server.post("/v1/contexts/again/restore", {"ref": "saved-fork"})
    assert restored.status_code == 201, restored.text
    got = server.get("/v1/contexts/again").json()
    assert got["text"] == "The capital of France is Paris" and got["snapshot_id"] == snap["snapshot_id"]
    assert server.post("/v1/contexts/again/restore", {"ref": "saved-fork"}).status_code == 409
    assert server.post("/v1/contexts/other/restore", {"ref": "no-such-ref"}).status_code == 404
    server.post("/v1/contexts/again/rewind", {"n": 1})
    assert server.get("/v1/contexts/again").json()["text"] == "The capital of France is"


def test_generation_on_a_context_equals_the_engine(server, model):
    server.post("/v1/contexts", {"name": "raw", "text": "The capital of France is"})
    r = server.post("/v1/completions", {"model": "smollm2", "prompt": " a city", "max_tokens": 6,
                                        "temperature": 0, "context": "raw"}).json()
    ctx = model.context(None)
    ctx.append("The capital of France is")
    ctx.append(" a city", parse_special=True)
    want = "".join(p.text for p in ctx.generate(6, temperature=0.0))
    ctx.delete()
    assert r["choices"][0]["text"] == want


def test_refusals_lose_nothing(server, openai_client):
    server.post("/v1/contexts", {"name": "keep", "text": "Some text."})
    before = server.get("/v1/contexts/keep", params={"tokens": "true"}).json()
    too_long = server.post("/v1/contexts/keep/append", {"text": "word " * 9000})
    assert too_long.status_code == 400 and "context length" in too_long.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError):
        openai_client.chat.completions.create(model="smollm2", max_tokens=4, extra_body={"context": "keep"},
                                       messages=[{"role": "user", "content": "word " * 9000}])
    assert server.get("/v1/contexts/keep", params={"tokens": "true"}).json()["tokens"] == before["tokens"]
    with pytest.raises(openai.NotFoundError, match="no context named 'nobody'"):
        openai_client.chat.completions.create(model="smollm2", max_tokens=4, extra_body={"context": "nobody"},
                                       messages=[{"role": "user", "content": "hi"}])
    assert server.post("/v1/contexts", {"name": "_mine"}).status_code == 400
    assert server.post("/v1/contexts", {"name": "../up"}).status_code == 400
    assert server.get("/v1/contexts/_prefix/1").status_code == 400
    assert "_prefix" not in str(server.get("/v1/contexts").json())
    assert server.post("/v1/contexts", {"name": "x", "labels": {"a": 1}}).status_code == 400
    # A lone surrogate (JSON "\ud800") cannot be stored: it made a 500 that still created a context
    # none could snapshot, nor evict to make room for another.
    bad = httpx.post(server.url + "/v1/contexts", content=b'{"name": "x", "labels": {"k": "\\ud800"}}',
                     headers={"Content-Type": "application/json"}, timeout=60)
    assert bad.status_code == 400 and "surrogate" in bad.json()["error"]["message"]
    assert server.get("/v1/contexts/x").status_code == 404
    # Labels travel in every listing: 0.9 MB each, three contexts once broke gRPC's List for everyone
    big = {"k": "x" * (64 << 10)}
    r = server.post("/v1/contexts", {"name": "x", "labels": big})
    assert r.status_code == 400 and "a request may set" in r.json()["error"]["message"]
    assert server.get("/v1/contexts/x").status_code == 404
    server.post("/v1/contexts", {"name": "lab", "labels": {"k": "v"}})
    r = server.post("/v1/contexts/lab/snapshot", {"ref": "lab-big", "labels": big})
    assert r.status_code == 400 and "a request may set" in r.json()["error"]["message"]
    httpx.delete(server.url + "/v1/contexts/lab", timeout=60)
    with pytest.raises(openai.BadRequestError, match="context"):  # a bad name, not an unknown one (404)
        openai_client.chat.completions.create(model="smollm2", max_tokens=4, extra_body={"context": "../x"},
                                       messages=[{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("refused", [{"grammar": 'root ::= root "a"'}, {"logit_bias": {str(2 ** 70): 1}}])
@pytest.mark.parametrize("stream", [False, True])
def test_a_request_refused_after_its_turn_was_added_leaves_the_context_as_it_was(server, refused, stream):
    # A grammar that allows no token, or a bias no id can have, failed after the user's turn was
    # appended: the turn and an empty reply stayed, and every later reply continued from them.
    server.post("/v1/contexts", {"name": "undo", "text": "Some text."})
    before = server.get("/v1/contexts/undo", params={"tokens": "true"}).json()["tokens"]
    r = server.post("/v1/chat/completions", {"model": "smollm2", "context": "undo", "max_tokens": 4, "stream": stream,
                                             "messages": [{"role": "user", "content": "MARKER"}], **refused})
    assert r.status_code == 400 or stream and r.status_code == 200 and "error" in r.text, r.text
    assert server.get("/v1/contexts/undo", params={"tokens": "true"}).json()["tokens"] == before
    assert httpx.delete(server.url + "/v1/contexts/undo", timeout=60).status_code in (200, 204)


def test_a_context_restored_under_another_name_for_the_same_weights_goes_on(tmp_path, smollm2_path, model):
    # Two served names for one file: a snapshot made under the second is restored under
    # the first with those weights; a request naming the second continued it with a 400
    # ("belongs to model ..."). The same weights and adapters now run it.
    from api_server import running

    alias = tmp_path / "alias.gguf"
    alias.symlink_to(smollm2_path)
    with running(tmp_path / "home", "-m", str(alias), "-m", "smollm2", "-m", "gemma3") as server:
        assert server.post("/v1/contexts", {"name": "talk", "model": "smollm2"}).status_code == 201
        turn = {"model": "smollm2", "context": "talk", "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "user", "content": "Name a fruit."}]}
        first = server.post("/v1/chat/completions", turn)
        assert first.status_code == 200, first.text
        assert server.post("/v1/contexts/talk/snapshot", {"ref": "talk"}).status_code == 200
        httpx.delete(f"{server.url}/v1/contexts/talk")
        restored = server.post("/v1/contexts/talk/restore", {"ref": "talk"})
        assert restored.status_code == 201 and restored.json()["model"] == "alias"  # the first with those weights
        again = server.post("/v1/chat/completions", {**turn, "messages": [{"role": "user", "content": "Another."}]})
        assert again.status_code == 200, again.text
        server.post("/v1/contexts", {"name": "same", "model": "smollm2"})  # the same two turns, never moved
        server.post("/v1/chat/completions", {**turn, "context": "same"})
        want = server.post("/v1/chat/completions", {**turn, "context": "same",
                                                     "messages": [{"role": "user", "content": "Another."}]})
        assert again.json()["choices"][0]["message"] == want.json()["choices"][0]["message"]
        other = server.post("/v1/chat/completions", {**turn, "model": "gemma3"})
        assert other.status_code == 400 and "belongs to model 'alias'" in other.text  # other weights: never
