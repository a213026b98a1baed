"""JSON schemas bounded before they become grammars (text/json_bounds.py), and
generations under them closed inside their budget (text/closing.py), on the
real SmolLM2."""
import json
import re

import jsonschema
import pytest

import ctxengine
from ctxengine.text.closing import Closer
from ctxengine.text.grammar import Constraint, Grammar, GrammarError
from ctxengine.text.json_bounds import MAX_ITEMS, MAX_PROPERTIES, MAX_STRING, bounded_schema
from ctxengine.text.json_numbers import MAX_INT_DIGITS
from ctxengine.text.tools import ToolChoice, as_tools, forced_call_grammar, parse_tool_calls

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"]}


@pytest.fixture(scope="module")
def model(smollm2_path):
    m = ctxengine.load(smollm2_path)
    yield m
    m.close()


def takes(model, schema, text: str) -> bool:
    """Whether the grammar of ``schema`` accepts ``text`` as a complete output."""
    c = Constraint(Grammar.json_schema(schema), model.engine.tokenizer, 0)
    try:
        c.feed(model.tokenize(text))
    except GrammarError:
        return False
    return c.accepting


def test_bounds_are_added_only_where_the_schema_sets_none():
    out = bounded_schema({"type": "object", "properties": {
        "a": {"type": "string"}, "b": {"type": "string", "maxLength": 3}, "n": {"type": "integer", "minimum": 0},
        "xs": {"type": "array", "items": {"type": "number"}, "maxItems": 2000}}})
    assert out["additionalProperties"] is False
    p = out["properties"]
    assert p["a"]["maxLength"] == MAX_STRING and p["b"]["maxLength"] == 3
    assert p["n"]["minimum"] == 0 and p["n"]["maximum"] == 10 ** MAX_INT_DIGITS - 1
    assert p["xs"]["maxItems"] == 2000 and p["xs"]["items"]["multipleOf"] == 1e-6
    assert bounded_schema({"type": "object", "properties": {}, "additionalProperties": True})["additionalProperties"]
    assert bounded_schema({"type": "array"})["maxItems"] == MAX_ITEMS


def test_the_grammar_refuses_runaway_values_and_takes_ordinary_ones(model):
    num = {"type": "object", "properties": {"r": {"type": "number"}}, "required": ["r"]}
    assert takes(model, num, '{"r": -3.25}') and takes(model, num, '{"r": 123456789012345}')
    assert not takes(model, num, '{"r": 1234567890123456}')   # 16 integer digits
    assert not takes(model, num, '{"r": 0.1234567}')          # 7 fraction digits
    assert not takes(model, num, '{"r": 1, "extra": 2}')      # closed once required properties are there
    big = {"type": "integer", "minimum": 0, "maximum": 10 ** 18}
    assert takes(model, big, str(10 ** 17))                   # the schema's own bounds win
    assert takes(model, {"type": "object"}, '{"any": [1, {"x": "y"}, null]}')
    assert not takes(model, {"type": "string"}, json.dumps("a" * (MAX_STRING + 1)))


def test_a_forced_call_closes_at_every_budget_from_the_shortest(model):
    tools = as_tools([{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}])
    grammar = forced_call_grammar(tools, ToolChoice("required"), "fallback")
    shortest = Closer(Constraint(grammar, model.engine.tokenizer, 0), model.engine.tokenizer).need
    assert 20 <= shortest <= 40  # <tool_call>\n{"name":"get_weather","arguments":{"city":"","unit":"c"}}\n</tool_call>
    for n in [shortest - 1, 3]:  # too few: "length", no call
        ctx = model.context(None)
        ctx.append(model.chat_prompt([{"role": "user", "content": "Weather?"}]), parse_special=True)
        text = "".join(p.text for p in ctx.generate(n, grammar=grammar, temperature=0))
        assert ctx.finish_reason == "length" and parse_tool_calls(text)[1] == [], text
        ctx.delete()
    ask = [{"role": "user", "content": "What is the weather in Paris? Tell me all about Paris in detail."}]
    for n in [shortest, shortest + 1, shortest + 3, shortest + 9, shortest + 30]:
        ctx = model.context(None)
        n0 = ctx.append(model.chat_prompt(ask), parse_special=True)
        text = "".join(p.text for p in ctx.generate(n, grammar=grammar, temperature=0.9, seed=n))
        assert ctx.finish_reason == "stop" and ctx.n_tokens - n0 <= n, (n, text)
        _, (call,) = parse_tool_calls(text)
        jsonschema.validate(call.arguments, WEATHER)
        ctx.delete()


