"""The context length a request states (Ollama's num_ctx, or a params layer's) as a
limit that holds on every path: a named context is refused past it and left as it
was (it took the turn and answered nothing), and a trimmed /api/chat keeps room for
its reply (it filled num_ctx to the last token) and trims a long history fast."""
import time

import anthropic
import ollama
import openai
import pytest

from api_server import greedy_reply, running
from api_server import model, ollama_client  # noqa: F401 (fixtures)
from ollama_layout import make_ollama_store
from ctxengine.serving.prompts import Prompt, prompt_ids, reply_room

SYSTEM = {"role": "system", "content": "You are a helpful AI assistant."}  # with STORY: no early stop
STORY = {"role": "user", "content": "Tell me a long story about a cat."}
ROME = [{"role": "user", "content": "Tell me about the history of Rome in great detail please, covering the "
                                    "republic and the empire."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory, smollm2_path):
    store = tmp_path_factory.mktemp("num-ctx-store")
    make_ollama_store(store, "ctx64", smollm2_path, params={"num_ctx": 64})
    with running(tmp_path_factory.mktemp("num-ctx-home"), "--ollama-models", str(store)) as s:
        yield s


def history(n: int) -> list[dict]:
    """``n`` questions and answers after a system message, then the story's request."""
    turns = []
    for i in range(n):
        turns += [{"role": "user", "content": f"Question number {i}: what is {i} plus {i}?"},
                  {"role": "assistant", "content": f"It is {2 * i}."}]
    return [SYSTEM, *turns, STORY]


def n_tokens(model, messages) -> int:
    return len(model.tokenize(model.chat_prompt(messages), parse_special=True))


def held(server, name: str) -> int:
    return server.get(f"/v1/contexts/{name}").json()["n_tokens"]


def new_context(server, name: str, model_name: str = "smollm2") -> int:
    r = server.post("/v1/contexts", {"name": name, "model": model_name, "messages": ROME})
    assert r.status_code == 201, r.text
    return held(server, name)


@pytest.mark.parametrize("path, body", [
    ("/api/chat", {"messages": [{"role": "user", "content": "More."}]}),
    ("/api/generate", {"prompt": " More."}),
])
def test_a_named_context_past_num_ctx_is_refused_and_unchanged(server, path, body):
    # It was a 200 with an empty reply (done_reason "length", eval_count 0), and the turn was
    # appended each time (45 -> 58 -> 71 tokens)
    before = new_context(server, name := path.rsplit("/", 1)[1])
    assert 40 < before
    for _ in range(2):
        r = server.post(path, {"model": "smollm2", "context": name, "stream": False, **body,
                               "options": {"num_ctx": 20, "num_predict": 10}})
        assert r.status_code == 400 and "the context length is 20" in r.json()["error"], r.text
        assert held(server, name) == before
    # as the same prompt without a context is refused
    r = server.post("/api/generate", {"model": "smollm2", "stream": False, "prompt": "word " * 50,
                                      "options": {"num_ctx": 20}})
    assert r.status_code == 400 and "the context length is 20" in r.json()["error"]
    # within num_ctx it answers, and the reply stays within it
    r = server.post(path, {"model": "smollm2", "context": name, "stream": False, **body,
                           "options": {"num_ctx": before + 12, "num_predict": 50, "temperature": 0}})
    assert r.status_code == 200, r.text
    assert r.json()["eval_count"] > 0 and held(server, name) <= before + 12 + 2  # + the closed turn's end


def test_a_params_layer_num_ctx_holds_a_named_context_on_every_face(server):
    # ctx64's params layer sets num_ctx 64: the OpenAI and Anthropic faces, which have no
    # num_ctx of their own, get the same limit on a named context as an unnamed prompt does
    before = new_context(server, "layered", "ctx64")
    long = [{"role": "user", "content": "Go on about the emperors, one by one, with their years. " * 2}]
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as o:
        with pytest.raises(openai.BadRequestError, match="the context length is 64"):
            o.chat.completions.create(model="ctx64", messages=long, max_tokens=4, extra_body={"context": "layered"})
        with pytest.raises(openai.BadRequestError, match="the context length is 64"):
            o.chat.completions.create(model="ctx64", messages=ROME + long, max_tokens=4)
    with anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0) as a:
        with pytest.raises(anthropic.BadRequestError, match="the context length is 64"):
            a.messages.create(model="ctx64", messages=long, max_tokens=4, extra_body={"context": "layered"})
    assert held(server, "layered") == before
    r = server.post("/api/chat", {"model": "ctx64", "context": "layered", "stream": False, "messages": long,
                                  "options": {"num_ctx": 200, "num_predict": 4}})  # the request's own num_ctx wins
    assert r.status_code == 200 and r.json()["eval_count"] == 4, r.text


