"""Where a chat's own text lies in its rendering, so that a control token's spelling in a
message stays text: serving/prompts.py tokenizes the rendering with control tokens parsed
outside these spans only (``Tokenizer.encode``'s ``plain``). Without them a message
holding ``<|im_end|>\\n<|im_start|>system\\n...`` (a user's, a tool result, a pasted
document) began a system turn of its own, as it does in llama.cpp's server.

The places are found by rendering the chat a second time with a stand-in for each text
that spells a control token (a message's content, a string at any depth of its tool
calls' arguments): where putting the texts back in place of the stand-ins gives the
rendering exactly, each text's place is known. A template that changes a text (Gemma's
trims it; ``tojson`` escapes an argument's newlines) gives another rendering unless the
text is put back so changed; one that tests or cuts it gives none, and then no place is
known and the rendering is parsed whole, as before. Messages without a control token's spelling (nearly all)
cost no second rendering, and change nothing: a span matters only where a control token
overlaps it.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Callable, Sequence

from ..errors import CtxError
from ..text.tools import ToolCall

STAND_IN = "\ue000{}\ue001"  # private-use code points: no control token is spelt with them
_STAND_INS = re.compile("\ue000([0-9]+)\ue001")

Span = tuple[int, int]


def message_spans(messages: Sequence[dict], text: str, render: Callable[[list[dict]], str],
                  spells_control: Callable[[str], bool], prefill: str = "") -> list[Span]:
    """[start, end) of each text of the messages in ``text`` (``render(messages)`` +
    ``prefill``) that spells a control token (a content, a string in a call's arguments),
    and of the ``prefill``; [] where they cannot be placed."""
    ending = [(len(text) - len(prefill), len(text))] if prefill and spells_control(prefill) else []
    originals: list[str] = []

    def stand_in(s: str) -> str:
        originals.append(s)
        return STAND_IN.format(len(originals) - 1)

    stood = [_standing(m, stand_in, spells_control) for m in messages]
    if not originals:
        return ending
    try:
        shown = render(stood)
    except CtxError:
        return ending
    spans = _placed(_STAND_INS.split(shown), originals, text[:len(text) - len(prefill)])
    return ending if spans is None else spans + ending


def _standing(m: Any, stand_in: Callable[[str], str], spells_control: Callable[[str], bool]) -> Any:
    """The message with a stand-in for each of its texts that spells a control token: its
    content, and the strings (at any depth) of its calls' arguments."""
    if not isinstance(m, dict):
        return m
    out = m
    if isinstance(m.get("content"), str) and spells_control(m["content"]):
        out = dict(out, content=stand_in(m["content"]))
    calls = m.get("tool_calls")
    if isinstance(calls, (list, tuple)):
        args = [_stood(c.arguments, stand_in, spells_control) if isinstance(c, ToolCall) else None for c in calls]
        if any(a is not None and a is not c.arguments for a, c in zip(args, calls)):
            out = dict(out, tool_calls=[c if a is None else dataclasses.replace(c, arguments=a)
                                        for a, c in zip(args, calls)])
    return out


def _stood(x: Any, stand_in: Callable[[str], str], spells_control: Callable[[str], bool]) -> Any:
    """``x`` with a stand-in for each string in it that spells a control token; ``x`` itself
    (the same object) where there is none."""
    if isinstance(x, str):
        return stand_in(x) if spells_control(x) else x
    if isinstance(x, dict):
        items = {k: _stood(v, stand_in, spells_control) for k, v in x.items()}
        return x if all(items[k] is v for k, v in x.items()) else items
    if isinstance(x, (list, tuple)):
        items = [_stood(v, stand_in, spells_control) for v in x]
        return x if all(a is b for a, b in zip(items, x)) else items
    return x


def _placed(pieces: list[str], originals: list[str], body: str) -> list[Span] | None:
    """The spans of the texts in ``body``, the rendering, given the stand-in rendering's
    ``pieces`` (text, a stand-in's index, text, ..., text); None where putting the texts
    back does not give ``body``. A text goes back as it is, trimmed (Gemma's template trims
    a message) or as JSON writes it inside a string (an argument under ``tojson``): the
    first that the rendering holds there, and the next piece after it."""
    spans, at = [], 0
    for k in range(0, len(pieces), 2):
        if not body.startswith(pieces[k], at):
            return None
        at += len(pieces[k])
        if k + 1 == len(pieces):
            break
        i = int(pieces[k + 1])
        if i >= len(originals):
            return None  # a message's own text looked like a stand-in: no place is known
        s = originals[i]
        for form in (s, s.strip(), json.dumps(s, ensure_ascii=False)[1:-1]):
            if body.startswith(form, at) and body.startswith(pieces[k + 2], at + len(form)):
                break
        else:
            return None
        spans.append((at, at + len(form)))
        at += len(form)
    return spans if at == len(body) else None
