"""Several clients at once, in every dialect: all complete, and each gets the
reply it gets alone (the scheduler batches their steps; results are bit-identical)."""
from concurrent.futures import ThreadPoolExecutor

import anthropic
import ollama
import openai

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