@pytest.mark.parametrize("num_ctx", [128, 256])
def test_a_trimmed_chat_leaves_its_reply_num_predict_tokens(ollama_client, model, num_ctx):
    # The oldest turns went until the prompt filled num_ctx to its last token or so: the
    # reply got 7-13 tokens of the 50 asked for
    chat = history(40)
    assert n_tokens(model, chat) > 4 * num_ctx
    r = ollama_client.chat(model="smollm2", messages=chat, options={"num_ctx": num_ctx, "num_predict": 50,
                                                                    "temperature": 0})
    assert r.prompt_eval_count + 50 <= num_ctx and r.eval_count == 50 and r.done_reason == "length"
    # the system message and the last turn are kept, with as many of the latest turns as leave the room
    kept = next(chat[:1] + chat[s:] for s in range(1, len(chat))
                if n_tokens(model, chat[:1] + chat[s:]) + 50 <= num_ctx)
    assert kept[0] == SYSTEM and kept[-1] == STORY and len(kept) > 3
    assert r.prompt_eval_count == n_tokens(model, kept)
    assert r.message.content == greedy_reply(model, messages=kept, max_tokens=50)


def test_a_trimmed_chat_without_num_predict_leaves_a_quarter(ollama_client, model):
    chat = history(40)
    r = ollama_client.chat(model="smollm2", messages=chat, options={"num_ctx": 256, "temperature": 0})
    kept = next(chat[:1] + chat[s:] for s in range(1, len(chat)) if n_tokens(model, chat[:1] + chat[s:]) <= 192)
    assert r.prompt_eval_count == n_tokens(model, kept) <= 256 - 64
    assert reply_room(256, None) == 64 and reply_room(256, 10 ** 12) == 128 and reply_room(256, 0) == 1


def test_the_system_and_last_message_stay_when_they_leave_less_room(ollama_client, model):
    last = {"role": "user", "content": "Tell me a story about a cat who lives on a boat."}
    chat = history(5)[:-1] + [last]
    least = n_tokens(model, [SYSTEM, last])
    assert 64 - 50 < least < 64
    r = ollama_client.chat(model="smollm2", messages=chat, options={"num_ctx": 64, "num_predict": 50})
    assert r.prompt_eval_count == least and 0 < r.eval_count <= 64 - least  # what is left, as any route's
    with pytest.raises(ollama.ResponseError, match="context length") as err:  # alone too long: refused
        ollama_client.chat(model="smollm2", messages=chat[:-1] + [{"role": "user", "content": "sea " * 80}],
                           options={"num_ctx": 64, "num_predict": 50})
    assert err.value.status_code == 400


def test_a_history_of_20k_messages_is_trimmed_in_seconds(ollama_client, model):
    # Each try rendered and tokenized the whole chat: 100k messages outlasted a client's 120 s
    chat = history(10_000)
    t = time.perf_counter()
    r = ollama_client.chat(model="smollm2", messages=chat, options={"num_ctx": 512, "num_predict": 8,
                                                                    "temperature": 0})
    assert time.perf_counter() - t < 10
    assert 512 - 8 - 40 < r.prompt_eval_count <= 512 - 8 and r.eval_count == 8  # a turn is about 30 tokens


def test_trimming_costs_the_kept_turns_not_the_whole_chat(model):
    # in process, at the model's whole context (no prefill): the trim alone, for 100k messages
    class Entry:
        name, template, system = "smollm2", None, None

    chat = history(50_000)
    t = time.perf_counter()
    ids = prompt_ids(model, Entry, Prompt(messages=chat, trim=True), 8192, reply_room(8192, None))
    assert time.perf_counter() - t < 5
    assert 8192 * 3 // 4 - 40 < len(ids) <= 8192 * 3 // 4
    text = model.detokenize(ids)
    assert text.count(SYSTEM["content"]) == 1
    assert text.endswith(STORY["content"] + "<|im_end|>\n<|im_start|>assistant\n")
