"""Ollama's Go templates: Ollama's own templates and renderings, its legacy
turn-by-turn semantics, the Go text/template rules we follow, and refusals."""
from pathlib import Path

import pytest

from ctxengine.ollama.template import OllamaTemplate, identifiers, render_go_template
from ctxengine.errors import CtxError, UnsupportedTemplateError

DATA = Path(__file__).parent / "data" / "ollama_templates"
TEMPLATES = sorted(p.name for p in DATA.glob("*.gotmpl"))

USER = {"role": "user", "content": "Hello, how are you?"}
ASSISTANT = {"role": "assistant", "content": "I'm doing great. How can I help you today?"}
USER2 = {"role": "user", "content": "I'd like to show off how chat templating works!"}
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
# template/template_test.go TestTemplate: the conversations behind testdata/<template>/<case>.
CASES = {"user": [USER], "user-assistant-user": [USER, ASSISTANT, USER2],
         "system-user-assistant-user": [SYSTEM, USER, ASSISTANT, USER2]}
# Ollama's test drops one trailing space from these before comparing.
TRAILING_SPACE = {"chatqa.gotmpl", "llama2-chat.gotmpl", "mistral-instruct.gotmpl", "openchat.gotmpl",
                  "vicuna.gotmpl"}


def test_all_of_ollamas_templates_are_here():
    assert len(TEMPLATES) == 20 and {"chatml.gotmpl", "llama3-instruct.gotmpl", "gemma-instruct.gotmpl",
                                     "zephyr.gotmpl", "command-r.gotmpl"} <= set(TEMPLATES)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", TEMPLATES)
def test_renders_as_ollama_does(name, case):
    got = OllamaTemplate((DATA / name).read_text()).execute(CASES[case])
    if name in TRAILING_SPACE and got.endswith(" "):
        got = got[:-1]
    assert got == (DATA / "testdata" / name / case).read_text()


def test_chatml_by_hand():
    text = render_go_template((DATA / "chatml.gotmpl").read_text(), messages=[SYSTEM, USER])
    assert text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                    "<|im_start|>user\nHello, how are you?<|im_end|>\n<|im_start|>assistant\n")


# -- legacy templates (no .Messages): template_test.go TestExecuteWithMessages --------------
MISTRAL_NO_RESPONSE = "[INST] {{ if .System }}{{ .System }}\n\n{{ end }}{{ .Prompt }}[/INST] "
MISTRAL_RESPONSE = "[INST] {{ if .System }}{{ .System }}\n\n{{ end }}{{ .Prompt }}[/INST] {{ .Response }}"
MISTRAL_MESSAGES = ("[INST] {{ if .System }}{{ .System }}\n\n{{ end }}\n{{- range .Messages }}\n"
                    "{{- if eq .Role \"user\" }}{{ .Content }}[/INST] {{ else if eq .Role \"assistant\" }}"
                    "{{ .Content }}[INST] {{ end }}\n{{- end }}")
FRIEND = [{"role": "user", "content": "Hello friend!"}, {"role": "assistant", "content": "Hello human!"},
          {"role": "user", "content": "What is your name?"}]


@pytest.mark.parametrize("template", [MISTRAL_NO_RESPONSE, MISTRAL_RESPONSE, MISTRAL_MESSAGES])
def test_legacy_turns_match_the_messages_template(template):
    assert OllamaTemplate(template).execute(FRIEND) == (
        "[INST] Hello friend![/INST] Hello human![INST] What is your name?[/INST] ")
    system = [{"role": "system", "content": "You are a helpful assistant!"}, *FRIEND]
    assert OllamaTemplate(template).execute(system) == (
        "[INST] You are a helpful assistant!\n\nHello friend![/INST] Hello human![INST] What is your name?[/INST] ")


@pytest.mark.parametrize("template", [
    "[INST] {{ .Prompt }}[/INST] ", "[INST] {{ .Prompt }}[/INST] {{ .Response }}",
    "\n{{- range $i, $m := .Messages }}\n{{- if eq .Role \"user\" }}[INST] {{ .Content }}[/INST] "
    "{{ else if eq .Role \"assistant\" }}{{ .Content }}{{ end }}\n{{- end }}"])
