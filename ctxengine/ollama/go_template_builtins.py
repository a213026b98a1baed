"""The functions a Go template calls: text/template's builtins and Ollama's own.

Comparison, ``len``, ``index`` and ``slice`` follow text/template's funcs.go
(``len``, ``slice`` and ``index`` on a string count bytes); ``print``,
``printf`` and ``println`` follow fmt, ``printf`` with its verbs' answers to a
value of the wrong type (``%!d(float64=1.5)``), a missing or an extra operand
and a trailing ``%``.  Flags, widths and the verbs we do not model raise
UnsupportedTemplateError.  ``and``/``or`` are the executor's, being lazy.
"""
from __future__ import annotations

from datetime import date, timedelta
from typing import Any

from ..errors import UnsupportedTemplateError
from .go_template_values import (GoStruct, JSONList, JSONMap, PropertyType, Slice, go_float, go_json, kind_of,
                                 to_text, truth)


def _compare(op: str, a: Any, b: Any) -> bool:
    ka, kb = kind_of(a), kind_of(b)
    if op in ("eq", "ne") and "nil" in (ka, kb):  # a nil slice or map equals nil too
        return (_is_nil(a) and _is_nil(b)) == (op == "eq")
    if ka != kb or ka in ("other", "nil") or (ka == "bool" and op not in ("eq", "ne")):
        raise UnsupportedTemplateError(f"template: {op}: incompatible types for comparison ({ka}, {kb})")
    return {"eq": a == b, "ne": a != b, "lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b}[op]


def _is_nil(v: Any) -> bool:
    return v is None or getattr(v, "nil", False)


def _length(v: Any) -> int:
    if isinstance(v, str):
        return len(v.encode())
    if isinstance(v, (list, tuple, dict)):
        return len(v)
    raise UnsupportedTemplateError(f"template: len of {kind_of(v)}")


def _index(v: Any, *keys: Any) -> Any:
    if v is None:
        raise UnsupportedTemplateError("template: index of untyped nil")
    for k in keys:
        if isinstance(v, dict):  # every map a template sees is keyed by strings
            if not isinstance(k, str):
                raise UnsupportedTemplateError(f"template: index: value has type {_type_name(k)}; should be string")
            v = v.get(k, v.zero) if isinstance(v, JSONMap) else v.get(k)
        elif isinstance(v, (list, tuple, str)) and kind_of(k) == "int":
            seq = v.encode() if isinstance(v, str) else v
            if not 0 <= k < len(seq):
                raise UnsupportedTemplateError(f"template: index out of range: {k}")
            v = seq[k]
        else:
            raise UnsupportedTemplateError(f"template: can't index item of type {kind_of(v)}")
    return v


def _slice(v: Any, *bounds: Any) -> Any:
    if not isinstance(v, (list, tuple, str)) or len(bounds) > 2 or any(kind_of(b) != "int" for b in bounds):
        raise UnsupportedTemplateError("template: slice: unsupported arguments")
    seq = v.encode() if isinstance(v, str) else v
    lo = bounds[0] if bounds else 0
    hi = bounds[1] if len(bounds) > 1 else len(seq)
    if not 0 <= lo <= hi <= len(seq):
        raise UnsupportedTemplateError(f"template: slice: index out of range [{lo}:{hi}]")
    out = seq[lo:hi]
    if isinstance(v, str):
        return out.decode("utf-8", "replace")
    return type(v)(out) if isinstance(v, Slice) else list(out)  # a slice keeps its Go type


def _sprint(*args: Any) -> str:
    """fmt.Sprint: a space between operands when neither is a string."""
    out = ""
    for i, a in enumerate(args):
        if i and not isinstance(a, str) and not isinstance(args[i - 1], str):
            out += " "
        out += to_text(a, True)
    return out


# -- printf -----------------------------------------------------------------------------
_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}
_STRINGERS = (JSONMap, JSONList, PropertyType)


def _quote(text: str, quote: str = '"') -> str:
    """strconv.Quote (QuoteRune with quote="'"): Go's escapes for what is not printable."""
    out = [quote]
    for ch in text:
        if ch in (quote, "\\"):
            out.append("\\" + ch)
        elif ch.isprintable():  # Python's printable set is Go's unicode.IsPrint
            out.append(ch)
        elif ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}")
    return "".join(out) + quote


def _rune(n: int) -> str:
    return chr(n) if 0 <= n <= 0x10FFFF and not 0xD800 <= n <= 0xDFFF else "\ufffd"


def _type_name(v: Any) -> str:
    names = {"bool": "bool", "int": "int", "float": "float64", "string": "string"}
    if kind_of(v) not in names:
        raise UnsupportedTemplateError("template: printf of this value names a Go type we do not model")
    return names[kind_of(v)]


