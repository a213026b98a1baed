"""Constrained replies end as valid JSON inside max_tokens whenever the
shortest valid reply fits, in every dialect, with the real clients: forced
tool calls with a plain tool schema (no additionalProperties, no maxLength),
and JSON schemas the other grammar tests never use (unbounded numbers,
strings without maxLength, arrays without maxItems, oneOf, $ref). A budget
below the shortest reply ends "length" in each dialect's words."""
import json
from concurrent.futures import ThreadPoolExecutor

import anthropic
import jsonschema
import ollama
import openai
import pytest

from api_server import module_server
from api_server import anthropic_client, ollama_client, openai_client  # noqa: F401 (fixtures)

server = module_server("closing")

# The tool of issue 25, as people write tool schemas: nothing closed, nothing bounded.
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
           "required": ["city", "unit"]}
OPENAI_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                                "parameters": WEATHER}}
SCHEMAS = {
    "numbers": {"type": "object", "properties": {"r": {"type": "number"}, "n": {"type": "integer"}},
                "required": ["r", "n"]},
    "strings": {"type": "object", "properties": {"title": {"type": "string"}, "body": {"type": "string"}},
                "required": ["title", "body"]},
    "arrays": {"type": "object", "properties": {"digits": {"type": "array", "items": {"type": "number"}}},
               "required": ["digits"]},
    "oneof": {"oneOf": [{"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
                        {"type": "object", "properties": {"value": {"type": "number"}}, "required": ["value"]}]},
    "ref": {"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "number"}, "label": {"type": "string"}},
                             "required": ["x", "label"]}},
            "type": "object", "properties": {"points": {"type": "array", "items": {"$ref": "#/$defs/pt"}}},
            "required": ["points"]},
}
ASK = "Write pi with as many digits as you can, and a long essay about it, as JSON."


def user(text):
    return [{"role": "user", "content": text}]


def concurrently(fn, items):
    with ThreadPoolExecutor(len(items)) as pool:  # the server batches them
        return list(pool.map(fn, items))


@pytest.mark.parametrize("max_tokens", [40, 80])
def test_a_forced_call_with_a_plain_schema_parses_in_every_dialect(max_tokens, openai_client, anthropic_client,
                                                                   ollama_client):
    def openai_call(choice):
        r = openai_client.chat.completions.create(
            model="smollm2", messages=user("What is the weather in Paris? Describe the city at length."),
            tools=[OPENAI_TOOL], tool_choice=choice, max_tokens=max_tokens, temperature=0.8, seed=7)
        assert r.choices[0].finish_reason == "tool_calls", r.choices[0]
        (call,) = r.choices[0].message.tool_calls
        return call.function.name, json.loads(call.function.arguments)

    def anthropic_call(_):
        m = anthropic_client.messages.create(
            model="smollm2", max_tokens=max_tokens, messages=user("Weather in Oslo, and a long story about it?"),
            tools=[{"name": "get_weather", "input_schema": WEATHER}], tool_choice={"type": "any"})
        assert m.stop_reason == "tool_use", m
        (block,) = [b for b in m.content if b.type == "tool_use"]
        return block.name, block.input

    def ollama_call(_):
        body = {"model": "smollm2", "messages": user("Weather in Rome? Tell me everything about Rome."),
                "tools": [OPENAI_TOOL], "tool_choice": "required", "stream": False,
                "options": {"temperature": 0.8, "seed": 3, "num_predict": max_tokens}}
        r = ollama_client._request(ollama.ChatResponse, "POST", "/api/chat", json=body)
        (call,) = r.message.tool_calls
        return call.function.name, dict(call.function.arguments)

    jobs = [lambda: openai_call("required"), lambda: openai_call({"type": "function", "function": {
        "name": "get_weather"}}), lambda: anthropic_call(None), lambda: ollama_call(None)]
    for name, args in concurrently(lambda job: job(), jobs):
        assert name == "get_weather"
        jsonschema.validate(args, WEATHER)