def test_a_trailing_assistant_message_is_continued(template):
    msgs = [*FRIEND, {"role": "assistant", "content": "My name is Ollama and I"}]
    assert OllamaTemplate(template).execute(msgs) == (
        "[INST] Hello friend![/INST] Hello human![INST] What is your name?[/INST] My name is Ollama and I")


def test_legacy_chatml_cuts_after_the_last_response():
    template = ("{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
                "{{ if .Prompt }}<|im_start|>user\n{{ .Prompt }}<|im_end|>\n{{ end }}"
                "<|im_start|>assistant\n{{ .Response }}<|im_end|>\n")
    msgs = [{"role": "system", "content": "S"}, *FRIEND]
    assert OllamaTemplate(template).execute(msgs) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHello friend!<|im_end|>\n"
        "<|im_start|>assistant\nHello human!<|im_end|>\n"
        "<|im_start|>user\nWhat is your name?<|im_end|>\n<|im_start|>assistant\n")


def test_generate_style_system_prompt_and_appended_response():
    # No .Response in the template: Parse appends one, so a response is continued.
    assert render_go_template("{{ .System }} {{ .Prompt }}", system="S", prompt="P") == "S P"
    assert render_go_template("{{ .System }} {{ .Prompt }}", system="S", prompt="P", response="R") == "S PR"
    # The system layer only applies when the messages bring none.
    msgs = [{"role": "system", "content": "mine"}, {"role": "user", "content": "u"}]
    assert render_go_template("{{ .System }}|{{ .Prompt }}", system="layer", messages=msgs) == "mine|u"


def test_consecutive_messages_of_a_role_are_collated():
    msgs = [{"role": "system", "content": "a"}, {"role": "system", "content": "b"},
            {"role": "user", "content": "x"}, {"role": "user", "content": "y"}]
    t = "{{ .System }}#{{ range .Messages }}[{{ .Role }}:{{ .Content }}]{{ end }}"
    assert render_go_template(t, messages=msgs) == "a\n\nb#[system:a\n\nb][user:x\n\ny]"


# -- tools ------------------------------------------------------------------------------
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get weather",
    "parameters": {"type": "object", "required": ["location"],
                   "properties": {"location": {"type": "string", "description": "City name"}}}}}


def test_tools_and_tool_calls_print_as_json():
    t = "{{ range .Messages }}{{ range .ToolCalls }}{{ .Function.Arguments }}{{ end }}{{ end }}|{{ .Tools }}"
    msgs = [{"role": "assistant", "content": "",
             "tool_calls": [{"function": {"name": "get_weather", "arguments": {"unit": "c", "location": "Tokyo"}}}]}]
    args, tools = render_go_template(t, messages=msgs, tools=[WEATHER]).split("|")
    assert args == '{"location":"Tokyo","unit":"c"}'
    assert tools == ('[{"type":"function","function":{"name":"get_weather","description":"Get weather",'
                     '"parameters":{"type":"object","required":["location"],'
                     '"properties":{"location":{"type":"string","description":"City name"}}}}}]')


def test_command_r_lists_the_tools():
    text = render_go_template((DATA / "command-r.gotmpl").read_text(), messages=[USER], tools=[WEATHER])
    assert "def get_weather(location: string, ) -> List[Dict]:\n    '''Get weather" in text
    assert "        location (string): City name\n" in text
    assert "<|USER_TOKEN|>Hello, how are you?<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Write 'Action:'" in text



