"""The Ollama dialect of `ctx serve`, driven by the real `ollama` client (whose
pydantic models validate every response), with an Ollama store laid out in a
temporary directory exactly as Ollama lays it out."""
import numpy as np
import ollama
import pytest

import ctxengine
from api_server import greedy_reply, running
from api_server import model, ollama_client  # noqa: F401 (fixtures)
from ollama_layout import make_ollama_store

PIRATE = "You are a pirate. Always answer like a pirate."
GREEDY = {"temperature": 0, "num_predict": 8}
# ChatML as an Ollama template layer: unlike the GGUF's template it adds no default system prompt
CHATML = ("{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}"
          "<|im_start|>assistant\n")
TOOLS_PARAMS = {"num_ctx": 512, "stop": ["<|im_end|>", 'say "hi"'], "temperature": 0.7}


@pytest.fixture(scope="module")
def store(tmp_path_factory, smollm2_path):
    root = tmp_path_factory.mktemp("ollama-store")
    make_ollama_store(root, "smollm2:135m", smollm2_path, system=PIRATE, params={"temperature": 0, "num_predict": 12})
    make_ollama_store(root, "smollm2:chatml", smollm2_path, template=CHATML)
    make_ollama_store(root, "smollm2:tools", smollm2_path, template="{{ if .Tools }}tools: {{ .Tools }}\n{{ end }}"
                      + CHATML, params=TOOLS_PARAMS)
    make_ollama_store(root, "broken:1b", smollm2_path,
                      extra_layers=[("application/vnd.ollama.image.tensor", b"not a tensor")])
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory, store):
    with running(tmp_path_factory.mktemp("ollama-home"), "--ollama-models", str(store)) as s:
        yield s


def test_root_and_version(server):
    assert server.get("/").text == "Ollama is running"
    assert server.get("/api/version").json()["version"] == ctxengine.__version__


def test_tags_list_every_model_and_why_one_cannot_be_served(ollama_client, server):
    models = {m.model: m for m in ollama_client.list().models}
    assert {"smollm2", "smollm2:135m", "broken:1b"} <= set(models)
    d = models["smollm2:135m"].details
    assert (d.format, d.family, d.parameter_size, d.quantization_level) == ("gguf", "llama", "134.52M", "Q4_1")
    assert len(models["smollm2:135m"].digest) == 64
    raw = {m["name"]: m for m in server.get("/api/tags").json()["models"]}
    assert "safetensors" in raw["broken:1b"]["error"] and "error" not in raw["smollm2:135m"]
    with pytest.raises(ollama.ResponseError, match="safetensors") as e:
        ollama_client.generate(model="broken:1b", prompt="hi")
    assert e.value.status_code == 400


def test_show_has_model_info_and_the_layers(ollama_client):
    r = ollama_client.show("smollm2:135m")
    assert r.modelinfo["general.architecture"] == "llama"
    assert r.modelinfo["llama.context_length"] == 8192
    assert r.details.parameter_size == "134.52M"
    assert r.parameters == "num_predict                    12\ntemperature                    0"
    assert PIRATE in r.modelfile
    assert "<|im_start|>" in r.template  # no template layer: the GGUF's own
    with pytest.raises(ollama.ResponseError) as e:
        ollama_client.show("no-such-model")
    assert e.value.status_code == 404


def test_generate_equals_the_engine_greedy(ollama_client, model):
    r = ollama_client.generate(model="smollm2", prompt="Name a colour.", options=GREEDY)
    assert r.response == greedy_reply(model, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8)
    assert r.done and r.done_reason == "length" and r.eval_count == 8
    assert r.prompt_eval_count == len(model.tokenize(model.chat_prompt(
        [{"role": "user", "content": "Name a colour."}]), parse_special=True))
    assert 0 < r.prompt_eval_duration < r.total_duration and 0 < r.eval_duration < r.total_duration
    assert r.load_duration >= 0
    assert len(r.context) == r.prompt_eval_count + r.eval_count


def test_generate_streams_ndjson(ollama_client):
    whole = ollama_client.generate(model="smollm2", prompt="Name a colour.", options=GREEDY).response
    parts = list(ollama_client.generate(model="smollm2", prompt="Name a colour.", options=GREEDY, stream=True))
    assert "".join(p.response for p in parts) == whole
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    last = parts[-1]
    assert last.eval_count == 8 and last.total_duration > 0 and last.context


