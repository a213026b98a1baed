"""chat_template_kwargs: extra variables for a model's Jinja chat template (Qwen3's
``enable_thinking``), through the Python API, a named context's continuation, and a real
``ctx serve`` (the OpenAI, Anthropic and Ollama chat routes, and ``--chat-template-kwargs``)."""
from pathlib import Path

import gguf
import openai
import pytest

import ctxengine as ce
from api_server import running
from ctxengine.errors import RequestError
from servers import ctx
from tiny_models import TinyConfig, make_weights, write_gguf

# Qwen3's soft switch, as its template writes it: "/no_think" after each user turn and an
# empty think block opening the reply, where enable_thinking is false. Turns end with the
# end-of-sequence token ("</s>"), so a context knows where a reply ended.
TEMPLATE = (
    "{%- set quiet = enable_thinking is defined and not enable_thinking -%}"
    "{%- for m in messages -%}"
    "<|{{ m.role }}|>{{ m.content }}{% if m.role == 'user' and quiet %} /no_think{% endif %}{{ eos_token }}\n"
    "{% endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{% if quiet %}<think></think>{% endif %}{%- endif -%}"
)
ASK = [{"role": "user", "content": "hi"}]
OFF = {"enable_thinking": False}


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("kwargs") / "tinykw.gguf"

    class Writer(gguf.GGUFWriter):
        def write_header_to_file(self, path=None):
            self.add_chat_template(TEMPLATE)
            super().write_header_to_file(path)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFWriter", Writer)
        cfg = TinyConfig()
        write_gguf(path, cfg, make_weights(cfg))
    return path


@pytest.fixture(scope="module")
def model(tiny_path):
    m = ce.load(tiny_path, threads=1)
    yield m
    m.close()


def test_chat_prompt_passes_the_variables(model):
    assert model.chat_prompt(ASK) == "<|user|>hi</s>\n<|assistant|>"
    assert model.chat_prompt(ASK, template_kwargs=OFF) == "<|user|>hi /no_think</s>\n<|assistant|><think></think>"
    assert model.chat_prompt(ASK, template_kwargs={"enable_thinking": True}) == model.chat_prompt(ASK)
    assert model.chat_prompt(ASK, template_kwargs={}) == model.chat_prompt(ASK)


@pytest.mark.parametrize("key", ["messages", "tools", "add_generation_prompt", "bos_token", "eos_token",
                                 "raise_exception", "namespace", "self"])
def test_a_variable_the_renderer_sets_is_refused_by_name(model, key):
    with pytest.raises(RequestError, match=f"may not set '{key}'"):
        model.chat_prompt(ASK, template_kwargs={key: 1})


@pytest.mark.parametrize("kwargs, message", [
    ([("enable_thinking", False)], "must be an object"),
    ({1: True}, "keys must be strings"),
    ({"when": object()}, r"\['when'\] must be a JSON value"),
    ({"deep": {"a": [1, {2: 3}]}}, "must be a JSON value"),
])
def test_kwargs_must_be_json(model, kwargs, message):
    with pytest.raises(RequestError, match=message):
        model.chat_prompt(ASK, template_kwargs=kwargs)


def test_a_continuation_renders_its_anchors_with_the_kwargs(model):
    first = model.chat_prompt(ASK, template_kwargs=OFF)
    reply = {"role": "assistant", "content": "hello"}
    held = model.tokenize(first + "hello</s>\n", parse_special=True)
    assert 258 in held  # "</s>" is the end-of-turn token
    more = [{"role": "user", "content": "again"}]
    text = model.chat.render(more, after=held, template_kwargs=OFF)
    assert text == "<|user|>again /no_think</s>\n<|assistant|><think></think>"
    # what the template writes for the whole conversation with the kwargs, past the first reply (it writes
    # no think block in a reply of the history, as Qwen3's strips them: the context keeps the one it had)
    whole = model.chat_prompt([*ASK, reply, *more], template_kwargs=OFF)
    assert whole.endswith("hello</s>\n" + text)
    assert model.chat.render(more, after=held) == "<|user|>again</s>\n<|assistant|>"  # without them
    # a named context in the Python API's terms: what it holds, then the continuation
    c = model.context(None)
    try:
        c.append(first, parse_special=True)
        c.append("hello</s>\n", parse_special=True)
        c.append(model.chat.render(more, after=c.tokens, template_kwargs=OFF), parse_special=True)
        assert model.tokenizer.decode(c.tokens) == first + "hello</s>\n" + text
    finally:
        c.delete()


def _prompt_tokens(model, messages, kwargs=None) -> int:
    return len(model.tokenize(model.chat_prompt(messages, template_kwargs=kwargs), parse_special=True))


