"""OpenAI's Responses API over our contexts and snapshots.

    POST   /v1/responses          a new response (``stream``: Responses events)
    GET    /v1/responses/{id}     a stored response
    DELETE /v1/responses/{id}

Fields: ``model``, ``input`` (a string, or items: messages with text parts,
``function_call`` and ``function_call_output``), ``instructions``,
``previous_response_id``, ``store`` (default true), ``max_output_tokens``,
``temperature``, ``top_p`` (and our ``top_k``, ``min_p``, ``seed``), ``tools``
and ``tool_choice`` (api/tools.py), ``text.format`` and ``grammar``
(api/structured.py).

A response continues the context of its previous one, so only the new input
is prefilled: ``usage.input_tokens_details.cached_tokens`` counts the tokens
reused (api/response_store.py). ``instructions`` are a system message: on a
continuation they are added only when they differ from the previous
response's (as a system turn at that point: the earlier turns' KV is kept).
"""
from __future__ import annotations

import json
import secrets
import time

import anyio.to_thread
from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from ..serving.events import Finished, Started
from ..serving.exports import SamplerParams
from ..serving.generation import GenerationRequest, Generations
from ..serving.prompts import Prompt
from ..text.tools import ToolCall
from .errors import ApiError
from .fields import Fields, json_body, template_kwargs, text_content
from .openai import RANGES, ROLES, refuse_stream_options
from .options import Sampling, seed
from .response_store import ResponseStore, context_name, new_id
from .streaming import GenerationStream, Writer, collected, sse, started
from .structured import responses_grammar
from .tools import responses_tool_use


def input_messages(f: Fields, known_calls: frozenset = frozenset()) -> list[dict]:
    """``input`` as engine messages (assistant tool calls as ToolCall lists).

    ``function_call`` items whose call_id is in ``known_calls`` (the previous
    response's own calls, which its context already holds) are skipped."""
    value = f.data.get("input")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise ApiError(400, "'input' must be a string or a non-empty list of items", param="input")
    out: list[dict] = []
    for i, item in enumerate(value):
        it = Fields(item, f"input[{i}].")
        kind = it.str("type", "message")
        if kind == "message":
            role = it.str("role")
            if role not in ROLES or role == "tool":
                raise ApiError(400, f"'input[{i}].role' is '{role}'; expected system, developer, user or assistant")
            out.append({"role": ROLES[role], "content": _text(it)})
        elif kind == "function_call":
            if it.str("call_id") in known_calls:
                continue
            try:
                args = json.loads(it.str("arguments") or "{}")
            except ValueError:
                raise ApiError(400, f"'input[{i}].arguments' is not valid JSON", param="input") from None
            call = ToolCall(it.str("name"), args if isinstance(args, dict) else {}, id=it.str("call_id"))
            if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = it.data.get("output")
            text = output if isinstance(output, str) else json.dumps(output)
            out.append({"role": "tool", "content": text, "tool_call_id": it.str("call_id")})
        else:
            raise ApiError(400, f"'input[{i}].type' is '{kind}'; supported: message, function_call, "
                                "function_call_output", param="input")
    return out


def _text(it: Fields) -> str:
    content = it.data.get("content")
    if isinstance(content, list):  # input_text / output_text parts are text parts
        content = [{**p, "type": "text"} if isinstance(p, dict) and p.get("type") in ("input_text", "output_text")
                   else p for p in content]
    return text_content(content, f"{it.where}content")


def _sampling(f: Fields) -> Sampling:
    params = {n: f.float(n, within=RANGES.get(n)) for n in ("temperature", "top_p", "min_p") if n in f}
    if "top_k" in f:
        params["top_k"] = f.int("top_k", min=0)
    if "seed" in f:
        params["seed"] = seed(f)
    return Sampling(max_tokens=f.int("max_output_tokens", None, min=1), params=params)


