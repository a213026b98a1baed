"""Tool calling as models do it: tool definitions rendered into the prompt,
calls parsed out of the reply, and forced calls constrained by a grammar.

Formats (``tool_format``), chosen from the model's chat template:

* ``hermes``: the template renders ``tools`` itself and its model answers
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes,
  Qwen 2.5/3, SmolLM3);
* ``llama3``: the template renders ``tools`` and its model answers a bare
  ``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``;
* ``mistral``, ``mistral_args``, ``granite``, ``deepseek``: the template renders
  tools and its model answers in its family's own markup (text/tool_formats.py);
* ``fallback``: the template knows no tools (SmolLM2's does not). The tool
  definitions then go into the system message as :data:`FALLBACK_PROMPT`
  describes them, in the Hermes format (into the first user turn where the
  template refuses a system turn, as Gemma's do), and so do earlier calls (as
  ``<tool_call>`` text in the assistant turn) and their results (a user turn
  holding ``<tool_response>...</tool_response>``).

A format is a str with what probing the template found (:class:`ToolFormat`):
whether it takes a system turn, whether it writes the ``tool_calls`` of an
earlier turn (if not, they are written into its text in the family's markup),
and whether it wants Mistral's call ids (9 alphanumerics: every id is then
mapped to one, the same way in a call and in its result).

Parsing accepts any of the shapes whatever the format, since models
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

import jinja2

from ..errors import CtxError
from . import tool_formats
from .grammar import JSON_OPTIONS, Grammar, GrammarError
from .json_bounds import bounded_schema
from .tool_formats import entries, skip_space

FALLBACK_PROMPT = (
    "You have access to the following functions. To call a function, reply with a JSON object "
    "inside <tool_call></tool_call> tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}}\n</tool_call>\nYou may call several functions, one tag each. Function results "
    "come back inside <tool_response></tool_response> tags.\nFunctions:\n<tools>\n{tools}\n</tools>"
)
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_DECODER = json.JSONDecoder()
_PYTHON_TAG = "<|python_tag|>"
_OPENINGS = (_OPEN, *tool_formats.OPENINGS)  # where a call may begin mid-reply


NO_PARAMETERS = {"type": "object", "properties": {}}  # OpenAI's omitted parameters: arguments {} (not made up)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str = ""
    parameters: dict = field(default_factory=lambda: dict(NO_PARAMETERS))
    spec: dict | None = field(default=None, compare=False, repr=False)  # the function as the client sent it

    def openai(self) -> dict:
        """The shape chat templates expect (``tools`` as transformers passes them): the client's
        own function object where there is one (``strict`` and all), else one built."""
        if self.spec is not None:
            return {"type": "function", "function": self.spec}
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


def not_an_object(params: dict) -> str | None:
    """What is wrong with a tool's parameters schema that is no object's (a call's arguments
    are an object), in words after "parameters"; None where it may be one."""
    if "type" in params and params["type"] != "object":
        return f'must be the schema of an object ("type": "object"), not of type {json.dumps(params["type"])}'[:300]
    return None


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
        params = f.get("parameters") or dict(NO_PARAMETERS)
        if not isinstance(params, dict):
            raise CtxError(f"tool {f['name']!r}: parameters must be a JSON schema object")
        if (wrong := not_an_object(params)) is not None:
            raise CtxError(f"tool {f['name']!r}: parameters {wrong}")
        spec = dict(f) if "function" in t else {k: v for k, v in f.items() if k != "type"}
        out.append(Tool(f["name"], f.get("description") or "", params, spec))
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
class ToolFormat(str):
    """A format's name (compares as the str it is) with what probing the template found."""
    system: bool = True        # it takes a system turn (where the fallback prompt goes)
    calls: bool = True         # it writes an earlier turn's tool_calls (else: written into its text)
    short_ids: bool = False    # it wants call ids of 9 alphanumerics (Mistral Nemo, Small 3.x)

    @classmethod
    def of(cls, name: str, **found) -> "ToolFormat":
        fmt = cls(name)
        fmt.__dict__.update(found)
        return fmt


