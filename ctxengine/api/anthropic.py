"""Anthropic's dialect: ``/v1/messages`` and ``/v1/messages/count_tokens``.

``system`` (a string or text blocks), messages with text content blocks,
``max_tokens`` (required, as Anthropic requires it), ``temperature``,
``top_p`` (both in [0, 1], as Anthropic's), ``top_k``, ``stop_sequences``,
``seed`` (our extension, as OpenAI's);
``stream`` sends Anthropic's event sequence. A final assistant message is a
prefill: the reply continues its text and holds only the continuation. Usage
follows Anthropic's accounting: ``input_tokens`` are the prompt tokens that
were prefilled (the prefill's among them), ``cache_read_input_tokens`` those
whose KV was reused; ``count_tokens`` counts the same prompt, tools included. ``tools`` and ``tool_choice`` with ``tool_use`` /
``tool_result`` blocks (api/tools.py); ``output_config.format`` (a JSON
schema) or ``grammar`` (our extension) constrains the reply; the rest of
``output_config`` (``effort``) is ignored. The current anthropic client has
no ``temperature``/``top_p``/``top_k`` arguments: send them in
``extra_body``. Images and extended thinking are refused (``thinking``
``{"type": "disabled"}`` is accepted), and a chat template's own thinking
switch (Qwen3's ``enable_thinking``) is rendered off unless
``chat_template_kwargs`` turns it on.
"""
from __future__ import annotations

import json
import secrets

import anyio.to_thread
from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from ..serving.events import Finished, Started
from ..serving.generation import GenerationRequest, Generations
from ..serving.prompts import Prompt, prompt_ids, take_prefill
from ..text.tools import ToolUse
from .errors import ANTHROPIC, ApiError, error_body
from .fields import Fields, json_body, messages_of, template_kwargs, text_content
from .options import Sampling, seed
from .streaming import GenerationStream, Writer, collected, sse, started
from .structured import anthropic_grammar
from .tools import anthropic_blocks, anthropic_messages, anthropic_tool_use


def messages_prompt(f: Fields, tools: ToolUse | None = None, defaults: dict | None = None) -> Prompt:
    """``defaults``: the server's chat template kwargs (fields.template_kwargs)."""
    messages = []
    if "system" in f:
        messages.append({"role": "system", "content": text_content(f.data["system"], "system", "content blocks")})
    for i, m in enumerate(messages_of(f)):
        mf = Fields(m, f"messages[{i}].")
        role = mf.str("role")
        if role not in ("user", "assistant"):
            raise ApiError(400, f"messages[{i}] has role '{role}'; expected 'user' or 'assistant'")
        messages.extend(anthropic_messages(mf, role))
    prefill = _prefill(messages)
    # Extended thinking is off here (refused when asked), so a template's own switch is too
    # (Qwen3's enable_thinking), unless chat_template_kwargs or the server's defaults set it.
    kwargs = template_kwargs(f, defaults) or {}
    return Prompt(messages=messages, tools=tools and tools.prompt_tools, prefill=prefill,
                  template_kwargs={"enable_thinking": False, **kwargs})


def _prefill(messages: list[dict]) -> str:
    """A final assistant message's text, taken off ``messages``: the reply continues it."""
    text = take_prefill(messages)
    if text != text.rstrip():
        raise ApiError(400, "final assistant content cannot end with trailing whitespace", param="messages")
    return text


def sampling(f: Fields) -> Sampling:
    # Anthropic's documented ranges; the engine's own are wider (Ollama's temperature has no cap)
    params = {name: f.float(name, within=(0, 1)) for name in ("temperature", "top_p") if name in f}
    if "top_k" in f:
        params["top_k"] = f.int("top_k", min=0)
    if "seed" in f:  # our extension (Anthropic has none): a sampled reply that can be had again
        params["seed"] = seed(f)
    return Sampling(max_tokens=f.int("max_tokens", min=1), stop=f.str_list("stop_sequences", None, one=False),
                    params=params, speculative=f.bool("speculative", None))


def usage(started: Started, finished: Finished | None) -> dict:
    return {"input_tokens": started.prompt_tokens - started.cached_tokens,
            "output_tokens": finished.completion_tokens if finished else 0,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": started.cached_tokens,
            "drafted_tokens": finished.drafted_tokens if finished else 0,  # speculation (our extension)
            "accepted_draft_tokens": finished.accepted_tokens if finished else 0}