# Ollama's qwen2.5 TEMPLATE layer (registry.ollama.ai/library/qwen2.5), as the model's template blob holds it.
QWEN25 = '''{{- if .Messages }}
{{- if or .System .Tools }}<|im_start|>system
{{- if .System }}
{{ .System }}
{{- end }}
{{- if .Tools }}

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{{- range .Tools }}
{"type": "function", "function": {{ .Function }}}
{{- end }}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call>
{{- end }}<|im_end|>
{{ end }}
{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 -}}
{{- if eq .Role "user" }}<|im_start|>user
{{ .Content }}<|im_end|>
{{ else if eq .Role "assistant" }}<|im_start|>assistant
{{ if .Content }}{{ .Content }}
{{- else if .ToolCalls }}<tool_call>
{{ range .ToolCalls }}{"name": "{{ .Function.Name }}", "arguments": {{ .Function.Arguments }}}
{{ end }}</tool_call>
{{- end }}{{ if not $last }}<|im_end|>
{{ end }}
{{- else if eq .Role "tool" }}<|im_start|>user
<tool_response>
{{ .Content }}
</tool_response><|im_end|>
{{ end }}
{{- if and (ne .Role "assistant") $last }}<|im_start|>assistant
{{ end }}
{{- end }}
{{- else }}
{{- if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}{{ if .Prompt }}<|im_start|>user
{{ .Prompt }}<|im_end|>
{{ end }}<|im_start|>assistant
{{ end }}{{ .Response }}{{ if .Response }}<|im_end|>{{ end }}'''
FORECAST = {"type": "function", "function": {
    "name": "get_weather", "description": "Get weather for a city",
    "parameters": {"type": "object", "required": ["city"],
                   "properties": {"days": {"type": "integer"},
                                  "city": {"type": "string", "description": "city name"}}}}}
ASKED = {"role": "user", "content": "What's the weather in Paris?"}
RESULT = {"role": "tool", "content": "sunny, 21C"}
# What Ollama renders for QWEN25 with the system layer "You are a terse bot.", FORECAST offered, and
# [ASKED, an assistant call of get_weather with {"note": "a<b & c>", "days": 2, "city": "Paris"}, RESULT].
# Derived by hand from Go's text/template and encoding/json (there is no Go toolchain here):
# * {{ .Function }} prints the function's JSON, as api.ToolFunction.String does (json.Marshal: struct fields
#   in declaration order name, description, parameters{type, required, properties}; properties is a Go map,
#   so its keys come sorted: city before days). Ollama up to v0.13 did so; v0.14+ passes a struct without
#   String() and prints Go struct syntax there, a regression (ollama/ollama#14601, fix in #18391).
# * {{ .Function.Arguments }} is templateArgs.String: json.Marshal of a map[string]any, keys sorted, the
#   number 2 decoded as float64 and written "2", and <, >, & escaped as \u003c, \u003e, \u0026.
# * Trim markers: {{- if .System }} eats the newline after "system", {{- range .Tools }} the one after
#   <tools>, {{- end }} the one after </tool_call>. The assistant turn is not $last, so it is closed with
#   <|im_end|>; the tool result is $last and not the assistant's, so the assistant's turn opens after it.
QWEN25_TOOLS = """<|im_start|>system
You are a terse bot.

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{"type": "function", "function": {"name":"get_weather","description":"Get weather for a city",\
"parameters":{"type":"object","required":["city"],"properties":{"city":{"type":"string","description":"city name"},\
"days":{"type":"integer"}}}}}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
<|im_start|>user
What's the weather in Paris?<|im_end|>
<|im_start|>assistant
<tool_call>
{"name": "get_weather", "arguments": {"city":"Paris","days":2,"note":"a\\u003cb \\u0026 c\\u003e"}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
sunny, 21C
</tool_response><|im_end|>
<|im_start|>assistant
"""


def test_qwen25_renders_tools_calls_and_results_as_ollama_does():
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"note": "a<b & c>", "days": 2, "city": "Paris"}}}]}
    text = render_go_template(QWEN25, system="You are a terse bot.", messages=[ASKED, call, RESULT],
                              tools=[FORECAST])
    assert text == QWEN25_TOOLS


