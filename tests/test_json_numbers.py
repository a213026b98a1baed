"""Numbers in JSON schemas that llguidance would get wrong, found by a probe of the
server (2026-12-07): bounds it reads as doubles, bounds that are not numbers, and a
minProperties it counts only over required keys. Each is kept exactly, or refused
with a message that names it; on the real SmolLM2."""
import json

import jsonschema
import pytest

from ctxengine.text.grammar import Grammar, GrammarError
from test_json_bounds import model, takes  # noqa: F401 (a fixture)

P = 2 ** 53


@pytest.mark.parametrize("schema, inside, outside", [
    # each let the second of its outside values through (the double nearest its bound)
    ({"type": "integer", "minimum": 9007199254740990, "maximum": 9007199254740999}, (P - 2, P + 6),
     (P + 7, 9007199254741000)),
    ({"type": "integer", "minimum": 2 ** 60, "maximum": 2 ** 60 + 1000}, (2 ** 60 + 1, 2 ** 60 + 768),
     (2 ** 60 + 1000, 2 ** 60 + 1024)),
    ({"type": "number", "minimum": 10 ** 16 + 1, "maximum": 10 ** 16 + 3}, (10 ** 16 + 2,), (10 ** 16 + 1, 10 ** 16)),
    ({"type": "integer", "exclusiveMaximum": 2 ** 60, "minimum": 0}, (5, 2 ** 60 - 128), (2 ** 60 - 1, 2 ** 60)),
    ({"type": "integer", "minimum": -9007199254740999}, (-P - 6, 5), (-P - 7, -9007199254740999)),
    ({"type": "integer", "maximum": 2 ** 63 - 1}, (5, 10 ** 15), (2 ** 63 - 1, 2 ** 63)),  # int64's: was refused
    ({"type": "number", "minimum": -1e300, "maximum": 3}, (-2.5, 3), (4,)),  # was refused
    ({"type": "integer", "minimum": P + 2, "maximum": P + 6}, (P + 2, P + 3, P + 6), (P + 1, P + 7, P + 8)),
])
def test_a_bound_past_2_to_the_53_is_kept_as_the_nearest_double_inside_it(model, schema, inside, outside):
    """llguidance reads bounds as doubles: one that is none moves inward to the nearest one."""
    assert all(takes(model, schema, str(n)) for n in inside), schema
    assert not any(takes(model, schema, str(n)) for n in outside), schema
    c = model.context(None)
    c.append("The number:")
    reply = "".join(p.text for p in c.generate(24, temperature=1.0, seed=3, json_schema=schema))
    c.delete()
    jsonschema.validate(json.loads(reply), schema)


def test_a_range_with_no_double_in_it_is_refused():
    for schema in ({"type": "integer", "minimum": P + 1, "maximum": P + 1},
                   {"type": "integer", "exclusiveMinimum": 2 ** 60, "exclusiveMaximum": 2 ** 60 + 100}):
        with pytest.raises(GrammarError, match="lies past 2\\*\\*53, where constrained sampling, which reads bounds "
                                               "as doubles, would enforce"):
            Grammar.json_schema(schema).compiled()


@pytest.mark.parametrize("schema, says", [
    ({"type": "integer", "multipleOf": -3}, "multipleOf -3 is not above 0"),
    ({"type": "number", "minimum": float("nan")}, "minimum nan is not a finite number"),
    ({"type": "number", "maximum": float("inf")}, "maximum inf is not a finite number"),
    ({"type": "object", "properties": {"n": {"type": "number", "exclusiveMinimum": float("-inf")}}},
     "exclusiveMinimum -inf is not a finite number"),
])
def test_a_number_keyword_that_is_no_number_is_refused(schema, says):
    # each was taken, and the bound dropped without a word
    with pytest.raises(GrammarError, match=says):
        Grammar.json_schema(schema).compiled()


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
     "minProperties": 2},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
     "minProperties": 2, "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["b"],
     "minProperties": 2},
])
def test_min_properties_met_by_optional_properties_is_kept(model, schema):
    # refused: "minProperties (2) is greater than number of properties (0)"
    assert not takes(model, schema, '{"a": 1}')
    for seed in range(3):
        c = model.context(None)
        c.append("An object:")
        reply = "".join(p.text for p in c.generate(40, temperature=1.0, seed=seed, json_schema=schema))
        c.delete()
        jsonschema.validate(json.loads(reply), schema)