class _Turn:
    """One request: its settings, and the response object it becomes."""

    def __init__(self, f: Fields, rid: str, previous: dict | None):
        self.id = rid
        self.f = f
        self.created = int(time.time())
        self.tools = responses_tool_use(f)
        self.instructions = f.str("instructions", None)
        known = frozenset(o.get("call_id") for o in (previous or {}).get("output", [])
                          if o.get("type") == "function_call")
        messages = input_messages(f, known)
        carried = previous.get("instructions") if previous else None
        if self.instructions and self.instructions != carried:
            messages.insert(0, {"role": "system", "content": self.instructions})
        if previous is not None and not self.instructions:
            self.instructions = carried  # the context still holds them
        self.messages = messages
        self.store = f.bool("store", True)
        self.previous_id = previous["id"] if previous else None
        self.sampler = SamplerParams()  # what it runs with: set once it started (ran_with)

    def ran_with(self, sampling: Sampling) -> None:
        """The settings the generation took (the request's over the model's and the engine's
        defaults): the response reports those, not OpenAI's defaults, which are not ours."""
        self.sampler = SamplerParams(**sampling.params)

    def request(self, model: str | None, template_defaults: dict | None = None) -> GenerationRequest:
        prompt = Prompt(messages=self.messages, tools=self.tools and self.tools.prompt_tools,
                        template_kwargs=template_kwargs(self.f, template_defaults))
        return GenerationRequest(model, prompt, _sampling(self.f), context=context_name(self.id), own_context=True,
                                 grammar=responses_grammar(self.f), tools=self.tools, lora=self.f.data.get("lora"))

    def body(self, model: str, status: str, output: list, usage: dict | None, fin: Finished | None = None) -> dict:
        f = self.f
        incomplete = {"reason": "max_output_tokens"} if fin is not None and fin.finish_reason == "length" else None
        fmt = f.obj("text").data.get("format") or {"type": "text"}
        return {"id": self.id, "object": "response", "created_at": self.created,
                "status": "incomplete" if incomplete else status, "error": None, "incomplete_details": incomplete,
                "instructions": self.instructions, "max_output_tokens": f.int("max_output_tokens", None),
                "model": model, "output": output, "parallel_tool_calls": f.bool("parallel_tool_calls", True),
                "previous_response_id": self.previous_id, "store": self.store,
                "temperature": self.sampler.temperature, "top_p": self.sampler.top_p,
                "tool_choice": f.data.get("tool_choice") or "auto", "tools": f.list("tools", []),
                "text": {"format": fmt}, "truncation": "disabled", "usage": usage,
                "metadata": f.data.get("metadata") or {}}


def usage(s: Started, fin: Finished) -> dict:
    return {"input_tokens": s.prompt_tokens, "input_tokens_details": {"cached_tokens": s.cached_tokens},
            "output_tokens": fin.completion_tokens,
            # reasoning_tokens as OpenAI's; the drafts speculation verified as chat completions names them
            "output_tokens_details": {"reasoning_tokens": 0, "accepted_prediction_tokens": fin.accepted_tokens,
                                      "rejected_prediction_tokens": fin.drafted_tokens - fin.accepted_tokens},
            "total_tokens": s.prompt_tokens + fin.completion_tokens}


def message_item(text: str, status: str = "completed", item_id: str | None = None) -> dict:
    content = [] if status == "in_progress" else [_text_part(text)]
    return {"type": "message", "id": item_id or "msg_" + secrets.token_hex(12), "status": status,
            "role": "assistant", "content": content}


def _refuse_logprobs(f: Fields) -> None:
    """Log-probabilities are refused, not answered with an empty list, as on every route."""
    f.refuse("top_logprobs", "log-probabilities are not returned", zero=True)
    if "message.output_text.logprobs" in f.list("include", []):
        raise ApiError(400, "'include' names message.output_text.logprobs: log-probabilities are not returned",
                       param="include")


def _message_status(fin: Finished) -> str:
    """A message cut at max_output_tokens is "incomplete", as the response is (OpenAI's)."""
    return "incomplete" if fin.finish_reason == "length" else "completed"


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(c: ToolCall, status: str = "completed") -> dict:
    return {"type": "function_call", "id": "fc_" + secrets.token_hex(12), "call_id": c.id, "name": c.name,
            "arguments": c.arguments_json if status == "completed" else "", "status": status}


def routes(runtime, generations: Generations) -> APIRouter:
    router = APIRouter()
    responses = ResponseStore(runtime)

    @router.post("/v1/responses")
    async def create(request: Request):
        f = Fields(await json_body(request))
        refuse_stream_options(f)
        _refuse_logprobs(f)
        previous_id = f.str("previous_response_id", None)
        previous = await anyio.to_thread.run_sync(responses.get, previous_id) if previous_id else None
        turn = _Turn(f, new_id(), previous)
        model = f.str("model", None)
        ctx = await anyio.to_thread.run_sync(responses.open, turn.id, model, previous_id, f.data.get("lora"))
        try:
            gen = await started(generations, turn.request(model or (previous and previous["model"]), runtime.template_kwargs), request)
        except BaseException:
            responses.discard_later(ctx)
            raise
        turn.ran_with(gen.sampling)
        reply = ResponseWriter(gen.started, turn, model or gen.entry.name, ctx, responses)
        if f.bool("stream", False):
            return GenerationStream(gen, reply)
        try:
            fin = await collected(gen, request)
        except BaseException:
            reply.close()
            raise
        return JSONResponse(await reply.saved(reply.body(fin)))

    @router.get("/v1/responses/{rid}")
    async def get(rid: str):
        return await anyio.to_thread.run_sync(responses.get, rid)

    @router.delete("/v1/responses/{rid}")
    async def delete(rid: str):
        await anyio.to_thread.run_sync(responses.delete, rid)
        return {"id": rid, "object": "response", "deleted": True}

    return router


