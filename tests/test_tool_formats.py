"""Tool calling against real chat templates (tests/data/templates: llama.cpp's models/templates,
MIT; see SOURCES-tool-formats.md there) and the call formats of model families beyond Hermes
and Llama 3 (text/tool_formats.py): call ids Mistral's templates take, the fallback prompt
where a template has no system turn, no tool preamble when no tools are offered, the
probe tool, tool definitions as the client sent them, and parsing Mistral, Granite and
DeepSeek calls, whole and streamed."""
import json
import re
from pathlib import Path

import numpy as np
import pytest

import ctxengine as ce
from ctxengine.text.chat import ChatRenderer
from ctxengine.text.chat_template import ChatTemplate
from ctxengine.text.grammar import Constraint, GrammarError
from ctxengine.text.tool_formats import family, short_id, written
from ctxengine.text.tool_stream import ToolStream
from ctxengine.text.tools import (NO_PARAMETERS, Tool, ToolCall, ToolChoice, as_tools, forced_call_grammar,
                                    parse_tool_calls, template_messages, tool_format)

TEMPLATES = Path(__file__).parent / "data" / "templates"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Time in a zone",
                                         "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}
NAMES = {"get_weather", "get_time"}


def template(name: str) -> ChatTemplate:
    bos, eos = {"google-gemma-2-2b-it": ("<bos>", "<eos>"), "meta-llama-Llama-3.1-8B-Instruct":
                ("<|begin_of_text|>", "<|eot_id|>")}.get(name, ("<s>", "</s>"))
    return ChatTemplate((TEMPLATES / f"{name}.jinja").read_text(), bos_token=bos, eos_token=eos)


def renderer(name: str) -> ChatRenderer:
    return ChatRenderer(template(name), None, name)


def round_trip(call: ToolCall) -> list[dict]:
    """A user asks, the engine's reply calls a tool, the client sends the result back."""
    return [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "21C", "tool_call_id": call.id}]


# -- F2: call ids ----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["mistralai-Mistral-Nemo-Instruct-2407", "Mistral-Small-3.2-24B-Instruct-2506"])
@pytest.mark.parametrize("call_id", [None, "toolu_01A09q90qw90lq917835lq9", "call_1", "abc123def"])
def test_mistral_templates_take_the_engines_and_any_clients_call_ids(name, call_id):
    # Nemo's and Small 3.x's templates raise unless an id is 9 alphanumerics; the engine's
    # own ids ("call_" + 24 hex) made every follow-up after a tool call a 400.
    call = ToolCall("get_weather", {"city": "Paris"}) if call_id is None else \
        ToolCall("get_weather", {"city": "Paris"}, call_id)
    assert tool_format(template(name)).short_ids
    text = renderer(name).render(round_trip(call), tools=[WEATHER])
    ids = re.findall(r'"id": "(\w+)"|\[CALL_ID\](\w+)\[ARGS\]', text)
    results = re.findall(r'"call_id": "(\w+)"|\[TOOL_RESULTS\](\w+)\[TOOL_CONTENT\]', text)
    sent = ["".join(x) for x in ids]
    assert len(sent) == 1 and re.fullmatch(r"[A-Za-z0-9]{9}", sent[0]) and ["".join(x) for x in results] == sent
    if call_id == "abc123def":
        assert sent == ["abc123def"]  # an id that fits stays as it is


def test_short_ids_are_stable_and_a_result_without_an_id_answers_the_call():
    assert short_id("call_1") == short_id("call_1") != short_id("call_2")
    fmt = tool_format(template("mistralai-Mistral-Nemo-Instruct-2407"))
    call = ToolCall("get_weather", {"city": "Paris"})
    messages = round_trip(call)
    del messages[2]["tool_call_id"]
    out, _ = template_messages(messages, as_tools([WEATHER]), fmt)
    assert out[2]["tool_call_id"] == out[1]["tool_calls"][0]["id"] == short_id(call.id)


@pytest.mark.parametrize("name", ["Qwen-Qwen2.5-7B-Instruct", "unsloth-mistral-Devstral-Small-2507",
                                  "meta-llama-Llama-3.1-8B-Instruct"])
def test_other_templates_get_the_ids_as_they_are(name):
    fmt = tool_format(template(name))
    assert not fmt.short_ids
    out, _ = template_messages(round_trip(ToolCall("get_weather", {}, "call_xyz")), as_tools([WEATHER]), fmt)
    assert out[1]["tool_calls"][0]["id"] == out[2]["tool_call_id"] == "call_xyz"


