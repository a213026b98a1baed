"""Tool calling as models do it: tool definitions rendered into the prompt,
calls parsed out of the reply, and forced calls constrained by a grammar.

Formats (``tool_format``), chosen from the model's chat template:

* ``hermes``: the template renders ``tools`` itself and its model answers
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes,
  Qwen 2.5/3, SmolLM3);
* ``llama3``: the template renders ``tools`` and its model answers a bare
  ``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``;
* ``fallback``: the template knows no tools (SmolLM2's does not). The tool
  definitions then go into the system message as :data:`FALLBACK_PROMPT`
  describes them, in the Hermes format, and so do earlier calls (as
  ``<tool_call>`` text in the assistant turn) and their results (a user turn
  holding ``<tool_response>...</tool_response>``).

Parsing accepts any of the three shapes whatever the format, since models
drift between them. With a forced call (tool_choice required or a named
tool) the reply is generated under :func:`forced_call_grammar`, so it always
parses, with the arguments valid against the tool's parameter schema.
"""
from __future__ import annotations

import functools
import json
import secrets
from dataclasses import dataclass, field
from typing import Collection, Iterator, Sequence

from ..errors import CtxError
from .grammar import JSON_OPTIONS, Grammar, GrammarError
from .json_bounds import bounded_schema

FALLBACK_PROMPT = (
    "You have access to the following functions. To call a function, reply with a JSON object "
    "inside <tool_call></tool_call> tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}}\n</tool_call>\nYou may call several functions, one tag each. Function results "
    "come back inside <tool_response></tool_response> tags.\nFunctions:\n<tools>\n{tools}\n</tools>"
)
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_DECODER = json.JSONDecoder()
_PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class Tool:
    name: str
    description: str = ""
    parameters: dict = field(default_factory=lambda: {"type": "object"})

    def openai(self) -> dict:
        """The shape chat templates expect (``tools`` as transformers passes them)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass
class ToolCall:
    name: str
    arguments: dict
    id: str = field(default_factory=lambda: "call_" + secrets.token_hex(12))

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class ToolChoice:
    mode: str = "auto"          # auto | none | required | named
    name: str | None = None     # the tool, when mode is named

    @property
    def forced(self) -> bool:
        return self.mode in ("required", "named")


@dataclass
class ToolUse:
    """The tools a request offers and how it lets the model choose among them."""
    tools: list[Tool]
    choice: ToolChoice
    parallel: bool = True       # more than one call in a reply (OpenAI parallel_tool_calls)

    @property
    def names(self) -> frozenset[str]:
        """The names a call may have: a reply "calling" any other is text."""
        return frozenset(t.name for t in self.tools)

    @property
    def prompt_tools(self) -> list[Tool] | None:
        """The tools the prompt shows (none for tool_choice none)."""
        return None if self.choice.mode == "none" else self.tools

    @property
    def parses(self) -> bool:
        """Whether the reply is split into text and tool calls (not for tool_choice none)."""
        return self.choice.mode != "none"


def as_tools(tools: Sequence) -> list[Tool]:
    """Tools from Tool objects or dicts (OpenAI's ``{"type": "function", "function": {...}}`` or flat)."""
    out = []
    for t in tools:
        if isinstance(t, Tool):
            out.append(t)
            continue
        if not isinstance(t, dict):
            raise CtxError(f"a tool must be a Tool or a dict, got {type(t).__name__}")
        f = t.get("function", t)
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
            raise CtxError(f"a tool needs a name: {t!r}"[:200])
        params = f.get("parameters") or {"type": "object"}
        if not isinstance(params, dict):
            raise CtxError(f"tool {f['name']!r}: parameters must be a JSON schema object")
        out.append(Tool(f["name"], f.get("description") or "", params))
    return out


def as_calls(calls: Sequence) -> list[ToolCall]:
    """Tool calls from ToolCall objects or dicts (OpenAI's ``{"id", "type": "function",
    "function": {"name", "arguments"}}`` or flat ``{"name", "arguments"}``; arguments an
    object or its JSON text)."""
    if not isinstance(calls, (list, tuple)):
        raise CtxError(f"tool_calls must be a list, got {type(calls).__name__}")
    out = []
    for c in calls:
        if isinstance(c, ToolCall):
            out.append(c)
            continue
        f = c.get("function", c) if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
            raise CtxError(f"a tool call must be a ToolCall or a dict with a function name: {c!r}"[:200])
        args = f.get("arguments") or {}
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                raise CtxError(f"tool call {f['name']!r}: arguments are not valid JSON") from None
        if not isinstance(args, dict):
            raise CtxError(f"tool call {f['name']!r}: arguments must be a JSON object")
        call = ToolCall(f["name"], args)
        if isinstance(c.get("id"), str) and c["id"]:
            call.id = c["id"]
        out.append(call)
    return out


# -- which format ---------------------------------------------------------------
@functools.lru_cache(maxsize=64)
def tool_format(template) -> str:
    """``hermes``, ``llama3`` or ``fallback`` for a ChatTemplate (or None)."""
    if template is None or not _renders_tools(template):
        return "fallback"
    source = template.source
    if _PYTHON_TAG in source or ("ipython" in source and "parameters" in source):
        return "llama3"
    return "hermes"


def _renders_tools(template) -> bool:
    """Whether the template writes the tools it is given (probed with a marker tool)."""
    marker = Tool("ctx_probe_tool_7c1e", "probe")
    try:
        text = template.render([{"role": "user", "content": "hi"}], tools=[marker.openai()])
    except Exception:  # a template that chokes on tools does not support them
        return False
    return marker.name in text


# -- rendering ------------------------------------------------------------------
def template_messages(messages: Sequence[dict], tools: Sequence[Tool], fmt: str) -> tuple[list[dict], dict]:
    """Messages (roles system/user/assistant/tool; assistant ``tool_calls`` as
    ToolCall lists) as the template takes them, and the template variables."""
    if fmt != "fallback":
        out = []
        for m in messages:
            m = dict(m)
            if m.get("tool_calls"):
                m["tool_calls"] = [{"type": "function", "id": c.id,
                                    "function": {"name": c.name, "arguments": c.arguments}} for c in m["tool_calls"]]
            out.append(m)
        return out, {"tools": [t.openai() for t in tools]}
    out = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            calls = "\n".join(f"{_OPEN}\n{json.dumps({'name': c.name, 'arguments': c.arguments}, ensure_ascii=False)}"
                              f"\n{_CLOSE}" for c in m["tool_calls"])
            out.append({"role": "assistant", "content": f"{content}\n{calls}" if content else calls})
        elif role == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
        else:
            out.append({"role": role, "content": content})
    if tools:
        prompt = FALLBACK_PROMPT.format(tools="\n".join(json.dumps(t.openai(), ensure_ascii=False) for t in tools))
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out, {}


# -- forcing a call -------------------------------------------------------------
def forced_call_grammar(tools: Sequence[Tool], choice: ToolChoice, fmt: str) -> Grammar:
    """A grammar whose every sentence is one well-formed call of an allowed tool."""
    allowed = [t for t in tools if choice.mode != "named" or t.name == choice.name]
    key = "parameters" if fmt == "llama3" else "arguments"
    calls, defs = [], {}
    for i, t in enumerate(allowed):
        try:  # a schema that cannot be compiled is named as the tool's, not as the call wrapper's
            Grammar.json_schema(t.parameters or {"type": "object"}).compiled()
        except GrammarError as err:
            raise GrammarError(f"tool {t.name!r}: its parameters are an {err}") from None
        # Each tool's schema is a root of its own: it moves under the wrapper's $defs, and its
        # local refs ("#", "#/$defs/X", "#/properties/x") are rewritten to point into it there.
        where = f"ctx_tool{i}"
        defs[where] = _rooted(t.parameters or {"type": "object"}, f"#/$defs/{where}")
        calls.append({"type": "object", "properties": {"name": {"const": t.name}, key: {"$ref": f"#/$defs/{where}"}},
                      "required": ["name", key], "additionalProperties": False})
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    schema = bounded_schema({**schema, "$defs": defs})
    schema["x-guidance"] = JSON_OPTIONS
    body = f"call: %json {json.dumps(schema, ensure_ascii=False)}"
    if fmt == "llama3":
        return Grammar("lark", f"start: call\n{body}")
    return Grammar("lark", f'start: "{_OPEN}\\n" call "\\n{_CLOSE}"\n{body}')


def _rooted(schema, root: str):
    """``schema`` with every local ``$ref`` (``#...``) made relative to ``root`` instead."""
    if isinstance(schema, dict):
        return {k: (root + v[1:] if k == "$ref" and isinstance(v, str) and v.startswith("#") else _rooted(v, root))
                for k, v in schema.items()}
    if isinstance(schema, list):
        return [_rooted(v, root) for v in schema]
    return schema


# -- parsing ----------------------------------------------------------------------
def parse_tool_calls(text: str, names: Collection[str] | None = None) -> tuple[str, list[ToolCall]]:
    """(the text that is not a call, the calls) of a reply, in any of the formats.
    ``names``: the tools offered; what names another (a JSON reply with a "name"
    field, say) is no call but text (None: any name)."""
    if _OPEN in text:
        calls, rest, pos = [], [], 0
        for start, end, call in _tagged(text, names):
            rest.append(text[pos:start])
            pos = end
            calls.extend(call)
        if calls:
            rest.append(text[pos:])
            return "".join(rest).strip(), calls
    body = text.strip()
    if body.startswith(_PYTHON_TAG):
        body = body[len(_PYTHON_TAG):].strip()
    calls = _call(body, names) if body[:1] in ("{", "[") else None
    return ("", calls) if calls else (text, [])


def _tagged(text: str, names: Collection[str] | None) -> Iterator[tuple[int, int, list[ToolCall]]]:
    """(start, end, calls) of each ``<tool_call>`` JSON ``</tool_call>`` in the text (the
    closing tag may be cut off at its end). The JSON value is read whole, so a string in
    it may hold the closing tag itself (a regex up to the first one cut such a call)."""
    start = text.find(_OPEN)
    while start != -1:
        at = _skip_space(text, start + len(_OPEN))
        try:
            value, end = _DECODER.raw_decode(text, at)
        except ValueError:
            value, end = None, -1
        after = _skip_space(text, end) if end >= 0 else -1
        call = _calls(value, names) if end >= 0 else None
        if call is not None and (text.startswith(_CLOSE, after) or after == len(text)):
            end = after + len(_CLOSE) if after < len(text) else after
            yield start, end, call
            start = text.find(_OPEN, end)
        else:
            start = text.find(_OPEN, start + len(_OPEN))


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _call(text: str, names: Collection[str] | None) -> list[ToolCall] | None:
    """The calls one JSON value holds (an object or a list of them, each naming
    one of ``names``), or None."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return _calls(value, names)


def _calls(value: object, names: Collection[str] | None) -> list[ToolCall] | None:
    items = value if isinstance(value, list) else [value]
    out = []
    for v in items:
        if not isinstance(v, dict) or not isinstance(v.get("name"), str) or (names is not None
                                                                           and v["name"] not in names):
            return None
        args = v.get("arguments", v.get("parameters", {}))
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except ValueError:
                return None
        if not isinstance(args, dict):
            return None
        out.append(ToolCall(v["name"], args))
    return out or None


class ToolStream:
    """Splits a streamed reply into text to show now and calls parsed at the end.

    Text before a possible call streams on; from ``<tool_call>`` (or, when the
    reply opens with ``{``, ``[`` or ``<|python_tag|>``, from its start) it is
    held until ``finish`` parses it. ``forced``: the whole reply is a call;
    ``names`` as parse_tool_calls'. Whitespace is shown only once text follows
    it, so none is left dangling before a call. What ``push`` and ``finish``
    return, joined, is the reply's text: streamed or not, the same.
    """

    def __init__(self, forced: bool = False, names: Collection[str] | None = None):
        self._held = ""
        self._space = ""  # trailing whitespace not shown yet
        self._holding = forced
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
        at = buf.find(_OPEN)
        if at >= 0:
            self._holding, self._held = True, buf[at:]
            return buf[:at]
        keep = next((n for n in range(min(len(_OPEN) - 1, len(buf)), 0, -1) if buf.endswith(_OPEN[:n])), 0)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep]

    def finish(self) -> tuple[str, list[ToolCall]]:
        """(text not shown yet, calls)."""
        held, self._held = self._held, ""
        space, self._space = self._space, ""
        if not self._holding:
            return space + held, []
        text, calls = parse_tool_calls(held, self._names)
        return (text, calls) if calls else (space + held, [])
