"""Ollama's dialect: ``/``, ``/api/version``, ``/api/tags``, ``/api/ps``,
``/api/generate``, ``/api/chat``, ``/api/embed``, ``/api/embeddings``
(``/api/show`` and the store's routes: api/ollama_store.py).

Streaming is Ollama's default (``"stream": false`` turns it off): NDJSON, the
last line with ``done``, the counts and nanosecond durations. ``options`` go
through ``options.ollama_sampling`` (an entry's params layer gives the
defaults). ``context`` is Ollama's token array on ``/api/generate``; a string
there or on ``/api/chat`` names one of our contexts instead. Besides
Ollama's fields, the last line carries ``prompt_cached_count``: how many of
the ``prompt_eval_count`` tokens had their KV reused. ``format`` ("json" or a
JSON Schema) and ``grammar`` (our extension: GBNF) constrain the reply
(api/structured.py); ``/api/chat`` takes ``tools`` and answers
``message.tool_calls`` (api/tools.py). A reply's ``model`` is the name as the
request spelled it (``smollm2``, not ``smollm2:latest``), as Ollama echoes it.
"""
from __future__ import annotations

import math
import re
from datetime import datetime, timezone

import anyio.to_thread
from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, PlainTextResponse

from ..serving.exports import __version__
from ..serving import model_facts
from ..serving.events import Finished, Started
from ..serving.generation import UNSET, GenerationRequest, Generations
from ..serving.prompts import Prompt, take_prefill
from ..text.tools import ToolUse
from .embeddings import embed
from .errors import OLLAMA, ApiError, error_body
from .fields import Fields, json_body, template_kwargs
from .options import context_length, ollama_sampling
from .streaming import GenerationStream, Writer, collected, ndjson, started
from .structured import ollama_grammar
from .tools import ollama_calls, ollama_tool_use, openai_message

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_FOREVER = "2318-01-01T00:00:00Z"  # what a model kept loaded without a deadline shows as its expiry
FOREVER_S = 100 * 365 * 86400  # a keep_alive longer than this is forever


def iso(ts: float | None = None) -> str:
    t = datetime.now(timezone.utc) if ts is None else datetime.fromtimestamp(ts, timezone.utc)
    return t.isoformat(timespec="microseconds").replace("+00:00", "Z")


def keep_alive_seconds(value) -> float | None:
    """Ollama's keep_alive (seconds, or a Go duration like "5m"); None: stay loaded. Negative,
    or longer than FOREVER_S: forever (a deadline in year 116106 made /api/ps a 500)."""
    seconds = _keep_alive_value(value)
    return None if seconds is None or seconds > FOREVER_S else seconds


def _keep_alive_value(value) -> float | None:
    if isinstance(value, bool) or isinstance(value, float) and math.isnan(value):
        raise ApiError(400, "'keep_alive' must be a number of seconds or a duration like '5m'")
    if isinstance(value, (int, float)):
        return None if value < 0 else float(min(value, 2 * FOREVER_S))  # 10**400 is no float
    if isinstance(value, str):
        text = value.strip()
        sign = -1 if text.startswith("-") else 1
        body = text.lstrip("+-")
        if re.fullmatch(r"\d+(\.\d+)?", body):
            seconds = float(body)
        elif body and _DURATION.sub("", body) == "":
            seconds = sum(float(n) * _UNIT_S[u] for n, u in _DURATION.findall(body))
        else:
            raise ApiError(400, f"'keep_alive' {value!r} is not a duration (e.g. 30s, 5m, 1h, -1)")
        return None if sign < 0 else seconds
    raise ApiError(400, "'keep_alive' must be a number of seconds or a duration like '5m'")


def untagged(catalog, name: str) -> str:
    """``name`` as the catalog knows it: ``x:latest`` is ``x`` unless listed with its tag.
    ``:latest`` alone names no model (it is not the default model: a 404, as /api/show's)."""
    if catalog.lookup(name) is None and name.endswith(":latest") and name != ":latest":
        return name.removesuffix(":latest")
    return name


def requested_model(f: Fields) -> str:
    """The model a request names: ``model``, or ``name`` as older clients send it."""
    name = f.str("model", None) or f.str("name", None)
    if not name:
        raise ApiError(400, "'model' is required", param="model")
    return name


