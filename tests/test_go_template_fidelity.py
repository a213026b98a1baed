"""Ollama's Go templates rendered exactly as Go's text/template renders them.

Every expected output here was taken from a Go oracle: Ollama's template package
(template/template.go at fb30760, which ctx-engine follows) compiled with Go 1.23
and run on the same template, messages and tools.  Where Go fails, we raise
UnsupportedTemplateError (a caller falls back to the GGUF's own template), never
another exception.  No Go is needed to run these tests.
"""
import pytest

from api_server import model, running  # noqa: F401 (fixture)
from ctxengine.errors import UnsupportedTemplateError
from ctxengine.ollama.template import OllamaTemplate
from ollama_layout import make_ollama_store

U = [{"role": "user", "content": "P"}]
TWO = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
CALL = [{"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "w", "arguments": {"days": 3}}}]},
        {"role": "tool", "content": "r"}]
TOOLS = [{"type": "function", "function": {"name": "w", "description": "d", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "description": "The city"},
                                     "days": {"type": ["integer", "null"]}}}}}]
M = "{{ if .Messages }}{{ end }}"  # Ollama passes .Messages and .Tools only to a template that mentions .Messages
PROPS = "{{ range .Tools }}{{ range $k, $v := .Function.Parameters.Properties }}"
END2 = "{{ end }}{{ end }}"


def render(template, messages=U, tools=None, think=None):
    return OllamaTemplate(template).execute(messages, tools=tools, think=think)


# -- 1. what we cannot render raises UnsupportedTemplateError, never another exception ----
@pytest.mark.parametrize("literal", [
    r'"\x4"', r'"\u12"', r'"\U00110000"', r'"\ud800"',  # these raised UnicodeDecodeError or rendered
    r'"\z"', r'"\'"', r'"\0"', r'"\N{BULLET}"', r'"\777"',
])
def test_a_bad_string_escape_is_a_parse_error(literal):
    # Go 1.23 text/template: "template: :1: invalid syntax" for each
    with pytest.raises(UnsupportedTemplateError, match="invalid syntax"):
        OllamaTemplate("{{ " + literal + " }}")


@pytest.mark.parametrize("template", [
    "{{ if true }}" * 249 + "x" + "{{ end }}" * 249,          # raised RecursionError; Go 1.23 gave "x"
    "{{ print " + "(" * 400 + "1" + ")" * 400 + " }}",         # raised RecursionError; Go 1.23 gave "1"
])
def test_nesting_too_deep_for_us_is_refused(template):
    with pytest.raises(UnsupportedTemplateError, match="nested"):
        render(template)


def test_nesting_up_to_the_cap_renders():
    assert render("{{ if true }}" * 100 + "x" + "{{ end }}" * 100) == "x"  # Go 1.23 text/template gave it
    assert render("{{ print " + "(" * 99 + "1" + ")" * 99 + " }}") == "1"  # Go 1.23 text/template gave it


