"""What each soak client does (bench/soak.py): one request pattern a call, with
the real openai, anthropic and ollama clients and plain httpx where a client
library cannot do it (disconnecting mid-stream, the contexts API). Every
action deletes what it made, so after the soak the store holds nothing of it.

An action returns how many HTTP requests it made; a failure raises, and the
caller counts it by kind."""
from __future__ import annotations

import json
import random

import anthropic
import httpx
import ollama
import openai

TOPICS = ["the sea", "mountains", "the moon", "forests", "cities", "deserts", "rivers", "snow",
          "volcanoes", "islands", "caves", "storms", "glaciers", "meadows", "canyons", "lakes"]
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["colour", "count"],
          "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue", "yellow"]},
                         "count": {"type": "integer", "minimum": 0, "maximum": 99}}}


class BadReply(Exception):
    """A reply that came back but is not what was asked for (e.g. JSON that does not parse)."""


class Client:
    """One soak client: its own connections and its own random stream."""

    def __init__(self, url: str, model: str, cid: int, seed: int):
        self.url, self.model, self.cid = url, model, cid
        self.rng = random.Random(seed * 1000 + cid)
        self.http = httpx.Client(base_url=url, timeout=300)
        self.openai = openai.OpenAI(base_url=url + "/v1", api_key="soak", max_retries=0, timeout=300)
        self.anthropic = anthropic.Anthropic(base_url=url, api_key="soak", max_retries=0, timeout=300)
        self.ollama = ollama.Client(host=url, timeout=300)
        self.n = 0

    def close(self) -> None:
        self.http.close()
        self.openai.close()
        self.anthropic.close()
        self.ollama.close()

    def ask(self) -> str:
        return f"Say one short sentence about {self.rng.choice(TOPICS)}."

    def name(self, what: str) -> str:
        self.n += 1
        return f"soak/{self.cid}/{what}{self.n}"

    def ok(self, r: httpx.Response) -> httpx.Response:
        if r.status_code >= 400:
            raise httpx.HTTPStatusError(f"HTTP {r.status_code}: {r.text[:200]}", request=r.request, response=r)
        return r


def openai_chat(c: Client) -> int:
    stream = c.rng.random() < 0.5
    messages = [{"role": "user", "content": c.ask()}]
    if stream:
        chunks = c.openai.chat.completions.create(model=c.model, messages=messages, max_tokens=24, stream=True)
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    else:
        text = c.openai.chat.completions.create(model=c.model, messages=messages, max_tokens=24).choices[0].message.content
    if text is None:
        raise BadReply("no content")
    return 1


def anthropic_messages(c: Client) -> int:
    messages = [{"role": "user", "content": c.ask()}]
    if c.rng.random() < 0.5:
        with c.anthropic.messages.stream(model=c.model, max_tokens=24, messages=messages) as s:
            "".join(s.text_stream)
    else:
        c.anthropic.messages.create(model=c.model, max_tokens=24, messages=messages)
    return 1


def ollama_chat(c: Client) -> int:
    messages = [{"role": "user", "content": c.ask()}]
    if c.rng.random() < 0.5:
        "".join(part.message.content or "" for part in
                c.ollama.chat(model=c.model, messages=messages, stream=True, options={"num_predict": 24}))
    else:
        c.ollama.chat(model=c.model, messages=messages, options={"num_predict": 24})
    return 1


def disconnect_mid_stream(c: Client) -> int:
    """A client that reads four chunks of a long streamed reply and goes away."""
    body = {"model": c.model, "max_tokens": 400, "stream": True,
            "messages": [{"role": "user", "content": "Tell me a long story about " + c.rng.choice(TOPICS)}]}
    with c.http.stream("POST", "/v1/chat/completions", json=body) as r:
        c.ok(r)
        for i, _ in enumerate(r.iter_lines()):
            if i >= 4:
                break
    return 1


def named_context(c: Client) -> int:
    """Create, continue, fork, snapshot, delete, restore from the ref, continue, delete all."""
    name, branch = c.name("ctx"), c.name("fork")
    c.ok(c.http.post("/v1/contexts", json={"name": name, "system": "You are brief."}))
    n = 1
    try:
        for _ in range(2):
            c.openai.chat.completions.create(model=c.model, max_tokens=12, extra_body={"context": name},
                                             messages=[{"role": "user", "content": c.ask()}])
            n += 1
        c.ok(c.http.post(f"/v1/contexts/{name}/fork", json={"name": branch}))
        c.ok(c.http.post(f"/v1/contexts/{branch}/append", json={"text": " And one more thing."}))
        c.ok(c.http.post(f"/v1/contexts/{name}/snapshot", json={"ref": name}))
        c.ok(c.http.delete(f"/v1/contexts/{name}"))
        c.ok(c.http.post(f"/v1/contexts/{name}/restore", json={"ref": name}))
        c.openai.chat.completions.create(model=c.model, max_tokens=12, extra_body={"context": name},
                                         messages=[{"role": "user", "content": "Thanks."}])
        n += 6
    finally:
        for ctx in (name, branch):
            c.http.delete(f"/v1/contexts/{ctx}")
        c.http.delete(f"/v1/studio/refs/{name}")
    return n + 3


def responses(c: Client) -> int:
    """A Responses conversation: a turn, its continuation and a branch from the first; all deleted."""
    first = c.openai.responses.create(model=c.model, input=c.ask(), max_output_tokens=16, store=True)
    ids = [first.id]
    try:
        for text in ("Go on.", "Say it differently."):  # the second is a branch of the first
            ids.append(c.openai.responses.create(model=c.model, input=text, previous_response_id=first.id,
                                                 max_output_tokens=12, store=True).id)
    finally:
        for rid in ids:
            c.openai.responses.delete(rid)
    return 2 * len(ids)


def json_reply(c: Client) -> int:
    r = c.openai.chat.completions.create(
        model=c.model, max_tokens=40,
        messages=[{"role": "user", "content": "Pick a colour and a count, as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "pick", "schema": SCHEMA, "strict": True}})
    try:
        json.loads(r.choices[0].message.content)
    except (TypeError, ValueError):
        raise BadReply(f"reply does not parse: {r.choices[0].message.content!r:.80}") from None
    return 1


# (action, weight): chats are most of the traffic, as they are of a server's.
ACTIONS = [(openai_chat, 4), (anthropic_messages, 2), (ollama_chat, 2), (disconnect_mid_stream, 1),
           (named_context, 1), (responses, 1), (json_reply, 2)]


def pick(c: Client):
    return c.rng.choices([a for a, _ in ACTIONS], weights=[w for _, w in ACTIONS])[0]


def error_kind(err: BaseException) -> str:
    status = getattr(err, "status_code", None) or getattr(getattr(err, "response", None), "status_code", None)
    return f"{type(err).__name__}" + (f" {status}" if status else "")
