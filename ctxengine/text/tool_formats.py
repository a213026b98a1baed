"""Tool-call shapes of model families, beyond Hermes' ``<tool_call>`` (text/tools.py).

Each shape as the family's own chat template writes an earlier call (the
templates in tests/data/templates) and as llama.cpp's common/chat.cpp parses it:

* ``mistral`` (Mistral Nemo, Small 3.1): ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}]``;
* ``mistral_args`` (Mistral Small 3.2, Devstral, Magistral):
  ``[TOOL_CALLS]name[ARGS]{...}``, a call each, optionally with ``[CALL_ID]id``
  before ``[ARGS]`` (without ``[ARGS]``: ``[TOOL_CALLS]name{...}``);
* ``granite`` (Granite 3.x; Phi-4-mini adds a closing ``<|/tool_call|>``):
  ``<|tool_call|>[{"name": ..., "arguments": {...}}]``;
* ``deepseek`` (DeepSeek R1 and its distills): ``<｜tool▁calls▁begin｜>``, then per call
  ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>name\\n```json\\n{...}\\n```<｜tool▁call▁end｜>``
  (V3.1: ``<｜tool▁call▁begin｜>name<｜tool▁sep｜>{...}<｜tool▁call▁end｜>``), then
  ``<｜tool▁calls▁end｜>``.

The markers are special tokens, and a reply's text holds them as their text
(the stream decoder keeps special tokens: state/context.py), so parsing works
on the detokenized reply. A closing marker cut off at the reply's end is no
obstacle. Parsers give (name, arguments, id the model wrote or None) entries.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Callable, Collection, Iterator

MISTRAL, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
GRANITE, GRANITE_END = "<|tool_call|>", "<|/tool_call|>"
DS_CALLS, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
OPENINGS = (MISTRAL, GRANITE, DS_CALLS, DS_CALL)  # where a call of these shapes begins

Entry = tuple  # (name, arguments dict, id or None)
_DECODER = json.JSONDecoder()
_NAME = re.compile(r"[A-Za-z0-9_.:\-]+")
_FENCE = re.compile(r"```(?:json)?")
_SHORT_ID = re.compile(r"[A-Za-z0-9]{9}")
_ALNUM = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def short_id(call_id: str) -> str:
    """The id as Mistral's templates take it (9 alphanumerics): itself if it is one, else
    one derived from it (the same every time, so a call and its result still match)."""
    if _SHORT_ID.fullmatch(call_id):
        return call_id
    n = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    return "".join(_ALNUM[(n // 62 ** i) % 62] for i in range(9))


def skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def entries(value: object, names: Collection[str] | None) -> list[Entry] | None:
    """The calls one JSON value holds (an object or a list of them, each naming one
    of ``names`` (None: any), arguments an object or its JSON text), or None."""
    items = value if isinstance(value, list) else [value]
    out = []
    for v in items:
        if not isinstance(v, dict) or not isinstance(v.get("name"), str) or (names is not None
                                                                           and v["name"] not in names):
            return None
        args = _object(v.get("arguments", v.get("parameters", {})))
        if args is None:
            return None
        out.append((v["name"], args, v["id"] if isinstance(v.get("id"), str) and v["id"] else None))
    return out or None


def joined_values(text: str) -> list | None:
    """The JSON values of a whole text that is one value, or several joined by ``;`` (Llama
    3.2's way of writing more than one call); None where the text is anything else."""
    values, at = [], 0
    while True:
        try:
            value, end = _DECODER.raw_decode(text, at)
        except ValueError:
            return None
        values.append(value)
        at = skip_space(text, end)
        if at < len(text) and text[at] == ";":
            at = skip_space(text, at + 1)
        elif at < len(text):
            return None
        if at == len(text):
            return values


def _object(args: object) -> dict | None:
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    return args if isinstance(args, dict) else None


def _json(text: str, i: int) -> tuple[object, int]:
    """The JSON value at i and where it ends; ValueError if none."""
    return _DECODER.raw_decode(text, skip_space(text, i))


def _named(name: str, names: Collection[str] | None) -> bool:
    return bool(_NAME.fullmatch(name)) and (names is None or name in names)


# -- one block each: (end, entries) for the block at ``at`` (its opening marker), or None
def _mistral(text: str, at: int, names) -> tuple[int, list[Entry]] | None:
    i = skip_space(text, at + len(MISTRAL))
    if text[i:i + 1] in ("[", "{"):  # Nemo / Small 3.1: a JSON list of calls
        value, end = _json(text, i)
        found = entries(value, names)
        return (end, found) if found else None
    out: list[Entry] = []
    while True:  # Small 3.2: name[CALL_ID]id[ARGS]{...}, each after its own [TOOL_CALLS]
        stops = [p for p in (text.find(ARGS, i), text.find(CALL_ID, i), text.find("{", i)) if p >= 0]
        if not stops:
            return None
        cut = min(stops)
        name, call_id = text[i:cut].strip(), None
        if not _named(name, names):
            return None
        if text.startswith(CALL_ID, cut):
            args_at = text.find(ARGS, cut)
            if args_at < 0:
                return None
            call_id, cut = text[cut + len(CALL_ID):args_at].strip() or None, args_at
        if text.startswith(ARGS, cut):
            cut += len(ARGS)
        value, end = _json(text, cut)
        args = _object(value)
        if args is None:
            return None
        out.append((name, args, call_id))
        nxt = skip_space(text, end)
        if not text.startswith(MISTRAL, nxt):
            return end, out
        i = skip_space(text, nxt + len(MISTRAL))


def _granite(text: str, at: int, names) -> tuple[int, list[Entry]] | None:
    value, end = _json(text, at + len(GRANITE))
    found = entries(value, names)
    if not found:
        return None
    after = skip_space(text, end)
    return (after + len(GRANITE_END) if text.startswith(GRANITE_END, after) else end), found


def _deepseek(text: str, at: int, names) -> tuple[int, list[Entry]] | None:
    i = at + len(DS_CALLS) if text.startswith(DS_CALLS, at) else at
    out: list[Entry] = []
    while True:
        i = skip_space(text, i)
        if not text.startswith(DS_CALL, i):
            break
        sep = text.find(DS_SEP, i)
        if sep < 0:
            return None
        head, j = text[i + len(DS_CALL):sep].strip(), sep + len(DS_SEP)
        if head == "function" and text[skip_space(text, j):][:1] != "{":  # R1: function<sep>name\n```json
            line = text.find("\n", j)
            name, j = (text[j:line] if line >= 0 else text[j:]).strip(), (line if line >= 0 else len(text))
            fence = _FENCE.match(text, skip_space(text, j))
            j = fence.end() if fence else j
        else:  # V3.1: name<sep>{...}
            name = head
        value, j = _json(text, j)
        args = _object(value)
        if args is None or not _named(name, names):
            return None
        out.append((name, args, None))
        j = skip_space(text, j)
        fence = _FENCE.match(text, j)
        j = skip_space(text, fence.end()) if fence else j
        if text.startswith(DS_CALL_END, j):
            j += len(DS_CALL_END)
        elif j < len(text):
            return None
        i = j
    if not out:
        return None
    j = skip_space(text, i)
    return (j + len(DS_CALLS_END) if text.startswith(DS_CALLS_END, j) else i), out


_PARSERS: dict[str, Callable] = {MISTRAL: _mistral, GRANITE: _granite, DS_CALLS: _deepseek, DS_CALL: _deepseek}


def blocks(text: str, names: Collection[str] | None) -> Iterator[tuple[int, int, list[Entry]]]:
    """(start, end, entries) of each call block of these shapes in the text, in order."""
    pos = 0
    while True:
        found = [(text.find(m, pos), m) for m in OPENINGS]
        found = [(at, m) for at, m in found if at >= 0]
        if not found:
            return
        at, marker = min(found)
        try:
            got = _PARSERS[marker](text, at, names)
        except ValueError:  # no JSON where the shape has it
            got = None
        if got is None:
            pos = at + len(marker)
            continue
        yield at, got[0], got[1]
        pos = got[0]


# -- writing an earlier call back, as the family writes it (templates that do not render tool_calls)
def written(fmt: str, calls: list) -> str:
    """Calls (ToolCall-like: name, arguments, id) as the model of ``fmt`` writes them."""
    def dumps(v):
        return json.dumps(v, ensure_ascii=False)
    if fmt == "mistral":
        return MISTRAL + dumps([{"name": c.name, "arguments": c.arguments, "id": c.id} for c in calls])
    if fmt == "mistral_args":
        return "".join(f"{MISTRAL}{c.name}{ARGS}{dumps(c.arguments)}" for c in calls)
    if fmt == "granite":
        return GRANITE + dumps([{"name": c.name, "arguments": c.arguments} for c in calls])
    if fmt == "deepseek":
        return DS_CALLS + "\n".join(f"{DS_CALL}function{DS_SEP}{c.name}\n```json\n{dumps(c.arguments)}\n```"
                                    f"{DS_CALL_END}" for c in calls) + DS_CALLS_END
    if fmt == "llama3":
        listed = [{"name": c.name, "parameters": c.arguments} for c in calls]
        return dumps(listed[0] if len(listed) == 1 else listed)
    return "\n".join(f"<tool_call>\n{dumps({'name': c.name, 'arguments': c.arguments})}\n</tool_call>" for c in calls)


def family(source: str) -> str | None:
    """The call format a template's source shows (for a template that renders tools), or None."""
    if MISTRAL in source:
        return "mistral_args" if ARGS in source else "mistral"
    if GRANITE in source:
        return "granite"
    if "tool▁calls▁begin" in source:
        return "deepseek"
    return None


def fallback_messages(messages, prompt: str | None, system: bool) -> list[dict]:
    """The messages for a template that knows no tools (text/tools.py, format ``fallback``):
    calls as ``<tool_call>`` text, results as user turns, and ``prompt`` (the tools) in the
    system message, or where the template takes no system turn (Gemma's), the first user turn."""
    out = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            calls = written("hermes", m["tool_calls"])
            out.append({"role": "assistant", "content": f"{content}\n{calls}" if content else calls})
        elif role == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
        else:
            out.append({"role": role, "content": content})
    if prompt:
        first = out[0] if out else None
        if first is not None and first["role"] == "system":
            out[0] = {"role": "system", "content": f"{first['content']}\n\n{prompt}"}
        elif system or first is None or first["role"] != "user":
            out.insert(0, {"role": "system", "content": prompt})
        else:
            out[0] = {"role": "user", "content": f"{prompt}\n\n{first['content']}"}
    return out


def rooted(schema, root: str):
    """``schema`` with every local ``$ref`` (``#...``) made relative to ``root`` instead."""
    if isinstance(schema, dict):
        return {k: (root + v[1:] if k == "$ref" and isinstance(v, str) and v.startswith("#") else rooted(v, root))
                for k, v in schema.items()}
    if isinstance(schema, list):
        return [rooted(v, root) for v in schema]
    return schema
