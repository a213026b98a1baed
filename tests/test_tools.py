"""Tool formats: which one a chat template speaks, rendering tools and calls into
prompts, parsing calls out of replies (whole and streamed), forced-call grammars."""
import json

import numpy as np
import pytest

import ctxengine as ce
from ctxengine.text.chat_template import ChatTemplate
from ctxengine.text.grammar import Constraint, GrammarError
from ctxengine.text.tool_stream import ToolStream
from ctxengine.text.tools import (Tool, ToolCall, ToolChoice, as_tools, forced_call_grammar,
                                    parse_tool_calls, tool_format)

WEATHER = Tool("get_weather", "Weather in a city",
               {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                "required": ["city"]})
TIME = Tool("get_time", "Time in a zone", {"type": "object", "properties": {"zone": {"type": "string"}}})

# The shape of Qwen 2.5's template (tools in the system turn, <tool_call> replies, tool turns).
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>"
    "\nReply with <tool_call></tool_call><|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- elif m.tool_calls %}<|im_start|>assistant\n{% for c in m.tool_calls %}<tool_call>\n"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA3_TEMPLATE = (
    "{% for m in messages %}<|start_header_id|>{{ 'ipython' if m.role == 'tool' else m.role }}<|end_header_id|>\n"
    "{% if tools and loop.last %}Call a function with {\"name\": ..., \"parameters\": ...}: "
    "{% for t in tools %}{{ t | tojson }}{% endfor %}\n{% endif %}{{ m.content }}<|eot_id|>{% endfor %}"
    "<|python_tag|>")


@pytest.fixture(scope="module")
def model(smollm2_path):
    m = ce.load(smollm2_path, threads=2)
    yield m
    m.close()


def test_formats_follow_the_template(model):
    assert tool_format(model.chat_template) == "fallback"  # SmolLM2's template knows no tools
    assert tool_format(ChatTemplate(HERMES_TEMPLATE)) == "hermes"
    assert tool_format(ChatTemplate(LLAMA3_TEMPLATE)) == "llama3"
    assert tool_format(None) == "fallback"


def test_fallback_renders_tools_calls_and_results_into_the_prompt(model):
    call = ToolCall("get_weather", {"city": "Paris"})
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "content": "sunny", "tool_call_id": call.id}]
    text = model.chat_prompt(messages, tools=[WEATHER])
    system = text[: text.index("<|im_end|>")]
    assert system.startswith("<|im_start|>system\nBe terse.\n\n") and '"name": "get_weather"' in system
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_openai_shaped_messages_render_as_the_engine_shaped_ones(model):
    # The Python API took only engine-shaped turns: text parts were refused, a user's
    # name too, and an OpenAI tool call (a dict) was an AttributeError.
    call = ToolCall("get_weather", {"city": "Paris"}, id="call_1")
    engine = [{"role": "user", "content": "Weather in Paris?"},
              {"role": "assistant", "content": "", "tool_calls": [call]},
              {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}]
    openai = [{"role": "user", "name": "ann", "content": [{"type": "text", "text": "Weather "},
                                                           {"type": "text", "text": "in Paris?"}]},
              {"role": "assistant", "content": None, "tool_calls": [
                  {"id": "call_1", "type": "function",
                   "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
              {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}]
    assert model.chat_prompt(openai, tools=[WEATHER]) == model.chat_prompt(engine, tools=[WEATHER])
    for bad, words in [([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
                        "content must be a string"),
                       ([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f",
                                                                                          "arguments": "{"}}]}],
                        "arguments are not valid JSON"),
                       ([{"role": "assistant", "content": "", "tool_calls": "f()"}], "tool_calls must be a list"),
                       ("Hi", "messages must be a list")]:
        with pytest.raises(ce.CtxError, match=words):
            model.chat_prompt(bad)


def test_a_template_that_knows_tools_renders_them_itself():
    t = ChatTemplate(HERMES_TEMPLATE)
    from ctxengine.text.tools import template_messages

    call = ToolCall("get_weather", {"city": "Oslo"})
    msgs, variables = template_messages([{"role": "user", "content": "Oslo?"},
                                         {"role": "assistant", "content": "", "tool_calls": [call]},
                                         {"role": "tool", "content": "rain"}], [WEATHER], "hermes")
    text = t.render(msgs, **variables)
    assert text.startswith("<|im_start|>system\n# Tools\n<tools>{\"type\": \"function\"")
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' in text
    assert "<tool_response>\nrain\n</tool_response>" in text


