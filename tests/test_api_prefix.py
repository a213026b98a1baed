"""Prefix reuse without asking: multi-turn chats sent as plain, stateless
requests in each dialect prefill only their new tokens, and say so in usage;
the replies are the same as without reuse."""
import anthropic
import openai

from api_server import greedy_reply, module_server, running
from api_server import model  # noqa: F401 (fixtures)

server = module_server("prefix")


def n_tokens(model, messages) -> int:
    return len(model.tokenize(model.chat_prompt(messages), parse_special=True))


def conversation(system: str) -> tuple[list[dict], list[dict]]:
    first = [{"role": "system", "content": system}, {"role": "user", "content": "Name three animals."}]
    return first, [{"role": "user", "content": "Which one is the largest?"}]


def test_openai_second_turn_reads_the_first_from_cache(server, model):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    first, follow_up = conversation("You are a zoologist who answers briefly.")
    r1 = client.chat.completions.create(model="smollm2", messages=first, max_tokens=16, temperature=0)
    assert r1.usage.prompt_tokens_details.cached_tokens < 8  # at most the shared "<|im_start|>system\n"
    second = first + [{"role": "assistant", "content": r1.choices[0].message.content}] + follow_up
    r2 = client.chat.completions.create(model="smollm2", messages=second, max_tokens=16, temperature=0)
    assert r2.usage.prompt_tokens == n_tokens(model, second)
    assert r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens
    # determinism: the reply with reuse is the reply computed from scratch
    assert r2.choices[0].message.content == greedy_reply(model, messages=second, max_tokens=16)
    # the very same request again: everything but the last token comes from cache
    r3 = client.chat.completions.create(model="smollm2", messages=second, max_tokens=16, temperature=0)
    assert r3.usage.prompt_tokens_details.cached_tokens == r3.usage.prompt_tokens - 1
    assert r3.choices[0].message.content == r2.choices[0].message.content
    client.close()


def test_anthropic_second_turn_reports_cache_reads(server, model):
    client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    first, follow_up = conversation("You are a geographer who answers briefly.")
    system, turns = first[0]["content"], first[1:]
    greedy = {"temperature": 0}
    r1 = client.messages.create(model="smollm2", system=system, messages=turns, max_tokens=16, extra_body=greedy)
    turns2 = turns + [{"role": "assistant", "content": r1.content[0].text}] + follow_up
    r2 = client.messages.create(model="smollm2", system=system, messages=turns2, max_tokens=16, extra_body=greedy)
    total = r2.usage.input_tokens + r2.usage.cache_read_input_tokens
    assert total == n_tokens(model, [first[0], *turns2])
    assert r2.usage.cache_read_input_tokens >= r1.usage.input_tokens + r1.usage.cache_read_input_tokens
    assert r2.usage.input_tokens < 30
    assert r2.content[0].text == greedy_reply(model, messages=[first[0], *turns2], max_tokens=16)
    client.close()


def test_ollama_second_turn_reports_cached_prompt_tokens(server, model):
    first, follow_up = conversation("You are a botanist who answers briefly.")
    body = {"model": "smollm2", "stream": False, "options": {"temperature": 0, "num_predict": 16}}
    r1 = server.post("/api/chat", {**body, "messages": first}).json()
    second = first + [r1["message"]] + follow_up
    r2 = server.post("/api/chat", {**body, "messages": second}).json()
    assert r2["prompt_eval_count"] == n_tokens(model, second)
    assert r2["prompt_cached_count"] >= r1["prompt_eval_count"]
    assert r2["message"]["content"] == greedy_reply(model, messages=second, max_tokens=16)


def test_metrics_count_cache_hits(server):
    # Hits of its own, so that it passes in any order: three follow-ups that reuse their first turn.
    before = server.metric("ctx_prefix_cache_hits_total")
    body = {"model": "smollm2", "max_tokens": 4, "temperature": 0}
    for persona in ("a baker", "a sailor", "a gardener"):
        first, follow_up = conversation(f"You are {persona} who answers briefly.")
        r1 = server.post("/v1/chat/completions", {**body, "messages": first}).json()
        server.post("/v1/chat/completions", {**body, "messages": first + [r1["choices"][0]["message"]] + follow_up})
    assert server.metric("ctx_prefix_cache_hits_total") >= before + 3
    assert server.metric("ctx_cached_prompt_tokens_total") > 0
    assert 0 < server.metric("ctx_prefix_cache_entries") <= 32


def test_reuse_can_be_turned_off(tmp_path, model):
    with running(tmp_path, "--prefix-cache", "0") as s:
        first, follow_up = conversation("You are a chemist who answers briefly.")
        body = {"model": "smollm2", "max_tokens": 16, "temperature": 0}
        r1 = s.post("/v1/chat/completions", {**body, "messages": first}).json()
        second = first + [r1["choices"][0]["message"]] + follow_up
        r2 = s.post("/v1/chat/completions", {**body, "messages": second}).json()
        assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert r2["choices"][0]["message"]["content"] == greedy_reply(model, messages=second, max_tokens=16)
        assert s.metric("ctx_prefix_cache_entries") == 0