def test_a_reply_cut_below_its_shortest_form_is_finished_by_the_next_generation(model):
    schema = {"type": "object", "properties": {"essay": {"type": "string"}}, "required": ["essay"]}
    ctx = model.context(None)
    ctx.append(model.chat_prompt([{"role": "user", "content": "A long essay on the sea, as JSON."}]),
               parse_special=True)
    first = "".join(p.text for p in ctx.generate(2, json_schema=schema, temperature=0))
    assert ctx.finish_reason == "length"
    rest = "".join(p.text for p in ctx.generate(40, temperature=0.9, seed=1))  # the grammar goes on, and closes
    assert ctx.finish_reason == "stop"
    jsonschema.validate(json.loads(first + rest), schema)
    ctx.delete()


@pytest.mark.parametrize("budget,seed", [(20, 1), (20, 2), (25, 1), (25, 2), (30, 1)])
def test_a_long_required_value_chosen_early_still_closes(model, budget, seed):
    # {} is the shortest reply (need 1), so the closer watched only the last 17 tokens; a
    # key whose value is a long constant, chosen before them, left no room to close. A
    # token that may start a key or value is now checked WIDE times as far from the end.
    long = "The quick brown fox jumps over the lazy dog while the cat sleeps on a warm mat by the door"
    schema = {"type": "object", "properties": {"a": {"const": long}}, "additionalProperties": False}
    ctx = model.context(None)
    n0 = ctx.append(model.chat_prompt([{"role": "user", "content": "Give JSON with key a."}]), parse_special=True)
    text = "".join(p.text for p in ctx.generate(budget, json_schema=schema, temperature=1.0, seed=seed,
                                                 top_k=0, top_p=1.0))
    assert ctx.n_tokens - n0 <= budget
    jsonschema.validate(json.loads(text), schema)
    ctx.delete()


@pytest.mark.parametrize("schema", [
    {"type": "string", "format": "email"},
    {"type": "string", "format": "duration"},
    {"type": "string", "pattern": "^\\w+@\\w+\\.com$"},
    {"type": "object", "properties": {"to": {"type": "string", "pattern": "^[a-z]+[A-Z]$"}}, "required": ["to"]},
])
@pytest.mark.parametrize("budget,seed", [(12, 1), (20, 2)])
def test_a_patterned_string_still_closes(model, schema, budget, seed):
    # The completion walk wrote free letters again and again (an email's @ never came), found
    # no completion, and the closer stood aside: the reply was cut invalid at max_tokens.
    ctx = model.context(None)
    n0 = ctx.append(model.chat_prompt([{"role": "user", "content": "Write a long essay about the ocean."}]),
                    parse_special=True)
    text = "".join(p.text for p in ctx.generate(budget, json_schema=schema, temperature=1.0, seed=seed,
                                                 top_k=0, top_p=1.0))
    assert ctx.finish_reason == "stop" and ctx.n_tokens - n0 <= budget, text
    jsonschema.validate(json.loads(text), schema)
    ctx.delete()


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"b": {"type": "integer", "multipleOf": 7, "minimum": 100}}, "required": ["b"]},
    {"type": "object", "properties": {"x": {"type": "number", "exclusiveMinimum": 0.5, "exclusiveMaximum": 0.6}},
     "required": ["x"]},
])
@pytest.mark.parametrize("budget,seed", [(10, 1), (12, 2), (14, 3)])
def test_a_number_that_cannot_end_yet_still_closes(model, schema, budget, seed):
    # The walk appended 0 after 0: 100000000000005 (15 digits) for a multiple of 7 from 100,
    # 0.500001 for 0.5 < x; longer than the budget left, so the closer stood aside.
    ctx = model.context(None)
    n0 = ctx.append(model.chat_prompt([{"role": "user", "content": "Write a long essay about the ocean."}]),
                    parse_special=True)
    text = "".join(p.text for p in ctx.generate(budget, json_schema=schema, temperature=1.5, seed=seed))
    assert ctx.finish_reason == "stop" and ctx.n_tokens - n0 <= budget, text
    jsonschema.validate(json.loads(text), schema)
    ctx.delete()


