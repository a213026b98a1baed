"""The Responses API over `ctx serve`, with the real openai client: a chain of
responses and a branch give exactly the replies of the resent conversations
while prefilling only the new turns, and stored responses are snapshots."""
import json

import jsonschema
import openai
import pytest

from api_server import model, module_server, openai_client, running  # noqa: F401 (fixtures)
from ctxengine.store import Store

server = module_server("responses")

INSTRUCTIONS = "Answer in one short sentence."
TURNS = ["What is the capital of France?", "And of Italy?", "Which of the two is bigger?",
         "Name a river in the first one.", "Thank you!"]
BRANCH = "And of Spain?"
GREEDY = dict(max_output_tokens=24, temperature=0)


def new_turn_tokens(model, text: str) -> int:
    """Tokens a user turn adds after a closed assistant turn (what must be prefilled)."""
    ids = model.tokenize(model.chat.render([{"role": "user", "content": text}], after=[model.tokenize("x")[0]]),
                         parse_special=True)
    return len(ids)


def resent(client, history: list[dict], text: str) -> openai.types.chat.ChatCompletion:
    messages = [{"role": "system", "content": INSTRUCTIONS}, *history, {"role": "user", "content": text}]
    return client.chat.completions.create(model="smollm2", messages=messages, max_tokens=24, temperature=0)


@pytest.fixture(scope="module")
def chain(openai_client):
    """Five chained responses, the first with the instructions."""
    out, previous = [], None
    for i, text in enumerate(TURNS):
        r = openai_client.responses.create(model="smollm2", input=text, previous_response_id=previous,
                                           instructions=INSTRUCTIONS if i == 0 else None, **GREEDY)
        out.append(r)
        previous = r.id
    return out


def test_a_chain_equals_the_resent_conversation(openai_client, model, chain):
    history = []
    for i, (text, r) in enumerate(zip(TURNS, chain)):
        ref = resent(openai_client, history, text)
        assert r.status in ("completed", "incomplete")
        assert r.output_text == ref.choices[0].message.content      # bit-identical greedy replies
        assert r.usage.input_tokens == ref.usage.prompt_tokens       # the same conversation
        reused = r.usage.input_tokens_details.cached_tokens
        if i == 0:
            assert reused == 0
        else:  # everything before this turn was reused; only the new turn was prefilled
            assert r.usage.input_tokens - reused == new_turn_tokens(model, text)
            assert reused > chain[i - 1].usage.input_tokens
        assert r.previous_response_id == (chain[i - 1].id if i else None)
        history += [{"role": "user", "content": text}, {"role": "assistant", "content": r.output_text}]


def test_a_branch_from_turn_2_shares_its_pages(openai_client, model, chain, server):
    b = openai_client.responses.create(model="smollm2", input=BRANCH, previous_response_id=chain[1].id, **GREEDY)
    history = [m for t, r in zip(TURNS[:2], chain[:2])
               for m in ({"role": "user", "content": t}, {"role": "assistant", "content": r.output_text})]
    assert b.output_text == resent(openai_client, history, BRANCH).choices[0].message.content
    assert b.usage.input_tokens - b.usage.input_tokens_details.cached_tokens == new_turn_tokens(model, BRANCH)
    # Two branches from turn 2's snapshot: the full pages of its context are the same pages in the store.
    store = Store(server.store)
    try:
        turn2, turn3, branch = (store.get_manifest(store.resolve(f"responses/{r.id}")) for r in (*chain[1:3], b))
    finally:
        store.close()
    shared = turn2.n_tokens // turn2.page_tokens
    assert shared >= 2
    assert turn3.page_keys[:shared] == branch.page_keys[:shared] == turn2.page_keys[:shared]
    assert turn3.page_keys[shared:] != branch.page_keys[shared:]
    assert json.loads(branch.labels["ctx.response"])["output"][0]["content"][0]["text"] == b.output_text


def test_streamed_events_parse_with_the_real_client(openai_client, chain):
    events = list(openai_client.responses.create(model="smollm2", input=BRANCH, previous_response_id=chain[1].id,
                                                 stream=True, **GREEDY))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          kinds[-1]] and kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == text
    assert openai_client.responses.retrieve(final.id).output_text == text
    with openai_client.responses.stream(model="smollm2", input=BRANCH, previous_response_id=chain[1].id,
                                        **GREEDY) as s:
        assert s.get_final_response().output_text == text