class _Ollama:
    """What the routes share: name lookup, keep_alive, and one way to run a generation."""

    def __init__(self, runtime, generations: Generations, metrics):
        self.runtime, self.generations, self.metrics = runtime, generations, metrics

    def resolve(self, name: str):
        """Ollama names: an untagged model is ``:latest``, so accept either spelling."""
        return self.runtime.resolve(untagged(self.runtime.catalog, name))

    def model_name(self, f: Fields) -> str:
        return self.resolve(requested_model(f)).name

    def listing(self, entry) -> dict:
        """An /api/tags entry; one that cannot be served says why in its top-level ``error``
        (a file the catalog lists but cannot read too: not in ``details``)."""
        details = model_facts.details(entry)
        error = entry.error or details.pop("error", None)
        item = {"name": entry.name, "model": entry.name, "modified_at": iso(entry.modified or None),
                "size": entry.listed_size, "digest": model_facts.digest(entry), "details": details}
        if error:
            item["error"] = error
        return item

    async def generation_body(self, request: Request) -> tuple[Fields, str]:
        f = Fields(await json_body(request))
        name = self.model_name(f)
        _refuse_unsupported(f)
        return f, name

    def apply_keep_alive(self, f: Fields, name: str) -> None:
        ka = _keep_alive(f)
        if ka is not UNSET:
            self.runtime.keep_alive(name, ka)

    async def load_or_unload(self, f: Fields, name: str, body: dict):
        """An empty prompt loads the model (keep_alive 0: unloads it), as Ollama does."""
        ka = _keep_alive(f)
        sent = requested_model(f)
        if ka == 0:
            await anyio.to_thread.run_sync(lambda: self.runtime.keep_alive(name, 0) if self.is_loaded(name) else None)
            return {"model": sent, "created_at": iso(), **body, "done": True, "done_reason": "unload"}
        await anyio.to_thread.run_sync(lambda: self.runtime.model(name))
        if ka is not UNSET:
            self.runtime.keep_alive(name, ka)
        return {"model": sent, "created_at": iso(), **body, "done": True, "done_reason": "load"}

    def tokenizer(self, name: str):
        """A loaded model's tokenizer (a generation that has started holds its model loaded)."""
        return next((e.model.tokenizer for e in self.runtime.loaded() if e.entry.name == name), None)

    def is_loaded(self, name: str) -> bool:
        return any(e.entry.name == name for e in self.runtime.loaded())

    async def run(self, f: Fields, name: str, prompt: Prompt, context: str | None, *, chat: bool,
                  client: Request, tools: ToolUse | None = None):
        req = GenerationRequest(name, prompt, _sampling(f), context=context, keep_alive=_keep_alive(f),
                                grammar=ollama_grammar(f), tools=tools, lora=f.data.get("lora"))
        stream = f.bool("stream", True)
        gen = await started(self.generations, req, client)
        reply = LineWriter(gen.started, requested_model(f), chat)  # the name as sent, as Ollama echoes it
        if not chat and context is None:  # Ollama's context array: none for a raw prompt
            tokenizer = self.tokenizer(gen.started.model)
            reply.context = None if not prompt.is_chat else UNSET if tokenizer is None else tokenizer
        if stream:
            return GenerationStream(gen, reply)
        return JSONResponse(reply.body(await collected(gen, client)))


def routes(runtime, generations: Generations, metrics) -> APIRouter:
    router = APIRouter()
    o = _Ollama(runtime, generations, metrics)
    _model_routes(router, o)
    _generation_routes(router, o)
    _embedding_routes(router, o)
    return router


def _model_routes(router: APIRouter, o: _Ollama) -> None:
    runtime = o.runtime

    @router.get("/")
    @router.head("/")
    async def root():
        return PlainTextResponse("Ollama is running")

    @router.get("/api/version")
    @router.head("/api/version")  # a load balancer's check: the headers alone
    async def version():
        return {"version": __version__}

    @router.get("/api/tags")
    @router.head("/api/tags")  # a load balancer's check: the headers alone
    async def tags():
        # A first listing reads every model's header: off the event loop.
        return await anyio.to_thread.run_sync(lambda: {"models": [o.listing(e) for e in runtime.catalog.entries()]})

    @router.get("/api/ps")
    async def ps():
        out = []
        for e in runtime.loaded():
            out.append({"name": e.entry.name, "model": e.entry.name, "size": e.memory_bytes,
                        "digest": model_facts.digest(e.entry), "details": model_facts.details(e.entry),
                        "expires_at": iso(e.expires_at) if e.expires_at is not None else _FOREVER,
                        "size_vram": 0, "context_length": _context_length(e)})
        return {"models": out}