def test_a_tool_request_renders_through_the_models_go_template():
    # serving/prompts.py chat_text with the shapes the API layer passes (text.tools Tool and ToolCall): an
    # Ollama model with a TEMPLATE layer renders tools through it even when its GGUF has no Jinja template.
    from types import SimpleNamespace
    from ctxengine.serving.prompts import chat_text
    from ctxengine.text.tools import Tool, ToolCall

    class NoJinja:
        def render(self, *args, **kwargs):
            raise CtxError("nojinja has no chat template")

    model = SimpleNamespace(chat=NoJinja())
    entry = SimpleNamespace(template=QWEN25, system="You are a terse bot.")
    fn = FORECAST["function"]
    call = ToolCall("get_weather", {"note": "a<b & c>", "days": 2, "city": "Paris"})
    msgs = [ASKED, {"role": "assistant", "content": "", "tool_calls": [call]}, RESULT]
    assert chat_text(model, entry, msgs, tools=[Tool(fn["name"], fn["description"], fn["parameters"])]) == \
        QWEN25_TOOLS
    history_only = chat_text(model, entry, msgs)  # tool calls and results with no tools offered
    assert history_only == QWEN25_TOOLS.replace(QWEN25_TOOLS[QWEN25_TOOLS.index("\n\n# Tools"):
                                                             QWEN25_TOOLS.index("<|im_end|>")], "")
    # Tools offered to a layer that cannot show them (Ollama refuses those) go to the GGUF's template.
    with pytest.raises(CtxError, match="no chat template"):
        chat_text(model, SimpleNamespace(template=(DATA / "chatml.gotmpl").read_text(), system=None), msgs,
                  tools=[Tool("get_weather")])


@pytest.mark.parametrize("arguments, printed", [
    ({"days": 2}, '{"days":2}'), ({"days": 2.0}, '{"days":2}'), ({"n": -0.0}, '{"n":-0}'),
    ({"n": 1e-7}, '{"n":1e-7}'), ({"n": 1.5e-10}, '{"n":1.5e-10}'), ({"n": 0.000001}, '{"n":0.000001}'),
    ({"n": 1e20}, '{"n":100000000000000000000}'), ({"n": 1e21}, '{"n":1e+21}'), ({"n": 123.456}, '{"n":123.456}'),
    ({"n": 12345678901234567890}, '{"n":12345678901234567000}'),  # a float64, as Go decodes every JSON number
    ({"s": "a<b>&c\u2028\n\"é"}, '{"s":"a\\u003cb\\u003e\\u0026c\\u2028\\n\\"é"}'),
    ({"z": [1, True, None], "a": {"y": 2.5, "b": "x"}}, '{"a":{"b":"x","y":2.5},"z":[1,true,null]}'),
    ('{"b": 1e-7, "a": 3}', '{"a":3,"b":1e-7}'),  # OpenAI's arguments string
])
def test_tool_call_arguments_print_as_go_json_marshals_them(arguments, printed):
    t = "{{ range .Messages }}{{ range .ToolCalls }}{{ .Function.Arguments }}{{ end }}{{ end }}"
    msgs = [USER, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f",
                                                                                     "arguments": arguments}}]}]
    assert render_go_template(t, messages=msgs) == printed


def test_an_argument_prints_as_fmt_prints_a_float64():
    t = "{{ range .Messages }}{{ range .ToolCalls }}{{ .Function.Arguments.n }} {{ end }}{{ end }}"
    calls = [{"function": {"name": "f", "arguments": {"n": n}}} for n in (2, 1e-7, 1234567, 0.5)]
    assert render_go_template(t, messages=[{"role": "assistant", "content": "", "tool_calls": calls}]) == \
        "2 1e-07 1.234567e+06 0.5 "


def test_function_and_parameters_print_as_json():
    t = ("{{ range .Messages }}{{ end }}"  # .Tools reach only a template that mentions .Messages
         "{{ range .Tools }}{{ .Function }}|{{ .Function.Parameters }}|{{ .Function.Parameters.Properties }}{{ end }}")
    bare = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    assert render_go_template(t, messages=[USER], tools=[bare]) == (
        '{"name":"f","description":"","parameters":{"type":"object","properties":null}}'
        '|{"type":"object","properties":null}|{}')
    enum = {"type": "function", "function": {"name": "g", "description": "<&>", "parameters": {
        "type": "object", "properties": {"u": {"type": ["string", "null"], "enum": ["c", 1], "items": {}}}}}}
    assert render_go_template(t, messages=[USER], tools=[enum]).split("|")[0] == (
        '{"name":"g","description":"\\u003c\\u0026\\u003e","parameters":{"type":"object",'
        '"properties":{"u":{"type":["string","null"],"items":{},"enum":["c",1]}}}}')


# -- Go text/template rules -------------------------------------------------------------
ONE, THREE = [USER], [USER, ASSISTANT, USER2]


