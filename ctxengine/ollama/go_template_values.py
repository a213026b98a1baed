"""Go values as a template sees them, in Python: types, truth, printing, builtins.

Go values are mapped as: ``dict`` = a Go map (a missing key is the zero value,
nil, which prints ``<no value>``), ``GoStruct`` = a struct (an unknown field is
an error), ``list``/``tuple`` = a slice, and str/bool/int/float/None as
themselves.  Truth is Go's: false, 0, nil and empty strings, slices and maps
are false; a struct is always true.  ``len``, ``slice`` and ``index`` on a
string count bytes, as Go does.  A value whose Go type has a ``String()``
method that renders JSON (Ollama's tool and argument types) is a GoStruct
with ``json`` set, or a ``JSONMap`` / ``JSONList``.  Errors raise
UnsupportedTemplateError (the caller falls back to the GGUF's template).
"""
from __future__ import annotations

import json
import math
import re
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

from ..errors import UnsupportedTemplateError


class GoStruct:
    """A Go struct value: named fields, optionally printed as JSON (a String() method)."""

    def __init__(self, fields: dict[str, Any], *, json: Any = None):
        self.fields = fields
        self.json = json

    def __repr__(self) -> str:
        return f"GoStruct({self.fields!r})"


class JSONMap(dict):
    """A Go map whose String() method is its JSON (Ollama's templateArgs/templateProperties)."""


class JSONList(list):
    """A Go slice whose String() method is its JSON (Ollama's templateTools)."""


class StructJSON(dict):
    """A JSON object in Go struct field order (json.Marshal sorts only map keys)."""


def go_json(value: Any) -> str:
    """encoding/json Marshal: compact, map keys sorted, struct fields in order, <>& escaped
    as \\u003c..., floats as Go writes a float64.  A value Marshal refuses (NaN, an
    infinity) gives "", as Ollama's String() methods print a failed Marshal."""
    try:
        return _encode(value)
    except ValueError:
        return ""


def _encode(value: Any) -> str:
    if isinstance(value, GoStruct):
        return _encode(value.json if value.json is not None else StructJSON(value.fields))
    if isinstance(value, dict):
        keys = value if isinstance(value, StructJSON) else sorted(value, key=str)
        return "{" + ",".join(f"{_json_string(str(k))}:{_encode(value[k])}" for k in keys) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_encode(v) for v in value) + "]"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _json_float(value)
    if isinstance(value, str):
        return _json_string(value)
    raise UnsupportedTemplateError(f"template: cannot marshal a {type(value).__name__} value")


def _json_string(text: str) -> str:
    out = json.dumps(text, ensure_ascii=False)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                          ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        out = out.replace(char, escaped)
    return out


def _digits(x: float) -> tuple[str, str, int]:
    """A finite non-zero float as (sign, shortest digits, decimal point position):
    1.25 -> ("", "125", 1), 0.001 -> ("", "1", -2).  Python's repr and Go's strconv
    both give the shortest digits that read back as the same float64."""
    sign, digits, exp = Decimal(repr(x)).normalize().as_tuple()
    ds = "".join(map(str, digits))
    return ("-" if sign else ""), ds, len(ds) + exp


def _fixed(ds: str, point: int) -> str:
    if point <= 0:
        return "0." + "0" * -point + ds
    if point >= len(ds):
        return ds + "0" * (point - len(ds))
    return ds[:point] + "." + ds[point:]


def _json_float(x: float) -> str:
    """encoding/json's float64: strconv 'f' with the shortest digits, or 'e' below 1e-6
    and from 1e21 on, its exponent at least two digits but e-07 cleaned to e-7."""
    if x != x or x in (float("inf"), float("-inf")):
        raise ValueError("json: unsupported value")
    if x == 0:
        return "-0" if math.copysign(1.0, x) < 0 else "0"
    sign, ds, point = _digits(x)
    if abs(x) < 1e-6 or abs(x) >= 1e21:
        e = point - 1
        mant = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
        return f"{sign}{mant}e-{-e}" if e < 0 else f"{sign}{mant}e+{e:02d}"
    return sign + _fixed(ds, point)


def truth(value: Any) -> bool:
    if isinstance(value, GoStruct):
        return True
    return bool(value)