def _generation_routes(router: APIRouter, o: _Ollama) -> None:
    @router.post("/api/generate")
    async def generate(request: Request):
        f, name = await o.generation_body(request)
        f.refuse("suffix", "fill-in-the-middle is not supported")
        context = f.data.get("context")
        named = f.str("context") if isinstance(context, str) else None
        prefix = f.int_list("context", []) if not isinstance(context, str) else []
        text = f.str("prompt", "")
        if not text and not prefix and named is None:
            return await o.load_or_unload(f, name, {"response": ""})
        if f.bool("raw", False):
            prompt = Prompt(text=text, prefix_ids=prefix)
        else:
            system = f.str("system", None)
            messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
            prompt = Prompt(messages=messages, prefix_ids=prefix, template=f.str("template", None), think=_think(f),
                            template_kwargs=_thinking(f, template_kwargs(f, o.runtime.template_kwargs)))
        return await o.run(f, name, prompt, named, chat=False, client=request)

    @router.post("/api/chat")
    async def chat(request: Request):
        f, name = await o.generation_body(request)
        tools = ollama_tool_use(f)
        messages = [_message(m, i) for i, m in enumerate(f.list("messages", []))]
        named = f.str("context", None)
        if not messages and named is None:  # Ollama's load (or, keep_alive 0, unload)
            return await o.load_or_unload(f, name, {"message": {"role": "assistant", "content": ""}})
        # A chat longer than the context loses its oldest turns, as Ollama's (its system messages
        # kept); a final assistant message is continued, as Ollama's is.
        prefill = take_prefill(messages)
        prompt = Prompt(messages=messages, tools=tools and tools.prompt_tools, trim=True, think=_think(f),
                        prefill=prefill, template_kwargs=_thinking(f, template_kwargs(f, o.runtime.template_kwargs)))
        return await o.run(f, name, prompt, named, chat=True, client=request, tools=tools)


def _embedding_routes(router: APIRouter, o: _Ollama) -> None:
    @router.post("/api/embed")
    async def embed_route(request: Request):
        f = Fields(await json_body(request))
        name, sent = o.model_name(f), requested_model(f)
        options = ollama_sampling(f.obj("options").data)  # checked; num_ctx alone applies
        if f.data.get("input") in (None, "", []):  # as Ollama's EmbedHandler: the model loads, nothing is embedded
            await anyio.to_thread.run_sync(lambda: o.runtime.model(name))
            o.apply_keep_alive(f, name)
            return {"model": sent, "embeddings": []}
        inputs = f.str_list("input")
        result = await embed(o.runtime, name, inputs, truncate=f.bool("truncate", True),
                             dimensions=f.int("dimensions", None), num_ctx=options.num_ctx, lora=f.data.get("lora"),
                             metrics=o.metrics, client=request)
        o.apply_keep_alive(f, name)
        return {"model": sent, "embeddings": [v.tolist() for v in result.vectors],
                "total_duration": result.total_ns, "load_duration": result.load_ns,
                "prompt_eval_count": result.n_tokens}

    @router.post("/api/embeddings")
    async def embeddings_route(request: Request):
        f = Fields(await json_body(request))
        name = o.model_name(f)
        options = ollama_sampling(f.obj("options").data)
        text = f.str("prompt", "")
        if not text:
            return {"embedding": []}
        # Ollama's legacy handler returns the pooled vector unnormalised (/api/embed normalises)
        result = await embed(o.runtime, name, [text], normalize=False, num_ctx=options.num_ctx,
                             lora=f.data.get("lora"), metrics=o.metrics, client=request)
        o.apply_keep_alive(f, name)
        return {"embedding": result.vectors[0].tolist()}


def _context_length(loaded) -> int:
    """The context a request on a loaded model gets (as /api/ps lists it)."""
    try:
        return context_length(loaded.entry, loaded.model.config.n_ctx)
    except ApiError:  # an unusable params layer: each request is refused, the model still runs
        return loaded.model.config.n_ctx


def _keep_alive(f: Fields):
    value = f.data.get("keep_alive")
    return UNSET if value is None else keep_alive_seconds(value)


def _sampling(f: Fields):
    s = ollama_sampling(f.obj("options").data)
    s.speculative = f.bool("speculative", None)  # our extension: false turns drafting off
    return s


def _refuse_unsupported(f: Fields) -> None:
    f.refuse("images", "images are not supported")
    f.refuse("logprobs", "log-probabilities are not returned")
    f.refuse("top_logprobs", "log-probabilities are not returned", zero=True)
    if f.data.get("think") not in (None, False):
        raise ApiError(400, "'think' is not supported: the models served here do not think aloud", param="think")