_A = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
_B = {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}


@pytest.mark.parametrize("schema,instance", [
    ({"allOf": [_A, _B]}, {"a": "x", "b": 1}),  # each branch closed alone forbade the other's key
    ({"$defs": {"A": _A, "B": _B}, "allOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}]}, {"a": "x", "b": 1}),
    ({"$defs": {"B": {**_B, "minProperties": 1}}, "allOf": [_A, {"$ref": "#/$defs/B"}]}, {"a": "x", "b": 1}),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "b"]}, {"a": "x", "b": 2}),
    ({"type": "object", "properties": {}, "minProperties": 1}, {"k": 1}),
    ({"type": "array", "items": {"type": "integer"}, "minItems": MAX_ITEMS + 36}, [1] * (MAX_ITEMS + 36)),
    ({"type": "string", "minLength": MAX_STRING + 5}, "a" * (MAX_STRING + 5)),
    ({"type": "number", "minimum": 1e16}, 2 * 10 ** 16),
    ({"type": "integer", "maximum": -10 ** 16}, -2 * 10 ** 16),
    ({"type": "object", "properties": {"kind": {"enum": ["a", "b"]}}, "required": ["kind"],  # parent and branch keys
      "anyOf": [{"properties": {"x": {"type": "integer"}}, "required": ["x"]},
                {"properties": {"y": {"type": "string"}}, "required": ["y"]}]}, {"kind": "a", "y": "z"}),
    ({"$defs": {"A": _A}, "$ref": "#/$defs/A", "properties": {"b": {"type": "integer"}}, "required": ["b"]},
     {"a": "x", "b": 1}),  # a $ref beside properties (2019-09): closed apart, each forbade the other's keys
    ({"type": "object", "properties": {"p": {"$ref": "#/$defs/A", "properties": {"b": {"type": "integer"}},
                                             "required": ["b"]}}, "required": ["p"], "$defs": {"A": _A}},
     {"p": {"a": "x", "b": 1}}),
    ({"$defs": {"c": {"type": "object", "properties": {"text": {"type": "string"}, "reply": {  # oneOf: anyOf
        "oneOf": [{"type": "null"}, {"$ref": "#/$defs/c"}]}}, "required": ["text", "reply"]}}, "$ref": "#/$defs/c"},
     {"text": "a", "reply": {"text": "b", "reply": None}}),
])
def test_a_bound_never_makes_a_satisfiable_schema_refused(model, schema, instance):
    jsonschema.validate(instance, schema)
    assert takes(model, schema, json.dumps(instance))


def test_bounds_past_64_bits_are_refused_before_llguidance_sees_them():
    # maximum -1e19 (with the cap added below it) crashed the server (SIGSEGV in llguidance);
    # minimum 1e19 was clamped to 2**63 - 1, which came back, failing the schema
    for schema in ({"type": "object", "properties": {"n": {"type": "integer", "maximum": -1e19}}, "required": ["n"]},
                   {"type": "integer", "minimum": -2e19, "maximum": -1e19}, {"type": "integer", "minimum": 1e19},
                   {"type": "integer", "exclusiveMinimum": 2 ** 63 - 1}, {"items": [{"type": "integer", "maximum": -1e19}]}):
        with pytest.raises(GrammarError, match="is beyond the \\+-9223372036854771712 constrained sampling can"):
            Grammar.json_schema(schema).compiled()
    with pytest.raises(GrammarError, match="beyond the"):  # a forced call's Lark too
        Grammar("lark", 'start: call\ncall: %json {"type": "integer", "maximum": -1e19}').compiled()
    for schema in ({"type": "integer", "maximum": -6e18}, {"type": "integer", "minimum": 6e18}):
        Grammar.json_schema(schema).compiled()  # the cap beyond them stays within 64 bits


