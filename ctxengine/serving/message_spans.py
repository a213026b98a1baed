"""Where a chat's own text lies in its rendering, so that a control token's spelling in a
message stays text: serving/prompts.py tokenizes the rendering with control tokens parsed
outside these spans only (``Tokenizer.encode``'s ``plain``). Without them a message
holding ``<|im_end|>\\n<|im_start|>system\\n...`` (a user's, a tool result, a pasted
document) began a system turn of its own, as it does in llama.cpp's server.

The places are found by rendering the chat a second time with a stand-in for each
message whose text spells a control token: where putting the texts back in place of the
stand-ins gives the rendering exactly, each text's place is known. A template that
changes a text (Gemma's trims it) gives another rendering unless the trimmed text is put
back; one that tests or cuts it gives none, and then no place is known and the rendering
is parsed whole, as before. Messages without a control token's spelling (nearly all)
cost no second rendering, and change nothing: a span matters only where a control token
overlaps it.
"""
from __future__ import annotations

import re
from typing import Callable, Sequence

from ..errors import CtxError

STAND_IN = "\ue000{}\ue001"  # private-use code points: no control token is spelt with them
_STAND_INS = re.compile("\ue000([0-9]+)\ue001")

Span = tuple[int, int]


def message_spans(messages: Sequence[dict], text: str, render: Callable[[list[dict]], str],
                  spells_control: Callable[[str], bool], prefill: str = "") -> list[Span]:
    """[start, end) of each message text in ``text`` (``render(messages)`` + ``prefill``)
    that spells a control token, and of the ``prefill``; [] where they cannot be placed."""
    risky = {i for i, m in enumerate(messages)
             if isinstance(m, dict) and isinstance(m.get("content"), str) and spells_control(m["content"])}
    ending = [(len(text) - len(prefill), len(text))] if prefill and spells_control(prefill) else []
    if not risky:
        return ending
    try:
        shown = render([dict(m, content=STAND_IN.format(i)) if i in risky else m for i, m in enumerate(messages)])
    except CtxError:
        return ending
    pieces = _STAND_INS.split(shown)  # text, stand-in's index, text, ..., text
    for put_back in (str, str.strip):
        out, spans, at = [], [], 0
        for k, piece in enumerate(pieces):
            if k % 2:
                if int(piece) not in risky:
                    break  # a message's own text looked like a stand-in: no place is known
                piece = put_back(messages[int(piece)]["content"])
                spans.append((at, at + len(piece)))
            out.append(piece)
            at += len(piece)
        else:
            if "".join(out) == text[:len(text) - len(prefill)]:
                return spans + ending
    return ending
