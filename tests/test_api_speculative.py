"""Speculation through the server: on by default, off per request, counted in
usage and /metrics, and the reply the same bits either way."""
import json

import pytest

from api_server import greedy_reply, module_server
from api_server import anthropic_client, model, ollama_client, openai_client  # noqa: F401 (fixtures)

server = module_server("speculative")
DOC = json.dumps({"name": "ctx", "ports": {"http": 11435, "grpc": 11436}, "tags": ["a", "b", "c"]}, indent=2)
EDIT = [{"role": "user", "content": f"Here is a JSON file:\n{DOC}\nRepeat it exactly, with grpc set to 9000."}]


def test_openai_usage_counts_drafts_and_false_turns_them_off(server, model, openai_client):
    before = server.metric("ctx_speculative_accepted_tokens_total")
    on = openai_client.chat.completions.create(model="smollm2", messages=EDIT, max_tokens=60, temperature=0)
    off = openai_client.chat.completions.create(model="smollm2", messages=EDIT, max_tokens=60, temperature=0,
                                                extra_body={"speculative": False})
    assert on.choices[0].message.content == off.choices[0].message.content == greedy_reply(
        model, messages=EDIT, max_tokens=60)
    details = on.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 10, details
    assert off.usage.completion_tokens_details.accepted_prediction_tokens == 0
    assert off.usage.completion_tokens_details.rejected_prediction_tokens == 0
    assert server.metric("ctx_speculative_accepted_tokens_total") - before == details.accepted_prediction_tokens
    assert server.metric("ctx_speculative_drafted_tokens_total") >= details.accepted_prediction_tokens


def test_anthropic_and_ollama_report_drafts(server, anthropic_client, ollama_client):
    r = anthropic_client.messages.create(model="smollm2", messages=EDIT, max_tokens=60,
                                         extra_body={"temperature": 0})
    extra = r.usage.model_extra
    assert extra["accepted_draft_tokens"] > 10 and extra["drafted_tokens"] >= extra["accepted_draft_tokens"]
    on = ollama_client.chat(model="smollm2", messages=EDIT, options={"num_predict": 60, "temperature": 0})
    raw = server.post("/api/chat", {"model": "smollm2", "messages": EDIT, "stream": False, "speculative": False,
                                    "options": {"num_predict": 60, "temperature": 0}}).json()
    assert raw["message"]["content"] == on.message.content
    assert raw["draft_accepted_count"] == 0
    assert server.post("/api/chat", {"model": "smollm2", "messages": EDIT, "stream": False,
                                     "options": {"num_predict": 60, "temperature": 0}}).json()[
        "draft_accepted_count"] > 10


@pytest.mark.parametrize("bad", ["no", 1])
def test_speculative_must_be_a_boolean(server, bad):
    r = server.post("/v1/chat/completions", {"model": "smollm2", "messages": EDIT, "speculative": bad})
    assert r.status_code == 400 and "speculative" in r.json()["error"]["message"]


def test_serve_with_a_draft_model_and_speculation_off_by_default(tmp_path, smollm2_path, model):
    from api_server import running

    with running(tmp_path, "--draft", str(smollm2_path), "--no-speculative") as s:
        body = {"model": "smollm2", "messages": EDIT, "max_tokens": 24, "temperature": 0}
        off = s.post("/v1/chat/completions", body).json()
        on = s.post("/v1/chat/completions", {**body, "speculative": True}).json()
    assert off["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] == 0
    # the model drafting for itself, greedy: every draft lands (the first token follows
    # the prompt's prefill; no draft reaches past max_tokens)
    assert on["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] >= 18
    assert on["usage"]["completion_tokens_details"]["rejected_prediction_tokens"] == 0
    assert on["choices"][0]["message"]["content"] == off["choices"][0]["message"]["content"]
