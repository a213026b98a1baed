"""OpenAI's dialect: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``.

Sampling fields: ``max_tokens`` / ``max_completion_tokens`` (completions: 16
when absent, as OpenAI's), ``temperature``, ``top_p``, ``seed``, ``stop``,
``presence_penalty``, ``frequency_penalty``, ``logit_bias``, and llama.cpp's
``top_k``, ``min_p``, ``repeat_penalty``; the ranges OpenAI documents are
checked here (``RANGES``), as the engine's are wider. ``n`` must be 1;
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

import anyio.to_thread
from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from ..errors import ContextError
from ..serving.events import Finished, Started
from ..serving.generation import GenerationRequest, Generations
from ..serving.prompts import Prompt
from .embeddings import embed
from .errors import OPENAI, ApiError, error_body
from .fields import Fields, json_body, messages_of, template_kwargs
from .options import Sampling, seed
from .streaming import GenerationStream, Writer, collected, sse, started
from .structured import openai_grammar
from .tools import openai_calls, openai_message, openai_tool_use

COMPLETION_MAX_TOKENS = 16  # /v1/completions without max_tokens: OpenAI's documented default
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


# OpenAI's documented ranges, checked here: the engine's own are wider (Ollama's temperature has no cap).
RANGES = {"temperature": (0, 2), "top_p": (0, 1), "presence_penalty": (-2, 2), "frequency_penalty": (-2, 2)}


def sampling(f: Fields, default_max_tokens: int | None = None) -> Sampling:
    params = {}
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty", "min_p", "repeat_penalty"):
        if name in f:
            params[name] = f.float(name, within=RANGES.get(name))
    if "top_k" in f:
        params["top_k"] = f.int("top_k")
    if "seed" in f:
        params["seed"] = seed(f)
    if "logit_bias" in f:  # {"token id": bias}; checked as the sampler checks it
        params["logit_bias"] = f.data["logit_bias"]
    max_tokens = f.int("max_completion_tokens", None, min=1)
    if max_tokens is None:
        max_tokens = f.int("max_tokens", default_max_tokens, min=1)
    return Sampling(max_tokens=max_tokens, stop=f.str_list("stop", None), params=params,
                    speculative=f.bool("speculative", None))


def refuse_stream_options(f: Fields) -> None:
    if "stream_options" in f and not f.bool("stream", False):
        raise ApiError(400, "'stream_options' is only allowed when 'stream' is true", param="stream_options")


def _refuse_unsupported(f: Fields) -> None:
    if f.int("n", 1) != 1:
        raise ApiError(400, "'n' must be 1: one choice per request", param="n")
    f.refuse("functions", "use 'tools' (the deprecated 'functions' is not supported)")
    refuse_stream_options(f)
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
    if p == []:
        raise ApiError(400, "'prompt' is an empty list: give a string (it may be empty) or token ids", param="prompt")
    raise ApiError(400, "'prompt' must be a string, or a list of token ids (one prompt per request)", param="prompt")


def routes(runtime, generations: Generations, metrics) -> APIRouter:
    router = APIRouter()

    def model_card(entry) -> dict:
        card = {"id": entry.name, "object": "model", "created": int(entry.modified), "owned_by": entry.source}
        if entry.error:
            card["error"] = entry.error  # listed with the reason it cannot be served
        return card

    @router.get("/v1/models")
    @router.head("/v1/models")  # a load balancer's check: the headers alone
    async def list_models():
        return {"object": "list", "data": [model_card(e) for e in runtime.catalog.entries()]}

    @router.get("/v1/models/{name:path}")
    async def get_model(name: str):
        return model_card(runtime.catalog.get(name))

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        f = Fields(await json_body(request))
        _refuse_unsupported(f)
        if "top_logprobs" in f:  # OpenAI's rule; with logprobs true, refused above as logprobs are
            raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        tools = openai_tool_use(f)
        prompt = Prompt(messages=chat_messages(messages_of(f)), tools=tools and tools.prompt_tools,
                        template_kwargs=template_kwargs(f, runtime.template_kwargs))
        req = GenerationRequest(await _model(runtime, f), prompt, sampling(f), context=f.str("context", None),
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
        req = GenerationRequest(await _model(runtime, f), _completion_prompt(f), sampling(f, COMPLETION_MAX_TOKENS),
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
                             truncate=False, lora=f.data.get("lora"), metrics=metrics,
                             client=request)  # too long: a 400, as OpenAI's

        def encoded(v):
            return base64.b64encode(v.astype("<f4").tobytes()).decode() if fmt == "base64" else v.tolist()

        return {"object": "list", "model": f.str("model", None) or result.model,
                "data": [{"object": "embedding", "index": i, "embedding": encoded(v)}
                         for i, v in enumerate(result.vectors)],
                "usage": {"prompt_tokens": result.n_tokens, "total_tokens": result.n_tokens}}

    return router


async def _model(runtime, f: Fields) -> str | None:
    """The model a generation runs on: the one named, else the named context's own (the
    server's default model may be another, and a context runs only on its own), else
    None: the default. A context not found is left for the generation to report."""
    model, context = f.str("model", None), f.str("context", None)
    if model or context is None:
        return model

    def owner() -> str | None:
        try:
            return runtime.sessions.loaded_entry(runtime.sessions.find(context)).entry.name
        except ContextError:
            return None

    return await anyio.to_thread.run_sync(owner)


async def _respond(generations: Generations, f: Fields, req: GenerationRequest, *, chat: bool, client: Request):
    include_usage = f.obj("stream_options").bool("include_usage", False)
    gen = await started(generations, req, client)
    reply = (ChatWriter if chat else CompletionWriter)(gen.started, req.model or gen.entry.name, include_usage)
    if f.bool("stream", False):
        return GenerationStream(gen, reply)
    return JSONResponse(reply.body(await collected(gen, client)))


class _OpenAIWriter(Writer):
    """What chat and completion replies share: the chunk head, usage, errors, ``[DONE]``."""

    id_prefix: str
    kind: str          # the reply's object; its chunks' is kind + chunk_suffix
    chunk_suffix: str

    def __init__(self, started: Started, model: str, include_usage: bool):
        self.started = started
        self.head_fields = {"id": self.id_prefix + secrets.token_hex(12), "object": self.kind + self.chunk_suffix,
                            "created": int(time.time()), "model": model}
        self.extra = {"usage": None} if include_usage else {}

    def chunk(self, choice: dict) -> bytes:
        return sse({**self.head_fields, "choices": [{"index": 0, **choice}], **self.extra})

    def ending(self, fin: Finished, last: dict) -> list[bytes]:
        out = [self.chunk(last)]
        if self.extra:
            out.append(sse({**self.head_fields, "choices": [], "usage": usage(self.started, fin)}))
        return out + [sse("[DONE]")]

    def error(self, err: ApiError) -> list[bytes]:
        return [sse(error_body(OPENAI, err)), sse("[DONE]")]

    def body(self, fin: Finished) -> dict:
        """The reply not streamed: the whole of it in one object."""
        choice = {"index": 0, "logprobs": None, "finish_reason": fin.finish_reason, **self.whole(fin)}
        return {**self.head_fields, "object": self.kind, "choices": [choice], "usage": usage(self.started, fin)}

    def whole(self, fin: Finished) -> dict:
        raise NotImplementedError


class ChatWriter(_OpenAIWriter):
    """``/v1/chat/completions``: deltas of one assistant message, its tool calls at the end."""

    id_prefix, kind, chunk_suffix = "chatcmpl-", "chat.completion", ".chunk"

    def head(self) -> list[bytes]:
        return [self.delta({"role": "assistant", "content": ""})]

    def delta(self, delta: dict, finish: str | None = None) -> bytes:
        return self.chunk({"delta": delta, "logprobs": None, "finish_reason": finish})

    def text(self, text: str) -> list[bytes]:
        return [self.delta({"content": text})]

    async def finish(self, fin: Finished) -> list[bytes]:
        calls = [self.delta({"tool_calls": [d]}) for d in _call_deltas(fin.calls)]
        return calls + self.ending(fin, {"delta": {}, "logprobs": None, "finish_reason": _chat_finish(fin)})

    def whole(self, fin: Finished) -> dict:
        message = {"role": "assistant", "content": fin.text if fin.text or not fin.calls else None}
        if not fin.calls:
            return {"message": message}
        return {"message": {**message, "tool_calls": openai_calls(fin.calls)}, "finish_reason": _chat_finish(fin)}


def _chat_finish(fin: Finished) -> str:
    """"tool_calls" where the reply made calls (even where the budget then ended it: the
    calls are whole), else the generation's own reason."""
    return "tool_calls" if fin.calls else fin.finish_reason


class CompletionWriter(_OpenAIWriter):
    """``/v1/completions``: pieces of text."""

    id_prefix, kind, chunk_suffix = "cmpl-", "text_completion", ""

    def text(self, text: str) -> list[bytes]:
        return [self.chunk({"text": text, "logprobs": None, "finish_reason": None})]

    async def finish(self, fin: Finished) -> list[bytes]:
        return self.ending(fin, {"text": "", "logprobs": None, "finish_reason": fin.finish_reason})

    def whole(self, fin: Finished) -> dict:
        return {"text": fin.text}


def _call_deltas(calls) -> list[dict]:
    """Each call as OpenAI streams it: its id and name first, then its arguments."""
    out = []
    for i, c in enumerate(openai_calls(calls)):
        out.append({"index": i, "id": c["id"], "type": "function",
                    "function": {"name": c["function"]["name"], "arguments": ""}})
        out.append({"index": i, "function": {"arguments": c["function"]["arguments"]}})
    return out
