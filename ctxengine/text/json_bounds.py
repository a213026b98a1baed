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

A bound never makes a satisfiable schema unsatisfiable: a cap below the
schema's own lower bound (``minItems: 100``, ``minimum: 1e16``) is raised
past it, a required property the ``properties`` do not list is added before the
object is closed, ``allOf`` branches that are objects are merged into one
before it is closed (closing each branch would forbid the others' keys), and
the number grid is made finer where a range holds no multiple of it. An
exclusive bound becomes an inclusive one a few units of the 15th significant
digit inside it, so a number written next to it cannot parse as the bound.
:func:`check_finite` refuses a schema with no finite instance (a ``$ref``
cycle with nothing to end it), which would otherwise fail mid-reply.

These bound the length of every value; the sampler's budget steering
(``text/closing.py``) makes the reply end inside ``max_tokens``.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterator

from .json_numbers import INT_CAP, MAX_BOUND, MAX_EXACT_INT, MAX_FRACTION_DIGITS, bound_number, is_num

MAX_STRING = 1000
MAX_ITEMS = 64
MAX_PROPERTIES = 32
MAX_DEPTH = 4

_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
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
    return _bound(schema, MAX_DEPTH, local_resolver(schema))


def _bound(s: Any, depth: int, resolve: Callable[[str], Any], closing: bool = True) -> Any:
    """``s`` bounded; ``closing``: an object that lists its properties may be closed (not
    so a branch of an ``allOf`` that could not be merged: others may add keys)."""
    if not isinstance(s, dict):
        return s  # True/False, or something the compiler will name as wrong
    if not (_SAYS_WHAT & s.keys()):
        return {**s, **_any_value(depth)}
    s = _merged_all_of(s, resolve) or _distributed(s, resolve) or _merged_ref(s, resolve) or s
    out = dict(s)
    for key in _SCHEMA_LISTS:
        if isinstance(s.get(key), list):
            # an allOf's branches stay open, a $ref among them inlined (its $defs entry is closed)
            out[key] = [_bound(_resolved(x, resolve) if key == "allOf" else x, depth, resolve, key != "allOf")
                        for x in s[key]]
    for key in _SCHEMA_MAPS:
        if isinstance(s.get(key), dict):
            out[key] = {k: _bound(v, depth if key in ("$defs", "definitions") else depth - 1, resolve)
                        for k, v in s[key].items()}
    for key in _SCHEMA_ONE:
        if key in s:
            out[key] = _bound(s[key], depth - 1 if key in ("items", "additionalProperties") else depth, resolve)
    types = _types(s)
    if "object" in types:
        _bound_object(s, out, depth, closing)
    if "array" in types:
        out.setdefault("maxItems", max(MAX_ITEMS, _int(s.get("minItems"))))
        if "items" not in s and "prefixItems" not in s:
            out["items"] = _any_value(depth - 1)
    if "string" in types and not ({"maxLength", "enum", "const", "pattern", "format"} & s.keys()):
        out["maxLength"] = max(MAX_STRING, _int(s.get("minLength")))
    if types & {"integer", "number"} and not ({"enum", "const"} & s.keys()):
        bound_number(s, out, exact="integer" in types)
    return out


def _bound_object(s: dict, out: dict, depth: int, closing: bool) -> None:
    """Close an object that lists its properties; bound the count of one that does not."""
    if "additionalProperties" in s or "patternProperties" in s:
        if s.get("additionalProperties") is not False or "patternProperties" in s:
            # keys of its own choosing: bounded in number too (a model repeated one at length)
            out.setdefault("maxProperties", max(MAX_PROPERTIES, _int(s.get("minProperties"))))
        else:
            _required_enough(out)
        return
    props = s.get("properties")
    if closing and isinstance(props, dict) and _int(s.get("minProperties")) <= len(props) + len(_missing(s, props)):
        # as OpenAI's strict mode: closed, with the required properties it forgot to list
        out["properties"] = {**out["properties"], **{k: _any_value(depth - 1) for k in _missing(s, props)}}
        out["additionalProperties"] = False
        _required_enough(out)
    else:
        out.setdefault("maxProperties", max(MAX_PROPERTIES, _int(s.get("minProperties"))))
        out["additionalProperties"] = _any_value(depth - 1)


def _required_enough(out: dict) -> None:
    """A closed object's minProperties met by requiring its first listed optional properties:
    llguidance counts only the required ones toward it, and refused the schema ("minProperties
    (2) is greater than number of properties (0)") where optional ones could meet it."""
    props, need = out.get("properties"), _int(out.get("minProperties"))
    required = [k for k in out.get("required") or [] if isinstance(k, str)] \
        if isinstance(out.get("required"), list) else []
    if not isinstance(props, dict) or len(required) >= need:
        return
    optional = [k for k in props if k not in required]
    out["required"] = required + optional[:need - len(required)]


def _missing(s: dict, props: dict) -> list[str]:
    required = s.get("required")
    return [k for k in required if isinstance(k, str) and k not in props] if isinstance(required, list) else []


def check_exact(schema: Any, bounded: Any = None) -> None:
    """ValueError naming a number in the schema (at any depth) that sampling could not keep.
    In ``schema`` as given: a bound or multipleOf that is not a finite number, a multipleOf
    not above 0, an integer const or enum value past 2**53. In its bounds as they reach
    llguidance (``bounded``: bounded_schema's, whose caps stand in for bounds far past them;
    else the schema's own): one past +-MAX_BOUND, and past 2**53 one that is not a double
    (llguidance reads bounds as doubles: a maximum of 9007199254740999 let 9007199254741000
    through) or an exclusive one (its neighbour is no double either)."""
    for s in _objects(schema):
        for word in (*_BOUNDS, "multipleOf"):
            x = s.get(word)
            if isinstance(x, float) and not math.isfinite(x):
                raise ValueError(f"{word} {x} is not a finite number")
            if word == "multipleOf" and is_num(x) and x <= 0:
                raise ValueError(f"multipleOf {x} is not above 0")
        values = [s["const"]] if "const" in s else s["enum"] if isinstance(s.get("enum"), list) else []
        for x in values:
            if isinstance(x, int) and not isinstance(x, bool) and abs(x) > MAX_EXACT_INT:
                raise ValueError(f"{'const' if 'const' in s else 'enum value'} {x} is an integer beyond 2**53, "
                                 "which constrained sampling cannot write exactly (it would come back rounded); "
                                 "give it as a string")
    for s in _objects(schema if bounded is None else bounded):
        for word in _BOUNDS:
            if not is_num(x := s.get(word)):
                continue
            if abs(x) > MAX_BOUND:
                raise ValueError(f"{word} {x} is beyond the +-{MAX_BOUND} constrained sampling can enforce")
            if abs(x) > MAX_EXACT_INT and (float(x) != x or word.startswith("exclusive")):
                raise ValueError(f"{word} {x} lies past 2**53, where constrained sampling, which reads bounds as "
                                 f"doubles, would enforce {float(x):.17g} instead; give a bound within 2**53 "
                                 "(or the value as a string)")


def uses_keyword(schema: Any, word: str) -> bool:
    """Whether a schema (at any depth, a const or enum value aside) uses this keyword."""
    return any(word in s for s in _objects(schema))


def counts_repeated_keys(schema: Any) -> bool:
    """Whether an object of the schema takes keys it does not list and sets minProperties:
    the grammar lets a key repeat and counts each time, where a parser keeps one."""
    return any("minProperties" in s and (s.get("patternProperties") or s.get("additionalProperties") is not False)
               for s in _objects(schema))


def _objects(schema: Any) -> Iterator[dict]:
    """Every object in a schema, however deep (without recursion), but for const and enum values."""
    stack = [schema]
    while stack:
        s = stack.pop()
        if isinstance(s, list):
            stack.extend(s)
        elif isinstance(s, dict):
            yield s
            stack.extend(v for k, v in s.items() if k not in ("const", "enum"))


def _int(x: Any) -> int:
    return x if isinstance(x, int) and not isinstance(x, bool) and x > 0 else 0


# -- allOf of objects -------------------------------------------------------------
_MERGEABLE = {"type", "properties", "required", "title", "description", "$comment", "examples", "default",
              "$schema", "$id"}


def _merged_all_of(s: dict, resolve: Callable[[str], Any], depth: int = 8) -> dict | None:
    """``s`` with its ``allOf`` of plain objects (inline or local ``$ref``) merged into one
    object, or None where it is not that (then llguidance intersects the branches)."""
    branches = s.get("allOf")
    if not isinstance(branches, list) or depth == 0:
        return None
    parts = [{k: v for k, v in s.items() if k != "allOf"}]
    for b in branches:
        b = _resolved(b, resolve)
        if isinstance(b, dict) and "allOf" in b:
            b = _merged_all_of(b, resolve, depth - 1)
        parts.append(b)
    own = set().union(*(p.keys() for p in parts[1:] if isinstance(p, dict)))
    own |= parts[0].keys() - {"$defs", "definitions"}
    if not all(isinstance(p, dict) and _types(p) <= {"object"} for p in parts) or not own <= _MERGEABLE \
            or not any(_types(p) for p in parts):
        return None
    merged: dict = {k: v for k, v in parts[0].items() if k in ("$defs", "definitions")}
    merged.update({"type": "object", "properties": {}, "required": []})
    for p in parts:
        for key, sub in (p.get("properties") or {}).items():
            have = merged["properties"].get(key)
            merged["properties"][key] = sub if have is None else {"allOf": [have, sub]}
        merged["required"] += [k for k in p.get("required") or [] if k not in merged["required"]]
    merged.update({k: parts[0][k] for k in ("title", "description") if k in parts[0]})
    return merged


def _merged_ref(s: dict, resolve: Callable[[str], Any]) -> dict | None:
    """An object with properties of its own beside a ``$ref`` to another (2019-09 on: both
    apply, as an ``allOf``), as one object; None where it is not that. Closing the two
    apart forbade each other's keys: a valid schema was refused as unsatisfiable."""
    if not isinstance(s.get("$ref"), str) or "allOf" in s or not ({"properties", "required"} & s.keys()):
        return None
    defs = {k: s[k] for k in ("$defs", "definitions") if k in s}
    own = {k: v for k, v in s.items() if k not in ("$ref", "$defs", "definitions")}
    return _merged_all_of({**defs, "allOf": [{"$ref": s["$ref"]}, own]}, resolve)  # the ref's keys first


def _distributed(s: dict, resolve: Callable[[str], Any]) -> dict | None:
    """An object with its own properties and an ``anyOf``/``oneOf`` of objects that add more,
    as the branches each merged with it (P and (A or B) = (P and A) or (P and B)), so that
    closing each one keeps its properties; None where it is not that."""
    key = next((k for k in ("anyOf", "oneOf") if isinstance(s.get(k), list) and s[k]), None)
    if key is None or "allOf" in s or not ({"properties", "required"} & s.keys()) or \
            ("anyOf" in s and "oneOf" in s):
        return None
    rest = {k: v for k, v in s.items() if k not in (key, "$defs", "definitions")}
    merged = [_merged_all_of({**rest, "allOf": [b]}, resolve) for b in s[key]]
    if not all(merged):
        return None
    return {**{k: s[k] for k in ("$defs", "definitions") if k in s}, key: merged}


def _resolved(b: Any, resolve: Callable[[str], Any]) -> Any:
    """A branch that is only a local ``$ref`` (beside words that say nothing), followed."""
    seen = 0
    while isinstance(b, dict) and isinstance(b.get("$ref"), str) and b.keys() <= {"$ref", "title", "description"}:
        target = resolve(b["$ref"])
        if target is None or seen == 8:
            return b
        b, seen = target, seen + 1
    return b


def local_resolver(root: Any) -> Callable[[str], Any]:
    """A local JSON pointer (``#``, ``#/$defs/x``) -> the schema there, or None."""
    def resolve(ref: str) -> Any:
        if not ref.startswith("#"):
            return None
        node = root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node
    return resolve


# -- schemas with no finite instance ------------------------------------------------
def infinite_ref(schema: Any) -> str | None:
    """A local ``$ref`` whose schema has no finite instance (``d -> d``, or an object that
    requires a property of its own kind with no way to stop), where the whole schema then
    has none either; else None. llguidance compiles such a schema, and the first token
    finds nothing allowed."""
    resolve = local_resolver(schema)
    finite = {ref: False for ref in _refs(schema) if resolve(ref) is not None}
    changed = True
    while changed:  # least fixed point: a ref is finite once its schema is, given the others
        changed = False
        for ref, known in finite.items():
            if not known and _finite(resolve(ref), finite):
                finite[ref] = changed = True
    if _finite(schema, finite):
        return None
    return next((ref for ref, ok in finite.items() if not ok), None)


def _refs(s: Any) -> set[str]:
    if isinstance(s, dict):
        found = {s["$ref"]} if isinstance(s.get("$ref"), str) and s["$ref"].startswith("#") else set()
        return found.union(*(_refs(v) for v in s.values()))
    if isinstance(s, list):
        return set().union(*(_refs(v) for v in s))
    return set()


def _finite(s: Any, finite: dict[str, bool]) -> bool:
    """Whether ``s`` has an instance of finite size, given which refs do (others: assumed)."""
    if not isinstance(s, dict):
        return s is not False
    if isinstance(s.get("$ref"), str) and not finite.get(s["$ref"], True):
        return False
    if "const" in s or s.get("enum"):
        return True
    if isinstance(s.get("allOf"), list) and not all(_finite(b, finite) for b in s["allOf"]):
        return False
    for key in ("anyOf", "oneOf"):
        if isinstance(s.get(key), list) and s[key] and not any(_finite(b, finite) for b in s[key]):
            return False
    types = _types(s)
    if not types or types - {"object", "array"}:
        return True  # a scalar will do
    props = s.get("properties") if isinstance(s.get("properties"), dict) else {}
    extra = s.get("additionalProperties", True)
    required = [k for k in s.get("required") or [] if isinstance(k, str)]
    if "object" in types and all(_finite(props.get(k, extra), finite) for k in required):
        return True
    items = s.get("prefixItems") if isinstance(s.get("prefixItems"), list) else []
    need = _int(s.get("minItems"))
    return "array" in types and all(_finite(items[i] if i < len(items) else s.get("items", True), finite)
                                    for i in range(min(need, len(items) + 1)))


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
               {"type": "number", "minimum": -INT_CAP, "maximum": INT_CAP,
                "multipleOf": 10.0 ** -MAX_FRACTION_DIGITS},
               {"type": "boolean"}, {"type": "null"}]
    if depth <= 0:
        return {"anyOf": scalars}
    inner = _any_value(depth - 1)
    return {"anyOf": scalars + [
        {"type": "array", "items": inner, "maxItems": MAX_ITEMS},
        {"type": "object", "additionalProperties": inner, "maxProperties": MAX_PROPERTIES}]}
