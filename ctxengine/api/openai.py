"""OpenAI's dialect: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``.

Sampling fields: ``max_tokens`` / ``max_completion_tokens``, ``temperature``,
``top_p``, ``seed``, ``stop``, ``presence_penalty``, ``frequency_penalty``,
and llama.cpp's ``top_k``, ``min_p``, ``repeat_penalty``. ``n`` must be 1;
logprobs are refused rather than ignored. ``response_format`` and
``grammar`` constrain the reply (api/structured.py); ``tools`` and
``tool_choice`` offer tools (api/tools.py). ``context`` (our
extension) continues a named context. ``usage.prompt_tokens_details.cached_tokens``
says how many prompt tokens were reused rather than prefilled.
"""
from __future__ import annotations

import base64
import secrets
import time

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from ..text.tools import parse_tool_calls
from .embeddings import embed
from .errors import OPENAI, ApiError, error_body
from .fields import Fields, json_body
from .generation import Finished, Generation, GenerationRequest, Generations, Started
from .options import Sampling
from ..serving.prompts import Prompt
from .streaming import GenerationStream, sse
from .structured import openai_grammar
from .tools import ToolUse, openai_calls, openai_message, openai_tool_use, reply_events

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def sampling(f: Fields) -> Sampling:
    params = {}
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty", "min_p", "repeat_penalty"):
        if name in f:
            params[name] = f.float(name)
    if "top_k" in f:
        params["top_k"] = f.int("top_k")
    if "seed" in f:
        params["seed"] = f.int("seed", min=0)
    max_tokens = f.int("max_completion_tokens", None, min=0)
    if max_tokens is None:
        max_tokens = f.int("max_tokens", None, min=0)
    return Sampling(max_tokens=max_tokens, stop=f.str_list("stop", None), params=params,
                    speculative=f.bool("speculative", None))


def _refuse_unsupported(f: Fields) -> None:
    if f.int("n", 1) != 1:
        raise ApiError(400, "'n' must be 1: one choice per request", param="n")
    f.refuse("functions", "use 'tools' (the deprecated 'functions' is not supported)")
    f.refuse("logprobs", "log-probabilities are not returned")


def chat_messages(raw: list) -> list[dict]:
    out = []
    for i, m in enumerate(raw):
        f = Fields(m, f"messages[{i}].")
        role = f.str("role")
        if role not in ROLES:
            raise ApiError(400, f"messages[{i}] has role '{role}'; supported: {', '.join(ROLES)}")
        out.append(openai_message(f, ROLES[role]))
    return out


def usage(started: Started, finished: Finished) -> dict:
    return {"prompt_tokens": started.prompt_tokens, "completion_tokens": finished.completion_tokens,
            "total_tokens": started.prompt_tokens + finished.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": started.cached_tokens},
            # OpenAI's names for its predicted outputs; here, the drafts speculation verified.
            "completion_tokens_details": {"accepted_prediction_tokens": finished.accepted_tokens,
                                          "rejected_prediction_tokens": finished.drafted_tokens
                                          - finished.accepted_tokens}}


def _completion_prompt(f: Fields) -> Prompt:
    p = f.data.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # a batch of one
    if isinstance(p, str):
        return Prompt(text=p)
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        return Prompt(text="", prefix_ids=list(p))
    raise ApiError(400, "'prompt' must be a string, or a list of token ids (one prompt per request)", param="prompt")


