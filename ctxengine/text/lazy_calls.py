"""Tool calls a model makes of its own accord, constrained once begun.

With tools offered and the choice left to the model (``tool_choice`` auto), the
reply is free text, and a call in it was parsed as the model wrote it: a small
model's call could give a city its tool's enum lacks or a key a closed schema
refuses (``strict: true`` unenforced), or not parse at all and come back as
text. llama.cpp's server constrains such calls with a "lazy" grammar, one that
starts where its trigger appears; so do we, for the calls written in Hermes
tags (the hermes format's and the fallback's, text/tools.py).

:class:`LazyCalls` watches the reply's bytes for ``<tool_call>``. Where it
appears, the forced call's grammar (``forced_call_grammar``, one call of any
offered tool, its arguments valid against the tool's schema) starts at the
token the tag began in, that token's bytes before the tag given to the grammar
as text of its own, and is fed the tokens since; it masks every token after,
until the call closes with ``</tool_call>``, and then the watch goes on for
another call. A token that completes the tag with bytes the grammar does not
take (the tag and more in one token) leaves that call as the model wrote it.

What starts a call's grammar and what it masks are functions of the tokens
alone, so the reply is the same under speculation, at any thread count, in any
batch. A reply without the tag is not touched.
"""
from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING, Sequence

from .grammar import Constraint, GrammarError
from .tools import Tool, ToolChoice, forced_call_grammar

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

TRIGGER = b"<tool_call>"
FORMATS = ("hermes", "fallback")  # those whose calls are written in Hermes tags


class LazyCalls:
    """Watches a reply for a call's opening tag; ``started`` gives the call's constraint."""

    def __init__(self, tools: Sequence[Tool], fmt: str, tok: "Tokenizer", single: bool = False):
        self._tools, self._fmt, self._tok = list(tools), fmt, tok
        self.single = single      # one call at most: the reply ends with it (parallel_tool_calls false)
        self._first = 0           # the index, among the context's tokens, of the first one watched
        self._data = bytearray()  # their bytes
        self._starts: list[int] = []  # where each one's bytes begin in _data
        self._seen = 0            # the bytes there before the watch began: a tag must end past them

    @staticmethod
    def offered(tools: Sequence[Tool], fmt: str, tok: "Tokenizer", single: bool = False) -> "LazyCalls | None":
        """Calls to watch for, where the format writes them in Hermes tags (else None)."""
        return LazyCalls(tools, fmt, tok, single) if tools and fmt in FORMATS else None

    def watch(self, tokens: Sequence[int]) -> None:
        """Watch the tokens appended after these (a reply's start, a call's end), a tag begun in
        their last few included (a reply cut by max_tokens inside ``<tool_call>`` goes on)."""
        back, held = len(tokens), 0
        while back > 0 and held < len(TRIGGER) - 1 and len(tokens) - back < len(TRIGGER):
            back -= 1
            held += len(self._tok.token_bytes(int(tokens[back])))
        self._first, self._data, self._starts = back, bytearray(), []
        for t in tokens[back:]:
            self._starts.append(len(self._data))
            self._data += self._tok.token_bytes(int(t))
        self._seen = len(self._data)

    def started(self, tokens: Sequence[int]) -> Constraint | None:
        """After ``tokens[-1]`` was appended: the grammar of a call it completed the tag of,
        fed the tokens from the one the tag began in; None if none began."""
        if len(tokens) - 1 != self._first + len(self._starts):
            raise ValueError("tokens were appended that the watch did not see")
        look = max(0, len(self._data) - len(TRIGGER) + 1)
        self._starts.append(len(self._data))
        self._data += self._tok.token_bytes(int(tokens[-1]))
        at = self._data.find(TRIGGER, look)
        if at < 0 or at + len(TRIGGER) <= self._seen:
            return None
        k = bisect_right(self._starts, at) - 1
        try:
            before = bytes(self._data[self._starts[k]:at]).decode("utf-8")
            grammar = forced_call_grammar(self._tools, ToolChoice("required"), self._fmt, before=before)
            constraint = Constraint(grammar, self._tok, self._first + k, call_skip=len(before.encode()))
            constraint.feed(tokens[self._first + k:])
        except (UnicodeDecodeError, GrammarError):
            self.watch(tokens)  # this call goes as written; the watch goes on after it
            return None
        return constraint