def stop_reason(fin: Finished, calls=()) -> str:
    if calls:
        return "tool_use"
    if fin.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if fin.stop_sequence is not None else "end_turn"


def routes(runtime, generations: Generations) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/messages")
    async def messages(request: Request):
        f = Fields(await json_body(request))
        if f.obj("thinking").str("type", "disabled") != "disabled":
            raise ApiError(400, "'thinking' is not supported: extended thinking", param="thinking")
        model = f.str("model")
        f.obj("metadata")  # an object (its user_id has no use here), as Anthropic requires
        tools = anthropic_tool_use(f)
        grammar = anthropic_grammar(f)
        prompt = messages_prompt(f, tools, runtime.template_kwargs)
        if prompt.prefill and grammar is not None:
            # The format holds the reply from its first token, so a prefill's "{" came out as
            # "{" + a whole JSON object: no prefill and reply that parse together.
            raise ApiError(400, "a final assistant message (prefill) cannot be combined with "
                           "output_config.format or grammar, which constrain the reply from its first token",
                           param="messages")
        req = GenerationRequest(model, prompt, sampling(f), context=f.str("context", None),
                                grammar=grammar, tools=tools, lora=f.data.get("lora"))
        stream = f.bool("stream", False)
        gen = await started(generations, req, request)
        reply = MessageWriter(gen.started, model, tools_offered=tools is not None and tools.parses)
        if stream:
            return GenerationStream(gen, reply)
        return JSONResponse(reply.body(await collected(gen, request)))

    @router.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        f = Fields(await json_body(request))
        prompt = messages_prompt(f, anthropic_tool_use(f), runtime.template_kwargs)
        entry = runtime.resolve(f.str("model"))

        def count() -> int:
            with runtime.lease(entry.name) as model:
                return len(prompt_ids(model, entry, prompt))

        return {"input_tokens": await anyio.to_thread.run_sync(count)}

    return router


class MessageWriter(Writer):
    """``/v1/messages``: Anthropic's event sequence, a text block then a tool_use block per call."""

    def __init__(self, started: Started, model: str, tools_offered: bool):
        self.started = started
        self.message = {"id": "msg_" + secrets.token_hex(12), "type": "message", "role": "assistant", "model": model}
        self.tools_offered = tools_offered
        self.blocks = 0  # content blocks opened; the text block (index 0) opens with the first text

    def head(self) -> list[bytes]:
        out = [_event("message_start", message={**self.message, "content": [], "stop_reason": None,
                                                "stop_sequence": None, "usage": usage(self.started, None)})]
        if not self.tools_offered:  # plain text: the text block opens at once, as before tools existed
            out += self._open_text()
        return out

    def _open_text(self) -> list[bytes]:
        if self.blocks:
            return []
        self.blocks = 1
        return [_event("content_block_start", index=0, content_block={"type": "text", "text": ""})]

    def text(self, text: str) -> list[bytes]:
        return self._open_text() + [_event("content_block_delta", index=0,
                                           delta={"type": "text_delta", "text": text})]

    async def finish(self, fin: Finished) -> list[bytes]:
        out = []  # with tools offered and no text (a forced call cut short): no block, as in body()
        if self.blocks:
            out.append(_event("content_block_stop", index=0))
        for block in anthropic_blocks("", fin.calls) if fin.calls else ():
            out += [_event("content_block_start", index=self.blocks, content_block={**block, "input": {}}),
                    _event("content_block_delta", index=self.blocks,
                           delta={"type": "input_json_delta", "partial_json": json.dumps(block["input"])}),
                    _event("content_block_stop", index=self.blocks)]
            self.blocks += 1
        return out + [_event("message_delta", delta={"stop_reason": stop_reason(fin, fin.calls),
                                                     "stop_sequence": fin.stop_sequence},
                             usage=usage(self.started, fin)),
                      _event("message_stop")]

    def error(self, err: ApiError) -> list[bytes]:
        return [sse(error_body(ANTHROPIC, err), event="error")]

    def body(self, fin: Finished) -> dict:
        """The reply not streamed: the message whole."""
        return {**self.message, "content": anthropic_blocks(fin.text, fin.calls, empty_text=not self.tools_offered),
                "stop_reason": stop_reason(fin, fin.calls), "stop_sequence": fin.stop_sequence,
                "usage": usage(self.started, fin)}


def _event(kind: str, **data) -> bytes:
    return sse({"type": kind, **data}, event=kind)
