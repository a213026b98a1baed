"""Constrained replies end as valid JSON inside max_tokens whenever the
shortest valid reply fits, in every dialect, with the real clients: forced
tool calls with a plain tool schema (no additionalProperties, no maxLength),
and JSON schemas the other grammar tests never use (unbounded numbers,
strings without maxLength, arrays without maxItems, oneOf, $ref). A budget
below the shortest reply ends "length" in each dialect's words."""
import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import ollama
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