# -- 2. think: .Think, .ThinkLevel and .IsThinkSet as Ollama sets them -------------------------
QWEN3 = (
    '{{- $lastUserIdx := -1 -}}\n{{- range $idx, $msg := .Messages -}}\n'
    '{{- if eq $msg.Role "user" }}{{ $lastUserIdx = $idx }}{{ end -}}\n{{- end }}\n'
    '{{- if or .System .Tools }}<|im_start|>system\n{{ if .System }}\n{{ .System }}\n{{- end }}\n'
    '{{- if .Tools }}\n\n# Tools\n<tools>\n{{- range .Tools }}\n{"type": "function", "function": {{ .Function }}}\n'
    '{{- end }}\n</tools>\n{{- end -}}\n<|im_end|>\n{{ end }}\n'
    '{{- range $i, $_ := .Messages }}\n{{- $last := eq (len (slice $.Messages $i)) 1 -}}\n'
    '{{- if eq .Role "user" }}<|im_start|>user\n{{ .Content }}\n'
    '{{- if and $.IsThinkSet (eq $i $lastUserIdx) }}\n   {{- if $.Think -}}\n      {{- " "}}/think\n'
    '   {{- else -}}\n      {{- " "}}/no_think\n   {{- end -}}\n{{- end }}<|im_end|>\n'
    '{{ else if eq .Role "assistant" }}<|im_start|>assistant\n'
    '{{ if (and $.IsThinkSet (and .Thinking (or $last (gt $i $lastUserIdx)))) -}}\n'
    '<think>{{ .Thinking }}</think>\n{{ end -}}\n{{ if .Content }}{{ .Content }}\n'
    '{{- else if .ToolCalls }}<tool_call>\n{{ range .ToolCalls }}'
    '{"name": "{{ .Function.Name }}", "arguments": {{ .Function.Arguments }}}\n{{ end }}</tool_call>\n'
    '{{- end }}{{ if not $last }}<|im_end|>\n{{ end }}\n'
    '{{- else if eq .Role "tool" }}<|im_start|>user\n<tool_response>\n{{ .Content }}\n</tool_response><|im_end|>\n'
    '{{ end }}\n{{- if and (ne .Role "assistant") $last }}<|im_start|>assistant\n'
    '{{ if and $.IsThinkSet (not $.Think) -}}\n<think>\n\n</think>\n\n{{ end -}}\n{{ end }}\n{{- end }}\n')
CHAT = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Yo", "thinking": "hmm"}, {"role": "user", "content": "More"}]
QWEN3_HEAD = "<|im_start|>system\n\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n"


@pytest.mark.parametrize("think, tail", [
    (True, "<|im_start|>user\nMore /think<|im_end|>\n<|im_start|>assistant\n\n"),  # Go 1.23 gave it (think true)
    (False, "<|im_start|>user\nMore /no_think<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n\n"),  # ditto
    (None, "<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n\n"),  # Go 1.23 gave it (IsThinkSet false)
])
def test_qwen3_renders_each_think_setting_as_ollama(think, tail):
    assert render(QWEN3, CHAT, think=think) == QWEN3_HEAD + tail


def test_an_unset_think_is_true_for_a_thinking_template_as_ollamas_handlers_make_it():
    qwen3 = OllamaTemplate(QWEN3)
    assert qwen3.thinks and not OllamaTemplate("{{ range .Messages }}{{ .Content }}{{ end }}").thinks
    assert qwen3.request_think(None) is True and qwen3.request_think(False) is False
    # Go 1.23 text/template gave it (think true): what Ollama renders when the request has no think
    rendered = qwen3.execute(CHAT, think=qwen3.request_think(None))
    assert rendered.endswith("More /think<|im_end|>\n<|im_start|>assistant\n\n")


@pytest.mark.parametrize("think, expected", [
    (None, "false|false|"),  # Go 1.23 text/template gave it
    (True, "true|true|medium"),  # Go 1.23 text/template gave it
    (False, "false|true|"),  # Go 1.23 text/template gave it
    ("high", "true|true|high"),  # Go 1.23 text/template gave it
])
def test_think_values_as_render_prompt_sets_them(think, expected):
    assert render(M + "{{ .Think }}|{{ .IsThinkSet }}|{{ .ThinkLevel }}", think=think) == expected
    # a legacy template gets them too; Go 1.23 text/template gave the same
    assert render("{{ .Think }}|{{ .IsThinkSet }}|{{ .ThinkLevel }}|{{ .Prompt }}", think=think) == expected + "|P"