@pytest.mark.parametrize("template, messages, expected", [
    ("a  {{- .System -}}  \n b{{ .Messages | len }} {{ .Prompt }}", ONE, "ab1 <no value>"),
    ("x {{/* a comment */}} y{{- /* trimmed */ -}} z", ONE, "x  yz"),
    ('{{ range .Messages }}{{ if eq .Content "nope" "Hello, how are you?" }}yes{{ else }}no{{ end }}{{ end }}',
     ONE, "yes"),
    ('{{ range .Messages }}{{ if eq .Role "system" }}S{{ else if eq .Role "user" }}U{{ else }}A{{ end }}{{ end }}',
     THREE, "UAU"),
    ('{{ $x := "a\\tb" }}{{ $x }}{{ `\\t` }}{{ range .Messages }}{{ $x = .Role }}{{ end }}{{ $x }}', THREE,
     "a\tb\\tuser"),
    ("{{ range $i, $m := .Messages }}{{ $i }}={{ $m.Role }} last={{ eq (len (slice $.Messages $i)) 1 }} {{ end }}",
     THREE, "0=user last=false 1=assistant last=false 2=user last=true "),
    ('{{ range .Messages }}{{ if eq .Role "assistant" }}{{ break }}{{ end }}{{ .Role }}{{ end }}', THREE, "user"),
    ('{{ range .Messages }}{{ if eq .Role "assistant" }}{{ continue }}{{ end }}{{ .Role }}{{ end }}', THREE,
     "useruser"),
    ('{{ or .System "none" }} {{ and .Messages "some" }} {{ not .Tools }} {{ len .Messages }}', THREE,
     "none some true 3"),
    ('{{ printf "%s=%d %v%%" "n" 3 true }} {{ print 1 2 "x" }} {{ .Messages }}', [], "n=3 true% 1 2x []"),
    ("{{ with .System }}has{{ else }}none{{ end }} {{ with index .Messages 0 }}{{ .Role }}{{ end }} {{ 1.5 }} {{ 2e6 }} {{ 123456.0 }}",
     ONE, "none user 1.5 2e+06 123456"),
    ('{{ .Nothing }}|{{ if .Nothing }}t{{ end }}|{{ len "h\u00e9llo" }} {{ range $k, $v := $.Map }}{{ end }}', [],
     "<no value>||6 "),
])
def test_go_semantics(template, messages, expected):
    assert OllamaTemplate(template).execute(messages) == expected


def test_identifiers_as_ollama_vars():
    # template_test.go TestParse (Ollama's Vars also counts the appended {{ .Response }}).
    cases = {"{{ .Prompt }}": {"prompt", "response"},
             "{{ .System }} {{ .Prompt }} {{ .Response }}": {"prompt", "response", "system"},
             "{{ with .Tools }}{{ . }}{{ end }} {{ .System }} {{ .Prompt }}": {"prompt", "response", "system", "tools"},
             "{{ range .Messages }}{{ if eq .Role \"tool\" }}Tool Result: {{ .ToolName }} {{ .Content }}{{ end }}{{ end }}":
                 {"content", "messages", "role", "toolname"}}
    for template, expected in cases.items():
        assert identifiers(OllamaTemplate(template).nodes) == expected


@pytest.mark.parametrize("template", [
    "{{ .Prompt ", "{{ if .Prompt }}x", "{{ end }}", '{{define "x"}}{{end}}{{template "x"}}', "{{ html .Prompt }}",
    "{{ .Prompt | toTypeScriptType }}", "{{ $undefined }}", "{{ if .Prompt }}{{ $x := 1 }}{{ end }}{{ $x }}",
    "{{ 'c' }}", "{{ printf \"%5.2f\" 1.0 }}", "{{ .Prompt.Field }}", "{{ print (1). }}",
    "{{/* unclosed", "{{ range .Messages }}{{ .Nope }}{{ end }}", "{{ eq 1 \"1\" }}",
])
def test_unsupported_templates_raise_for_a_fallback(template):
    with pytest.raises(UnsupportedTemplateError) as err:
        render_go_template(template, messages=[USER])
    assert isinstance(err.value, CtxError) and str(err.value).startswith("template:")