@pytest.mark.parametrize("brk", ["\u2028", "\u2029", "\x85"])
def test_a_reply_holding_a_unicode_line_break_streams_as_one_line_each(ollama_client, server, brk):
    # Sent raw, U+2028 cut the NDJSON line where the client reads lines as str.splitlines
    # does: "Unterminated string" (Go's encoding/json, Ollama's, escapes U+2028 and U+2029).
    opts = {"temperature": 0, "num_predict": 4}
    whole = ollama_client.generate(model="smollm2", prompt=f"a{brk}" * 12, raw=True, options=opts).response
    assert brk in whole
    parts = ollama_client.generate(model="smollm2", prompt=f"a{brk}" * 12, raw=True, options=opts, stream=True)
    assert "".join(p.response for p in parts) == whole
    assert brk.encode() not in server.post("/api/generate", {"model": "smollm2", "prompt": f"a{brk}" * 12,
                                                             "raw": True, "options": opts}).content


def test_generate_continues_a_context_array(ollama_client, server, model):
    first = ollama_client.generate(model="smollm2", prompt="Name a colour.", options=GREEDY)
    body = {"model": "smollm2", "prompt": "Another one.", "context": list(first.context), "options": GREEDY,
            "stream": False}
    raw = server.post("/api/generate", body).json()
    second = ollama.GenerateResponse(**raw)  # what the ollama_client makes of it (it drops our extra field)
    ctx = model.context(None)
    ctx.append(first.context + model.tokenize(model.chat_prompt([{"role": "user", "content": "Another one."}]),
                                              parse_special=True))
    want = "".join(p.text for p in ctx.generate(8, temperature=0.0))
    ctx.delete()
    assert second.response == want
    assert raw["prompt_cached_count"] >= len(first.context) - 1  # the first exchange was not prefilled again


def test_generate_raw_and_system(ollama_client, model):
    raw = ollama_client.generate(model="smollm2", prompt="The capital of France is", raw=True, options=GREEDY)
    assert raw.response == greedy_reply(model, text="The capital of France is", max_tokens=8)
    sys = ollama_client.generate(model="smollm2", prompt="Say hi.", system="Answer in French.", options=GREEDY)
    assert sys.response == greedy_reply(model, messages=[{"role": "system", "content": "Answer in French."},
                                                         {"role": "user", "content": "Say hi."}], max_tokens=8)