@functools.lru_cache(maxsize=64)
def tool_format(template) -> ToolFormat:
    """The format (``hermes``, ``llama3``, a family's, or ``fallback``) for a ChatTemplate (or None)."""
    if template is None:
        return ToolFormat("fallback")
    if not _renders_tools(template):
        system = _probe(template, [{"role": "system", "content": "x"}, _USER], tools=False) is not None
        return ToolFormat.of("fallback", system=system)
    source = template.source
    name = tool_formats.family(source)
    if name is None:
        name = "llama3" if _PYTHON_TAG in source or ("ipython" in source and "parameters" in source) else "hermes"
    long_ids, short = _probe(template, _history("call_" + "0" * 24)), _probe(template, _history("a1B2c3D4e"))
    return ToolFormat.of(name, calls=short is None or _PROBE.name + "_call" in short,
                         short_ids=long_ids is None and short is not None)


_PROBE = Tool("ctx_probe_tool_7c1e", "probe", {
    "type": "object", "properties": {"city": {"type": "string", "description": "a city"}}, "required": ["city"]})


def _renders_tools(template) -> bool:
    """Whether the template writes the tools it is given (probed with a marker tool)."""
    text = _probe(template, [_USER])
    return text is not None and _PROBE.name in text


_USER = {"role": "user", "content": "hi"}


def _history(call_id: str) -> list[dict]:
    call = {"type": "function", "id": call_id, "function": {"name": _PROBE.name + "_call", "arguments": {"city": "x"}}}
    return [_USER, {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "ok", "tool_call_id": call_id, "name": _PROBE.name + "_call"}]


def _probe(template, turns: list[dict], tools: bool = True) -> str | None:
    """The template's text for the turns (with the probe tool), or None where it refuses them."""
    try:
        return template.render(turns, tools=[_PROBE.openai()] if tools else None)
    except Exception:  # a template that chokes on this shape does not support it
        return None