def test_served_chat_routes_take_chat_template_kwargs(tmp_path, tiny_path, model):
    plain, quiet = _prompt_tokens(model, ASK), _prompt_tokens(model, ASK, OFF)
    assert plain != quiet
    with running(tmp_path, "-m", str(tiny_path)) as server, \
            openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as client:
        def ask(**extra):
            return client.chat.completions.create(model="tinykw", messages=ASK, max_tokens=1, **extra)

        assert ask().usage.prompt_tokens == plain
        assert ask(extra_body={"chat_template_kwargs": OFF}).usage.prompt_tokens == quiet
        with pytest.raises(openai.BadRequestError, match="chat_template_kwargs") as err:
            ask(extra_body={"chat_template_kwargs": ["enable_thinking"]})
        assert err.value.body.get("param") == "chat_template_kwargs"
        with pytest.raises(openai.BadRequestError, match="may not set 'messages'"):
            ask(extra_body={"chat_template_kwargs": {"messages": []}})

        r = server.post("/v1/messages", {"model": "tinykw", "max_tokens": 1, "messages": ASK,
                                         "chat_template_kwargs": OFF})
        assert r.status_code == 200, r.text
        used = r.json()["usage"]
        assert used["input_tokens"] + used["cache_read_input_tokens"] == quiet
        r = server.post("/v1/messages/count_tokens", {"model": "tinykw", "messages": ASK,
                                                      "chat_template_kwargs": OFF})
        assert r.json()["input_tokens"] == quiet
        # Anthropic's extended thinking is off unless asked for: so is the template's switch
        r = server.post("/v1/messages/count_tokens", {"model": "tinykw", "messages": ASK})
        assert r.json()["input_tokens"] == quiet
        r = server.post("/v1/messages/count_tokens", {"model": "tinykw", "messages": ASK,
                                                      "chat_template_kwargs": {"enable_thinking": True}})
        assert r.json()["input_tokens"] == plain
        r = server.post("/v1/messages", {"model": "tinykw", "max_tokens": 1, "messages": ASK,
                                         "chat_template_kwargs": 3})
        assert r.status_code == 400 and "chat_template_kwargs" in r.text

        r = server.post("/api/chat", {"model": "tinykw", "messages": ASK, "stream": False,
                                      "options": {"num_predict": 1}, "chat_template_kwargs": OFF})
        assert r.status_code == 200, r.text
        assert r.json()["prompt_eval_count"] == quiet
        # Ollama's think false is Qwen3's enable_thinking false for a Jinja template; the kwargs win
        for route, body in (("/api/chat", {"messages": ASK}), ("/api/generate", {"prompt": ASK[-1]["content"]})):
            r = server.post(route, {"model": "tinykw", "stream": False, "options": {"num_predict": 1}, "think": False,
                                    **body})
            assert r.status_code == 200 and r.json()["prompt_eval_count"] == quiet, r.text
        r = server.post("/api/chat", {"model": "tinykw", "messages": ASK, "stream": False, "think": False,
                                      "options": {"num_predict": 1}, "chat_template_kwargs": {"enable_thinking": True}})
        assert r.json()["prompt_eval_count"] == plain

        r = server.post("/v1/responses", {"model": "tinykw", "input": "hi", "max_output_tokens": 1,
                                          "chat_template_kwargs": OFF})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["input_tokens"] == quiet


def test_a_named_context_continues_with_the_kwargs_over_http(tmp_path, tiny_path, model):
    more = [{"role": "user", "content": "again"}]
    with running(tmp_path, "-m", str(tiny_path)) as server:
        def chat(messages):
            r = server.post("/v1/chat/completions", {"model": "tinykw", "messages": messages, "max_tokens": 1,
                                                     "temperature": 0, "context": "kw",
                                                     "chat_template_kwargs": OFF})
            assert r.status_code == 200, r.text
            return r.json()

        assert server.post("/v1/contexts", {"name": "kw", "model": "tinykw"}).status_code in (200, 201)
        first = chat(ASK)
        assert first["usage"]["prompt_tokens"] == _prompt_tokens(model, ASK, OFF)
        chat(more)
        text = server.get("/v1/contexts/kw").json()["text"]
        # each turn as the template writes it with the kwargs: the continuation's too
        assert text.startswith("<|user|>hi /no_think</s>\n<|assistant|><think></think>")
        assert "<|user|>again /no_think</s>\n<|assistant|><think></think>" in text
        assert text.count("<think></think>") == 2


def test_serve_default_kwargs_and_a_request_overrides_them(tmp_path, tiny_path, model):
    plain, quiet = _prompt_tokens(model, ASK), _prompt_tokens(model, ASK, OFF)
    with running(tmp_path, "-m", str(tiny_path), "--chat-template-kwargs", '{"enable_thinking": false}') as server, \
            openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as client:
        def ask(**extra):
            return client.chat.completions.create(model="tinykw", messages=ASK, max_tokens=1, **extra)

        assert ask().usage.prompt_tokens == quiet
        on = ask(extra_body={"chat_template_kwargs": {"enable_thinking": True}})
        assert on.usage.prompt_tokens == plain


@pytest.mark.parametrize("value, message", [
    ("{bad", "not valid JSON"),
    ("[1]", "must be a JSON object"),
    ('{"bos_token": "x"}', "may not set 'bos_token'"),
])
def test_a_malformed_serve_default_is_a_cli_error(tmp_path, value, message):
    r = ctx("serve", "--chat-template-kwargs", value, home=tmp_path, timeout=60)
    assert r.returncode == 2
    assert "--chat-template-kwargs" in r.stderr and message in r.stderr
