"""An object key the schema does not list can never be an escaped spelling of one it does
(text/json_keys.py): every text the grammar accepts parses, with json.loads, to a value
the schema accepts. Acceptance is read through a fresh matcher fed the SmolLM2
tokenizer's encoding of the text, the path sampling takes."""
import itertools
import json
import re

import jsonschema
import pytest

import ctxengine as ce
from ctxengine.text.grammar import Constraint, Grammar
from ctxengine.text.json_keys import exact_keys, lark_variants, not_names
from ctxengine.text.tools import Tool, ToolChoice, forced_call_grammar

OPEN = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}}
AWKWARD = ["a", "a/b", "na\u00efve", 'q"', "back\\slash", "new\nline", "\u0001", "", "ab", "-^]x", "\U0001F600",
           "\t", "x\u001f", "\u007f", 'q\\', 'q"\n']


@pytest.fixture(scope="module")
def model(smollm2_path):
    m = ce.load(smollm2_path, threads=2)
    yield m
    m.close()


def accepts(model, schema, text: str) -> bool:
    """The grammar (a JSON schema's, or a Grammar) takes all of ``text`` and is complete after it."""
    grammar = schema if isinstance(schema, Grammar) else Grammar.json_schema(schema)
    return matches(Constraint(grammar, model.tokenizer, 0).matcher, model, text)


def matches(fresh, model, text: str) -> bool:
    matcher = fresh.deep_copy()
    ids = model.tokenizer.encode(text)
    if matcher.validate_tokens(ids) != len(ids):
        return False
    matcher.consume_tokens(ids)
    return matcher.is_accepting()


def spellings(key: str) -> set[str]:
    """JSON string texts that all denote ``key``: as written, ASCII-only, every character
    as \\u, slashes as \\/, and (for a control character) \\u in upper case."""
    plain = json.dumps(key, ensure_ascii=False)
    every = '"' + "".join(f"\\u{unit:04x}" for unit in _utf16(key)) + '"'
    return {plain, json.dumps(key), every, every.upper().replace("\\U", "\\u"), plain.replace("/", "\\/")}


def _utf16(key: str) -> list[int]:
    data = key.encode("utf-16-be")
    return [int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2)]


def check_sound(model, schema, keys, values=("1", '"x"')) -> list[str]:
    """Every object of one or two of these keys (each spelling) and values that the grammar
    accepts is valid; returns the texts accepted."""
    fresh = Constraint(Grammar.json_schema(schema), model.tokenizer, 0).matcher
    taken = []
    objects = [[(k, v)] for k in keys for v in values]
    objects += [[(k1, "1"), (k2, '"x"')] for k1, k2 in itertools.permutations(keys, 2)]
    for pairs in objects:
        for spelled in itertools.product(*(sorted(spellings(k)) for k, _ in pairs)):
            text = "{" + ", ".join(f"{s}: {v}" for s, (_, v) in zip(spelled, pairs)) + "}"
            if matches(fresh, model, text):
                jsonschema.validate(json.loads(text), schema)  # fails the test, naming the text
                taken.append(text)
    return taken


def test_the_reported_object(model):
    assert accepts(model, OPEN, '{"a": 1}')
    assert accepts(model, OPEN, '{"b": "x"}')
    assert accepts(model, OPEN, '{"a": 1, "b": "x"}')
    assert not accepts(model, OPEN, '{"\\u0061": "x"}')
    assert not accepts(model, OPEN, '{"\\u0061": 1}')  # a listed key is written as such
    assert not accepts(model, OPEN, '{"a": 1, "\\u0061": "x"}')


def test_escaped_spellings_of_listed_keys(model):
    schema = {"type": "object", "properties": {"a/b": {"type": "integer"}, "na\u00efve": {"type": "integer"}},
              "required": ["a/b"], "additionalProperties": {"type": "string"}}
    for text in ('{"a\\/b": "x"}', '{"a/b": 1, "a\\/b": "x"}', '{"a/b": 1, "na\\u00efve": "x"}',
                 '{"a/b": 1, "na\\u00EFve": "x"}'):
        assert not accepts(model, schema, text), text
    assert accepts(model, schema, '{"a/b": 1, "na\u00efve": 2, "other": "x"}')


def test_listed_keys_that_need_escapes(model):
    names = ['q"', "back\\slash", "new\nline", "\u0001"]
    schema = {"type": "object", "properties": {n: {"type": "integer"} for n in names},
              "additionalProperties": {"type": "string"}}
    for name in names:
        assert accepts(model, schema, "{" + json.dumps(name) + ": 1}"), name
        assert not accepts(model, schema, "{" + json.dumps(name) + ': "x"}'), name
    # unlisted keys holding the same characters still work
    for key in ['q"x', "back\\", "new\n", "\u0001\u0001", "\u0002"]:
        assert accepts(model, schema, "{" + json.dumps(key) + ': "x"}'), key
        assert not accepts(model, schema, "{" + json.dumps(key) + ": 1}"), key


