"""Structured output and tool calls over `ctx serve`, with the real openai,
anthropic and ollama clients: constrained replies parse and validate; forced
tool calls parse every time; bad schemas and grammars are 400s in each
dialect's shape."""
import json
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import jsonschema
import ollama
import openai
import pytest

from api_server import module_server
from api_server import anthropic_client, ollama_client, openai_client  # noqa: F401 (fixtures)

server = module_server("structured")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "role": {"enum": ["admin", "editor", "viewer"]},
        "address": {"type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 10},
                                   "zone": {"enum": ["north", "south"]}},
                    "required": ["city", "zone"], "additionalProperties": False},
        "skills": {"type": "array", "items": {"type": "string", "maxLength": 10}, "minItems": 1, "maxItems": 2},
    },
    "required": ["name", "role", "address", "skills"],
    "additionalProperties": False,
}
PEOPLE = ["a nurse in Lyon", "a pilot", "a retired teacher", "a chess player", "a baker in Rome", "a student",
          "a sailor", "a judge", "a gardener in Oslo", "a drummer", "a chemist", "a farmer", "a poet",
          "a surgeon", "a plumber in Cairo", "a spy", "a referee", "a tailor", "an astronaut", "a clown"]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 12}},
                   "required": ["zone"], "additionalProperties": False}}}
ASKS = ["What's the weather in Paris?", "Is it cold in Oslo right now?", "Tell me about Rome's weather.",
        "Weather for Tokyo, please."]


def user(text):
    return [{"role": "user", "content": text}]


def test_json_schema_replies_are_valid_on_20_prompts(openai_client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}

    def ask(i_who):
        i, who = i_who
        return openai_client.chat.completions.create(
            model="smollm2", messages=user(f"Describe {who} as a JSON user record."), response_format=fmt,
            max_tokens=120, temperature=0.8, seed=i)

    with ThreadPoolExecutor(len(PEOPLE)) as pool:  # concurrent: the scheduler batches them
        replies = list(pool.map(ask, enumerate(PEOPLE)))
    for r in replies:
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)


def test_json_object_and_grammar_streamed(openai_client):
    parts = [c.choices[0].delta.content or "" for c in openai_client.chat.completions.create(
        model="smollm2", messages=user("Give a JSON object with keys city and country for Paris."),
        response_format={"type": "json_object"}, max_tokens=60, temperature=0, stream=True) if c.choices]
    assert isinstance(json.loads("".join(parts)), dict)
    r = openai_client.completions.create(model="smollm2", prompt="Colour of the sky:", max_tokens=8, temperature=0,
                                         extra_body={"grammar": 'root ::= " " ("blue" | "grey") "."'})
    assert r.choices[0].text in (" blue.", " grey.") and r.choices[0].finish_reason == "stop"


def test_an_unfinishable_object_ends_with_length(openai_client):
    r = openai_client.chat.completions.create(
        model="smollm2", messages=user("A long JSON list."), max_tokens=6, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "l", "schema": {
            "type": "array", "items": {"type": "integer"}, "minItems": 50}}})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 6


def test_ollama_format_schema_and_json(ollama_client):
    for who in PEOPLE[:3]:
        r = ollama_client.chat("smollm2", user(f"Describe {who} as a JSON user record."), format=SCHEMA,
                               options={"temperature": 0, "num_predict": 150})
        assert r.done_reason == "stop"
        jsonschema.validate(json.loads(r.message.content), SCHEMA)
    r = ollama_client.generate("smollm2", "Give a JSON object with keys city and country for Paris.", format="json",
                               options={"temperature": 0, "num_predict": 80})
    assert isinstance(json.loads(r.response), dict)


def test_bad_schemas_and_grammars_are_400_in_each_shape(server, openai_client, anthropic_client, ollama_client):
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.chat.completions.create(model="smollm2", messages=user("x"), response_format=bad, max_tokens=4)
    assert e.value.body["message"] == "'response_format': invalid JSON schema: Invalid type: objekt"
    assert e.value.body["param"] == "response_format"
    with pytest.raises(anthropic.BadRequestError) as e:
        anthropic_client.messages.create(model="smollm2", max_tokens=4, messages=user("x"),
                                         extra_body={"grammar": 'root ::= "a" ('})
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "'grammar': invalid GBNF grammar" in e.value.body["error"]["message"]
    with pytest.raises(ollama.ResponseError) as e:
        ollama_client.chat("smollm2", user("x"), format={"type": "objekt"})
    assert e.value.status_code == 400 and "'format': invalid JSON schema" in e.value.error
    r = server.post("/api/generate", {"model": "smollm2", "prompt": "x", "format": 3})
    assert r.status_code == 400 and r.json() == {"error": "'format' must be \"json\" or a JSON schema object, got 3"}
    r = server.post("/v1/chat/completions", {"model": "smollm2", "messages": user("x"), "tool_choice": "required"})
    assert r.status_code == 400 and "needs 'tools'" in r.json()["error"]["message"]
    r = server.post("/v1/messages", {"model": "smollm2", "max_tokens": 5, "messages": user("x"),
                                     "tool_choice": {"type": "any"}})  # it was told of OpenAI's 'required'
    assert r.status_code == 400 and "'required'" not in r.json()["error"]["message"]
    assert "needs 'tools'" in r.json()["error"]["message"]


def check_weather(name, args):
    assert name == "get_weather"
    jsonschema.validate(args, WEATHER["function"]["parameters"])


def concurrently(fn, items):
    """fn over items on one thread each: the server batches them (the tests stay fast)."""
    with ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(fn, items))


