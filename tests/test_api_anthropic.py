"""The Anthropic dialect of `ctx serve`, driven by the real `anthropic` client."""
import anthropic
import pytest

from api_server import greedy_reply, module_server
from api_server import anthropic_client, model  # noqa: F401 (fixtures)

HELLO = [{"role": "user", "content": "Say hello to the reader."}]
# This client no longer has sampling arguments; the API still takes them, so they go in the body.
GREEDY = {"extra_body": {"temperature": 0}}

server = module_server("anthropic")


def test_message_equals_the_engine_greedy(anthropic_client, model):
    r = anthropic_client.messages.create(model="smollm2", max_tokens=10, messages=HELLO, **GREEDY)
    assert r.type == "message" and r.role == "assistant"
    assert [b.type for b in r.content] == ["text"]
    assert r.content[0].text == greedy_reply(model, messages=HELLO, max_tokens=10)
    assert r.stop_reason == "max_tokens"
    assert r.usage.output_tokens == 10
    n_prompt = len(model.tokenize(model.chat_prompt(HELLO), parse_special=True))
    assert r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0) == n_prompt


def test_system_and_content_blocks(anthropic_client, model):
    system = "You answer in French."
    r = anthropic_client.messages.create(model="smollm2", max_tokens=100, **GREEDY,
                               system=[{"type": "text", "text": system}],
                               messages=[{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}])
    want = greedy_reply(model, messages=[{"role": "system", "content": system},
                                         {"role": "user", "content": "Say hello."}], max_tokens=100)
    assert r.content[0].text == want
    assert r.stop_reason == "end_turn" and r.stop_sequence is None


def test_stop_sequences(anthropic_client, model):
    full = greedy_reply(model, messages=HELLO, max_tokens=10)
    stop = full[3:6]
    r = anthropic_client.messages.create(model="smollm2", max_tokens=10, messages=HELLO, **GREEDY,
                               stop_sequences=["never-appears", stop])
    assert r.content[0].text == full[: full.index(stop)]
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop


def test_streaming_events(anthropic_client):
    kw = dict(model="smollm2", max_tokens=8, messages=HELLO, **GREEDY)
    whole = anthropic_client.messages.create(**kw).content[0].text
    with anthropic_client.messages.stream(**kw) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole == final.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 8
    kinds = [e.type for e in anthropic_client.messages.create(stream=True, **kw)]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}


def test_top_k_and_top_p_are_honoured(anthropic_client):
    kw = dict(model="smollm2", max_tokens=8, messages=HELLO)
    # top_k=1 leaves only the most likely token: greedy whatever the temperature
    top_k_1 = anthropic_client.messages.create(extra_body={"temperature": 1.0, "top_k": 1}, **kw).content[0].text
    assert top_k_1 == anthropic_client.messages.create(**GREEDY, **kw).content[0].text
    assert anthropic_client.messages.create(extra_body={"temperature": 1.0, "top_p": 0.5}, **kw).usage.output_tokens > 0
    with pytest.raises(anthropic.BadRequestError, match="top_p"):
        anthropic_client.messages.create(extra_body={"top_p": 1.5}, **kw)


def test_a_seed_makes_a_sampled_reply_again(anthropic_client, server):
    """``seed`` (our extension, as OpenAI's): it was read by no one, so no sampled reply
    could be had again. A seed gives the reply OpenAI's face gives for it."""
    kw = dict(model="smollm2", max_tokens=12, messages=HELLO)
    replies = [anthropic_client.messages.create(extra_body={"temperature": 1.0, "seed": s}, **kw).content[0].text
               for s in (7, 7, 8, 9, 10)]
    assert replies[0] == replies[1] and len(set(replies[1:])) > 1
    body = {"model": "smollm2", "max_tokens": 12, "messages": HELLO, "temperature": 1.0, "seed": 7}
    assert server.post("/v1/chat/completions", body).json()["choices"][0]["message"]["content"] == replies[0]
    with pytest.raises(anthropic.BadRequestError, match="'seed' must be a 64-bit integer"):
        anthropic_client.messages.create(extra_body={"seed": 1 << 64}, **kw)


def test_count_tokens(anthropic_client, model):
    r = anthropic_client.messages.count_tokens(model="smollm2", messages=HELLO, system="Be brief.")
    msgs = [{"role": "system", "content": "Be brief."}, *HELLO]
    assert r.input_tokens == len(model.tokenize(model.chat_prompt(msgs), parse_special=True))


WEATHER = [{"name": "get_weather", "description": "Get the current weather for a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
PREFILLED = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."},
             {"role": "assistant", "content": "The capital of France is"}]


@pytest.mark.parametrize("kw", [dict(messages=HELLO, tools=WEATHER),
                                dict(messages=HELLO, tools=WEATHER, tool_choice={"type": "any"}, system="Be brief."),
                                dict(messages=PREFILLED)], ids=["tools", "tool_choice", "prefill"])
def test_count_tokens_counts_the_prompt_a_message_prefills(anthropic_client, kw):
    counted = anthropic_client.messages.count_tokens(model="smollm2", **kw).input_tokens
    r = anthropic_client.messages.create(model="smollm2", max_tokens=1, **GREEDY, **kw)
    assert counted == r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0)