def _bad_verb(verb: str, v: Any) -> str:
    return f"%!{verb}(<nil>)" if v is None else f"%!{verb}({_type_name(v)}={to_text(v, True)})"


def _format(v: Any, verb: str) -> str:
    """fmt's printArg of one operand with a verb (no flags)."""
    if v is None:
        return "<nil>" if verb == "v" else _bad_verb(verb, v)
    if isinstance(v, (str, bool, int, float)):
        return _format_basic(v, verb)
    if isinstance(v, _STRINGERS) or (isinstance(v, GoStruct) and v.string):
        if verb in "vsqxX":  # fmt calls String() for these verbs
            return _format_basic(to_text(v), verb)
    elif isinstance(v, (list, tuple)):  # verbs apply to each element; a nil interface shows <nil>
        return "[" + " ".join(to_text(e, True) if e is None else _format(e, verb) for e in v) + "]"
    elif isinstance(v, dict):
        return "map[" + " ".join(f"{_format(k, verb)}:{'<nil>' if e is None else _format(e, verb)}"
                                 for k, e in sorted(v.items())) + "]"
    if verb == "v":
        return to_text(v, True)
    raise UnsupportedTemplateError(f"template: printf %{verb} of a struct is not supported")


def _format_basic(v: str | bool | int | float, verb: str) -> str:
    if isinstance(v, bool):
        return ("true" if v else "false") if verb in "tv" else _bad_verb(verb, v)
    if isinstance(v, int):
        formats = {"d": str, "v": str, "b": lambda n: format(n, "b"), "o": lambda n: format(n, "o"),
                   "O": lambda n: format(n, "#o"), "x": lambda n: format(n, "x"), "X": lambda n: format(n, "X"),
                   "c": _rune, "q": lambda n: _quote(_rune(n), "'")}
    elif isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            return go_float(v) if verb in "vgGeEfF" else _bad_verb(verb, v)
        formats = {"v": go_float, "g": go_float, "G": lambda x: go_float(x).upper(), "e": lambda x: f"{x:.6e}",
                   "E": lambda x: f"{x:.6E}", "f": lambda x: f"{x:.6f}", "F": lambda x: f"{x:.6f}"}
        if verb in "bxX":
            raise UnsupportedTemplateError(f"template: printf %{verb} of a float is not supported")
    else:
        formats = {"v": str, "s": str, "q": _quote, "x": lambda s: s.encode().hex(),
                   "X": lambda s: s.encode().hex().upper()}
    if verb == "U" and isinstance(v, int):
        raise UnsupportedTemplateError("template: printf %U is not supported")
    return formats[verb](v) if verb in formats else _bad_verb(verb, v)


def _sprintf(fmt: Any, *args: Any) -> str:
    if not isinstance(fmt, str):
        raise UnsupportedTemplateError("template: printf: the format must be a string")
    out, rest, i = [], list(args), 0
    while i < len(fmt):
        if fmt[i] != "%":
            j = fmt.find("%", i)
            j = len(fmt) if j < 0 else j
            out.append(fmt[i:j])
            i = j
            continue
        if i + 1 == len(fmt):
            out.append("%!(NOVERB)")
            break
        verb = fmt[i + 1]
        i += 2
        if verb in "+-# 0123456789.*[":
            raise UnsupportedTemplateError(f"template: printf flags and widths ({fmt!r}) are not supported")
        if verb in "Tp":
            raise UnsupportedTemplateError(f"template: printf %{verb} is not supported")
        out.append("%" if verb == "%" else _format(rest.pop(0), verb) if rest else f"%!{verb}(MISSING)")
    if rest:
        extra = ("<nil>" if a is None else f"{_type_name(a)}={to_text(a, True)}" for a in rest)
        out.append("%!(EXTRA " + ", ".join(extra) + ")")
    return "".join(out)


FUNCS = {
    "not": lambda a: not truth(a),
    "eq": lambda a, *bs: any(_compare("eq", a, b) for b in bs) if bs else arity_error("eq"),
    "ne": lambda a, b: _compare("ne", a, b),
    "lt": lambda a, b: _compare("lt", a, b),
    "le": lambda a, b: _compare("le", a, b),
    "gt": lambda a, b: _compare("gt", a, b),
    "ge": lambda a, b: _compare("ge", a, b),
    "len": _length, "index": _index, "slice": _slice,
    "print": _sprint, "printf": _sprintf,
    "println": lambda *a: " ".join(to_text(x, True) for x in a) + "\n",
    "json": go_json,
    "currentDate": lambda *_: date.today().isoformat(),
    "yesterdayDate": lambda *_: (date.today() - timedelta(days=1)).isoformat(),
}


def arity_error(name: str):
    raise UnsupportedTemplateError(f"template: wrong number of args for {name}")