def test_openai_forced_tool_calls_parse_every_time(openai_client):
    def ask(i):
        choice = "required" if i % 2 else {"type": "function", "function": {"name": "get_weather"}}
        r = openai_client.chat.completions.create(model="smollm2", messages=user(ASKS[i]), tools=[CLOCK, WEATHER],
                                                  tool_choice=choice, max_tokens=80, temperature=0.7, seed=i)
        return choice, r

    for choice, r in concurrently(ask, range(len(ASKS))):
        assert r.choices[0].finish_reason == "tool_calls"
        (call,) = r.choices[0].message.tool_calls
        args = json.loads(call.function.arguments)
        if choice == "required" and call.function.name == "get_time":
            jsonschema.validate(args, CLOCK["function"]["parameters"])  # either tool may be called
        else:
            check_weather(call.function.name, args)


def test_openai_streamed_tool_call_deltas(openai_client):
    stream = openai_client.chat.completions.create(model="smollm2", messages=user(ASKS[0]), tools=[WEATHER],
                                                   tool_choice="required", max_tokens=80, temperature=0, stream=True)
    name, args, finish, ids = "", "", None, set()
    for chunk in stream:
        for d in chunk.choices[0].delta.tool_calls or []:
            assert d.index == 0
            ids.add(d.id) if d.id else None
            name += d.function.name or ""
            args += d.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and len(ids) == 1
    check_weather(name, json.loads(args))


def test_a_tool_result_turn_is_accepted(openai_client):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                              "arguments": '{"city": "Paris", "unit": "celsius"}'}}
    messages = user(ASKS[0]) + [{"role": "assistant", "content": None, "tool_calls": [call]},
                                {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"}]
    r = openai_client.chat.completions.create(model="smollm2", messages=messages, tools=[WEATHER], max_tokens=24,
                                              temperature=0)
    assert r.choices[0].message.content or r.choices[0].message.tool_calls


def test_anthropic_forced_tool_use_parses_every_time(anthropic_client):
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in (CLOCK, WEATHER)]

    def ask(i):
        if i == len(ASKS) - 1:  # streamed, with tool_choice any
            with anthropic_client.messages.stream(model="smollm2", max_tokens=80, messages=user(ASKS[i]), tools=tools,
                                                  tool_choice={"type": "any"}) as s:
                return s.get_final_message()
        return anthropic_client.messages.create(model="smollm2", max_tokens=80, messages=user(ASKS[i]), tools=tools,
                                                tool_choice={"type": "tool", "name": "get_weather"})

    for m in concurrently(ask, range(len(ASKS))):
        assert m.stop_reason == "tool_use"
        (block,) = [b for b in m.content if b.type == "tool_use"]
        if block.name == "get_time":
            jsonschema.validate(block.input, CLOCK["function"]["parameters"])
        else:
            check_weather(block.name, block.input)
    # The result goes back as a tool_result block.
    follow = user(ASKS[-1]) + [{"role": "assistant", "content": [b.model_dump() for b in m.content]},
                               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id,
                                                             "content": "warm"}]}]
    assert anthropic_client.messages.create(model="smollm2", max_tokens=4, messages=follow, tools=tools).content


def test_ollama_tool_calls_parse_every_time(ollama_client):
    def ask(i):
        body = {"model": "smollm2", "messages": user(ASKS[i]), "tools": [WEATHER], "tool_choice": "required",
                "options": {"temperature": 0.7, "seed": i, "num_predict": 80}}
        if i == len(ASKS) - 1:  # streamed: the calls come in a message line before the last
            lines = [json.loads(x) for x in httpx.post(f"{ollama_client._client.base_url}/api/chat", json=body,
                                                       timeout=120).text.splitlines()]
            assert lines[-1]["done"]
            return [c for x in lines for c in x["message"].get("tool_calls", [])]
        # Ollama has no tool_choice; ours is an extension, sent through the client's own request path.
        r = ollama_client._request(ollama.ChatResponse, "POST", "/api/chat", json={**body, "stream": False})
        return [c.model_dump() for c in r.message.tool_calls]

    for calls in concurrently(ask, range(len(ASKS))):
        (call,) = calls
        check_weather(call["function"]["name"], dict(call["function"]["arguments"]))
    follow = user(ASKS[-1]) + [{"role": "assistant", "content": "", "tool_calls": calls},
                               {"role": "tool", "content": "20 degrees"}]
    assert ollama_client.chat("smollm2", follow, tools=[WEATHER], options={"temperature": 0, "num_predict": 4}).done


def test_the_clients_parse_helpers_work(openai_client):
    from typing import Literal

    from pydantic import BaseModel, Field

    class Place(BaseModel):
        city: str = Field(max_length=12)
        country: str = Field(max_length=12)
        size: Literal["small", "big"]

    ask = user("Paris as JSON with its country.")
    r = openai_client.chat.completions.parse(model="smollm2", messages=ask, response_format=Place, max_tokens=60,
                                             temperature=0)
    assert isinstance(r.choices[0].message.parsed, Place)
    r = openai_client.chat.completions.parse(model="smollm2", messages=ask, max_tokens=60, temperature=0,
                                             tools=[openai.pydantic_function_tool(Place, name="save_place")],
                                             tool_choice="required")
    assert isinstance(r.choices[0].message.tool_calls[0].function.parsed_arguments, Place)
    r = openai_client.responses.parse(model="smollm2", input=ask[0]["content"], text_format=Place,
                                      max_output_tokens=60, temperature=0)
    assert isinstance(r.output_parsed, Place)
