"""Object keys a JSON Schema does not list, made impossible to spell as keys it does.

llguidance writes a key the schema lists as its one literal text (``"a"``) and
lets any other key take ``additionalProperties``, where "any other" is decided
on the key's raw text, escapes and all: ``{"\\u0061": "x"}`` passed as an
additional key, and a JSON parser reads it as ``{"a": "x"}``, which the schema
forbids (``a`` is an integer); ``{"a": 1, "\\u0061": "x"}`` too, parsed as the
second value. A key of a ``patternProperties`` pattern, by contrast, is matched
on what it denotes: llguidance quotes the pattern's strings itself, with an
escape only where JSON needs one.

So :func:`exact_keys` rewrites, before compiling, an object whose listed
properties sit beside keys of its own choosing (``additionalProperties`` other
than false) into the same schema in JSON Schema's terms, with those keys as a
pattern: ``additionalProperties: X`` becomes ``patternProperties: {R: X}`` and
``additionalProperties: false``, where ``R`` matches every string but the
listed names (:func:`not_names`, a regular expression built from their trie:
no look-ahead, which llguidance lacks). A key is then either a listed name,
written as such, or a string that is none of them, however it is spelled.
Names that need escapes themselves (a quote, a backslash, a newline, U+0001)
are listed as before; an unlisted key may still hold such characters.

An object that has patterns of its own and keys beyond them cannot be written
so (the keys matching no pattern have no regex without a complement); for a
schema with one, :func:`exact_keys` says so, and the compiler is told to allow
no ``\\uXXXX`` escape at all (``json_allowed_escapes``): every string is then
written one way, its key checked against the patterns as it reads, at the cost
of the control characters that only ``\\u`` can write (U+0001, DEL) in that
schema's strings. So is a rewrite llguidance refuses (:func:`schema_variants`:
it intersects the branches of an ``allOf`` it cannot merge, and wants their
patterns disjoint). A forced tool call's Lark grammar gets the same for each of
its ``%json`` schemas (:func:`lark_variants`).
"""
from __future__ import annotations

import json
import re
from typing import Any

from .json_bounds import _SCHEMA_LISTS, _SCHEMA_MAPS, _SCHEMA_ONE

# The escapes a string may use where every string must be spelled one way (no \u).
NO_UNICODE_ESCAPES = "nrbtf\\\""
_META = set("\\^$.|?*+()[]{}/-")


def schema_variants(schema: Any) -> list[tuple[Any, dict]]:
    """The bounded schema as llguidance should compile it, best first: (schema, options to add).
    The rewrite, else where llguidance refuses it (it intersects the branches of an ``allOf``
    it could not merge, and wants their patterns disjoint) the schema as it is, with no \\u."""
    exact, loose = exact_keys(schema)
    no_u = {"json_allowed_escapes": NO_UNICODE_ESCAPES}
    if isinstance(schema, dict) and isinstance(schema.get("x-guidance"), dict):  # its own options win
        schema = {**schema, "x-guidance": {**schema["x-guidance"], **no_u}} if loose or exact != schema else schema
    if loose:
        return [(schema, no_u)]
    return [(schema, {})] if exact == schema else [(exact, {}), (schema, no_u)]


def lark_variants(source: str) -> list[str]:
    """A Lark grammar's ``%json`` schemas (a forced tool call's) as :func:`schema_variants`
    gives them, best first; [source] where none needs a change."""
    spans, decoder = [], json.JSONDecoder()
    for m in re.finditer(r"%json\s*", source):
        try:
            schema, end = decoder.raw_decode(source, m.end())
        except ValueError:
            continue
        spans.append((m.end(), end, schema_variants(schema) if isinstance(schema, dict) else [(schema, {})]))
    if all(len(v) == 1 and not v[0][1] for _, _, v in spans):
        return [source]
    out = []
    for pick in (0, -1):
        text, at = [], 0
        for start, end, variants in spans:
            schema, extra = variants[pick]
            if extra:
                schema = {**schema, "x-guidance": {**schema.get("x-guidance", {}), **extra}}
            text += [source[at:start], json.dumps(schema, ensure_ascii=False)]
            at = end
        out.append("".join(text) + source[at:])
    return out


