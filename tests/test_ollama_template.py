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
    "{{ 'c' }}", "{{ printf \"%5.2f\" 1.0 }}", "{{ .Prompt.Field }}", "{{ (index .Messages 0).Role }}",
    "{{/* unclosed", "{{ range .Messages }}{{ .Nope }}{{ end }}", "{{ eq 1 \"1\" }}",
])
def test_unsupported_templates_raise_for_a_fallback(template):
    with pytest.raises(UnsupportedTemplateError) as err:
        render_go_template(template, messages=[USER])
    assert isinstance(err.value, CtxError) and str(err.value).startswith("template:")