def _chain(n: int, link) -> dict:
    defs = {f"d{i}": link(f"#/$defs/d{i + 1}") for i in range(n)}
    return {"$defs": {**defs, f"d{n}": {"type": "integer"}}, "$ref": "#/$defs/d0"}


def test_a_long_chain_of_refs_is_refused_before_llguidance_sees_it():
    # 1,000 objects each naming the next (95 KB) overflowed llguidance's stack: the server
    # died, every request on every model with it; an allOf chain was Python's RecursionError.
    nested = lambda ref: {"type": "object", "properties": {"a": {"$ref": ref}}, "required": ["a"]}  # noqa: E731
    for schema in (_chain(1000, nested), _chain(3000, lambda ref: {"$ref": ref}),
                   _chain(1000, lambda ref: {"allOf": [{"$ref": ref}]})):
        with pytest.raises(GrammarError, match="its schemas nest more than 256 deep \\(its \\$refs followed"):
            Grammar.json_schema(schema).compiled()
    with pytest.raises(GrammarError, match="nest more than 256"):  # a forced call's Lark too
        Grammar("lark", f"start: call\ncall: %json {json.dumps(_chain(300, lambda ref: {'$ref': ref}))}").compiled()
    # What real schemas do still compiles: a chain of 80, recursion, and a definition named
    # twice at each of 60 levels (counted once each, not 2**60 times).
    twice = lambda ref: {"anyOf": [{"$ref": ref}, {"type": "array", "items": {"$ref": ref}}]}  # noqa: E731
    listed = {"$defs": {"n": {"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#/$defs/n"},
                                                                                  {"type": "null"}]}}}},
              "$ref": "#/$defs/n"}
    for schema in (_chain(80, nested), _chain(60, twice), listed):
        Grammar.json_schema(schema).compiled()


def test_a_tiny_range_gets_no_grid_llguidance_refuses(model):
    # the grid 1e-12 (9.999999999999999e-13 to llguidance) was a 400 "too many digits", and an
    # exclusive bound of 1e-20 moved inside by 1e-14 crossed the other end
    for schema, inside, outside in (({"type": "number", "exclusiveMinimum": 0, "maximum": 1e-12}, "0.0000000000005", "0"),
                                    ({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1e-9}, "0.0000000005",
                                     "0.000000001")):
        assert takes(model, schema, inside) and not takes(model, schema, outside)
    Grammar.json_schema({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1e-20}).compiled()


def test_an_integer_const_past_2_to_the_53_is_refused_not_rounded():
    # {"const": 12345678901234567890123} came back as 12345678901234568000000
    for schema in ({"const": 12345678901234567890123}, {"enum": [1, 2 ** 60]}):
        with pytest.raises(GrammarError, match="beyond 2\\*\\*53, which constrained sampling cannot write exactly"):
            Grammar.json_schema(schema).compiled()
    Grammar.json_schema({"enum": [1, 2 ** 53, "x"]}).compiled()


def test_one_of_is_named_among_what_sampling_cannot_enforce():
    # read as anyOf: a value matching two branches passed a strict schema
    g = Grammar.json_schema({"oneOf": [{"type": "integer"}, {"type": "number"}]})
    assert g.unenforced() == ["oneOf (enforced as anyOf)"]
    assert Grammar.json_schema({"anyOf": [{"type": "integer"}, {"type": "string"}]}).unenforced() == []


def test_min_properties_over_keys_not_listed_is_named_among_what_sampling_cannot_enforce(model):
    # the grammar took {"x_5": 10, "x_5": 10} for two properties; a parser keeps one
    free = {"type": "object", "patternProperties": {"^x_[0-9]$": {"type": "integer"}},
            "additionalProperties": False, "minProperties": 2}
    assert takes(model, free, '{"x_5": 10, "x_5": 10}')
    for schema in (free, {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 3}):
        assert Grammar.json_schema(schema).unenforced() == ["minProperties (with keys beyond its properties: "
                                                            "a key may repeat)"]
    listed = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "minProperties": 1}
    assert Grammar.json_schema(listed).unenforced() == []


