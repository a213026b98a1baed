"""The events one generation streams, in order, whatever dialect asked for it:

    Started   the prompt is prefilled (awaited before a reply begins, so a
              refused prompt is still an error reply)
    Text*     reply text to show now; with tools offered, text that may be a
              tool call is held back until the reply ends (text/tool_stream.py's ToolStream)
    Finished  how it ended, its counts, the whole reply and its tool calls
  | Failed    it stopped on an error (after Started: the reply has begun)

They flow one way, from the generation's thread (serving/generation.py) to
one writer per reply shape in the face (api/streaming.py's Writer), which
turns them into wire chunks; a reply that is not streamed is the Finished
event, whose ``text`` and ``calls`` fold the whole reply.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..text.tools import ToolCall


@dataclass
class Started:
    model: str               # the catalog entry's name
    prompt_tokens: int       # every token the model was given
    cached_tokens: int       # of those, how many had their KV already (not prefilled)
    load_ns: int
    prefill_ns: int


@dataclass
class Text:
    text: str


@dataclass
class Finished:
    finish_reason: str       # "stop" (end of turn or a stop string) or "length"
    stop_sequence: str | None
    completion_tokens: int
    decode_ns: int
    total_ns: int
    tokens: list[int]        # the context's tokens afterwards (Ollama's context array)
    drafted_tokens: int = 0  # speculative decoding: tokens drafted and verified,
    accepted_tokens: int = 0  # and those the sampler chose too
    text: str = ""           # the reply, less its tool calls: the Text events joined (text/tool_stream.py's ToolStream)
    calls: list["ToolCall"] = field(default_factory=list)  # the tool calls it made, when tools were offered


@dataclass
class Failed:
    error: BaseException     # as raised: the face reports it in its own terms (api/errors.py)


Event = Text | Finished | Failed
