"""Each face's word for how a reply ended, when the reply made tool calls: a
whole reply with calls says "tool_calls" / "tool_use" (Ollama has no such
reason: "stop"), streamed and not, carrying the calls (where the budget ended
such a reply the faces differ: docs/agents.md). The writers are driven
directly with the generation's last event."""
import asyncio
import json

from ctxengine.api.anthropic import MessageWriter
from ctxengine.api.ollama import LineWriter
from ctxengine.api.openai import ChatWriter
from ctxengine.serving.events import Finished, Started
from ctxengine.text.tools import ToolCall

STARTED = Started(model="m", prompt_tokens=10, cached_tokens=0, load_ns=0, prefill_ns=0)


def finished(reason):
    return Finished(reason, None, 20, 1, 2, [], text="", calls=[ToolCall("get_time", {"zone": "UTC"})])


def streamed(writer, fin) -> list[dict]:
    lines = b"".join(asyncio.run(writer.finish(fin))).decode().splitlines()
    return [json.loads(line.removeprefix("data: ")) for line in lines
            if line.strip() and not line.startswith("event:") and line != "data: [DONE]"]


def test_a_reply_with_calls_ends_in_each_dialects_words():
    openai_word, anthropic_word, ollama_word = "tool_calls", "tool_use", "stop"
    fin = finished("stop")
    choice = ChatWriter(STARTED, "m", False).body(fin)["choices"][0]
    assert choice["finish_reason"] == openai_word and choice["message"]["tool_calls"][0]["function"]["name"] == "get_time"
    assert streamed(ChatWriter(STARTED, "m", False), fin)[-1]["choices"][0]["finish_reason"] == openai_word
    message = MessageWriter(STARTED, "m", True).body(fin)
    assert message["stop_reason"] == anthropic_word and message["content"][-1]["type"] == "tool_use"
    delta = [e for e in streamed(MessageWriter(STARTED, "m", True), fin) if e.get("type") == "message_delta"]
    assert delta[0]["delta"]["stop_reason"] == anthropic_word
    reply = LineWriter(STARTED, "m", True).body(fin)
    assert reply["done_reason"] == ollama_word and reply["message"]["tool_calls"][0]["function"]["name"] == "get_time"