def test_retrieve_delete_and_unknown_ids(openai_client, server):
    r = openai_client.responses.create(model="smollm2", input="Hi", max_output_tokens=4, temperature=0)
    assert openai_client.responses.retrieve(r.id).output_text == r.output_text
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].status == "incomplete"  # the message cut short says so too (it said "completed")
    events = list(openai_client.responses.create(model="smollm2", input="Hi", max_output_tokens=4, temperature=0,
                                                 stream=True, store=False))
    assert events[-1].type == "response.incomplete" and events[-1].response.output[0].status == "incomplete"
    openai_client.responses.delete(r.id)
    for call in (lambda: openai_client.responses.retrieve(r.id),
                 lambda: openai_client.responses.create(model="smollm2", input="x", previous_response_id=r.id),
                 lambda: openai_client.responses.delete(r.id)):
        with pytest.raises(openai.NotFoundError, match=f"no response with id '{r.id}'"):
            call()
    unstored = openai_client.responses.create(model="smollm2", input="Hi", store=False, max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        openai_client.responses.retrieve(unstored.id)
    body = server.post("/v1/responses", {"model": "smollm2", "input": "x", "previous_response_id": "../etc"}).json()
    assert (body["error"]["type"], body["error"]["code"]) == ("invalid_request_error", "not_found")
    bad = server.post("/v1/responses", {"model": "smollm2", "input": "x",
                                        "text": {"format": {"type": "json_schema", "schema": {"type": "objekt"}}}})
    assert bad.status_code == 400 and "invalid JSON schema" in bad.json()["error"]["message"]


def test_tools_and_text_format(openai_client):
    tools = [{"type": "function", "name": "get_weather", "description": "Current weather in a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                             "required": ["city"], "additionalProperties": False}}]
    r = openai_client.responses.create(model="smollm2", input="What's the weather in Paris?", tools=tools,
                                       tool_choice="required", max_output_tokens=60, temperature=0)
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), tools[0]["parameters"])
    after = openai_client.responses.create(
        model="smollm2", previous_response_id=r.id, tools=tools, max_output_tokens=8, temperature=0,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18C and sunny"}])
    assert after.usage.input_tokens_details.cached_tokens > r.usage.input_tokens
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                               "country": {"type": "string", "maxLength": 12}},
              "required": ["city", "country"], "additionalProperties": False}
    j = openai_client.responses.create(model="smollm2", input="Paris as JSON with its country.", max_output_tokens=60,
                                       temperature=0, text={"format": {"type": "json_schema", "name": "place",
                                                                       "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(j.output_text), schema)


def test_a_stored_response_outlives_the_server(tmp_path):
    with running(tmp_path) as first:
        with openai.OpenAI(base_url=f"{first.url}/v1", api_key="x", max_retries=0) as c:
            r = c.responses.create(model="smollm2", input=TURNS[0], instructions=INSTRUCTIONS, **GREEDY)
            expected = c.responses.create(model="smollm2", input=TURNS[1], previous_response_id=r.id, **GREEDY)
    with running(tmp_path) as second:  # the same store: the response is a snapshot there
        with openai.OpenAI(base_url=f"{second.url}/v1", api_key="x", max_retries=0) as c:
            assert c.responses.retrieve(r.id).output_text == r.output_text
            again = c.responses.create(model="smollm2", input=TURNS[1], previous_response_id=r.id, **GREEDY)
    assert again.output_text == expected.output_text
    assert again.usage.input_tokens_details.cached_tokens == expected.usage.input_tokens_details.cached_tokens
    # ctx ls shows the client's contexts; the stored responses only with --all.
    from servers import ctx

    env = {"CTX_STORE": str(tmp_path / "store")}
    assert f"responses/{r.id}" not in ctx("ls", home=tmp_path, env=env).stdout
    assert f"responses/{r.id}" in ctx("ls", "--all", home=tmp_path, env=env).stdout


def _follow_up(client, rid: str):
    return client.responses.create(model="smollm2", input=TURNS[1], previous_response_id=rid, store=False, **GREEDY)


def test_a_chat_cannot_name_a_stored_responses_own_context(openai_client, server):
    # "_responses/<id>" is the server's own, refused by /v1/contexts, yet a chat's `context`
    # field reached it (200): the injected turn went into every later follow-up.
    r = openai_client.responses.create(model="smollm2", input=TURNS[0], **GREEDY)
    before = _follow_up(openai_client, r.id)
    for path in ("/v1/chat/completions", "/v1/completions"):
        body = {"model": "smollm2", "max_tokens": 2, "context": f"_responses/{r.id}",
                **({"prompt": "INJECTED"} if path == "/v1/completions" else
                   {"messages": [{"role": "user", "content": "INJECTED"}]})}
        hijack = server.post(path, body)
        assert hijack.status_code == 400 and "reserved for the server" in hijack.text, hijack.text
    after = _follow_up(openai_client, r.id)
    assert (after.usage.input_tokens, after.output_text) == (before.usage.input_tokens, before.output_text)


def test_a_stored_responses_ref_is_never_changed_by_a_client(openai_client, server):
    # A context snapshot onto "responses/<id>" moved the response's ref (200): its id then
    # named another conversation.
    r = openai_client.responses.create(model="smollm2", input=TURNS[0], **GREEDY)
    before = _follow_up(openai_client, r.id)
    server.post("/v1/contexts", {"name": "other", "text": "Another conversation."})
    moved = server.post("/v1/contexts/other/snapshot", {"ref": f"responses/{r.id}"})
    assert moved.status_code == 400 and "never changes" in moved.json()["error"]["message"], moved.text
    for path in ("/v1/contexts", f"/v1/contexts/responses/{r.id}/restore", "/v1/contexts/other/fork"):
        assert server.post(path, {"name": f"responses/{r.id}"}).status_code == 400, path
    chat = server.post("/v1/chat/completions", {"model": "smollm2", "max_tokens": 2, "context": f"responses/{r.id}",
                                                "messages": [{"role": "user", "content": "INJECTED"}]})
    assert chat.status_code == 400 and "never changes" in chat.text, chat.text
    copy = server.post("/v1/contexts/copy/restore", {"ref": f"responses/{r.id}"})  # reading it: fine
    assert copy.status_code == 201, copy.text
    after = _follow_up(openai_client, r.id)
    assert (after.usage.input_tokens, after.output_text) == (before.usage.input_tokens, before.output_text)