# -- rendering ------------------------------------------------------------------
def template_messages(messages: Sequence[dict], tools: Sequence[Tool], fmt: str) -> tuple[list[dict], dict]:
    """Messages (roles system/user/assistant/tool; assistant ``tool_calls`` as
    ToolCall lists) as the template takes them, and the template variables. No tools:
    ``tools`` is left undefined, as for a conversation without calls (an empty list
    made templates write a tool preamble around nothing)."""
    if fmt == "fallback":
        prompt = FALLBACK_PROMPT.format(tools="\n".join(json.dumps(t.openai(), ensure_ascii=False) for t in tools))
        return tool_formats.fallback_messages(messages, prompt if tools else None, getattr(fmt, "system", True)), {}
    short, native = getattr(fmt, "short_ids", False), getattr(fmt, "calls", True)
    out, pending = [], []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            calls = [ToolCall(c.name, c.arguments, tool_formats.short_id(c.id) if short else c.id)
                     for c in m["tool_calls"]]
            pending = [c.id for c in calls]
            if native:
                m["tool_calls"] = [{"type": "function", "id": c.id,
                                    "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
            else:  # a template that drops them (Granite) or cannot take them (DeepSeek's want content None)
                del m["tool_calls"]
                sep = "\n" if m.get("content") and fmt in ("hermes", "llama3") else ""
                m["content"] = (m.get("content") or "") + sep + tool_formats.written(fmt, calls)
        elif m.get("role") == "tool" and short:
            given = m.get("tool_call_id")
            m["tool_call_id"] = tool_formats.short_id(given) if isinstance(given, str) and given else \
                (pending.pop(0) if pending else tool_formats.short_id(""))
        out.append(m)
    return out, {"tools": [t.openai() for t in tools] if tools else jinja2.Undefined(name="tools")}


# -- forcing a call -------------------------------------------------------------
def forced_call_grammar(tools: Sequence[Tool], choice: ToolChoice, fmt: str, before: str = "") -> Grammar:
    """A grammar whose every sentence is one well-formed call of an allowed tool: in Hermes
    tags, Llama 3's bare JSON, or for Mistral and Granite the JSON list that follows their
    ``[TOOL_CALLS]`` / ``<|tool_call|>`` (a control token, which the grammar cannot write:
    the model's own marker is masked, and the list it goes on with parses as bare JSON).
    ``before``: text before the Hermes tag (a call begun mid-reply, text/lazy_calls.py)."""
    allowed = [t for t in tools if choice.mode != "named" or t.name == choice.name]
    key = "parameters" if fmt == "llama3" else "arguments"
    calls, defs = [], {}
    for i, t in enumerate(allowed):
        try:  # a schema that cannot be compiled is named as the tool's, not as the call wrapper's
            Grammar.json_schema(t.parameters or NO_PARAMETERS).compiled()
        except GrammarError as err:
            raise GrammarError(f"tool {t.name!r}: its parameters are an {err}") from None
        # Each tool's schema is a root of its own: it moves under the wrapper's $defs, and its
        # local refs ("#", "#/$defs/X", "#/properties/x") are rewritten to point into it there.
        where = f"ctx_tool{i}"
        defs[where] = tool_formats.rooted(t.parameters or NO_PARAMETERS, f"#/$defs/{where}")
        calls.append({"type": "object", "properties": {"name": {"const": t.name}, key: {"$ref": f"#/$defs/{where}"}},
                      "required": ["name", key], "additionalProperties": False})
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    schema = bounded_schema({**schema, "$defs": defs})
    schema["x-guidance"] = JSON_OPTIONS
    body = f"call: %json {json.dumps(schema, ensure_ascii=False)}"
    if fmt == "llama3":
        return Grammar("lark", f"start: call\n{body}")
    if fmt in ("mistral", "mistral_args", "granite"):
        return Grammar("lark", f'start: "[" call "]"\n{body}')
    opening = json.dumps(before + _OPEN + "\n", ensure_ascii=False)
    return Grammar("lark", f'start: {opening} call "\\n{_CLOSE}"\n{body}')


# -- parsing ----------------------------------------------------------------------
def parse_tool_calls(text: str, names: Collection[str] | None = None) -> tuple[str, list[ToolCall]]:
    """(the text that is not a call, the calls) of a reply, in any of the formats.
    ``names``: the tools offered; what names another (a JSON reply with a "name"
    field, say) is no call but text (None: any name)."""
    for found in (_tagged(text, names) if _OPEN in text else (), tool_formats.blocks(text, names)):
        calls, rest, pos = [], [], 0
        for start, end, got in found:
            rest.append(text[pos:start])
            pos = end
            calls.extend(ToolCall(n, a, i) if i else ToolCall(n, a) for n, a, i in got)
        if calls:
            rest.append(text[pos:])
            return "".join(rest).strip(), calls
    body = text.strip()
    if body.startswith(_PYTHON_TAG):
        body = body[len(_PYTHON_TAG):].strip()
    calls = _call(body, names) if body[:1] in ("{", "[") else None
    return ("", calls) if calls else (text, [])


def _tagged(text: str, names: Collection[str] | None) -> Iterator[tuple[int, int, list]]:
    """(start, end, entries) of each ``<tool_call>`` JSON ``</tool_call>`` in the text (the
    closing tag, or the end of it, may be cut off at the text's end: ``</tool`` there is
    what max_tokens left of it). The JSON value is read whole, so a string in it may hold
    the closing tag itself (a regex up to the first one cut such a call)."""
    start = text.find(_OPEN)
    while start != -1:
        at = skip_space(text, start + len(_OPEN))
        try:
            value, end = _DECODER.raw_decode(text, at)
        except ValueError:
            value, end = None, -1
        after = skip_space(text, end) if end >= 0 else -1
        call = entries(value, names) if end >= 0 else None
        if call is not None and (text.startswith(_CLOSE, after) or _CLOSE.startswith(text[after:])):
            end = min(after + len(_CLOSE), len(text))
            yield start, end, call
            start = text.find(_OPEN, end)
        else:
            start = text.find(_OPEN, start + len(_OPEN))


def _call(text: str, names: Collection[str] | None) -> list[ToolCall] | None:
    """The calls the JSON values of the text hold (an object or a list of them, or several
    joined by ``;``, each naming one of ``names``), or None."""
    found = [entries(v, names) for v in tool_formats.joined_values(text) or [None]]
    return [ToolCall(n, a) for got in found for n, a, _ in got] if all(found) else None