# -- 3-7. Go's semantics, case by case -----------------------------------------------------
@pytest.mark.parametrize("template, messages, tools, expected", [
    # 3: a field after a space is a new argument; right after ")" it is a field of the value
    ('{{ range .Messages }}{{ if and (eq .Role "user") .Content }}U{{ end }}{{ end }}', U, None, "U"),  # Go 1.23
    ("{{ range .Messages }}{{ (index $.Messages 0).Role }}{{ end }}", U, None, "user"),  # Go 1.23
    (M + "{{ len .Tools }}", U, None, "0"),  # Go 1.23 text/template gave it
    # 4: a range's else keeps the outer dot; break there ends that range, continue the enclosing one's turn
    ("{{ range .Messages }}x{{ else }}{{ if . }}T{{ else }}F{{ end }}{{ end }}", [], None, "T"),  # Go 1.23
    ("{{ range .Messages }}x{{ else }}[{{ . }}]{{ end }}", [], None,
     "[map[IsThinkSet:false Messages:[] Response: System: Think:false ThinkLevel: Tools:null]]"),  # Go 1.23
    ("{{ range .Messages }}x{{ else }}[{{ .System }}]{{ end }}", [], None, "[]"),  # Go 1.23 text/template gave it
    ("{{ range .Messages }}{{ range .ToolCalls }}{{ else }}{{ break }}{{ end }}X{{ end }}Y", TWO, None,
     "XXY"),  # Go 1.23 text/template gave it
    ("{{ range .Messages }}{{ range .ToolCalls }}{{ else }}{{ continue }}{{ end }}X{{ end }}Y", TWO, None,
     "Y"),  # Go 1.23 text/template gave it
    # 5: literals as strconv reads them
    (M + r'{{ "\xc3\xa9" }}{{ "\303\251" }}', U, None, "éé"),  # Go 1.23 text/template gave it
    (M + r'{{ "\a\b\f\n\r\t\v\\\"\u00e9\U0001F600" }}', U, None, '\a\b\f\n\r\t\v\\"é😀'),  # Go 1.23
    (M + "{{ `a\rb` }}", U, None, "ab"),  # Go 1.23 text/template gave it
    ("A\r\n{{ .Prompt }}", U, None, "A\r\nP"),  # Go 1.23 text/template gave it
    (M + "{{ print 017 0o17 0b101 0x1F 1_000 1e3 1.0 -0 +5 1e-400 }}", U, None,
     "15 15 5 31 1000 1000 1 0 5 0"),  # Go 1.23 text/template gave it
    (M + "{{ if false }}{{ 18446744073709551615 }}{{ end }}ok", U, None, "ok"),  # Go 1.23 text/template gave it
    # 6: printf as fmt answers a wrong type, a missing or extra operand, a lone %
    (M + '{{ printf "%d" 1.5 }}|{{ printf "%s" 3 }}|{{ printf "%s|%d" .Nope .Nope }}', U, None,
     "%!d(float64=1.5)|%!s(int=3)|%!s(<nil>)|%!d(<nil>)"),  # Go 1.23 text/template gave it
    (M + '{{ printf "a" 1 "b" nil }}|{{ printf "100%" }}|{{ printf "%d %s" }}', U, None,
     "a%!(EXTRA int=1, string=b, <nil>)|100%!(NOVERB)|%!d(MISSING) %!s(MISSING)"),  # Go 1.23
    ('{{ range .Messages }}{{ printf "%q" .Content }}{{ end }}',
     [{"role": "user", "content": "a\x01\x7f\a\v\u00a0\u2028\u200b\"\\é"}], None,
     '"a\\x01\\x7f\\a\\v\\u00a0\\u2028\\u200b\\"\\\\é"'),  # Go 1.23 text/template gave it
    (M + '{{ printf "%q %q %c" 65 39 66 }}', U, None, "'A' '\\'' B"),  # Go 1.23 text/template gave it
    ('{{ range .Messages }}{{ range .ToolCalls }}{{ printf "%d" .Function.Arguments.days }}{{ end }}{{ end }}',
     CALL, None, "%!d(float64=3)"),  # Go 1.23 text/template gave it
    (M + '{{ printf "%v %t %x %X %o %b %e %f %g|%d %s" true true 255 "hi" 8 5 1.5 1.5 2e6 "s" false }}', U, None,
     "true true ff 6869 10 101 1.500000e+00 1.500000 2e+06|%!d(string=s) %!s(bool=false)"),  # Go 1.23
    (M + "{{ print nil }}|{{ json nil }}|{{ eq .Tools nil }}", U, None, "<nil>|null|true"),  # Go 1.23
    # 7: Ollama's values: nil stays nil; a property is an api.ToolProperty, its Type a list
    (M + "[{{ .Tools }}|{{ print .Tools }}|{{ json .Tools }}]", U, None, "[null|null|null]"),  # Go 1.23
    (M + "[{{ .Tools }}]", U, [], "[[]]"),  # Go 1.23 text/template gave it
    ("{{ json .Messages }}", U, None, '[{"Role":"user","Content":"P","Thinking":"","Images":null,'
                                      '"ToolCalls":null,"ToolName":"","ToolCallID":""}]'),  # Go 1.23
    ("{{ range .Messages }}{{ json .ToolCalls }}|{{ .ToolCalls }}|{{ .Images }};{{ end }}", CALL, None,
     'null|[]|[];[{"ID":"","Function":{"Index":0,"Name":"w","Arguments":{"days":3}}}]|[{ {0 w {"days":3}}}]|[];'
     "null|[]|[];"),  # Go 1.23 text/template gave it
    ("{{ range .Messages }}{{ . }};{{ end }}", CALL, None,
     '{user q  [] []  };{assistant   [] [{ {0 w {"days":3}}}]  };{tool r  [] []  };'),  # Go 1.23
    (M + PROPS + "{{ $k }}={{ len $v.Type }},{{ json $v.Type }},{{ index $v.Type 0 }},{{ print $v.Type 1 }};" + END2,
     U, TOOLS, 'city=1,"string",string,string 1;days=2,["integer","null"],integer,[integer null] 1;'),  # Go 1.23
    (M + PROPS + "{{ range $v.Type }}<{{ . }}>{{ end }}" + END2, U, TOOLS, "<string><integer><null>"),  # Go 1.23
    (M + "{{ range .Tools }}{{ .Function.Parameters.Properties.city }}{{ end }}", U, TOOLS,
     "{[] string <nil> The city [] <nil> []}"),  # Go 1.23 text/template gave it
    (M + '{{ range .Tools }}{{ with .Function.Parameters.Properties }}{{ .nope }}|{{ json .nope }}|'
         '{{ index . "nope" }}{{ end }}{{ end }}', U, TOOLS,
     "{[]  <nil>  [] <nil> []}|{}|{[]  <nil>  [] <nil> []}"),  # Go 1.23 text/template gave it
    (M + "{{ range .Tools }}{{ .Function.Parameters.Properties }}|{{ json .Function.Parameters.Properties }}"
         "{{ end }}", U, [{"type": "function", "function": {"name": "n", "parameters": {"type": "object"}}}],
     "{}|null"),  # Go 1.23 text/template gave it
    (M + PROPS + "{{ $v }};" + END2, U, [{"type": "function", "function": {"name": "n", "parameters": {
        "type": "object", "required": ["a"], "properties": {"a": {
            "type": "string", "description": "A", "enum": ["x", 1], "items": {"type": "x", "n": 2},
            "anyOf": [{"type": "string"}], "required": ["q"]}, "b": {"type": None}}}}}],
     "{[{[] string <nil>  [] <nil> []}] string map[n:2 type:x] A [x 1] <nil> [q]};"
     "{[]  <nil>  [] <nil> []};"),  # Go 1.23 text/template gave it
    ("{{ range .Messages }}{{ range .ToolCalls }}{{ .Function.Arguments }}|{{ json .Function.Arguments }}"
     "{{ end }}{{ end }}", [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "w"}}]}],
     None, "{}|null"),  # Go 1.23 text/template gave it
])
def test_renders_as_go(template, messages, tools, expected):
    assert render(template, messages, tools) == expected