@pytest.mark.parametrize("max_tokens", [40, 100, 300])
def test_replies_under_unbounded_schemas_always_parse(max_tokens, openai_client):
    def ask(name):
        fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name]}}
        r = openai_client.chat.completions.create(model="smollm2", messages=user(ASK), response_format=fmt,
                                                  max_tokens=max_tokens, temperature=0.9, seed=11)
        return name, r

    for name, r in concurrently(ask, list(SCHEMAS)):
        assert r.choices[0].finish_reason == "stop", (name, r.choices[0])
        assert r.usage.completion_tokens <= max_tokens
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMAS[name])


@pytest.mark.parametrize("max_tokens", [40, 100])
def test_anthropic_output_config_and_ollama_format_always_parse(max_tokens, anthropic_client, ollama_client):
    def anthropic_reply(name):
        m = anthropic_client.messages.create(
            model="smollm2", max_tokens=max_tokens, messages=user(ASK), extra_body={"temperature": 0.9},
            output_config={"format": {"type": "json_schema", "schema": SCHEMAS[name]}})
        assert m.stop_reason == "end_turn", (name, m)
        return name, m.content[0].text

    def ollama_reply(name):
        r = ollama_client.chat("smollm2", user(ASK), format=SCHEMAS[name],
                               options={"temperature": 0.9, "seed": 5, "num_predict": max_tokens})
        assert r.done_reason == "stop", (name, r)
        return name, r.message.content

    jobs = [(fn, name) for fn in (anthropic_reply, ollama_reply) for name in SCHEMAS]
    for name, text in concurrently(lambda job: job[0](job[1]), jobs):
        jsonschema.validate(json.loads(text), SCHEMAS[name])


def test_a_budget_below_the_shortest_reply_says_length_in_each_dialect(openai_client, anthropic_client,
                                                                       ollama_client):
    # The shortest call, <tool_call>\n{"name":"get_weather","arguments":{"city":"","unit":"c"}}\n</tool_call>,
    # is more than 12 tokens.
    r = openai_client.chat.completions.create(model="smollm2", messages=user("Weather?"), tools=[OPENAI_TOOL],
                                              tool_choice="required", max_tokens=12, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.tool_calls is None
    m = anthropic_client.messages.create(model="smollm2", max_tokens=12, messages=user("Weather?"),
                                         tools=[{"name": "get_weather", "input_schema": WEATHER}],
                                         tool_choice={"type": "any"})
    assert m.stop_reason == "max_tokens"
    r = ollama_client.chat("smollm2", user(ASK), format=SCHEMAS["ref"], options={"temperature": 0, "num_predict": 3})
    assert r.done_reason == "length"


PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


def test_a_json_reply_with_a_name_is_no_call_to_a_tool_nobody_offered(openai_client, anthropic_client):
    """Tools offered (auto) and a response format: the format constrains the reply, and
    its "name" field made it a call to a tool named after the person, its JSON lost."""
    ask = user("Invent a person. Reply as JSON.")
    r = openai_client.chat.completions.create(
        model="smollm2", messages=ask, tools=[OPENAI_TOOL], max_tokens=60, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    a = anthropic_client.messages.create(
        model="smollm2", max_tokens=60, messages=ask, extra_body={"temperature": 0, "output_config": {
            "format": {"type": "json_schema", "schema": PERSON}}},
        tools=[{"name": "get_weather", "input_schema": WEATHER}])
    assert [b.type for b in a.content] == ["text"] and a.stop_reason == "end_turn"
    jsonschema.validate(json.loads(a.content[0].text), PERSON)


@pytest.mark.parametrize("stop", [["\n"], ["}"], [",", "city"]])
def test_stop_strings_do_not_cut_a_reply_that_must_parse(stop, openai_client):
    """A forced call and a schema reply ended "stop" at the first newline or brace,
    half written (the flexible JSON whitespace writes newlines itself)."""
    r = openai_client.chat.completions.create(
        model="smollm2", messages=user("What is the weather in Paris?"), tools=[OPENAI_TOOL],
        tool_choice="required", max_tokens=60, temperature=0, stop=stop)
    assert r.choices[0].finish_reason == "tool_calls"
    (call,) = r.choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    r = openai_client.chat.completions.create(
        model="smollm2", messages=user("Invent a person."), max_tokens=60, temperature=0, stop=stop,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)


PINNED = ('root ::= "Let me check. <tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": {\\"city\\": '
          '\\"Paris\\", \\"unit\\": \\"c\\"}}\\n</tool_call><tool_call>\\n{\\"name\\": \\"get_weather\\", '
          '\\"arguments\\": {\\"city\\": \\"Rome\\", \\"unit\\": \\"c\\"}}\\n</tool_call>"')


def test_text_before_calls_is_the_same_streamed_or_not_and_parallel_calls_can_be_refused(openai_client):
    """A reply pinned by a grammar to text and two calls: the text streamed ("Let me
    check. ") differed from the text not streamed ("Let me check."); and
    parallel_tool_calls false still gave two calls."""
    kw = dict(model="smollm2", messages=user("Weather in Paris and Rome?"), tools=[OPENAI_TOOL], max_tokens=100,
              temperature=0, extra_body={"grammar": PINNED})
    whole = openai_client.chat.completions.create(**kw).choices[0].message
    streamed = "".join(c.choices[0].delta.content or "" for c in openai_client.chat.completions.create(
        **kw, stream=True) if c.choices)
    assert whole.content == streamed == "Let me check."
    assert [json.loads(c.function.arguments)["city"] for c in whole.tool_calls] == ["Paris", "Rome"]
    one = openai_client.chat.completions.create(**kw, parallel_tool_calls=False).choices[0].message
    assert [json.loads(c.function.arguments)["city"] for c in one.tool_calls] == ["Paris"]


UNIQUE = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                                                   "uniqueItems": True, "maxItems": 3}},
          "required": ["tags"], "if": {"required": ["tags"]}, "then": {"required": ["tags"]}}