# -- F3: the fallback prompt where there is no system turn -----------------------------------
def test_gemma2_takes_tools_in_its_first_user_turn():
    r = renderer("google-gemma-2-2b-it")
    fmt = tool_format(r.template)
    assert fmt == "fallback" and not fmt.system
    asked = [{"role": "user", "content": "Weather in Paris?"}]
    text = r.render(asked, tools=[WEATHER])  # was: "System role not supported"
    assert text.startswith("<bos><start_of_turn>user\nYou have access to the following functions.")
    assert '"name": "get_weather"' in text
    assert text.endswith("\n\nWeather in Paris?<end_of_turn>\n<start_of_turn>model\n")
    assert r.render(asked) == "<bos><start_of_turn>user\nWeather in Paris?<end_of_turn>\n<start_of_turn>model\n"
    then = r.render(round_trip(ToolCall("get_weather", {"city": "Paris"})), tools=[WEATHER])
    assert "<start_of_turn>model\n<tool_call>\n" in then and "<start_of_turn>user\n<tool_response>\n21C\n" in then


def test_templates_with_a_system_turn_keep_the_fallback_prompt_there():
    fmt = tool_format(template("llama-cpp-deepseek-r1"))  # its tools block fails (tojson of a generator)
    assert fmt == "fallback" and fmt.system
    out, _ = template_messages([{"role": "user", "content": "hi"}], as_tools([WEATHER]), fmt)
    assert [m["role"] for m in out] == ["system", "user"] and out[1]["content"] == "hi"


# -- F5: no tools offered ------------------------------------------------------------------
@pytest.mark.parametrize("tools", [None, []])
def test_a_conversation_with_calls_but_no_tools_gets_no_tool_preamble(tools):
    call = ToolCall("get_weather", {"city": "Paris"}, "abc123def")
    llama = renderer("meta-llama-Llama-3.1-8B-Instruct").render(round_trip(call), tools=tools)
    assert "Environment: ipython" not in llama and "Given the following functions" not in llama
    assert '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>' in llama
    nemo = renderer("mistralai-Mistral-Nemo-Instruct-2407").render(round_trip(call), tools=tools)
    assert nemo.startswith("<s>[INST]Weather in Paris?[/INST][TOOL_CALLS][") and "AVAILABLE_TOOLS" not in nemo
    small = renderer("Mistral-Small-3.2-24B-Instruct-2506").render(round_trip(call), tools=tools)
    assert "AVAILABLE_TOOLS" not in small and "[TOOL_CALLS]get_weather[CALL_ID]abc123def[ARGS]" in small


# -- F6: the probe tool ---------------------------------------------------------------------
def test_seed_oss_is_found_to_render_tools():
    r = renderer("ByteDance-Seed-OSS")
    assert tool_format(r.template) == "hermes"  # it reads parameters.properties: the old probe tool had none
    text = r.render([{"role": "user", "content": "hi"}], tools=[WEATHER])
    assert "get_weather" in text and "You have access to the following functions" not in text


# -- F9: tool definitions as the client sent them ------------------------------------------------
def test_tools_render_as_the_client_sent_them():
    sparse = {"type": "function", "function": {"name": "ping", "strict": True}}
    text = renderer("Qwen-Qwen2.5-7B-Instruct").render([{"role": "user", "content": "hi"}], tools=[sparse, WEATHER])
    assert '\n{"type": "function", "function": {"name": "ping", "strict": true}}\n' in text
    assert "\n" + json.dumps(WEATHER, ensure_ascii=False) + "\n" in text
    flat = as_tools([{"type": "function", "name": "ping", "strict": True}])[0]
    assert flat.openai() == sparse and flat.parameters == NO_PARAMETERS  # defaults still there for grammars
    assert Tool("ping").openai() == {"type": "function", "function": {"name": "ping", "description": "",
                                                                      "parameters": NO_PARAMETERS}}


# -- F1: the families' formats -----------------------------------------------------------------
def test_formats_of_the_families():
    assert tool_format(template("mistralai-Mistral-Nemo-Instruct-2407")) == "mistral"
    assert tool_format(template("Mistral-Small-3.2-24B-Instruct-2506")) == "mistral_args"
    assert tool_format(template("unsloth-mistral-Devstral-Small-2507")) == "mistral_args"
    granite = tool_format(template("ibm-granite-granite-3.3-2B-Instruct"))
    assert granite == "granite" and not granite.calls  # its template drops an earlier turn's tool_calls
    assert family(template("llama-cpp-deepseek-r1").source) == "deepseek"
    assert tool_format(template("Qwen-Qwen2.5-7B-Instruct")) == "hermes"
    assert tool_format(template("meta-llama-Llama-3.1-8B-Instruct")) == "llama3"