@pytest.mark.parametrize("template", [
    M + r'{{ "\xe9" }}',  # Go 1.23 prints the byte 0xe9; a prompt of ours is text, so we refuse
    M + "{{ print (1).X }}",  # Go 1.23: can't evaluate field X in type int
    M + "{{ print (1). }}",  # Go 1.23: unexpected <.> in operand
    M + "{{ 08 }}", M + "{{ 99999999999999999999 }}",  # Go 1.23: integer overflow
    M + "{{ 18446744073709551615 }}",  # Go 1.23: 18446744073709551615 overflows int
    M + "{{ 1e400 }}",  # Go 1.23: illegal number syntax
    M + "{{ nil }}", M + "{{ if nil }}a{{ end }}",  # Go 1.23: nil is not a command
    M + "{{ if false }}{{ break }}{{ end }}ok",  # Go 1.23: {{break}} outside {{range}}
    M + "{{ if false }}{{ continue }}{{ end }}ok",  # Go 1.23: {{continue}} outside {{range}}
    M + "{{ range .Messages }}{{ else }}{{ break }}{{ end }}",  # Go 1.23: {{break}} outside {{range}}
    M + "{{ index . 1 }}",  # Go 1.23: error calling index: value has type int; should be string
    M + "{{ index nil }}",  # Go 1.23: error calling index: index of untyped nil
    M + "{{ print(1) }}", M + '{{ print "a""b" }}',  # Go 1.23: unexpected "(" / "\"b\"" in operand
    M + PROPS + '{{ if eq $v.Type "string" }}S{{ end }}' + END2,  # Go 1.23: incompatible types for comparison
    M + "{{ range .Tools }}{{ range .Function.Parameters.Properties }}{{ . }}{{ end }}{{ end }}",  # Go 1.23 prints
    # an address for the nested properties' pointer: {[] object <nil>  [] 0xc000086250 []}
])
def test_what_go_refuses_or_prints_as_an_address_is_refused(template):
    tools = [{"type": "function", "function": {"name": "n", "parameters": {"type": "object", "properties": {
        "a": {"type": "object", "properties": {"b": {"type": "string"}}}}}}}]
    with pytest.raises(UnsupportedTemplateError):
        render(template, U, tools)