def test_keywords_sampling_cannot_enforce_are_ignored_unless_strict(openai_client, anthropic_client):
    """uniqueItems, if/then (valid JSON Schema, common in MCP tools) made a forced call or a
    response format a 400 "invalid JSON schema"; now they are ignored, and strict refuses them."""
    fmt = {"type": "json_schema", "json_schema": {"name": "tags", "schema": UNIQUE}}
    r = openai_client.chat.completions.create(model="smollm2", messages=user("Three tags for a cat photo."),
                                              max_tokens=60, temperature=0, response_format=fmt)
    assert isinstance(json.loads(r.choices[0].message.content)["tags"], list)
    a = anthropic_client.messages.create(model="smollm2", max_tokens=60, messages=user("Tag a cat photo."),
                                         tools=[{"name": "tag", "input_schema": UNIQUE}],
                                         tool_choice={"type": "any"}, extra_body={"temperature": 0})
    assert a.stop_reason == "tool_use" and isinstance(a.content[-1].input["tags"], list)
    with pytest.raises(openai.BadRequestError, match="uniqueItems"):
        openai_client.chat.completions.create(
            model="smollm2", messages=user("Tags."), max_tokens=20,
            response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": UNIQUE, "strict": True}})


@pytest.mark.parametrize("tool", [{"type": "web_search_20250305", "name": "web_search"},
                                  {"type": "bash_20250124", "name": "bash"},
                                  {"name": "no_schema"}])
def test_anthropic_server_tools_and_tools_without_a_schema_are_refused(tool, anthropic_client):
    # They were "called" on the client's side with input {"type": "function", "function": {}}.
    with pytest.raises(anthropic.BadRequestError, match="custom tools|input_schema"):
        anthropic_client.messages.create(model="smollm2", max_tokens=20, messages=user("Search the web."),
                                         tools=[tool])
