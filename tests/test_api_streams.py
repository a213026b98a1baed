"""Each dialect's streamed reply is its reply not streamed, in pieces: the same
text, tool calls, finish reason and counts, read with the real clients. Both
are made from one generation's events by one writer per reply shape
(serving/events.py, api/streaming.py); greedy and deterministic, the two
generations give the same reply, the second from the prefix cache."""
import json

import pytest

from ctxengine.serving.generation import UNSET, GenerationRequest
from ctxengine.serving.prompts import Prompt

from api_server import module_server
from api_server import anthropic_client, ollama_client, openai_client  # noqa: F401 (fixtures)

server = module_server("streams")

HELLO = [{"role": "user", "content": "Say hello to the reader."}]
WEATHER = [{"role": "user", "content": "What's the weather in Paris?"}]
PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
          "additionalProperties": False}
OPENAI_TOOLS = {"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}],
                "tool_choice": "required"}


def _openai_streamed(chunks) -> tuple[str, list[dict], str, object]:
    text, calls, finish, usage = "", {}, None, None
    for chunk in chunks:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            delta = getattr(choice, "delta", None)  # chat; a completion's choice has text
            text += (delta.content if delta is not None else choice.text) or ""
            for d in (delta.tool_calls if delta is not None else None) or []:
                call = calls.setdefault(d.index, {"name": "", "arguments": ""})
                call["name"] += d.function.name or ""
                call["arguments"] += d.function.arguments or ""
            finish = choice.finish_reason or finish
    return text, list(calls.values()), finish, usage


def test_openai_chat_text_and_tool_calls(openai_client):
    for messages, extra in ((HELLO, {}), (WEATHER, OPENAI_TOOLS)):
        kw = dict(model="smollm2", messages=messages, max_tokens=40, temperature=0, **extra)
        whole = openai_client.chat.completions.create(**kw)
        text, calls, finish, usage = _openai_streamed(openai_client.chat.completions.create(
            stream=True, stream_options={"include_usage": True}, **kw))
        m = whole.choices[0].message
        assert text == (m.content or "")
        assert calls == [{"name": c.function.name, "arguments": c.function.arguments} for c in m.tool_calls or []]
        assert bool(calls) == bool(extra)
        assert finish == whole.choices[0].finish_reason
        assert (finish == "tool_calls") == bool(extra)
        assert (usage.prompt_tokens, usage.completion_tokens) == (whole.usage.prompt_tokens,
                                                                  whole.usage.completion_tokens)


def test_openai_completions(openai_client):
    kw = dict(model="smollm2", prompt="The capital of France is", max_tokens=12, temperature=0)
    whole = openai_client.completions.create(**kw)
    text, _, finish, usage = _openai_streamed(openai_client.completions.create(
        stream=True, stream_options={"include_usage": True}, **kw))
    assert (text, finish) == (whole.choices[0].text, whole.choices[0].finish_reason)
    assert usage.completion_tokens == whole.usage.completion_tokens == 12


def _blocks(message) -> list[tuple]:
    return [(b.type, getattr(b, "text", None), getattr(b, "name", None), getattr(b, "input", None))
            for b in message.content]


def test_anthropic_text_and_tool_use(anthropic_client):
    tools = {"tools": [{"name": "get_weather", "input_schema": PARAMS}], "tool_choice": {"type": "any"}}
    for messages, extra in ((HELLO, {}), (WEATHER, tools)):
        kw = dict(model="smollm2", max_tokens=40, messages=messages, extra_body={"temperature": 0}, **extra)
        whole = anthropic_client.messages.create(**kw)
        with anthropic_client.messages.stream(**kw) as stream:
            streamed = stream.get_final_message()
        assert _blocks(streamed) == _blocks(whole)
        assert [b.type for b in whole.content] == (["tool_use"] if extra else ["text"])
        assert (streamed.stop_reason, streamed.stop_sequence) == (whole.stop_reason, whole.stop_sequence)
        assert streamed.usage.output_tokens == whole.usage.output_tokens
        assert (streamed.usage.input_tokens + streamed.usage.cache_read_input_tokens
                == whole.usage.input_tokens + whole.usage.cache_read_input_tokens)


def _items(response) -> list[tuple]:
    return [(o.type, getattr(o, "name", None), getattr(o, "arguments", None),
             [c.text for c in getattr(o, "content", None) or []]) for o in response.output]


def test_responses_text_and_function_calls(openai_client):
    tools = {"tools": [{"type": "function", "name": "get_weather", "parameters": PARAMS}], "tool_choice": "required"}
    for text, extra in (("Say hello to the reader.", {}), ("What's the weather in Paris?", tools)):
        kw = dict(model="smollm2", input=text, max_output_tokens=40, temperature=0, **extra)
        whole = openai_client.responses.create(**kw)
        deltas, final = "", None
        for event in openai_client.responses.create(stream=True, **kw):
            if event.type == "response.output_text.delta":
                deltas += event.delta
            if event.type in ("response.completed", "response.incomplete"):
                final = event.response
        assert _items(final) == _items(whole)
        assert [o.type for o in whole.output] == (["function_call"] if extra else ["message"])
        assert deltas == whole.output_text
        assert final.status == whole.status
        assert final.usage.output_tokens == whole.usage.output_tokens
        assert openai_client.responses.retrieve(final.id).output_text == final.output_text  # saved before done


def test_ollama_chat_and_generate(ollama_client):
    options = {"temperature": 0, "num_predict": 12}
    whole = ollama_client.chat(model="smollm2", messages=HELLO, options=options)
    pieces = list(ollama_client.chat(model="smollm2", messages=HELLO, options=options, stream=True))
    assert "".join(p.message.content for p in pieces) == whole.message.content
    last = pieces[-1]
    assert last.done and not any(p.done for p in pieces[:-1])
    assert (last.done_reason, last.eval_count, last.prompt_eval_count) == (whole.done_reason, whole.eval_count,
                                                                          whole.prompt_eval_count)
    whole = ollama_client.generate(model="smollm2", prompt="Why is the sky blue?", options=options)
    pieces = list(ollama_client.generate(model="smollm2", prompt="Why is the sky blue?", options=options,
                                         stream=True))
    assert "".join(p.response for p in pieces) == whole.response
    assert pieces[-1].context == whole.context and pieces[-1].eval_count == whole.eval_count == 12


def test_ollama_tool_calls(server):
    body = {"model": "smollm2", "messages": WEATHER, "stream": False, "options": {"temperature": 0, "num_predict": 40},
            **OPENAI_TOOLS}
    whole = server.post("/api/chat", body).json()
    lines = [json.loads(line) for line in server.post("/api/chat", {**body, "stream": True}).text.splitlines()]
    calls = [c for line in lines for c in line["message"].get("tool_calls", [])]
    assert calls == whole["message"]["tool_calls"] and calls[0]["function"]["name"] == "get_weather"
    assert "".join(line["message"]["content"] for line in lines) == whole["message"]["content"]
    assert lines[-1]["done"] and lines[-1]["eval_count"] == whole["eval_count"]


def test_a_generation_request_takes_only_a_keep_alive_it_can_apply():
    """keep_alive is UNSET, None or seconds: the Ollama face once passed a sentinel of
    its own, which failed after every reply (unseen, after Finished); now it would fail
    the request, loudly."""
    for fine in (UNSET, None, 0, 30.0, -1):
        GenerationRequest("m", Prompt(text="x"), keep_alive=fine)
    for wrong in (object(), "5m", True):
        with pytest.raises(TypeError, match="keep_alive"):
            GenerationRequest("m", Prompt(text="x"), keep_alive=wrong)
