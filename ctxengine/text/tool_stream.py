"""Splitting a streamed reply into the text to show as it comes and the tool calls
parsed at its end (text/tools.py parses them)."""
from __future__ import annotations

from typing import Collection

from .tools import _OPENINGS, _PYTHON_TAG, ToolCall, parse_tool_calls


class ToolStream:
    """Splits a streamed reply into text to show now and calls parsed at the end.

    Text before a possible call streams on; from ``<tool_call>`` or a family's
    opening (``[TOOL_CALLS]``, ``<|tool_call|>``, DeepSeek's ``<｜tool▁calls▁begin｜>``:
    tool_formats.OPENINGS, as their special tokens' text), or, when the reply
    opens with ``{``, ``[`` or ``<|python_tag|>``, from its start, it is
    held until ``finish`` parses it. ``forced``: the whole reply is a call (cut short: none);
    ``names`` as parse_tool_calls'. Whitespace is shown only once text follows it, so
    none dangles before a call. ``push`` and ``finish`` joined are the reply's text.
    """

    def __init__(self, forced: bool = False, names: Collection[str] | None = None):
        self._held = ""
        self._space = ""  # trailing whitespace not shown yet
        self._holding = self._forced = forced
        self._started = False
        self._names = names

    def push(self, text: str) -> str:
        shown = self._text(text)
        if not shown:
            return ""
        body = (self._space + shown).rstrip()
        self._space = (self._space + shown)[len(body):]
        return body

    def _text(self, text: str) -> str:
        if self._holding:
            self._held += text
            return ""
        buf = self._held + text
        if not self._started:
            head = buf.lstrip()
            if not head or (len(head) < len(_PYTHON_TAG) and _PYTHON_TAG.startswith(head)):
                self._held = buf  # cannot tell yet
                return ""
            self._started = True
            if head[0] in "{[" or head.startswith(_PYTHON_TAG):
                self._holding, self._held = True, buf
                return ""
        at = min((i for i in map(buf.find, _OPENINGS) if i >= 0), default=-1)
        if at >= 0:
            self._holding, self._held = True, buf[at:]
            return buf[:at]
        keep = max(next((n for n in range(min(len(o) - 1, len(buf)), 0, -1) if buf.endswith(o[:n])), 0)
                   for o in _OPENINGS)  # what may be the start of an opening
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep]

    def finish(self) -> tuple[str, list[ToolCall]]:
        """(text not shown yet, calls)."""
        held, self._held = self._held, ""
        space, self._space = self._space, ""
        if not self._holding:
            return space + held, []
        text, calls = parse_tool_calls(held, self._names)
        if not calls:  # a forced call cut short (max_tokens) is not text either
            return ("" if self._forced else space + held), []
        return (space + text if text else ""), calls  # the space before text held with a call is kept