def routes(runtime, generations: Generations, metrics) -> APIRouter:
    router = APIRouter()

    def model_card(entry) -> dict:
        card = {"id": entry.name, "object": "model", "created": int(entry.modified), "owned_by": entry.source}
        if entry.error:
            card["error"] = entry.error  # listed with the reason it cannot be served
        return card

    @router.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [model_card(e) for e in runtime.catalog.entries()]}

    @router.get("/v1/models/{name:path}")
    async def get_model(name: str):
        return model_card(runtime.catalog.get(name))

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        f = Fields(await json_body(request))
        _refuse_unsupported(f)
        tools = openai_tool_use(f)
        prompt = Prompt(messages=chat_messages(f.list("messages")), tools=tools and tools.prompt_tools)
        req = GenerationRequest(f.str("model", None), prompt, sampling(f), context=f.str("context", None),
                                grammar=openai_grammar(f), tools=tools, lora=f.data.get("lora"))
        return await _respond(generations, f, req, chat=True, client=request)

    @router.post("/v1/completions")
    async def completions(request: Request):
        f = Fields(await json_body(request))
        _refuse_unsupported(f)
        f.refuse("echo", "the prompt is not echoed")
        f.refuse("suffix", "fill-in-the-middle is not supported")
        if f.int("best_of", 1) != 1:
            raise ApiError(400, "'best_of' must be 1", param="best_of")
        f.refuse("tools", "tools need /v1/chat/completions")
        req = GenerationRequest(f.str("model", None), _completion_prompt(f), sampling(f),
                                context=f.str("context", None), grammar=openai_grammar(f),
                                lora=f.data.get("lora"))
        return await _respond(generations, f, req, chat=False, client=request)

    @router.post("/v1/embeddings")
    async def embeddings(request: Request):
        f = Fields(await json_body(request))
        items = f.data.get("input")
        if isinstance(items, str) or (isinstance(items, list) and items and isinstance(items[0], int)):
            items = [items]
        if not isinstance(items, list) or not all(isinstance(x, (str, list)) for x in items):
            raise ApiError(400, "'input' must be a string, a list of strings, or token ids", param="input")
        fmt = f.str("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise ApiError(400, "'encoding_format' must be 'float' or 'base64'", param="encoding_format")
        result = await embed(runtime, f.str("model", None), items, dimensions=f.int("dimensions", None),
                             metrics=metrics)

        def encoded(v):
            return base64.b64encode(v.astype("<f4").tobytes()).decode() if fmt == "base64" else v.tolist()

        return {"object": "list", "model": f.str("model", None) or result.model,
                "data": [{"object": "embedding", "index": i, "embedding": encoded(v)}
                         for i, v in enumerate(result.vectors)],
                "usage": {"prompt_tokens": result.n_tokens, "total_tokens": result.n_tokens}}

    return router


async def _respond(generations: Generations, f: Fields, req: GenerationRequest, *, chat: bool, client: Request):
    stream = f.bool("stream", False)
    include_usage = f.obj("stream_options").bool("include_usage", False)
    gen = await generations.start(req)
    model = req.model or gen.entry.name
    rid = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
    created = int(time.time())
    tools = req.tools if req.tools is not None and req.tools.parses else None
    if not stream:
        text, fin = await gen.collect(client)
        choice = {"index": 0, "logprobs": None, "finish_reason": fin.finish_reason}
        if chat:
            calls = []
            if tools is not None:
                text, calls = parse_tool_calls(text)
            choice["message"] = {"role": "assistant", "content": text if text or not calls else None}
            if calls:
                choice["message"]["tool_calls"] = openai_calls(calls)
                choice["finish_reason"] = "tool_calls"
        else:
            choice["text"] = text
        return JSONResponse({"id": rid, "object": "chat.completion" if chat else "text_completion",
                             "created": created, "model": model, "choices": [choice],
                             "usage": usage(gen.started, fin)})
    return GenerationStream(_chunks(gen, rid, created, model, chat, include_usage, tools), gen, "text/event-stream")


async def _chunks(gen: Generation, rid: str, created: int, model: str, chat: bool, include_usage: bool,
                  tools: ToolUse | None = None):
    head = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
            "model": model}
    extra = {"usage": None} if include_usage else {}

    def chunk(text: str | None, finish: str | None = None, role: bool = False, delta: dict | None = None) -> dict:
        if chat:
            if delta is None:
                delta = {"role": "assistant", "content": text or ""} if role else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {**head, "choices": [choice], **extra}

    if chat:
        yield sse(chunk("", role=True))
    try:
        async for kind, *data in reply_events(gen, tools):
            if kind == "text":
                yield sse(chunk(data[0]))
                continue
            fin, calls = data
            for d in _call_deltas(calls):
                yield sse(chunk(None, delta={"tool_calls": [d]}))
            yield sse(chunk(None, "tool_calls" if calls else fin.finish_reason))
            if include_usage:
                yield sse({**head, "choices": [], "usage": usage(gen.started, fin)})
    except ApiError as err:
        yield sse(error_body(OPENAI, err))
    yield sse("[DONE]")


def _call_deltas(calls) -> list[dict]:
    """Each call as OpenAI streams it: its id and name first, then its arguments."""
    out = []
    for i, c in enumerate(openai_calls(calls)):
        out.append({"index": i, "id": c["id"], "type": "function",
                    "function": {"name": c["function"]["name"], "arguments": ""}})
        out.append({"index": i, "function": {"arguments": c["function"]["arguments"]}})
    return out
