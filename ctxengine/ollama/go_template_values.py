"""Go values as a template sees them, in Python: types, truth, printing, JSON.

Go values are mapped as: ``dict`` = a Go map (a missing key is the zero value,
nil, which prints ``<no value>``), ``GoStruct`` = a struct (an unknown field is
an error), ``list``/``tuple`` = a slice, and str/bool/int/float/None as
themselves.  ``Slice`` marks a nil slice (JSON ``null``, printed ``[]``).
Truth is Go's: false, 0, nil and empty strings, slices and maps are false; a
struct is always true.  A value whose Go type has a ``String()`` method is a
``JSONMap`` / ``JSONList`` / ``PropertyType`` or a GoStruct with ``string``
set (Ollama's tool and argument types).  Errors raise
UnsupportedTemplateError (the caller falls back to the GGUF's template).
"""
from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any

from ..errors import UnsupportedTemplateError


class GoStruct:
    """A Go struct value: named fields in Go's order.  `json` is what encoding/json makes of it
    (its field names and omissions), `string` whether a String() method prints that JSON
    (default: when there is a `json`); `pointer` marks a *struct, which text/template prints
    dereferenced but fmt prints as an address inside another value (so that is refused);
    `printable=False` marks a struct whose %v shows a pointer field, an address, refused too."""

    def __init__(self, fields: dict[str, Any], *, json: Any = None, string: bool | None = None,
                 pointer: bool = False, printable: bool = True):
        self.fields = fields
        self.json = json
        self.string = json is not None if string is None else string
        self.pointer = pointer
        self.printable = printable

    def __repr__(self) -> str:
        return f"GoStruct({self.fields!r})"


class Slice(list):
    """A Go slice that can be nil: a nil one (``nil=True``, empty) marshals to JSON null."""

    def __init__(self, items: Any = (), *, nil: bool = False):
        super().__init__(items)
        self.nil = nil and not self


class JSONList(Slice):
    """A Go slice whose String() method is its JSON (Ollama's templateTools)."""


class PropertyType(Slice):
    """api.PropertyType, a []string: String() is its one type, "" or fmt's [a b]; its
    JSON is the one type as a string, else the list."""

    def text(self) -> str:
        return self[0] if len(self) == 1 else "[" + " ".join(self) + "]" if self else ""


class JSONMap(dict):
    """A Go map whose String() method is its JSON (Ollama's templateArgs/templateProperties):
    a nil one prints {} and marshals to null; `zero` is what a missing key gives."""

    def __init__(self, items: Any = (), *, nil: bool = False, zero: Any = None):
        super().__init__(items)
        self.nil = nil and not self
        self.zero = zero


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
    if getattr(value, "nil", False):
        return "null"
    if isinstance(value, PropertyType) and len(value) == 1:
        return _encode(value[0])
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


def go_float(x: float) -> str:
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


def to_text(value: Any, nested: bool = False) -> str:
    """fmt's %v of a value, as a template action prints it (`nested`: inside another value)."""
    if value is None:
        return "<nil>" if nested else "<no value>"
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return go_float(value)
    if isinstance(value, PropertyType):
        return value.text()
    if isinstance(value, JSONMap):
        return "{}" if value.nil else go_json(value)
    if isinstance(value, JSONList) or (isinstance(value, GoStruct) and value.string):
        return go_json(value)
    if isinstance(value, GoStruct):
        if not value.printable or (nested and value.pointer):
            raise UnsupportedTemplateError("template: printing this value shows a memory address")
        return "{" + " ".join(to_text(v, True) for v in value.fields.values()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + " ".join(to_text(v, True) for v in value) + "]"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{to_text(k, True)}:{to_text(v, True)}" for k, v in sorted(value.items())) + "]"
    raise UnsupportedTemplateError(f"template: cannot print a {type(value).__name__} value")


def kind_of(v: Any) -> str:
    if v is None:
        return "nil"
    for kind, types in (("bool", bool), ("int", int), ("float", float), ("string", str)):
        if isinstance(v, types):
            return kind
    return "other"



