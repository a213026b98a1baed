"""Several clients at once, in every dialect: all complete, and each gets the
reply it gets alone (the scheduler batches their steps; results are bit-identical)."""
import time
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import ollama
import openai
import pytest

from api_server import module_server

TOPICS = ["the sea", "a mountain", "the moon", "a forest", "a city", "the desert", "a river", "snow"]


server = module_server("concurrency")


def ask(url: str, i: int) -> str:
    """Request i: a greedy reply through one of the three clients, streamed for odd i."""
    question = [{"role": "user", "content": f"Write two sentences about {TOPICS[i % len(TOPICS)]}."}]
    stream = i % 2 == 1
    kind = i % 3
    if kind == 0:
        with openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as c:
            if stream:
                return "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
                    model="smollm2", messages=question, max_tokens=24, temperature=0, stream=True))
            return c.chat.completions.create(model="smollm2", messages=question, max_tokens=24,
                                             temperature=0).choices[0].message.content
    if kind == 1:
        with anthropic.Anthropic(base_url=url, api_key="x", max_retries=0) as a:
            kw = dict(model="smollm2", messages=question, max_tokens=24, extra_body={"temperature": 0})
            if stream:
                with a.messages.stream(**kw) as s:
                    return "".join(s.text_stream)
            return a.messages.create(**kw).content[0].text
    with ollama.Client(host=url) as o:
        opts = {"temperature": 0, "num_predict": 24}
        if stream:
            return "".join(p.message.content for p in o.chat(model="smollm2", messages=question, options=opts,
                                                             stream=True))
        return o.chat(model="smollm2", messages=question, options=opts).message.content


def test_concurrent_clients_all_complete_with_their_own_replies(server):
    n = 8
    alone = [ask(server.url, i) for i in range(n)]
    steps_before = server.metric("ctx_generations_total")
    with ThreadPoolExecutor(n) as pool:
        together = list(pool.map(lambda i: ask(server.url, i), range(n)))
    assert together == alone
    assert all(together)
    assert server.metric("ctx_generations_total") - steps_before == n


# 6,390 tokens of SmolLM2: seconds of prefill on any machine.
LONG_PROMPT = " ".join(f"item{i}" for i in range(1500))


def settled(server) -> float:
    """ctx_forward_tokens_total once the forward queue is empty and it has stopped moving."""
    deadline, last = time.monotonic() + 120, None
    while time.monotonic() < deadline:
        now = server.metric("ctx_forward_tokens_total")
        if now == last and server.metric("ctx_forward_queue") == 0:
            return now
        last = now
        time.sleep(0.5)
    pytest.fail("the forward steps never stopped")


@pytest.mark.parametrize("named", [False, True], ids=["request", "named-context"])
def test_a_client_gone_during_its_prompt_stops_the_prefill(server, named):
    """The prefill of a prompt whose client has left stops at the next step (it
    ran to its end, holding the model, before); a named context is left as it was."""
    body = {"model": "smollm2", "max_tokens": 4, "messages": [{"role": "user", "content": LONG_PROMPT}]}
    if named:
        assert server.post("/v1/contexts", {"name": "gone"}).status_code == 201
        before_text = server.get("/v1/contexts/gone").json()["text"]
        body["context"] = "gone"
    server.post("/v1/chat/completions", {"model": "smollm2", "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]})
    before = settled(server)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(60, read=1.0))
    ran = settled(server) - before
    assert ran < 6390 / 2, ran  # 0 when it left before its prefill began (a loaded machine)
    if named:
        assert server.get("/v1/contexts/gone").json()["text"] == before_text
    r = server.post("/v1/chat/completions", {**body, "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize("route,body", [
    ("/v1/embeddings", {"model": "smollm2", "input": [LONG_PROMPT]}),
    ("/api/embed", {"model": "smollm2", "input": LONG_PROMPT}),
])
def test_a_client_gone_during_its_embedding_stops_it(server, route, body):
    """It embedded all 6,390 tokens for nobody, a chunk at a time, holding the model."""
    server.post(route, {**body, "input": "warm up"})
    before = settled(server)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + route, json=body, timeout=httpx.Timeout(60, read=1.0))
    ran = settled(server) - before
    assert ran < 6390 / 2, ran
    assert server.post(route, {**body, "input": "still serving"}).status_code == 200