def test_a_number_written_next_to_an_exclusive_bound_parses_inside_it(model):
    schema = {"type": "number", "exclusiveMinimum": 1e14, "exclusiveMaximum": 2e14}
    # 100000000000000.000001 is the double 1e14 itself: a value the grammar took before
    assert not takes(model, schema, "100000000000000.000001")
    assert not takes(model, schema, "199999999999999.999999")
    assert takes(model, schema, "100000000000001") and takes(model, schema, "150000000000000.5")
    small = {"type": "number", "exclusiveMinimum": 0, "maximum": 1}
    assert takes(model, small, "0.000001") and not takes(model, small, "0")
    tiny = {"type": "number", "minimum": 1e-7, "maximum": 2e-7}  # no multiple of 1e-6 in it: a finer one
    assert takes(model, tiny, "0.0000002") and not takes(model, tiny, "0.0000003")


def test_a_schema_with_no_finite_value_is_refused_before_any_token(model):
    for schema, ref in [({"$defs": {"d": {"$ref": "#/$defs/d"}}, "$ref": "#/$defs/d"}, "#/$defs/d"),
                        ({"type": "object", "properties": {"c": {"$ref": "#"}}, "required": ["c"]}, "#")]:
        with pytest.raises(GrammarError, match=f"no value of it is finite: {re.escape(ref)} always contains itself"):
            Constraint(Grammar.json_schema(schema), model.engine.tokenizer, 0)
    node = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
            "required": ["kids"]}
    tree = {"$defs": {"n": node}, "$ref": "#/$defs/n"}  # recursive, and ends with an empty list
    assert takes(model, tree, '{"kids": [{"kids": []}]}')
    linked = {"$defs": {"n": {"type": "object", "required": ["next"], "properties": {
        "next": {"anyOf": [{"$ref": "#/$defs/n"}, {"type": "null"}]}}}}, "$ref": "#/$defs/n"}
    assert takes(model, linked, '{"next": {"next": null}}')


def _obj(sub):
    return {"type": "object", "properties": {"v": sub}, "required": ["v"], "additionalProperties": False}


_NODE = {"type": "object", "properties": {"v": {"type": "number"}, "next": {"anyOf": [{"$ref": "#/$defs/n"},
                                                                                     {"type": "null"}]}},
         "required": ["v", "next"]}


@pytest.mark.parametrize("schema,shortest", [
    ({"type": "object", "properties": {"head": {"$ref": "#/$defs/n"}}, "required": ["head"], "$defs": {"n": _NODE}},
     '{"head":{"v":0,"next":null}}'),  # { was tried before n: a node opened another forever
    (_obj({"type": "string", "pattern": "[0-9]{3}"}), '{"v":"000"}'),  # unanchored, as JSON Schema's are
    (_obj({"type": "string", "pattern": "hello"}), '{"v":"hello"}'),
    (_obj({"type": "string", "pattern": "cat|dog"}), '{"v":"cat"}'),
    (_obj({"type": "string", "pattern": "\\.pdf$"}), '{"v":".pdf"}'),
    (_obj({"type": "string", "pattern": '^"[a-z]+"$'}), '{"v":"\\"a\\""}'),
])
def test_the_closing_walk_finds_a_completion_the_schema_allows(model, schema, shortest):
    # The walk wrote free letters to its limit and found none: the closer stood aside, and a
    # reply cut by max_tokens did not parse (Closer.need was None for each of these).
    tok = model.engine.tokenizer
    need = Closer(Constraint(Grammar.json_schema(schema), tok, 0), tok).need
    assert need is not None and need <= len(tok.encode(shortest)) + 1
    ctx = model.context(None)
    n0 = ctx.append(model.chat_prompt([{"role": "user", "content": "Write a long essay about the ocean."}]),
                    parse_special=True)
    text = "".join(p.text for p in ctx.generate(need + 3, json_schema=schema, temperature=1.0, seed=7,
                                                 top_k=0, top_p=1.0))
    assert ctx.finish_reason == "stop" and ctx.n_tokens - n0 <= need + 3, text
    jsonschema.validate(json.loads(text), schema)
    ctx.delete()


