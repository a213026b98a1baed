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

MAX_INT_DIGITS = 15
MAX_FRACTION_DIGITS = 6
MAX_STRING = 1000
MAX_ITEMS = 64
MAX_PROPERTIES = 32
MAX_DEPTH = 4
_INT_BOUND = 10 ** MAX_INT_DIGITS - 1
# llguidance builds number ranges in 64-bit integers, read through doubles: a bound past
# them is clamped (a minimum of 1e19 let 2**63 - 1 through) or, below -2**63, crashes the
# process. A bound beyond this (a double, 2**63 less 4096) is refused, and the caps added
# here stay within it.
MAX_BOUND = 2 ** 63 - 4096
# An integer const or enum value llguidance writes exactly (it holds them as doubles).
MAX_EXACT_INT = 2 ** 53

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
        _bound_number(s, out, exact="integer" in types)
    return out


def _bound_object(s: dict, out: dict, depth: int, closing: bool) -> None:
    """Close an object that lists its properties; bound the count of one that does not."""
    if "additionalProperties" in s or "patternProperties" in s:
        if s.get("additionalProperties") is not False or "patternProperties" in s:
            # keys of its own choosing: bounded in number too (a model repeated one at length)
            out.setdefault("maxProperties", max(MAX_PROPERTIES, _int(s.get("minProperties"))))
        return
    props = s.get("properties")
    if closing and isinstance(props, dict) and _int(s.get("minProperties")) <= len(props) + len(_missing(s, props)):
        # as OpenAI's strict mode: closed, with the required properties it forgot to list
        out["properties"] = {**out["properties"], **{k: _any_value(depth - 1) for k in _missing(s, props)}}
        out["additionalProperties"] = False
    else:
        out.setdefault("maxProperties", max(MAX_PROPERTIES, _int(s.get("minProperties"))))
        out["additionalProperties"] = _any_value(depth - 1)


def _missing(s: dict, props: dict) -> list[str]:
    required = s.get("required")
    return [k for k in required if isinstance(k, str) and k not in props] if isinstance(required, list) else []


def check_exact(schema: Any) -> None:
    """ValueError naming a number in the schema (at any depth) that sampling could not keep:
    a bound past +-MAX_BOUND, an integer const or enum value past 2**53."""
    for s in _objects(schema):
        for word in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if _is_num(x := s.get(word)) and abs(x) > MAX_BOUND:
                raise ValueError(f"{word} {x} is beyond the +-{MAX_BOUND} constrained sampling can enforce")
        values = [s["const"]] if "const" in s else s["enum"] if isinstance(s.get("enum"), list) else []
        for x in values:
            if isinstance(x, int) and not isinstance(x, bool) and abs(x) > MAX_EXACT_INT:
                raise ValueError(f"{'const' if 'const' in s else 'enum value'} {x} is an integer beyond 2**53, "
                                 "which constrained sampling cannot write exactly (it would come back rounded); "
                                 "give it as a string")


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


def _bound_number(s: dict, out: dict, exact: bool) -> None:
    lo, hi = _edge(s, "minimum", "exclusiveMinimum", -1), _edge(s, "maximum", "exclusiveMaximum", 1)
    if lo is None:  # the added cap, or twice the schema's upper bound where that is below it
        lo = out["minimum"] = -_INT_BOUND if hi is None or hi >= -_INT_BOUND else _far(hi, exact)
    if hi is None:
        hi = out["maximum"] = _INT_BOUND if lo <= _INT_BOUND else _far(lo, exact)
    if exact:
        return  # integers compare exactly; their bounds stay as written
    for word, plain, pick in (("exclusiveMinimum", "minimum", max), ("exclusiveMaximum", "maximum", min)):
        x = s.get(word)
        if _is_num(x):  # a number written next to x may parse as x itself
            del out[word]
            # (next to 0, the unit is a tenth of the range, for a range as narrow as (0, 1e-20))
            unit = _ulp15(x) if x else min(1e-14, abs(hi if pick is max else lo) / 10 or 1e-14)
            inside = x + unit * (1 if pick is max else -1)
            out[plain] = pick(inside, s[plain]) if _is_num(s.get(plain)) else inside
    if "multipleOf" not in s:
        step = _grid(out.get("minimum", lo), out.get("maximum", hi))
        if step is not None:
            out["multipleOf"] = step


def _edge(s: dict, plain: str, exclusive: str, side: int) -> float | None:
    """The schema's own bound on one side (either keyword), or None."""
    found = [s[k] for k in (plain, exclusive) if _is_num(s.get(k))]
    return (max(found) if side < 0 else min(found)) if found else None


def _far(bound: float, exact: bool) -> float:
    """A cap for the other side of a bound beyond the added ones: twice it, within
    +-MAX_BOUND."""
    far = int(bound) * 2 if exact else bound * 2.0
    return max(-MAX_BOUND, min(MAX_BOUND, far))


def _ulp15(x: float) -> float:
    """A unit of the 15th significant digit of x: numbers that far from x parse as other doubles."""
    return 10.0 ** (math.floor(math.log10(abs(x))) + 1 - 15)


def _grid(lo: float, hi: float) -> float | None:
    """The coarsest step 10**-k (MAX_FRACTION_DIGITS <= k <= 10: llguidance refuses finer ones,
    1e-11 being 9.999999999999999e-12) with a multiple in [lo, hi]."""
    for k in range(MAX_FRACTION_DIGITS, 11):
        step = 10.0 ** -k
        if math.ceil(lo / step) <= math.floor(hi / step):
            return step
    return None


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


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
               {"type": "number", "minimum": -_INT_BOUND, "maximum": _INT_BOUND,
                "multipleOf": 10.0 ** -MAX_FRACTION_DIGITS},
               {"type": "boolean"}, {"type": "null"}]
    if depth <= 0:
        return {"anyOf": scalars}
    inner = _any_value(depth - 1)
    return {"anyOf": scalars + [
        {"type": "array", "items": inner, "maxItems": MAX_ITEMS},
        {"type": "object", "additionalProperties": inner, "maxProperties": MAX_PROPERTIES}]}