@pytest.mark.parametrize("extra", [{"type": "string"}, True, {}])
def test_every_accepted_text_is_valid(model, extra):
    schema = {"type": "object", "properties": {k: {"type": "integer"} for k in AWKWARD[:6] + AWKWARD[-3:]},
              "additionalProperties": extra}
    taken = check_sound(model, schema, AWKWARD + ["a\n", "b", "na\u00efv", "\u0002", "q\n", "q", "x"])
    for text in ('{"b": "x"}', '{"a": 1}', '{"na\u00efv": "x"}', '{"a\\n": "x"}', '{"\U0001F600": "x"}'):
        assert text in taken, text


def test_required_names_beyond_the_properties(model):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "c"],
              "additionalProperties": {"type": "string"}}
    assert accepts(model, schema, '{"a": 1, "c": "x"}')
    assert accepts(model, schema, '{"a": 1, "c": "x", "d": "y"}')
    assert not accepts(model, schema, '{"a": 1, "c": "x", "\\u0063": "y"}')
    check_sound(model, schema, ["a", "c", "d"])


def test_pattern_properties(model):
    schema = {"type": "object", "properties": {"id": {"type": "integer"}},
              "patternProperties": {"^x": {"type": "integer"}}, "additionalProperties": {"type": "string"}}
    assert accepts(model, schema, '{"id": 1, "xy": 2, "b": "s"}')
    for text in ('{"\\u0078y": "s"}', '{"\\u0069d": "s"}', '{"id": 1, "\\u0069d": "s"}'):
        assert not accepts(model, schema, text), text
    check_sound(model, schema, ["id", "xy", "x", "b", "\u00e9", "\n"])
    # with no other keys allowed, patterns keep the \u escapes of control characters
    closed = {**schema, "additionalProperties": False}
    assert accepts(model, closed, '{"x\\u0001": 2}')
    check_sound(model, closed, ["id", "xy", "b"])


def test_closed_and_unlisted_objects_are_unchanged(model):
    closed = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False}
    assert exact_keys(closed) == (closed, False)
    assert not accepts(model, closed, '{"\\u0061": 1}') and not accepts(model, closed, '{"b": 1}')
    anything = {"type": "object", "additionalProperties": {"type": "string"}}
    assert exact_keys(anything) == (anything, False)
    assert accepts(model, anything, '{"\\u0001": "x"}') and accepts(model, anything, '{"a": "x"}')


def test_an_all_of_llguidance_must_intersect_falls_back_to_no_unicode_escapes(model):
    # two objects llguidance intersects may not both have patterns: the schema is then compiled as
    # it was, with no \u escapes in any string (a key is then spelled one way only)
    a = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    b = {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"], "minProperties": 1}
    schema = {"$defs": {"B": b}, "allOf": [a, {"$ref": "#/$defs/B"}]}
    assert accepts(model, schema, '{"a": "x", "b": 1}')
    assert not accepts(model, schema, '{"a": "x", "b": 1, "\\u0062": "y"}')
    assert not accepts(model, schema, '{"a": "x", "b": 1, "\\u0063": "y"}')  # no \\u at all
    assert accepts(model, schema, '{"a": "x", "b": 1, "c": "y"}')
    check_sound(model, schema, ["a", "b", "c"])


def test_a_forced_tool_call_keeps_its_arguments_keys_exact(model):
    grammar = forced_call_grammar([Tool("f", parameters=OPEN)], ToolChoice("required"), "llama3")
    assert len(lark_variants(grammar.source)) == 2
    call = '{"name": "f", "parameters": %s}'
    assert accepts(model, grammar, call % '{"a": 1, "b": "x"}')
    assert not accepts(model, grammar, call % '{"\\u0061": "x"}')
    assert not accepts(model, grammar, call % '{"a": 1, "\\u0061": "x"}')


def test_nested_objects_are_rewritten():
    schema = {"type": "array", "items": {"anyOf": [OPEN, {"$ref": "#/$defs/d"}]}, "$defs": {"d": OPEN},
              "properties": {"properties": OPEN}}
    out, loose = exact_keys(schema)
    assert not loose
    assert out["items"]["anyOf"][0]["additionalProperties"] is False
    assert out["$defs"]["d"]["additionalProperties"] is False
    assert out["properties"]["properties"]["additionalProperties"] is False  # a property named "properties"
    assert schema["items"]["anyOf"][0]["additionalProperties"] == {"type": "string"}  # the input kept


def test_the_names_regex():
    names = AWKWARD
    rx = re.compile(not_names(names).replace("$", r"\Z"))  # Python's $ also matches before a final newline
    for name in names:
        assert not rx.search(name), name
    for other in ["b", "a\n", "ab/", "abc", "na\u00efv", "na\u00efvee", " ", "\u0002", "\U0001F601", "-^]"]:
        assert rx.search(other), other


def test_the_model_writes_a_valid_object(model):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": {"type": "string", "maxLength": 12}}
    ctx = model.context()
    ctx.append(model.chat_prompt([{"role": "user", "content": "Describe a person as JSON."}]), parse_special=True)
    text = "".join(p.text for p in ctx.generate(60, json_schema=schema, temperature=0.0))
    jsonschema.validate(json.loads(text), schema)
