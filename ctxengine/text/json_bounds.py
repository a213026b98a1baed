"""Bounds a JSON Schema gets before it becomes a grammar, so that a small
model under it cannot write one value forever.

JSON Schema leaves most things open: a ``number`` may have a thousand
digits, a ``string`` without ``maxLength`` and an ``array`` without
``maxItems`` never have to end, and an object that does not say
``additionalProperties: false`` may gain invented properties forever. A
grammar built from such a schema lets a model that has lost its way (SmolLM2
writing ``1000000000...``) run to ``max_tokens`` and leave invalid JSON.
:func:`bounded_schema` returns the schema with these bounds added where the
schema sets none itself (a bound the schema gives is kept as it is):

* an object that lists ``properties`` (and no ``patternProperties``) is
  closed, as OpenAI's strict mode treats every schema: it ends once its
  required properties are there, unless it sets ``additionalProperties``;
  an object that lists none keeps any keys, at most :data:`MAX_PROPERTIES`;
* an integer is within +-(10**MAX_INT_DIGITS - 1); a number too, and a
  multiple of 10**-MAX_FRACTION_DIGITS (so no exponent, few decimals);
* a string is at most :data:`MAX_STRING` characters; an array at most
  :data:`MAX_ITEMS` items; an untyped value (``{}``) is any JSON value
  bounded the same way, nested at most :data:`MAX_DEPTH` deep.

These bound the length of every value; the sampler's budget steering
(``text/closing.py``) makes the reply end inside ``max_tokens``.
"""
from __future__ import annotations

from typing import Any

MAX_INT_DIGITS = 15
MAX_FRACTION_DIGITS = 6
MAX_STRING = 1000
MAX_ITEMS = 64
MAX_PROPERTIES = 32
MAX_DEPTH = 4
_INT_BOUND = 10 ** MAX_INT_DIGITS - 1

_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_SCHEMA_ONE = ("items", "additionalProperties", "contains", "not", "if", "then", "else",
               "unevaluatedProperties", "additionalItems")
# Keywords that say what a value may be: a schema with none of them allows anything.
_SAYS_WHAT = {"type", "enum", "const", "$ref", "anyOf", "oneOf", "allOf", "not", "properties", "items",
              "prefixItems", "pattern", "format", "minimum", "maximum", "additionalProperties",
              "patternProperties", "required", "minLength", "maxLength", "minItems", "maxItems"}


def bounded_schema(schema: Any) -> Any:
    """The schema with bounds added where it sets none (see the module's doc); a new dict."""
    return _bound(schema, MAX_DEPTH)


def _bound(s: Any, depth: int) -> Any:
    if not isinstance(s, dict):
        return s  # True/False, or something the compiler will name as wrong
    if not (_SAYS_WHAT & s.keys()):
        return {**s, **_any_value(depth)}
    out = dict(s)
    for key in _SCHEMA_LISTS:
        if isinstance(s.get(key), list):
            out[key] = [_bound(x, depth) for x in s[key]]
    for key in _SCHEMA_MAPS:
        if isinstance(s.get(key), dict):
            out[key] = {k: _bound(v, depth if key in ("$defs", "definitions") else depth - 1)
                        for k, v in s[key].items()}
    for key in _SCHEMA_ONE:
        if key in s:
            out[key] = _bound(s[key], depth - 1 if key in ("items", "additionalProperties") else depth)
    types = _types(s)
    if "object" in types and "additionalProperties" not in s:
        if "properties" in s and "patternProperties" not in s:
            out["additionalProperties"] = False
        elif "patternProperties" not in s:
            out.setdefault("maxProperties", MAX_PROPERTIES)
            out["additionalProperties"] = _any_value(depth - 1)
    if "array" in types:
        out.setdefault("maxItems", MAX_ITEMS)
        if "items" not in s and "prefixItems" not in s:
            out["items"] = _any_value(depth - 1)
    if "string" in types and not ({"maxLength", "enum", "const", "pattern", "format"} & s.keys()):
        out["maxLength"] = MAX_STRING
    if types & {"integer", "number"} and not ({"enum", "const"} & s.keys()):
        if "minimum" not in s and "exclusiveMinimum" not in s:
            out["minimum"] = -_INT_BOUND
        if "maximum" not in s and "exclusiveMaximum" not in s:
            out["maximum"] = _INT_BOUND
        if "number" in types and "integer" not in types and "multipleOf" not in s:
            out["multipleOf"] = 10.0 ** -MAX_FRACTION_DIGITS
    return out


def _types(s: dict) -> set[str]:
    t = s.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {x for x in t if isinstance(x, str)}
    inferred = set()
    if "properties" in s or "required" in s:
        inferred.add("object")
    if "items" in s or "prefixItems" in s:
        inferred.add("array")
    return inferred


def _any_value(depth: int) -> dict:
    """Any JSON value, every part bounded; containers only while ``depth`` lasts."""
    scalars = [{"type": "string", "maxLength": MAX_STRING},
               {"type": "number", "minimum": -_INT_BOUND, "maximum": _INT_BOUND,
                "multipleOf": 10.0 ** -MAX_FRACTION_DIGITS},
               {"type": "boolean"}, {"type": "null"}]
    if depth <= 0:
        return {"anyOf": scalars}
    inner = _any_value(depth - 1)
    return {"anyOf": scalars + [
        {"type": "array", "items": inner, "maxItems": MAX_ITEMS},
        {"type": "object", "additionalProperties": inner, "maxProperties": MAX_PROPERTIES}]}