class ResponseWriter(Writer):
    """``/v1/responses``: a message item with one text part, then a function_call
    item per call; the response is saved with its context before it completes."""

    def __init__(self, started: Started, turn: _Turn, model: str, ctx, responses: ResponseStore):
        self.started, self.turn, self.model = started, turn, model
        self.ctx, self.responses = ctx, responses
        self.seq = 0
        self.msg_id = "msg_" + secrets.token_hex(12)
        self.parts: list[str] = []   # the message's text so far (none: not opened yet)
        self.output: list[dict] = []
        self.is_saved = False

    def event(self, kind: str, **data) -> bytes:
        self.seq += 1
        return sse({"type": kind, "sequence_number": self.seq - 1, **data}, event=kind)

    def head(self) -> list[bytes]:
        start = self.turn.body(self.model, "in_progress", [], None)
        return [self.event("response.created", response=start), self.event("response.in_progress", response=start)]

    def _open_message(self) -> list[bytes]:
        if self.parts:
            return []
        self.parts.append("")
        return [self.event("response.output_item.added", output_index=0,
                           item=message_item("", "in_progress", self.msg_id)),
                self.event("response.content_part.added", item_id=self.msg_id, output_index=0, content_index=0,
                           part=_text_part(""))]

    def text(self, text: str) -> list[bytes]:
        out = self._open_message()
        self.parts.append(text)
        return out + [self.event("response.output_text.delta", item_id=self.msg_id, output_index=0,
                                 content_index=0, delta=text, logprobs=[])]

    async def finish(self, fin: Finished) -> list[bytes]:
        out = self._open_message() if not fin.calls else []
        if self.parts:
            out += self._message_done("".join(self.parts), _message_status(fin))
        for c in fin.calls:
            out += self._call(c)
        body = await self.saved(self.turn.body(self.model, "completed", self.output, usage(self.started, fin), fin))
        kind = "response.completed" if body["status"] == "completed" else "response.incomplete"
        return out + [self.event(kind, response=body)]

    def _message_done(self, text: str, status: str) -> list[bytes]:
        ids = {"item_id": self.msg_id, "output_index": 0, "content_index": 0}
        self.output.append(message_item(text, status, item_id=self.msg_id))
        return [self.event("response.output_text.done", **ids, text=text, logprobs=[]),
                self.event("response.content_part.done", **ids, part=_text_part(text)),
                self.event("response.output_item.done", output_index=0, item=self.output[-1])]

    def _call(self, c: ToolCall) -> list[bytes]:
        item, index = call_item(c), len(self.output)
        self.output.append(item)
        return [self.event("response.output_item.added", output_index=index,
                           item={**call_item(c, "in_progress"), "id": item["id"]}),
                self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                           delta=item["arguments"]),
                self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                           name=c.name, arguments=item["arguments"]),
                self.event("response.output_item.done", output_index=index, item=item)]

    def error(self, err: ApiError) -> list[bytes]:
        return [self.event("error", code=str(err.status), message=err.message, param=err.param)]

    def body(self, fin: Finished) -> dict:
        """The reply not streamed: the response whole."""
        output = (([message_item(fin.text, _message_status(fin))] if fin.text or not fin.calls else [])
                  + [call_item(c) for c in fin.calls])
        return self.turn.body(self.model, "completed", output, usage(self.started, fin), fin)

    async def saved(self, body: dict) -> dict:
        """``body``, saved with the context (or the context let go: store false)."""
        await anyio.to_thread.run_sync(lambda: self.responses.save(self.ctx, body, store=self.turn.store))
        self.is_saved = True
        return body

    def close(self) -> None:
        if not self.is_saved:  # failed, or the client went away: nothing keeps the context
            self.responses.discard_later(self.ctx)