def _think(f: Fields) -> bool | str | None:
    """Ollama's think (api.ThinkValue: a bool or a level), which a model's template layer sees
    as .Think, .ThinkLevel and .IsThinkSet; None when the request does not say."""
    value = f.data.get("think")
    if value is None or isinstance(value, bool) or value in ("high", "medium", "low", "max"):
        return value
    raise ApiError(400, "think must be a boolean or one of 'high', 'medium', 'low', 'max'", param="think")


def _thinking(f: Fields, kwargs: dict | None) -> dict | None:
    """``think: false`` for a model's Jinja template: ``enable_thinking`` false (Qwen3's switch),
    unless chat_template_kwargs sets it (a Go template layer sees .Think instead)."""
    if f.data.get("think") is False and "enable_thinking" not in (kwargs or {}):
        return {**(kwargs or {}), "enable_thinking": False}
    return kwargs


def _message(m, i: int) -> dict:
    f = Fields(m, f"messages[{i}].")
    role = f.str("role")
    if role not in ("system", "user", "assistant", "tool"):
        raise ApiError(400, f"messages[{i}] has role '{role}'; supported: system, user, assistant, tool")
    f.refuse("images", "images are not supported")
    if f.data.get("content") is None:
        f = Fields({**f.data, "content": f.str("content", "")}, f.where)
    return openai_message(f, role)


class LineWriter(Writer):
    """``/api/chat`` and ``/api/generate``: a line per piece, tool calls in a line
    of their own, then the last line with the counts and durations."""

    media_type = "application/x-ndjson"

    context = UNSET  # /api/generate: UNSET (a named context): its tokens; None: no context array;
    # else the tokenizer that spells the reply Ollama's way (context_array)

    def __init__(self, started: Started, model: str, chat: bool):
        self.started, self.model, self.chat = started, model, chat

    def piece(self, text: str) -> dict:
        body = {"message": {"role": "assistant", "content": text}} if self.chat else {"response": text}
        return {"model": self.model, "created_at": iso(), **body, "done": False}

    def text(self, text: str) -> list[bytes]:
        return [ndjson(self.piece(text))]

    async def finish(self, fin: Finished) -> list[bytes]:
        out = []
        if fin.calls:
            piece = self.piece("")
            piece["message"]["tool_calls"] = ollama_calls(fin.calls)
            out.append(ndjson(piece))
        return out + [ndjson(self.last(fin, ""))]

    def error(self, err: ApiError) -> list[bytes]:
        return [ndjson(error_body(OLLAMA, err))]

    def body(self, fin: Finished) -> dict:
        """The reply not streamed: the last line, holding the whole reply."""
        out = self.last(fin, fin.text)
        if fin.calls:
            out["message"]["tool_calls"] = ollama_calls(fin.calls)
        return out

    def last(self, fin: Finished, text: str) -> dict:
        s = self.started
        out = self.piece(text)
        out.update(done=True, done_reason=fin.finish_reason, total_duration=fin.total_ns, load_duration=s.load_ns,
                   prompt_eval_count=s.prompt_tokens, prompt_eval_duration=s.prefill_ns,
                   eval_count=fin.completion_tokens, eval_duration=fin.decode_ns,
                   prompt_cached_count=s.cached_tokens, draft_count=fin.drafted_tokens,
                   draft_accepted_count=fin.accepted_tokens)
        if not self.chat and self.context is not None:
            out["context"] = fin.tokens if self.context is UNSET else context_array(self.context, fin)
        return out


def context_array(tokenizer, fin: Finished) -> list[int]:
    """Ollama's ``context``: the prompt's tokens and the reply's visible text, not what a stop
    string cut off nor the end-of-turn token. The reply's own tokens while they spell that text."""
    new = fin.tokens[len(fin.tokens) - fin.completion_tokens:]
    out, shown = fin.tokens[:len(fin.tokens) - fin.completion_tokens], fin.text.encode("utf-8", "surrogatepass")
    at = 0
    for i in new:
        piece = tokenizer.token_bytes(i) if i not in tokenizer.eog_ids else None
        if not piece or not shown.startswith(piece, at):
            break
        out.append(i)
        at += len(piece)
    rest = shown[at:].decode("utf-8", "replace")
    return out + tokenizer.encode(rest, parse_special=True) if rest else out