def test_a_final_assistant_message_is_continued(anthropic_client, model):
    prompt = model.chat_prompt(PREFILLED[:1]) + PREFILLED[1]["content"]  # the open turn, then the prefill
    want = greedy_reply(model, text=prompt, max_tokens=8)
    kw = dict(model="smollm2", max_tokens=8, messages=PREFILLED, **GREEDY)
    r = anthropic_client.messages.create(**kw)
    assert r.content[0].text == want  # only the continuation
    assert r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0) == len(
        model.tokenize(prompt, parse_special=True))
    with anthropic_client.messages.stream(**kw) as stream:
        assert "".join(stream.text_stream) == want
    blocks = [*PREFILLED[:1], {"role": "assistant", "content": [{"type": "text", "text": "The capital of "},
                                                                {"type": "text", "text": "France is"}]}]
    assert anthropic_client.messages.create(**{**kw, "messages": blocks}).content[0].text == want
    with pytest.raises(anthropic.BadRequestError, match="final assistant content cannot end with trailing whitespace"):
        anthropic_client.messages.create(**{**kw, "messages": [*PREFILLED[:1], {"role": "assistant",
                                                                                "content": "The capital is "}]})
    # a format holds the whole reply: a prefill "{" came out as "{" + a whole object
    with pytest.raises(anthropic.BadRequestError, match="cannot be combined with output_config.format"):
        anthropic_client.messages.create(**{**kw, "messages": [*PREFILLED[:1], {"role": "assistant", "content": "{"}]},
                                         output_config={"format": {"type": "json_schema",
                                                                   "schema": {"type": "object"}}})


def test_sampling_ranges_are_anthropics(anthropic_client):
    kw = dict(model="smollm2", max_tokens=4, messages=HELLO)
    # top_p 0 keeps only the most likely token (llama.cpp's reading): greedy at any temperature
    assert (anthropic_client.messages.create(extra_body={"temperature": 1.0, "top_p": 0}, **kw).content[0].text
            == anthropic_client.messages.create(**GREEDY, **kw).content[0].text)
    for body in ({"temperature": 1.5}, {"temperature": -0.1}, {"top_p": 1.01}):
        with pytest.raises(anthropic.BadRequestError, match=f"'{next(iter(body))}' must be in \\[0, 1\\]"):
            anthropic_client.messages.create(extra_body=body, **kw)
    with pytest.raises(anthropic.BadRequestError, match="metadata must be an object"):
        anthropic_client.messages.create(extra_body={"metadata": "not-an-object"}, **kw)
    assert anthropic_client.messages.create(metadata={"user_id": "u1"}, **kw).usage.output_tokens > 0


def test_refused_requests_are_anthropic_errors(anthropic_client, server):
    with pytest.raises(anthropic.NotFoundError) as e:
        anthropic_client.messages.create(model="no-such-model", max_tokens=4, messages=HELLO)
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError, match="image"):
        anthropic_client.messages.create(model="smollm2", max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    r = server.post("/v1/messages", {"model": "smollm2", "messages": HELLO})  # no max_tokens
    assert r.status_code == 400
    assert r.json()["error"] == {"type": "invalid_request_error", "message": "'max_tokens' is required"}
    with pytest.raises(anthropic.BadRequestError, match="'messages' is empty"):
        anthropic_client.messages.create(model="smollm2", max_tokens=4, messages=[])
    with pytest.raises(anthropic.BadRequestError, match="'messages' is empty"):
        anthropic_client.messages.count_tokens(model="smollm2", messages=[])


def _with_result(content: str, **result) -> list[dict]:
    return [{"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                               "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": content,
                                          **result}]}]


def test_a_failed_tool_result_is_shown_as_an_error(anthropic_client, server):
    """``is_error: true`` was dropped, so the model saw a failure as a success (found by a probe)."""
    def count(**result):
        return anthropic_client.messages.count_tokens(model="smollm2", tools=WEATHER,
                                                      messages=_with_result("timed out", **result)).input_tokens
    assert count(is_error=True) > count(is_error=False) == count()
    # a result that says so itself is not told twice
    said = dict(model="smollm2", tools=WEATHER, messages=_with_result("Error: timed out", is_error=True))
    assert anthropic_client.messages.count_tokens(**said).input_tokens == \
        anthropic_client.messages.count_tokens(**{**said, "messages": _with_result("Error: timed out")}).input_tokens
    r = server.post("/v1/messages", {"model": "smollm2", "max_tokens": 2, "tools": WEATHER,
                                     "messages": _with_result("timed out", is_error="yes")})
    assert r.status_code == 400 and "is_error' must be a boolean" in r.json()["error"]["message"]


def test_a_forced_call_cut_short_is_an_empty_content_list(anthropic_client, server):
    """No call and no text: the content is [], not an empty text block (which Anthropic
    refuses when a client sends the reply back), streamed or not."""
    kw = dict(model="smollm2", max_tokens=3, messages=HELLO, tools=WEATHER, tool_choice={"type": "any"}, **GREEDY)
    r = anthropic_client.messages.create(**kw)
    assert r.content == [] and r.stop_reason == "max_tokens"
    with anthropic_client.messages.stream(**kw) as s:
        events = [e.type for e in s]
        final = s.get_final_message()
    assert final.content == [] and "content_block_start" not in events and events[-1] == "message_stop"