def test_granite_sees_its_earlier_calls_in_its_own_markup():
    text = renderer("ibm-granite-granite-3.3-2B-Instruct").render(
        round_trip(ToolCall("get_weather", {"city": "Paris"})), tools=[WEATHER])
    assert ('<|start_of_role|>assistant<|end_of_role|><|tool_call|>[{"name": "get_weather", "arguments": '
            '{"city": "Paris"}}]<|end_of_text|>\n<|start_of_role|>tool<|end_of_role|>21C') in text


CALL_W, CALL_T = ("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})
DS = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```"
      "<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{\"zone\": \"CET\"}\n```"
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
# (a model's reply, as its tokens detokenize, special ones included; its text; its calls)
REPLIES = [
    ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abc123def"}]', "", [CALL_W]),
    ('[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
     '{"name": "get_time", "arguments": {"zone": "CET"}}]', "", [CALL_W, CALL_T]),                      # Nemo, v3 SPM
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "", [CALL_W]),                                  # Small 3.2
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"zone": "CET"}', "", [CALL_W, CALL_T]),
    ('Let me check.[TOOL_CALLS]get_weather[CALL_ID]abc123def[ARGS]{"city": "Paris"}', "Let me check.", [CALL_W]),
    ('[TOOL_CALLS]get_weather{"city": "Paris"}', "", [CALL_W]),                                         # Magistral
    ('<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]', "", [CALL_W]),           # Granite 3.x
    ('<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|/tool_call|>', "", [CALL_W]),  # Phi-4
    (DS, "", [CALL_W, CALL_T]),                                                                         # DeepSeek R1
    ("<think>\nok\n</think>\n\n" + DS, "<think>\nok\n</think>", [CALL_W, CALL_T]),
    ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>'
     '<｜tool▁calls▁end｜>', "", [CALL_W]),                                                              # DeepSeek V3.1
    ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city": "Paris"}',
     "", [CALL_W]),                                                                                     # cut short
]
NOT_CALLS = [
    '[TOOL_CALLS]get_stock[ARGS]{"sym": "X"}',                      # a tool nobody offered
    '[TOOL_CALLS][{"name": "get_weather", "arguments": 3}]',         # arguments no object
    "<|tool_call|>not json",
    "Use [TOOL_CALLS] to call a tool.",
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\nno json<｜tool▁call▁end｜>",
]


def named(result):
    text, calls = result
    return text, [(c.name, c.arguments) for c in calls]


@pytest.mark.parametrize("reply, text, calls", REPLIES)
def test_family_calls_parse(reply, text, calls):
    assert named(parse_tool_calls(reply, NAMES)) == (text, calls)
    assert named(parse_tool_calls(reply)) == (text, calls)


def test_a_call_id_the_model_wrote_is_kept():
    assert [c.id for c in parse_tool_calls(REPLIES[0][0])[1]] == ["abc123def"]
    assert [c.id for c in parse_tool_calls(REPLIES[4][0])[1]] == ["abc123def"]
    assert parse_tool_calls(REPLIES[2][0])[1][0].id.startswith("call_")


@pytest.mark.parametrize("reply", NOT_CALLS)
def test_family_markup_that_is_no_call_is_text(reply):
    assert named(parse_tool_calls(reply, NAMES)) == (reply, [])


def stream(pieces, names=NAMES, forced=False):
    s = ToolStream(forced=forced, names=names)
    shown = "".join(s.push(p) for p in pieces)
    rest, calls = s.finish()
    return shown, rest, [(c.name, c.arguments) for c in calls]


@pytest.mark.parametrize("reply, text, calls", REPLIES + [(r, r, []) for r in NOT_CALLS])
def test_family_calls_stream_at_every_split(reply, text, calls):
    # The markers are special tokens: their text comes whole in one piece, or (a token
    # boundary inside a longer piece, or text a grammar spelled) cut anywhere.
    splits = [[reply[:i], reply[i:]] for i in range(len(reply) + 1)] + [list(reply)]
    for pieces in splits:
        shown, rest, got = stream(pieces)
        assert (shown + rest, got) == (text, calls), pieces
        assert text.startswith(shown)  # no markup was shown before it was known to be a call


def test_text_before_a_family_call_streams_before_the_call_ends():
    s = ToolStream(names=NAMES)
    assert s.push("Sure, checking") == "Sure, checking"
    assert s.push(" now.[TOOL") == " now."
    assert s.push("_CALLS]get_weather[ARGS]{") == ""
    assert s.push('"city": "Paris"}') == ""
    assert named(s.finish()) == ("", [CALL_W])


@pytest.mark.parametrize("fmt", ["mistral", "mistral_args", "granite", "deepseek", "hermes", "llama3"])
def test_earlier_calls_written_in_a_familys_markup_parse_back(fmt):
    calls = [ToolCall(*CALL_W), ToolCall(*CALL_T)]
    assert named(parse_tool_calls(written(fmt, calls), NAMES))[1] == [CALL_W, CALL_T]