def test_free_keys_the_walk_writes_are_distinct_and_dates_are_real_dates(model):
    # {"":0,"":0} parses as one property, short of minProperties 2; and a date-time of year 0
    # (0000-01-01t01:01:01z) is refused by datetime and pydantic.
    import datetime
    tok = model.engine.tokenizer
    counted = {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2}
    walk = Closer(Constraint(Grammar.json_schema(counted), tok, 0), tok)
    value = json.loads(tok.decode([t for t in walk._completion(walk._c.matcher, False, False) if t not in tok.eog_ids]))
    assert len(value) == 2
    jsonschema.validate(value, counted)
    dated = {"type": "object", "properties": {"at": {"type": "string", "format": "date-time"},
                                              "day": {"type": "string", "format": "date"}}, "required": ["at", "day"]}
    walk = Closer(Constraint(Grammar.json_schema(dated), tok, 0), tok)
    value = json.loads(tok.decode([t for t in walk._completion(walk._c.matcher, False, False) if t not in tok.eog_ids]))
    assert datetime.datetime.fromisoformat(value["at"]).year >= 1 and datetime.date.fromisoformat(value["day"])


def test_an_object_of_keys_of_its_own_choosing_is_bounded_in_number():
    # {"x_x":1,"x_x":1,"x_x":1,...}: a patternProperties object had no cap, and a model repeated a key
    pattern = {"type": "object", "patternProperties": {"^x_[a-z]+$": {"type": "integer"}}, "additionalProperties": False}
    assert bounded_schema(pattern)["maxProperties"] == MAX_PROPERTIES
    assert bounded_schema({**pattern, "minProperties": 40})["maxProperties"] == 40
    assert bounded_schema({"type": "object", "additionalProperties": {"type": "integer"}})["maxProperties"] == MAX_PROPERTIES
    closed = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False}
    assert "maxProperties" not in bounded_schema(closed)


def test_free_keys_the_walk_writes_are_not_keys_the_reply_has(model):
    # {"a": 1, "a@":0,"a@":0}: "a" taken by the model, the walk wrote one name twice (a parsed
    # object of two properties, short of minProperties 3)
    tok = model.engine.tokenizer
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": {"type": "integer"}, "minProperties": 3}
    for begun in ('{"a": 1', '{"a": 1, "b": 2', '{"a": 1, "k26": 2, "c": 3'):
        c = Constraint(Grammar.json_schema(schema), tok, 0)
        ids = model.tokenize(begun)
        c.feed(ids)
        walk = Closer(c, tok, ids)
        rest = tok.decode([t for t in walk._completion(c.matcher, False, False) if t not in tok.eog_ids])
        value = json.loads(begun + rest)
        assert len(value) >= 3 and (begun + rest).count('"') == 2 * len(value), begun + rest
        jsonschema.validate(value, schema)


@pytest.mark.parametrize("pattern", [
    "[0-9]{3}", r"\d{4}-\d{2}", r"\.pdf$", "hello", "cat|dog|bird", '^"[a-z]+"$', r"^[A-Z]{2}-[0-9]+$",
    r"^\w+@\w+\.com$", r"^(\([0-9]{3}\))?[0-9]{3}-[0-9]{4}$", r"[^0-9a]x", r"^\S+\s\S+$", r"^(?:ab|c){2,3}$",
    r"^[\u00e9\u00e8]+$", r"^.{3}$", r"^(a|bc)*d$"])
def test_a_pattern_example_matches_its_pattern(pattern):
    from ctxengine.text.string_examples import pattern_example
    example = pattern_example(pattern)
    assert example is not None and re.search(pattern, example), (pattern, example)
    assert pattern_example("(?=x)a") is None and pattern_example("(a)\\1") is None  # look-arounds, back-references