def exact_keys(schema: Any) -> tuple[Any, bool]:
    """``schema`` with every object's unlisted keys kept from spelling a listed one (see the
    module's doc), and whether it has an object the rewrite cannot cover (then no \\u escapes)."""
    found = [False]
    return _rewrite(schema, found), found[0]


def _rewrite(s: Any, found: list[bool]) -> Any:
    if isinstance(s, list):
        return [_rewrite(x, found) for x in s]
    if not isinstance(s, dict):
        return s
    out = dict(s)
    for key in _SCHEMA_LISTS:
        if isinstance(s.get(key), list):
            out[key] = [_rewrite(x, found) for x in s[key]]
    for key in _SCHEMA_MAPS:
        if isinstance(s.get(key), dict):
            out[key] = {k: _rewrite(v, found) for k, v in s[key].items()}
    for key in _SCHEMA_ONE:
        if key in s:
            out[key] = _rewrite(s[key], found)
    extra = out.get("additionalProperties", True)
    if extra is False:
        return out
    if out.get("patternProperties"):
        found[0] = True
        return out
    props = out.get("properties") if isinstance(out.get("properties"), dict) else {}
    required = out.get("required") if isinstance(out.get("required"), list) else []
    names = list(props) + [k for k in required if isinstance(k, str) and k not in props]
    if not names:
        return out  # no listed keys: llguidance's key is any string, quoted the one way
    out["properties"] = {**props, **{k: extra for k in names if k not in props}}
    out["patternProperties"] = {not_names(names): extra}
    out["additionalProperties"] = False
    return out


def not_names(names: list[str]) -> str:
    """A regular expression (JSON Schema's dialect, anchored) matching every string but ``names``:
    one that leaves their trie at some character (then anything), or ends inside it where no
    name ends. The "then anything" is written once: repeated at every node, it made llguidance
    take a second to build a matcher for sixty properties."""
    trie: dict = {}
    for name in names:
        node = trie
        for ch in name:
            node = node.setdefault(ch, {})
        node[None] = {}  # the end of a name
    short = _ends_inside(trie)
    return f"^(?:{_leaves(trie)}[\\s\\S]*" + (f"|{short}" if short is not None else "") + ")$"


def _leaves(node: dict) -> str:
    """The strings that reach a character no name has next, from this trie node on (that one included)."""
    chars = sorted(ch for ch in node if ch is not None)
    alts = [_not_one_of(chars)] + [_escape(ch) + _leaves(node[ch]) for ch in chars]
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def _ends_inside(node: dict) -> str | None:
    """The strings that end, from this trie node on, on a node where no name ends; None: none do."""
    alts = [] if None in node else [""]
    alts += [_escape(ch) + rest for ch in sorted(c for c in node if c is not None)
             if (rest := _ends_inside(node[ch])) is not None]
    return None if not alts else alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def _not_one_of(chars: list[str]) -> str:
    """Any one character but ``chars``. llguidance quotes some classes wrongly: one that holds
    a control character but not '"' or '\\' also lets a key take \\" and \\\\ there (so did
    [^"]). Where a name has '"' or '\\' next, the class leaves out every control character
    (a key may not differ from the name by one at that place) and the other of the two is
    an alternative of its own."""
    if not {'"', "\\"} & set(chars):
        return f"[^{''.join(_escape(ch) for ch in chars)}]" if chars else "[\\s\\S]"
    quotes = [_escape(ch) for ch in ('"', "\\") if ch not in chars]
    shut = "".join(_escape(ch) for ch in chars if ch not in '"\\')
    return "(?:" + "|".join([f'[^{shut}"\\\\\\x00-\\x1f\\x7f]'] + quotes) + ")"


def _escape(ch: str) -> str:
    if ch in _META:
        return "\\" + ch
    if ord(ch) < 0x20 or ord(ch) == 0x7F:
        return f"\\x{ord(ch):02x}"
    return ch
