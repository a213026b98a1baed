"""Ollama's /api/chat on a named context with no new messages goes on from what the context
holds, as OpenAI's and Anthropic's routes do (docs/http-api.md); without a context an empty
chat stays Ollama's load. It was a load either way: the context was left as it was and the
reply empty."""
import openai

from api_server import module_server

server = module_server("ollama-continue")

ROME = [{"role": "user", "content": "Tell me about the history of Rome."}]
OPTIONS = {"temperature": 0, "num_predict": 12}


def held(server, name: str) -> int:
    return server.get(f"/v1/contexts/{name}").json()["n_tokens"]


def opened(server, name: str) -> int:
    r = server.post("/v1/contexts", {"name": name, "model": "smollm2", "messages": ROME})
    assert r.status_code == 201, r.text
    return held(server, name)


def test_an_empty_chat_on_a_named_context_continues_it_as_openai_does(server):
    before = opened(server, "via-ollama")
    r = server.post("/api/chat", {"model": "smollm2", "context": "via-ollama", "messages": [], "stream": False,
                                  "options": OPTIONS})
    assert r.status_code == 200, r.text
    ollama_reply = r.json()["message"]["content"]
    assert ollama_reply and r.json()["eval_count"] > 0
    assert held(server, "via-ollama") > before

    opened(server, "via-openai")
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as client:
        done = client.chat.completions.create(model="smollm2", messages=[], max_tokens=12, temperature=0,
                                              extra_body={"context": "via-openai"})
    assert done.choices[0].message.content == ollama_reply
    assert held(server, "via-openai") == held(server, "via-ollama")


def test_an_empty_chat_without_a_context_still_loads_the_model(server):
    r = server.post("/api/chat", {"model": "smollm2", "messages": [], "stream": False})
    assert r.status_code == 200, r.text
    assert r.json()["message"] == {"role": "assistant", "content": ""} and r.json()["done_reason"] == "load"