# -- the request's think reaches the template layer through /api/generate ------------------
THINKING_LAYER = ("{{ range .Messages }}{{ if .Thinking }}<think>{{ .Thinking }}</think>{{ end }}"
                  "{{ .Content }}{{ end }}|{{ .IsThinkSet }} {{ .Think }}")


@pytest.fixture(scope="module")
def server(tmp_path_factory, smollm2_path):
    root = tmp_path_factory.mktemp("ollama-store")
    make_ollama_store(root, "smollm2:thinks", smollm2_path, template=THINKING_LAYER)
    make_ollama_store(root, "smollm2:plain", smollm2_path, template="{{ range .Messages }}{{ .Content }}{{ end }}"
                                                                    "|{{ .IsThinkSet }} {{ .Think }}")
    with running(tmp_path_factory.mktemp("ollama-home"), "--ollama-models", str(root)) as s:
        yield s


@pytest.mark.parametrize("name, think, prompt", [
    ("smollm2:plain", None, "Hi|false false"),
    ("smollm2:plain", False, "Hi|true false"),
    ("smollm2:thinks", False, "Hi|true false"),
    ("smollm2:thinks", None, "Hi|true true"),  # a thinking template: Ollama's handlers set think true
])
def test_generate_passes_think_to_the_template_layer(server, model, name, think, prompt):  # noqa: F811
    body = {"model": name, "prompt": "Hi", "stream": False, "options": {"num_predict": 1, "temperature": 0}}
    r = server.post("/api/generate", body if think is None else {**body, "think": think}).json()
    assert model.detokenize(r["context"][:r["prompt_eval_count"]]).endswith(prompt)


def test_a_think_value_ollama_would_not_read_is_a_400(server):
    r = server.post("/api/generate", {"model": "smollm2:plain", "prompt": "Hi", "think": "bogus"})
    assert r.status_code == 400 and "think" in r.json()["error"]