def _go_float(x: float) -> str:
    """strconv.FormatFloat(x, 'g', -1, 64), which %v uses: shortest digits, an exponent
    when it is below -4 or at least 6 (2e6 prints as 2e+06, 123456.0 as 123456)."""
    if x != x or x in (float("inf"), float("-inf")):
        return {"nan": "NaN", "inf": "+Inf", "-inf": "-Inf"}[repr(x)]
    if x == 0:
        return "-0" if math.copysign(1.0, x) < 0 else "0"
    sign, ds, point = _digits(x)
    e = point - 1
    if e < -4 or e >= 6:
        mant = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
        return f"{sign}{mant}e{'-' if e < 0 else '+'}{abs(e):02d}"
    return sign + _fixed(ds, point)


def go_any(value: Any) -> Any:
    """A JSON value as Go's encoding/json decodes it into ``any``: every number a float64
    (so 2 prints as 2, 12345678901234567890 as 12345678901234567000, 1e-7 as 1e-07)."""
    if isinstance(value, bool) or value is None or isinstance(value, (str, float)):
        return value
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:  # beyond float64: Go's decoder refuses it; keep the digits
            return value
    if isinstance(value, dict):
        return {k: go_any(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [go_any(v) for v in value]
    return value


def to_text(value: Any) -> str:
    """fmt's %v of a value, as a template action prints it."""
    if value is None:
        return "<no value>"
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _go_float(value)
    if isinstance(value, (JSONMap, JSONList)) or (isinstance(value, GoStruct) and value.json is not None):
        return go_json(value)
    if isinstance(value, (list, tuple)):
        return "[" + " ".join(_inner_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{_inner_text(k)}:{_inner_text(v)}" for k, v in sorted(value.items())) + "]"
    raise UnsupportedTemplateError(f"template: cannot print a {type(value).__name__} value")


def _inner_text(value: Any) -> str:
    return "<nil>" if value is None else to_text(value)


# -- builtins ---------------------------------------------------------------------------
def kind_of(v: Any) -> str:
    if v is None:
        return "nil"
    for kind, types in (("bool", bool), ("int", int), ("float", float), ("string", str)):
        if isinstance(v, types):
            return kind
    return "other"


def _compare(op: str, a: Any, b: Any) -> bool:
    ka, kb = kind_of(a), kind_of(b)
    if op in ("eq", "ne") and "nil" in (ka, kb):
        return (a is None and b is None) == (op == "eq")
    if ka != kb or ka in ("other", "nil") or (ka == "bool" and op not in ("eq", "ne")):
        raise UnsupportedTemplateError(f"template: {op}: incompatible types for comparison ({ka}, {kb})")
    return {"eq": a == b, "ne": a != b, "lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b}[op]


def _length(v: Any) -> int:
    if isinstance(v, str):
        return len(v.encode())
    if isinstance(v, (list, tuple, dict)):
        return len(v)
    raise UnsupportedTemplateError(f"template: len of {kind_of(v)}")


def _index(v: Any, *keys: Any) -> Any:
    for k in keys:
        if isinstance(v, dict):
            v = v.get(k)
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
    return out.decode("utf-8", "replace") if isinstance(v, str) else list(out)


def _sprint(*args: Any) -> str:
    """fmt.Sprint: a space between operands when neither is a string."""
    out = ""
    for i, a in enumerate(args):
        if i and not isinstance(a, str) and not isinstance(args[i - 1], str):
            out += " "
        out += _inner_text(a)
    return out


_VERB = re.compile(r"%([%svdq])")


def _sprintf(fmt: Any, *args: Any) -> str:
    if not isinstance(fmt, str):
        raise UnsupportedTemplateError("template: printf: the format must be a string")
    if re.search(r"%[^%svdq]", fmt):
        raise UnsupportedTemplateError(f"template: printf verb in {fmt!r} is not supported")
    rest = list(args)

    def verb(m: re.Match) -> str:
        if m.group(1) == "%":
            return "%"
        if not rest:
            return f"%!{m.group(1)}(MISSING)"
        a = rest.pop(0)
        return json.dumps(a, ensure_ascii=False) if m.group(1) == "q" and isinstance(a, str) else _inner_text(a)

    return _VERB.sub(verb, fmt)


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
    "println": lambda *a: " ".join(_inner_text(x) for x in a) + "\n",
    "json": go_json,
    "currentDate": lambda *_: date.today().isoformat(),
    "yesterdayDate": lambda *_: (date.today() - timedelta(days=1)).isoformat(),
}


def arity_error(name: str):
    raise UnsupportedTemplateError(f"template: wrong number of args for {name}")