@pytest.fixture(scope="module")
def model(smollm2_path):
    m = ce.load(smollm2_path, threads=2)
    yield m
    m.close()


@pytest.mark.parametrize("fmt", ["mistral", "mistral_args", "granite"])
def test_forced_calls_of_mistral_and_granite_are_the_json_list_after_their_marker(model, fmt):
    # Their marker ([TOOL_CALLS], <|tool_call|>) is a control token, which a grammar's text cannot
    # write; the model's own marker is masked and the JSON list it goes on with is the call.
    tok, tools = model.tokenizer, as_tools([WEATHER, TIME])
    good = '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
    c = Constraint(forced_call_grammar(tools, ToolChoice("required"), fmt), tok, 0)
    c.feed(model.tokenize(good))
    assert c.done and named(parse_tool_calls(good, NAMES)) == ("", [CALL_W])
    with pytest.raises(GrammarError, match="do not match"):
        Constraint(forced_call_grammar(tools, ToolChoice("named", "get_time"), fmt), tok, 0).feed(model.tokenize(good))
    hermes = Constraint(forced_call_grammar(tools, ToolChoice("required"), fmt), tok, 0)
    assert hermes.mask(np.zeros(tok.n_vocab, np.float32)).max() == 0
    with pytest.raises(GrammarError, match="do not match"):
        hermes.feed(model.tokenize("<tool_call>"))


def test_forced_deepseek_calls_use_the_tagged_form_its_parser_reads(model):
    # DeepSeek's own markup is all control tokens; the generic <tool_call> form parses the same.
    tok = model.tokenizer
    good = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    c = Constraint(forced_call_grammar(as_tools([WEATHER]), ToolChoice("required"), "deepseek"), tok, 0)
    c.feed(model.tokenize(good))
    assert c.done and named(parse_tool_calls(good, NAMES)) == ("", [CALL_W])


def test_a_mistral_reply_parsed_then_sent_back_renders():
    r = renderer("mistralai-Mistral-Nemo-Instruct-2407")
    _, calls = parse_tool_calls(REPLIES[1][0], NAMES)  # no ids written: the engine's are given
    messages = [{"role": "user", "content": "Weather and time in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": calls},
                {"role": "tool", "content": "21C", "tool_call_id": calls[0].id},
                {"role": "tool", "content": "10:00", "tool_call_id": calls[1].id}]
    text = r.render(messages, tools=[WEATHER, TIME])
    ids = re.findall(r'"id": "(\w{9})"', text)
    assert len(ids) == 2 and re.findall(r'"call_id": "(\w{9})"', text) == ids


def test_the_faces_hand_templates_each_function_as_the_client_wrote_it():
    from ctxengine.api.fields import Fields
    from ctxengine.api.tools import anthropic_tool_use, ollama_tool_use, openai_tool_use
    params = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    fn = {"name": "weather", "parameters": params, "strict": False}
    openai = openai_tool_use(Fields({"tools": [{"type": "function", "function": fn}]}))
    assert openai.tools[0].openai() == {"type": "function", "function": fn}  # strict kept, no description added
    ollama = ollama_tool_use(Fields({"tools": [{"type": "function", "function": {"name": "now"}}]}))
    assert ollama.tools[0].openai() == {"type": "function", "function": {"name": "now"}}  # no parameters made up
    anthropic = anthropic_tool_use(Fields({"tools": [{"name": "weather", "description": "d", "input_schema": params,
                                                      "cache_control": {"type": "ephemeral"}}]}))
    assert anthropic.tools[0].openai() == {"type": "function",
                                           "function": {"name": "weather", "description": "d", "parameters": params}}
    assert anthropic.tools[0].parameters == params and ollama.tools[0].parameters == NO_PARAMETERS


LLAMA_TWO = '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}'


@pytest.mark.parametrize("reply, calls", [
    (LLAMA_TWO, [("get_weather", {"city": "Paris"}), ("get_time", {})]),   # Llama 3.2's ";"-joined calls
    (LLAMA_TWO + ";", [("get_weather", {"city": "Paris"}), ("get_time", {})]),
    ('<|python_tag|>' + LLAMA_TWO, [("get_weather", {"city": "Paris"}), ("get_time", {})]),
    (LLAMA_TWO + "; and more", []), (LLAMA_TWO.replace("get_time", "get_date"), []),  # text: not all calls
])
def test_llama_calls_joined_by_semicolons(reply, calls):
    rest, got = parse_tool_calls(reply, NAMES)
    assert ([(c.name, c.arguments) for c in got], rest) == (calls, "" if calls else reply)
    shown, rest, streamed = stream([reply[i:i + 7] for i in range(0, len(reply), 7)])
    assert streamed == calls and (shown + rest == ("" if calls else reply))