def test_chat_streaming_and_not(ollama_client, model):
    messages = [{"role": "user", "content": "Name a fruit."}]
    r = ollama_client.chat(model="smollm2", messages=messages, options=GREEDY)
    assert r.message.role == "assistant"
    assert r.message.content == greedy_reply(model, messages=messages, max_tokens=8)
    parts = list(ollama_client.chat(model="smollm2", messages=messages, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in parts) == r.message.content
    assert parts[-1].done and parts[-1].eval_count == 8 and parts[-1].prompt_eval_count == r.prompt_eval_count


def test_chat_continues_a_final_assistant_message(ollama_client, model):
    """As Ollama's: the reply continues the message and holds only the continuation (it
    began a new assistant turn, and the model said the opening again)."""
    messages = [{"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "content": "The capital of France is"}]
    r = ollama_client.chat(model="smollm2", messages=messages, options=GREEDY)
    opened = model.chat_prompt(messages[:1]) + messages[1]["content"]
    assert r.message.content == greedy_reply(model, text=opened, max_tokens=8)
    assert r.prompt_eval_count == len(model.tokenize(opened, parse_special=True))
    parts = list(ollama_client.chat(model="smollm2", messages=messages, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in parts) == r.message.content


def test_model_from_the_store_by_its_ollama_name_with_its_layers(ollama_client, model):
    messages = [{"role": "user", "content": "Where is the treasure?"}]
    # temperature 0 and num_predict 12 come from the params layer, the system prompt from the system layer
    r = ollama_client.chat(model="smollm2:135m", messages=messages)
    want = greedy_reply(model, messages=[{"role": "system", "content": PIRATE}, *messages], max_tokens=12)
    assert r.message.content == want and r.eval_count <= 12
    assert ollama_client.chat(model="smollm2:135m", messages=messages, options={"num_predict": 3}).eval_count == 3
    # a request's own system message replaces the layer's
    own = ollama_client.chat(model="smollm2:135m", messages=[{"role": "system", "content": "Be brief."}, *messages])
    assert own.message.content == greedy_reply(
        model, messages=[{"role": "system", "content": "Be brief."}, *messages], max_tokens=12)


def test_the_template_layer_renders_the_prompt(ollama_client, model):
    r = ollama_client.chat(model="smollm2:chatml", messages=[{"role": "user", "content": "Name a fruit."}],
                           options=GREEDY)
    text = "<|im_start|>user\nName a fruit.<|im_end|>\n<|im_start|>assistant\n"
    assert r.prompt_eval_count == len(model.tokenize(text, parse_special=True))
    assert r.message.content == greedy_reply(model, text=text, max_tokens=8)
    assert ollama_client.show("smollm2:chatml").template == CHATML


def test_a_request_template_that_cannot_be_rendered_is_a_400(server):
    # It was dropped in silence, the model's own template used instead.
    r = server.post("/api/generate", {"model": "smollm2", "prompt": "Hi", "stream": False,
                                      "template": "{{ if .Prompt }}never closed", "options": {"num_predict": 2}})
    assert r.status_code == 400 and "the request's template cannot be rendered" in r.json()["error"]


def test_embed_and_embeddings(ollama_client, model):
    r = ollama_client.embed(model="smollm2", input=["The cat sat on the mat.", "Stock prices fell."])
    vectors = np.array(r.embeddings)
    assert vectors.shape == (2, model.config.n_embd)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert r.prompt_eval_count == sum(len(model.tokenize(t)) for t in ["The cat sat on the mat.",
                                                                       "Stock prices fell."])
    # The legacy endpoint, as Ollama's: the same direction, not normalised
    one = np.array(ollama_client.embeddings(model="smollm2", prompt="The cat sat on the mat.").embedding)
    assert not np.isclose(np.linalg.norm(one), 1.0, atol=1e-3)
    assert np.allclose(one / np.linalg.norm(one), vectors[0], atol=1e-6)
    assert ollama_client.embed(model="smollm2", input="Stock prices fell.", dimensions=64).embeddings[0].__len__() == 64


def test_options_unknown_ignored_wrong_types_refused(ollama_client, server):
    r = ollama_client.generate(model="smollm2", prompt="Hi", options={**GREEDY, "mirostat": 0, "num_gpu": 1})
    assert r.eval_count == 8
    ok = server.post("/api/generate", {"model": "smollm2", "prompt": "Hi", "stream": False,
                                       "options": {**GREEDY, "no_such_option": [1, 2]}})
    assert ok.status_code == 200 and ok.json()["eval_count"] == 8
    for bad in ({"temperature": "hot"}, {"num_predict": 1.5}, {"stop": 3}, {"mirostat": "x"}):
        r = server.post("/api/generate", {"model": "smollm2", "prompt": "Hi", "options": bad})
        assert r.status_code == 400, bad
        assert set(r.json()) == {"error"} and next(iter(bad)) in r.json()["error"]


def test_a_context_of_ids_outside_the_vocabulary_is_refused(server):
    for context in ([2**64], [-1], [1, 10**6]):  # 2**64 was a 500 (an OverflowError in the prefix cache)
        r = server.post("/api/generate", {"model": "smollm2", "prompt": "Hi", "stream": False, "context": context})
        assert r.status_code == 400 and "outside the vocabulary" in r.json()["error"], context


def test_load_unload_and_ps(ollama_client):
    assert ollama_client.generate(model="smollm2", prompt="", keep_alive=0).done_reason == "unload"
    assert "smollm2" not in [m.model for m in ollama_client.ps().models]
    assert ollama_client.generate(model="smollm2", prompt="").done_reason == "load"
    loaded = {m.model: m for m in ollama_client.ps().models}
    assert loaded["smollm2"].context_length == 8192 and loaded["smollm2"].size > 90_000_000
    ollama_client.generate(model="smollm2", prompt="Hi", options=GREEDY, keep_alive="10m")
    assert ollama_client.ps().models[0].expires_at is not None


def test_unknown_model_is_404(ollama_client):
    with pytest.raises(ollama.ResponseError) as e:
        ollama_client.chat(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 404 and "no-such-model" in e.value.error


def test_show_formats_parameters_as_ollama_and_says_what_the_template_can(ollama_client):
    # Ollama's GetModelInfo: fmt.Sprintf("%-*s %#v", 30, k, v), a line a value; they were "k v"
    r = ollama_client.show("smollm2:tools")
    assert r.parameters == ('num_ctx                        512\n'
                            'stop                           "<|im_end|>"\n'
                            'stop                           "say \\"hi\\""\n'
                            'temperature                    0.7')
    assert "PARAMETER num_ctx 512" in r.modelfile
    # a template that uses .Tools can call tools (capabilities were always ["completion"])
    assert r.capabilities == ["completion", "tools"]
    assert ollama_client.show("smollm2:chatml").capabilities == ["completion"]
    assert ollama_client.show("smollm2").capabilities == ["completion"]  # SmolLM2's Jinja renders no tools


@pytest.mark.parametrize("route, body", [("/api/chat", {"messages": [{"role": "user", "content": "hi"}]}),
                                         ("/api/generate", {"prompt": "hi"})])
def test_log_probabilities_are_refused_not_ignored(server, route, body):
    for extra in ({"logprobs": True}, {"top_logprobs": 5}, {"logprobs": True, "top_logprobs": 2}):
        r = server.post(route, {"model": "smollm2", "stream": False, "options": {"num_predict": 1}, **body, **extra})
        assert r.status_code == 400 and set(r.json()) == {"error"}, extra
        assert "logprobs" in r.json()["error"]
    off = server.post(route, {"model": "smollm2", "stream": False, "options": {"num_predict": 1}, **body,
                              "logprobs": False, "top_logprobs": 0})
    assert off.status_code == 200


def test_a_tag_without_a_model_name_is_no_model(server):
    # ":latest" lost its tag and named the default model: /api/show said 404 while these served it
    for route, body in (("/api/chat", {"messages": [{"role": "user", "content": "hi"}]}),
                        ("/api/generate", {"prompt": "hi"}), ("/api/embed", {"input": "hi"}), ("/api/show", {})):
        r = server.post(route, {"model": ":latest", "stream": False, "options": {"num_predict": 1}, **body})
        assert r.status_code == 404 and "':latest' not found" in r.json()["error"], route


def test_ps_context_length_is_the_context_requests_get(ollama_client):
    assert ollama_client.generate(model="smollm2:tools", prompt="").done_reason == "load"
    loaded = {m.model: m for m in ollama_client.ps().models}
    assert loaded["smollm2:tools"].context_length == 512  # its params layer's num_ctx, not the file's 8192
    ollama_client.generate(model="smollm2:tools", prompt="", keep_alive=0)


def test_embed_of_no_input_is_no_embedding(server):
    # As Ollama's EmbedHandler: the model loads and nothing is embedded (they were 400s)
    for body in ({"input": []}, {"input": ""}, {}):
        r = server.post("/api/embed", {"model": "smollm2", **body})
        assert r.status_code == 200 and r.json() == {"model": "smollm2", "embeddings": []}, body


def test_generate_context_is_the_prompt_and_the_visible_reply(ollama_client, model):
    # "The colour I'm referring to is a": the stop string cuts " referring" after " re"
    prompt = model.tokenize(model.chat_prompt([{"role": "user", "content": "Name a colour."}]), parse_special=True)
    r = ollama_client.generate(model="smollm2", prompt="Name a colour.", options={**GREEDY, "stop": ["ferring"]})
    assert r.done_reason == "stop" and r.response == "The colour I'm re"
    assert r.context[:len(prompt)] == prompt
    assert model.detokenize(r.context[len(prompt):]) == r.response  # the stop string's tokens were in it
    streamed = list(ollama_client.generate(model="smollm2", prompt="Name a colour.", stream=True,
                                           options={**GREEDY, "stop": ["ferring"]}))
    assert streamed[-1].context == r.context
    # a raw prompt has no context array (Ollama's GenerateHandler makes none)
    assert ollama_client.generate(model="smollm2", prompt="The sky is", raw=True, options=GREEDY).context is None


def test_a_listed_model_whose_file_cannot_be_read_says_why_at_the_top_level(tmp_path):
    # It was in details.error, where an Ollama store entry has it at the top level
    from ctxengine.api.ollama import _Ollama
    from ctxengine.serving.exports import CatalogEntry
    item = _Ollama(None, None, None).listing(CatalogEntry("gone", tmp_path / "gone.gguf", "packaged"))
    assert "is gone" in item["error"] and "error" not in item["details"]
    broken = _Ollama(None, None, None).listing(CatalogEntry("broken", None, "ollama", error="blob is missing"))
    assert broken["error"] == "blob is missing" and "error" not in broken["details"]


def test_a_chat_longer_than_its_context_loses_its_oldest_turns(ollama_client, model):
    """As Ollama's chatPrompt: the oldest turns go (system messages stay) until the chat
    fits num_ctx with room for the reply (num_predict); it was a 400. The reply is the one to the chat that fits."""
    system = {"role": "system", "content": "You answer in one word."}
    turns = []
    for i in range(12):
        turns += [{"role": "user", "content": f"Tell me fact number {i} about the sea, at some length please."},
                  {"role": "assistant", "content": f"Fact {i}: the sea is deep, wide, salty and old."}]
    chat = [system, *turns, {"role": "user", "content": "Name a colour."}]
    full = n_tokens(model, chat)
    assert full > 300
    r = ollama_client.chat(model="smollm2", messages=chat, options={**GREEDY, "num_ctx": 300})
    assert 0 < r.prompt_eval_count <= 300 - 8  # room left for num_predict's 8 tokens
    kept = next(chat[:1] + chat[start:] for start in range(1, len(chat))
                if n_tokens(model, chat[:1] + chat[start:]) + 8 <= 300)
    assert r.prompt_eval_count == n_tokens(model, kept) and kept[1:] != chat[1:]
    assert r.message.content == greedy_reply(model, messages=kept, max_tokens=8)
    with pytest.raises(ollama.ResponseError, match="context length"):  # the last message alone is too long
        ollama_client.chat(model="smollm2", messages=[{"role": "user", "content": "sea " * 400}],
                           options={**GREEDY, "num_ctx": 300})


def n_tokens(model, messages) -> int:
    return len(model.tokenize(model.chat_prompt(messages), parse_special=True))