@pytest.mark.parametrize("text, content, calls", [
    ('I will check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
     '<tool_call>{"name": "get_time", "arguments": "{\\"zone\\": \\"CET\\"}"}</tool_call>',
     "I will check.", [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})]),
    ('<tool_call>{"name": "get_time", "arguments": {}}', "", [("get_time", {})]),  # cut before the close
    ('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool', "", [("get_time", {})]),  # cut in it
    ('<tool_call>{"name": "get_time", "arguments": {}}\n<', "", [("get_time", {})]),
    ('<tool_call>{"name": "get_time", "arguments": {}}</tool_cal> x', '<tool_call>{"name": "get_time", '
     '"arguments": {}}</tool_cal> x', []),                                  # a wrong close, text after it
    ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}', "", [("get_weather", {"city": "Rome"})]),
    (' {"name": "get_weather", "arguments": {"city": "Nice"}}', "", [("get_weather", {"city": "Nice"})]),
    ('[{"name": "get_time", "parameters": {"zone": "UTC"}}]', "", [("get_time", {"zone": "UTC"})]),
    ('{"city": "Paris"}', '{"city": "Paris"}', []),                        # JSON, but not a call
    ("<tool_call>not json</tool_call> hello", "<tool_call>not json</tool_call> hello", []),
    ("Just text.", "Just text.", []),
])
def test_parsing_every_format(text, content, calls):
    got_content, got = parse_tool_calls(text)
    assert got_content == content
    assert [(c.name, c.arguments) for c in got] == calls
    assert all(c.id.startswith("call_") for c in got)


@pytest.mark.parametrize("text", [
    '{"name": "John Doe", "age": 31}',                                       # a JSON reply about a person
    '[{"name": "Max", "arguments": {}}]',
    '<tool_call>{"name": "get_time_of_mars", "arguments": {}}</tool_call>',  # a tool nobody offered
])
def test_a_call_must_name_an_offered_tool(text):
    """A JSON reply with a "name" field became a call to a tool named "John Doe",
    and its text was lost (OpenAI and Anthropic only ever return offered tools)."""
    assert parse_tool_calls(text, {"get_weather", "get_time"}) == (text, [])
    assert parse_tool_calls(text)[1]  # with no names given, any name is a call
    s = ToolStream(names={"get_weather"})
    assert s.push(text) + "".join(s.finish()[0]) == text


def stream(pieces, forced=False):
    s = ToolStream(forced=forced)
    shown = "".join(s.push(p) for p in pieces)
    rest, calls = s.finish()
    return shown, rest, [(c.name, c.arguments) for c in calls]


def test_a_call_whose_arguments_hold_the_closing_tag_is_a_call():
    # the call ran to the first </tool_call>, inside the JSON string: no call, the raw text
    def named(found):
        return found[0], [(c.name, c.arguments) for c in found[1]]

    text = '<tool_call>\n{"name": "f", "arguments": {"s": "a</tool_call>b"}}\n</tool_call>'
    assert named(parse_tool_calls(text, {"f"})) == ("", [("f", {"s": "a</tool_call>b"})])
    stream = ToolStream(forced=True, names={"f"})
    assert stream.push(text) == "" and named(stream.finish()) == ("", [("f", {"s": "a</tool_call>b"})])
    text = 'x <tool_call>{"name": "f", "arguments": {}} junk</tool_call> <tool_call>{"name": "f", "arguments": {}}'
    assert named(parse_tool_calls(text, {"f"})) == ('x <tool_call>{"name": "f", "arguments": {}} junk</tool_call>',
                                                    [("f", {})])


def test_streaming_shows_text_and_holds_calls():
    call = '{"name": "get_time", "arguments": {"zone": "UTC"}}'
    pieces = ["Let me", " look. <to", "ol_c", "all>\n", call[:10], call[10:], "\n</tool_call>"]
    # The space before the call is never shown: streamed or not, the reply's text is "Let me look."
    assert stream(pieces) == ("Let me look.", "", [("get_time", {"zone": "UTC"})])
    assert stream(["Hi ", " there ", "\n"]) == ("Hi  there", " \n", [])  # whitespace waits for what follows
    assert stream(["a <t", "able>"]) == ("a <table>", "", [])     # a tag prefix that was not one
    assert stream([" ", call]) == ("", "", [("get_time", {"zone": "UTC"})])  # a bare JSON call
    assert stream(["{not", " a call}"]) == ("", "{not a call}", [])  # held, then given back as text
    assert stream(["<|python", "_tag|>", call]) == ("", "", [("get_time", {"zone": "UTC"})])
    assert stream(["<b>bold</b>"]) == ("<b>bold</b>", "", [])
    assert stream(["<tool_call>\n", call, "\n</tool_call>"], forced=True) == ("", "", [("get_time", {"zone": "UTC"})])
    # a forced call cut by max_tokens is no call, and its markup is not the reply's text (it was)
    assert stream(["<tool_call>\n", call[:12]], forced=True) == ("", "", [])


