"""Chat templates: the real SmolLM2 template, the Gemma fallback, the sandbox, message checks."""
import json
import random
import re

import pytest
from gguf import GGUFReader

from ctxengine.text.chat_template import GEMMA_FALLBACK, ChatTemplate
from ctxengine.errors import CtxError

SMOL_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.fixture(scope="module")
def smollm2_source(smollm2_path):
    # Read with gguf's own reader, independently of ctxengine's parser.
    return GGUFReader(smollm2_path).fields["tokenizer.chat_template"].contents()


# smollm2_meta / gemma3_meta: conftest.py


def token_text(meta):
    return meta["tokenizer.ggml.tokens"].__getitem__


# -- SmolLM2's own template -------------------------------------------------------------
def test_smollm2_system_and_user(smollm2_source):
    t = ChatTemplate(smollm2_source)
    text = t.render([{"role": "system", "content": "You are terse."},
                     {"role": "user", "content": "What is 2+2?"}])
    assert text == ("<|im_start|>system\nYou are terse.<|im_end|>\n"
                    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                    "<|im_start|>assistant\n")


def test_smollm2_default_system_prompt(smollm2_source):
    text = ChatTemplate(smollm2_source).render([{"role": "user", "content": "Hi"}])
    assert text == (f"<|im_start|>system\n{SMOL_SYSTEM}<|im_end|>\n"
                    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_smollm2_multi_turn_without_generation_prompt(smollm2_source):
    text = ChatTemplate(smollm2_source).render(
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
        add_generation_prompt=False)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n")


def test_for_model_uses_the_file_template_and_token_texts(smollm2_meta, smollm2_source):
    assert smollm2_meta["tokenizer.chat_template"] == smollm2_source
    t = ChatTemplate.for_model(smollm2_meta, token_text(smollm2_meta))
    assert t.source == smollm2_source
    assert (t.bos_token, t.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert t.render([{"role": "user", "content": "Hi"}]).endswith("<|im_start|>assistant\n")


# -- the Gemma fallback ------------------------------------------------------------------------
def test_gemma3_file_has_no_template_and_gets_the_fallback(gemma3_meta):
    assert "tokenizer.chat_template" not in gemma3_meta
    assert gemma3_meta["general.architecture"] == "gemma3"
    t = ChatTemplate.for_model(gemma3_meta, token_text(gemma3_meta))
    assert t is not None and t.source == GEMMA_FALLBACK
    assert (t.bos_token, t.eos_token) == ("<bos>", "<eos>")
    text = t.render([{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "Hi"},
                     {"role": "assistant", "content": "Hello!"},
                     {"role": "user", "content": "Bye"}])
    assert text == ("<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
                    "<start_of_turn>model\nHello!<end_of_turn>\n"
                    "<start_of_turn>user\nBye<end_of_turn>\n"
                    "<start_of_turn>model\n")
    # The turn markers are single control tokens of this vocabulary.
    tokens = set(gemma3_meta["tokenizer.ggml.tokens"])
    assert {"<start_of_turn>", "<end_of_turn>"} <= tokens


def test_gemma_fallback_without_system_and_generation_prompt():
    text = ChatTemplate(GEMMA_FALLBACK).render([{"role": "user", "content": " Hi \n"}], add_generation_prompt=False)
    assert text == "<start_of_turn>user\nHi<end_of_turn>\n"  # content trimmed, as Gemma's template does


# Gemma 3's own chat template (Hugging Face's tokenizer_config.json, text only).
HF_GEMMA3 = (
    "{%- if messages[0]['role'] == 'system' -%}{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


def test_gemma_fallback_is_gemma3s_own_template_wherever_that_renders():
    rng = random.Random(20261203)
    texts = ["Hi", " padded \n", "", "\xa0nbsp\u3000", "two\n\nlines", "<start_of_turn>"]
    rendered, hf_gemma3, fallback = 0, ChatTemplate(HF_GEMMA3), ChatTemplate(GEMMA_FALLBACK)
    for _ in range(3000):
        roles = [rng.choice(["system", "user", "assistant"]) for _ in range(rng.randrange(1, 6))]
        messages = [{"role": r, "content": rng.choice(texts)} for r in roles]
        gp = rng.random() < 0.5
        try:
            want = hf_gemma3.render(messages, add_generation_prompt=gp)
        except CtxError:
            continue  # roles that do not alternate: below
        rendered += 1
        assert fallback.render(messages, add_generation_prompt=gp) == want, messages
    assert rendered > 300


@pytest.mark.parametrize("messages, text", [
    ([("user", "a"), ("user", "b")], "<start_of_turn>user\na<end_of_turn>\n<start_of_turn>user\nb<end_of_turn>\n"),
    # trimmed as llama.cpp trims (C's isspace), not as Jinja's trim: Unicode spaces stay (they were
    # stripped, and a system message of one U+3000 lost its "\n\n")
    ([("user", "a"), ("user", "\u3000b\xa0\x85"), ("system", "\u3000"), ("user", " \t\u2028c\r\n")],
     "<start_of_turn>user\na<end_of_turn>\n<start_of_turn>user\n\u3000b\xa0\x85<end_of_turn>\n"
     "<start_of_turn>user\n\u3000\n\n\u2028c<end_of_turn>\n"),
    ([("system", "Be kind."), ("assistant", "Hello! Ask me."), ("user", "Hi")],
     "<start_of_turn>model\nHello! Ask me.<end_of_turn>\n<start_of_turn>user\nBe kind.\n\nHi<end_of_turn>\n"),
    ([("system", "s1"), ("system", "s2"), ("user", "b")], "<start_of_turn>user\ns1s2\n\nb<end_of_turn>\n"),
    # as llama.cpp's too (the probe of 2026-12-05 compared 456 such chats with it): a system
    # message in the middle joins the next user turn, one at the end is dropped, and system
    # text is trimmed (these were a "system" turn, a system turn, and " s1  s2 ")
    ([("user", "a"), ("user", "b"), ("system", "mid"), ("user", "c")],
     "<start_of_turn>user\na<end_of_turn>\n<start_of_turn>user\nb<end_of_turn>\n<start_of_turn>user\nmid\n\nc"
     "<end_of_turn>\n"),
    ([("user", "a"), ("user", "b"), ("system", "late")],
     "<start_of_turn>user\na<end_of_turn>\n<start_of_turn>user\nb<end_of_turn>\n"),
    ([("system", "S"), ("assistant", "x"), ("system", "T")], "<start_of_turn>model\nx<end_of_turn>\n"),
    ([("system", " s1 "), ("system", " s2 "), ("user", "hi")], "<start_of_turn>user\ns1s2\n\nhi<end_of_turn>\n"),
])
def test_gemma_fallback_renders_what_gemma3s_template_refuses_as_llama_cpp_does(messages, text):
    # Two user turns in a row (an agent's), a chat that opens with the model's greeting, two
    # system messages: Gemma 3's template raises; llama.cpp's gemma template (and so this
    # fallback) gives each message its turn and every system message's text, trimmed, to
    # the next user turn.
    turns = [{"role": r, "content": c} for r, c in messages]
    with pytest.raises(CtxError, match="alternate"):
        ChatTemplate(HF_GEMMA3).render(turns, add_generation_prompt=False)
    assert ChatTemplate(GEMMA_FALLBACK).render(turns, add_generation_prompt=False) == text


@pytest.mark.parametrize("arch, fallback", [("gemma", True), ("gemma2", True), ("gemma3", True),
                                            ("llama", False), (None, False)])
def test_fallback_by_architecture(arch, fallback):
    meta = {"general.architecture": arch} if arch else {}
    t = ChatTemplate.for_model(meta, lambda i: "")
    assert (t is not None) == fallback


def test_a_template_that_is_not_a_string_is_a_file_error():
    with pytest.raises(CtxError, match="not a string"):
        ChatTemplate.for_model({"tokenizer.chat_template": 3}, lambda i: "")


# -- HF-compatible environment ---------------------------------------------------------------------
def test_bos_eos_and_extra_variables():
    t = ChatTemplate("{{ bos_token }}{{ messages[0].content }}{{ eos_token }}{{ greeting }}", bos_token="<s>",
                     eos_token="</s>")
    assert t.render([{"role": "user", "content": "x"}], greeting="!") == "<s>x</s>!"


def test_trim_and_lstrip_blocks_like_transformers():
    src = "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}"
    assert ChatTemplate(src).render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == \
        "[a]\n[b]\n"


def test_tojson_is_json_dumps_without_html_escaping():
    t = ChatTemplate("{{ {'b': '<é>', 'a': [1, 2]} | tojson }}|{{ {'b': 1, 'a': 2} | tojson(indent=2, sort_keys=true) }}")
    first, second = t.render([]).split("|")
    assert first == json.dumps({"b": "<é>", "a": [1, 2]}, ensure_ascii=False)
    assert second == json.dumps({"a": 2, "b": 1}, indent=2)


def test_strftime_now_and_loop_controls():
    src = ("{{ strftime_now('%Y-%m-%d') }}:"
           "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}"
           "{% generation %}!{% endgeneration %}")
    out = ChatTemplate(src).render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    assert re.fullmatch(r"\d{4}-\d\d-\d\d:a!", out)


def test_raise_exception_surfaces_as_ctx_error():
    t = ChatTemplate("{% if messages[0].role != 'user' %}{{ raise_exception('First message must be from the user') }}"
                     "{% endif %}ok")
    assert t.render([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(CtxError, match="First message must be from the user"):
        t.render([{"role": "assistant", "content": "x"}])


def test_template_runtime_errors_are_ctx_errors():
    with pytest.raises(CtxError, match="ZeroDivisionError"):
        ChatTemplate("{{ 1 / 0 }}").render([])


@pytest.mark.parametrize("src", ["{% if %}", "{% for m in messages %}", "{{ x | no_such_filter }}", "{{ 'a' }"])
def test_syntax_errors_are_ctx_errors(src):
    with pytest.raises(CtxError, match="syntax error"):
        ChatTemplate(src)


# -- the sandbox ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("src", [
    "{{ ''.__class__ }}",
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ raise_exception.__globals__ }}",
    "{{ messages.__len__() }}",
    "{{ messages.append(1) }}",  # immutable sandbox: the caller's data stays as given
    "{% set x = messages[0].update({'role': 'system'}) %}",
])
def test_sandbox_escapes_are_refused(src):
    with pytest.raises(CtxError, match="unsafe"):
        ChatTemplate(src).render([{"role": "user", "content": "x"}])


_RENDER = """
import sys
import ctxengine.text.template_limits as limits
from ctxengine.text.chat_template import ChatTemplate
from ctxengine.errors import CtxError
# Each template must meet its own bound, not the clock: on a fresh VM, first touches of a GiB
# of memory (the doubling string's) took more than the 10 s time bound (CI, machine E). The
# memory bound is the same check at 64 MiB: touching the real 1 GiB took the test 26 s.
limits.MAX_SECONDS = 100.0
limits.MAX_GROWTH = 64 << 20
try:
    ChatTemplate(sys.argv[1]).render([{"role": "user", "content": "x"}])
except CtxError as err:
    print(err)
"""


@pytest.mark.parametrize("src, says", [
    ("{% for a in range(99999) %}{% for b in range(99999) %}x{% endfor %}{% endfor %}", "range() steps"),
    ("{{ 10 ** (10 ** 9) }}", "larger than 4096 bits"),
    ("{% set s = 'x' * 1000000000 %}{{ s | length }}", "a sequence repeated 1,000,000,000 times"),
    ("{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "MiB of memory"),
])
def test_a_template_that_would_run_forever_or_fill_memory_is_stopped(src, says):
    # Each hung the render (a chat request) or allocated gigabytes: the sandbox bounds access only.
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", _RENDER, src], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "chat template stopped: " in r.stdout and says in r.stdout, (r.stdout, r.stderr)


def test_bounded_range_still_behaves_as_range():
    src = "{% for i in range(3)|reverse %}{{ i }}{% endfor %}|{{ range(5)|length }}|{{ range(5)[2] }}|{{ 3 in range(4) }}"
    assert ChatTemplate(src).render([{"role": "user", "content": "x"}]) == "210|5|2|True"


# -- message checks -------------------------------------------------------------------------------------
@pytest.mark.parametrize("messages, problem", [
    ("hello", "list"),
    ([["user", "hi"]], "dict"),
    ([{"role": "tool", "content": "x"}], "role"),
    ([{"content": "x"}], "role"),
    ([{"role": "user"}], "content"),
    ([{"role": "user", "content": None}], "content"),
    ([{"role": "user", "content": [{"type": "text", "text": "x"}]}], "content"),
    ([{"role": "user", "content": "x", "name": "bob"}], "unsupported key"),
])
def test_malformed_messages_are_refused(messages, problem):
    with pytest.raises(CtxError, match=problem):
        ChatTemplate("{{ messages }}").render(messages)


def test_an_empty_conversation_renders():
    assert ChatTemplate(GEMMA_FALLBACK).render([]) == "<start_of_turn>model\n"


# -- the one renderer (text/chat.py) ----------------------------------------------------
class _Tok:
    """Just what ChatRenderer reads of a tokenizer: end-of-turn ids and their text, and
    the tokens of an assistant turn's opening (7, 8)."""
    eog_ids = frozenset({2})

    def decode(self, ids):
        return "".join({2: "<|im_end|>", 5: "x", 7: "<|im_start|>", 8: "assistant\n"}[i] for i in ids)

    def encode(self, text, parse_special=False):
        assert text == "<|im_start|>assistant\n" and parse_special
        return [7, 8]


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_renderer_whole_system_and_continuation():
    from ctxengine.text.chat import ChatRenderer

    r = ChatRenderer(ChatTemplate(CHATML), _Tok(), "m")
    t = ChatTemplate(CHATML)
    hi = [{"role": "user", "content": "Hi"}]
    assert r.render(hi) == t.render(hi)
    # system: first unless the turns hold one
    assert r.render(hi, system="S") == t.render([{"role": "system", "content": "S"}, *hi])
    assert r.render([{"role": "system", "content": "T"}, *hi], system="S") == t.render(
        [{"role": "system", "content": "T"}, *hi])
    assert r.render(system="S", generation_prompt=False) == "<|im_start|>system\nS<|im_end|>\n"
    # after: only what the turns add; after an end-of-turn token, the closing comes first ("\n")
    assert r.render(hi, after=[5]) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert r.render(hi, after=[5, 2]) == "\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    # closing: what closes a reply, less the end-of-turn token it ended on
    assert r.render(after=[5], closing=True, generation_prompt=False) == "<|im_end|>\n"
    assert r.render(after=[5, 2], closing=True, generation_prompt=False) == "\n"
    assert r.render(after=[], closing=True, generation_prompt=False) == "<|im_end|>\n"
    # a reply cut short (its turn opened after the last end-of-turn token) is closed first
    assert r.render(hi, after=[5, 2, 7, 8, 5]) == "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert r.render(hi, after=[7, 8, 5, 2, 5]) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_renderer_without_a_template_says_so():
    from ctxengine.text.chat import ChatRenderer

    with pytest.raises(CtxError, match="m has no chat template"):
        ChatRenderer(None, _Tok(), "m").render([{"role": "user", "content": "Hi"}])
    assert ChatRenderer(None, _Tok(), "m").render(after=[5], closing=True, generation_prompt=False) == ""


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
def test_a_conversation_built_turn_by_turn_is_the_whole_conversation(which, request):
    # Gemma's template holds a system turn's text for the first user turn, so the system
    # anchor rendered to nothing on its own and its stand-in text leaked into every
    # continuation of a Gemma context ("ctx-anchor-3f9b1c\n\nAnother one?"); and a reply
    # cut short by its token limit was left open when the next turn came.
    from ctxengine.text.chat import ChatRenderer
    from ctxengine.text.tokenizer import Tokenizer

    meta = request.getfixturevalue(f"{which}_meta")
    tok = Tokenizer.from_metadata(meta)
    r = ChatRenderer(ChatTemplate.for_model(meta, lambda i: tok.token_bytes(i).decode("utf-8", "replace")), tok, which)
    turns = [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "A pear."},
             {"role": "user", "content": "Another one?"}, {"role": "assistant", "content": "A plum, cut"},
             {"role": "user", "content": "And a third?"}]
    for system in ([], [{"role": "system", "content": "Be terse."}]):
        conv = system + turns
        whole = r.render(conv)
        held = tok.encode(r.render(conv[:len(system) + 1]), parse_special=True)
        for i in range(len(system) + 1, len(conv), 2):
            held += tok.encode(conv[i]["content"], parse_special=False)  # the reply, as generated
            if i != len(system) + 3:  # the second reply was cut short: no end-of-turn token
                held += [tok.encode(r.render(after=held, closing=True, generation_prompt=False),
                                    parse_special=True)[0]]
            held += tok.encode(r.render([conv[i + 1]], after=held), parse_special=True)
        assert tok.decode(held) == whole


@pytest.mark.parametrize("source", ["{% if 1 %}" * 3000 + "x" + "{% endif %}" * 3000,
                                    "{{ " + "(" * 20000 + "1" + ")" * 20000 + " }}"])
def test_a_template_nested_past_the_recursion_limit_is_a_clear_error(source):
    # jinja2's parser recursed once a level: a RecursionError escaped ce.load, and ctx run
    # printed three thousand lines of traceback.
    with pytest.raises(CtxError, match="nests too deeply to compile"):
        ChatTemplate(source)