def test_forced_call_grammars_accept_calls_and_only_calls(model):
    tok = model.tokenizer
    tools = as_tools([WEATHER.openai(), {"name": "get_time", "parameters": TIME.parameters}])
    good = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n</tool_call>'
    c = Constraint(forced_call_grammar(tools, ToolChoice("required"), "fallback"), tok, 0)
    c.feed(model.tokenize(good))
    assert c.done
    named = Constraint(forced_call_grammar(tools, ToolChoice("named", "get_time"), "fallback"), tok, 0)
    assert named.mask(np.zeros(tok.n_vocab, np.float32)).max() == 0  # something is allowed
    with pytest.raises(GrammarError, match="do not match"):
        named.feed(model.tokenize(good))  # a call of the wrong tool
    llama = Constraint(forced_call_grammar(tools, ToolChoice("required"), "llama3"), tok, 0)
    llama.feed(model.tokenize(json.dumps({"name": "get_time", "parameters": {"zone": "UTC"}})))
    assert llama.done
    with pytest.raises(GrammarError, match="do not match"):  # a required argument missing
        Constraint(forced_call_grammar(tools, ToolChoice("required"), "fallback"), tok, 0).feed(
            model.tokenize('<tool_call>\n{"name": "get_weather", "arguments": {"unit": "K"}}'))


def test_a_tools_refs_point_into_its_own_schema(model):
    # "#" meant the {name, arguments} wrapper, "#/properties/..." was a 400, and two tools
    # with the same $defs name shared the last one's.
    tok = model.tokenizer
    tree = Tool("tree", "", {"type": "object", "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}},
        "w": {"$ref": "#/properties/v"}}, "required": ["v"]})
    ta = Tool("ta", "", {"type": "object", "properties": {"x": {"$ref": "#/$defs/X"}}, "required": ["x"],
                         "$defs": {"X": {"type": "string"}}})
    tb = Tool("tb", "", {"type": "object", "properties": {"x": {"$ref": "#/$defs/X"}}, "required": ["x"],
                         "$defs": {"X": {"type": "integer"}}})

    def takes(tools, call) -> bool:
        c = Constraint(forced_call_grammar(tools, ToolChoice("required"), "fallback"), tok, 0)
        try:
            c.feed(model.tokenize(f"<tool_call>\n{json.dumps(call)}\n</tool_call>"))
        except GrammarError:
            return False
        return c.done

    assert takes([tree], {"name": "tree", "arguments": {"v": 1, "kids": [{"v": 2, "kids": []}], "w": 3}})
    assert not takes([tree], {"name": "tree", "arguments": {"v": 1, "kids": [{"name": "tree", "arguments": {}}]}})
    assert not takes([tree], {"name": "tree", "arguments": {"v": 1, "w": "three"}})
    assert takes([ta, tb], {"name": "ta", "arguments": {"x": "hello"}})
    assert takes([ta, tb], {"name": "tb", "arguments": {"x": 5}})
    assert not takes([ta, tb], {"name": "ta", "arguments": {"x": 5}})


def test_a_tool_schema_that_cannot_compile_is_named_as_the_tools():
    # The error named the {name, arguments} wrapper ("invalid Lark grammar", "required property
    # 'arguments' is unsatisfiable"), not the tool or its own schema.
    bad = Tool("lookup", "", {"type": "object", "properties": {"s": {"type": "string", "pattern": "(?=x)a"}},
                              "required": ["s"]})
    with pytest.raises(GrammarError, match="tool 'lookup': its parameters are an invalid JSON schema: .*look-around"):
        forced_call_grammar([WEATHER, bad], ToolChoice("required"), "fallback")


def test_a_function_without_parameters_is_forced_to_empty_arguments(model):
    # OpenAI: "omitting parameters defines a function with an empty parameter list"; as
    # {"type": "object"} a forced call of it made keys up
    tok = model.tokenizer
    for tools in (as_tools([{"type": "function", "function": {"name": "ping", "description": "Ping"}}]),
                  [Tool("ping", "Ping")]):
        grammar = forced_call_grammar(tools, ToolChoice("required"), "fallback")
        c = Constraint(grammar, tok, 0)
        c.feed(model.tokenize('<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'))
        assert c.done
        with pytest.raises(GrammarError, match="do not match"):
            Constraint(grammar, tok, 0).feed(model.tokenize('<tool_call>\n{"name": "ping", "arguments": {"a'))


def test_text_held_with_a_call_keeps_the_space_before_it():
    """Text that opens like a call (the tag, mentioned) and a real call after it: the space
    before the held text was dropped ("Wrap it in<tool_call>..."), found by a probe."""
    raw = 'Wrap it in <tool_call></tool_call> tags:\n<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'
    for pieces in ([raw], list(raw)):
        s = ToolStream(names={"get_weather"})
        shown = "".join(s.push(p) for p in pieces)
        rest, calls = s.finish()
        assert (shown + rest, [c.name for c in calls]) == ("Wrap it in <tool_call></tool_call> tags:", ["get_weather"])


@pytest.mark.parametrize("kind", ["array", "string", "integer", ["object", "null"]])
def test_parameters_that_are_not_an_objects_schema_are_refused(kind):
    """A call's arguments are an object: a forced call of a tool whose parameters were an
    array's schema ended "stop" with no call and no text (OpenAI and Anthropic refuse them)."""
    with pytest.raises(ce.CtxError, match="parameters must be the schema of an object"):
        as_tools([{"type": "function", "function": {"name": "f", "parameters": {"type": kind}}}])
    assert as_tools([{"name": "f", "parameters": {"type": "object"}}])[0].parameters == {"type": "object"}
