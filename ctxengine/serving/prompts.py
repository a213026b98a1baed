"""From what a request says to the tokens a model continues.

Every dialect turns its request into a :class:`Prompt`: chat turns
(``messages``), or raw text whose special tokens are parsed (OpenAI
completions, Ollama ``raw``), optionally after token ids a previous reply
returned (Ollama's ``context`` array).

Chat turns are rendered with the model's template: an Ollama template layer
(a Go template) when the entry has one and it can be rendered, else the
GGUF's own chat template. An entry's system layer is the system prompt when
the messages have none.

A named context (our extension) already holds the conversation so far, so
only the new turns are rendered: the template's text for ``[anchor] + new``
minus its text for ``[anchor]``, where the anchor is a stand-in exchange
(text/chat.py; a reply cut short is closed first). After a
chat reply the context's assistant turn is closed as the template closes it
(``model.chat.render(after=..., closing=True)``, text/chat.py), so the context
always ends on a turn boundary.

Ollama's ``/api/chat`` (``trim``) is not refused for length while its last
message fits: its oldest turns go (its system messages stay) until the prompt
leaves its reply room within the context (``reply_room``): ``num_predict``
tokens where the request sets it, else a quarter of the context, at most half.
Ollama's runner shifts its context as a reply grows, so a prompt that fills
it still gets a reply; ours is exact KV, which cannot shift, so the room is
left before the prompt is prefilled. A named context is never trimmed: a
request that would leave it no room for a reply is refused, changing nothing
(``continuation_ids``).

A chat prompt's ``prefill`` (a final assistant message, on the Anthropic and
Ollama faces: ``take_prefill``) follows the template's opening of the
assistant turn, so the reply continues it.
"""
from __future__ import annotations

import dataclasses
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import ContextError, CtxError, RequestError, UnsupportedTemplateError
from ..ollama.template import OllamaTemplate
from ..text.chat import with_system
from .message_spans import message_spans

if TYPE_CHECKING:
    from ..engine.model_source import CatalogEntry
    from ..state.model import Model


@dataclass
class Prompt:
    messages: list[dict] | None = None            # chat: [{"role", "content"}], system first if any
    text: str | None = None                       # raw text, used as is (special tokens parsed)
    prefix_ids: list[int] = field(default_factory=list)  # token ids before the rest (Ollama context)
    template: str | None = None                   # a Go template for this request (Ollama's `template`)
    tools: list | None = None                     # text.tools.Tool definitions to render (text/tools.py)
    prefill: str = ""                             # chat: the reply's opening text, which it continues
    trim: bool = False                            # chat: drop the oldest turns that do not fit (Ollama's)
    think: bool | str | None = None               # Ollama's think, for a Go template's .Think (None: unset)
    template_kwargs: dict | None = None           # chat: more Jinja template variables (chat_template_kwargs)

    @property
    def is_chat(self) -> bool:
        return self.messages is not None


def take_prefill(messages: list[dict]) -> str:
    """A final assistant message's text, taken off ``messages`` to be the reply's opening
    (``Prompt.prefill``): the reply continues it and holds only the continuation, as
    Anthropic's and Ollama's do. One that made tool calls is a turn of its own: ""."""
    last = messages[-1] if messages else None
    if last is None or last.get("role") != "assistant" or last.get("tool_calls"):
        return ""
    return messages.pop().get("content") or ""


def chat_text(model: "Model", entry: "CatalogEntry", messages: list[dict], *,
              add_generation_prompt: bool = True, layer_template: bool = True,
              template: str | None = None, tools: list | None = None, think: bool | str | None = None,
              template_kwargs: dict | None = None) -> str:
    """The messages rendered as the model expects them (see the module doc).

    ``layer_template=False`` uses the GGUF's template even when the entry has
    a Go template: turns rendered piecemeal (named contexts) need a template
    that can end without a generation prompt, which Ollama's cannot.
    ``template`` overrides the entry's Go template.

    Tools, tool calls and tool results go through the Go template as Ollama
    passes them (``.Tools``, ``.ToolCalls``, tool-role messages), except tools
    offered to a model's layer that never mentions ``.Tools`` (Ollama refuses
    those): the GGUF's template then shows them (text/tools.py).  ``think`` is Ollama's request
    field, unset (None) by default: the Go template sees it as Ollama renders it.
    ``template_kwargs`` are the GGUF's Jinja template's variables: a Go template ignores them."""
    asked, template = template, template or entry.template
    if template and layer_template and add_generation_prompt:
        try:
            go = OllamaTemplate(template)
            if asked or not tools or go.renders_tools:
                return go.execute(with_system(messages, entry.system), tools=tools, think=go.request_think(think))
        except UnsupportedTemplateError as err:
            if asked:  # the request's own: the client hears why, it was not silently replaced
                raise RequestError(f"the request's template cannot be rendered: {err}", param="template") from None
            # a model's template layer we cannot run: the GGUF's own template instead
    return model.chat.render(messages, system=entry.system, tools=tools, generation_prompt=add_generation_prompt,
                             template_kwargs=template_kwargs)


def prompt_ids(model: "Model", entry: "CatalogEntry", prompt: Prompt, limit: int | None = None,
               room: int = 1) -> list[int]:
    """Every token of a fresh request's prompt, BOS included where the model wants one;
    with a ``limit``, a text that cannot fit in it is refused before it is tokenized
    (a ``trim`` chat that does not fit with ``room`` tokens for its reply first loses its oldest turns)."""
    if prompt.trim and prompt.is_chat and limit is not None:
        return _trimmed_ids(model, entry, prompt, limit, room)
    text = _text(model, entry, prompt)
    if limit is not None and (least := model.tokenizer.at_least_tokens(text)) >= limit:
        raise ContextError(f"the prompt is at least {least} tokens; the context length is {limit}")
    return _ids(model, entry, prompt, text)


def reply_room(limit: int, max_tokens: int | None) -> int:
    """The tokens a trimmed chat leaves for its reply (see the module doc): ``max_tokens``
    (Ollama's num_predict) where the request sets it, else a quarter of ``limit``; never
    more than half of ``limit`` (a huge num_predict keeps some history), never less than 1."""
    return max(1, min(limit // 4 if max_tokens is None else max_tokens, limit // 2))


def _text(model: "Model", entry: "CatalogEntry", prompt: Prompt) -> str:
    if not prompt.is_chat:
        return prompt.text or ""
    return chat_text(model, entry, prompt.messages, template=prompt.template, tools=prompt.tools,
                     think=prompt.think, template_kwargs=prompt.template_kwargs) + prompt.prefill


def _ids(model: "Model", entry: "CatalogEntry", prompt: Prompt, text: str) -> list[int]:
    ids = model.tokenizer.encode(text, parse_special=True, plain=_spans(
        model, prompt, text, lambda stood: _text(model, entry, stood)))
    # token ids a client sent (a completion's prompt, Ollama's context): checked here, before
    # anything (the prefix cache's int64 arrays, say) reads them
    ids = model.engine.checked_ids(prompt.prefix_ids) + ids if prompt.prefix_ids else model.tokenizer.with_bos(ids)
    if not ids:
        raise CtxError("the prompt is empty")
    return ids


def _trimmed_ids(model: "Model", entry: "CatalogEntry", prompt: Prompt, limit: int, room: int) -> list[int]:
    """The ids of a chat from the oldest turn on which it fits ``limit`` with ``room`` tokens
    for the reply, every system message before that turn kept, as Ollama's chatPrompt keeps
    them; the last message is always kept (where it leaves less room, the reply gets what is
    left; alone too long, it is refused as any prompt is). Only suffixes about as long as the
    one kept are rendered and tokenized (found by doubling, then halving), so a chat of 100k
    messages costs what its kept turns cost, not 100k messages' BPE a try."""
    msgs, budget = prompt.messages, max(1, limit - room)
    systems = [i for i, m in enumerate(msgs) if m.get("role") == "system"]

    def kept(start: int) -> Prompt:
        return dataclasses.replace(prompt, messages=[msgs[i] for i in systems[:bisect_left(systems, start)]]
                                   + msgs[start:])

    def ids_from(start: int) -> list[int] | None:  # None: more than the budget
        shorter = kept(start)
        text = _text(model, entry, shorter)
        if model.tokenizer.at_least_tokens(text) > budget:  # before any BPE
            return None
        ids = _ids(model, entry, shorter, text)
        return ids if len(ids) <= budget else None

    n = len(msgs)
    if n <= budget and (whole := ids_from(0)) is not None:  # the usual chat: it fits as it is
        return whole
    if (best := ids_from(n - 1)) is None:  # the last turn leaves less room: it alone, if it fits
        return prompt_ids(model, entry, dataclasses.replace(kept(n - 1), trim=False), limit)
    fits, over = 1, None  # the last `fits` messages fit, the last `over` do not
    while over is None and fits < n:
        k = min(2 * fits, n)
        ids = ids_from(n - k)
        fits, best, over = (k, ids, None) if ids is not None else (fits, best, k)
    while over is not None and fits + 1 < over:
        mid = (fits + over) // 2
        ids = ids_from(n - mid)
        fits, best, over = (mid, ids, over) if ids is not None else (fits, best, mid)
    return best


def continuation_text(model: "Model", entry: "CatalogEntry", prompt: Prompt, context_tokens: list[int]) -> str:
    """The text to append to a named context that holds ``context_tokens``."""
    if not prompt.is_chat:
        return prompt.text or ""
    return turns_text(model, entry, prompt.messages, context_tokens, tools=prompt.tools,
                      template_kwargs=prompt.template_kwargs) + prompt.prefill


def continuation_spans(model: "Model", entry: "CatalogEntry", prompt: Prompt, context_tokens: list[int],
                       text: str) -> list[tuple[int, int]]:
    """Where the messages' own text lies in ``text`` (continuation_text's), for
    continuation_ids' ``plain`` (serving/message_spans.py)."""
    return _spans(model, prompt, text, lambda stood: continuation_text(model, entry, stood, context_tokens))


def _spans(model: "Model", prompt: Prompt, text: str, render) -> list[tuple[int, int]]:
    """Where a chat prompt's own text lies in ``text``, its rendering by ``render(prompt)`` (render
    takes the prompt with stand-ins for its messages: message_spans)."""
    if not prompt.is_chat:
        return []
    return message_spans(prompt.messages, text,
                         lambda messages: render(dataclasses.replace(prompt, messages=messages, prefill="")),
                         model.tokenizer.has_control_text, prompt.prefill)


def continuation_ids(ctx, text: str, limit: int, plain: list[tuple[int, int]] = ()) -> list[int]:
    """``text`` (continuation_text's) as the ids to append to the named context ``ctx``,
    control tokens parsed but where they overlap ``plain`` (continuation_spans');
    a ContextError, before anything is appended (and before any BPE of a text that cannot
    fit), where they would leave the reply no token within ``limit`` (the request's context
    length: num_ctx, else the model's), as a fresh prompt that long is refused."""
    held, tokenizer = ctx.n_tokens, ctx.engine.tokenizer

    def refuse(n: int, bound: str = "") -> ContextError:
        return ContextError(f"context '{ctx.name}' would hold {bound}{n} tokens with this request's prompt; "
                            f"the context length is {limit}")

    if (least := held + (tokenizer.at_least_tokens(text) if text else 0)) >= limit:
        raise refuse(least, "at least " if text else "")
    ids = tokenizer.encode(text, parse_special=True, plain=plain) if text else []
    ids = ids if held or not ids else tokenizer.with_bos(ids)
    if held + len(ids) >= limit:
        raise refuse(held + len(ids))
    return ids


def turns_text(model: "Model", entry: "CatalogEntry", messages: list[dict], context_tokens: list[int], *,
               tools: list | None = None, generation_prompt: bool = True, template_kwargs: dict | None = None) -> str:
    """Chat turns to append to a named context (a chat request naming it, ``POST
    /v1/contexts``, its ``/append``): the start of a conversation in an empty context, else
    its continuation. RequestError where the template drops them all: Gemma's shows a system
    prompt only inside the first user turn, so one sent alone would vanish without a word."""
    def render(turns: list[dict]) -> str:
        if context_tokens:
            return model.chat.render(turns, tools=tools, after=context_tokens, generation_prompt=generation_prompt,
                                     template_kwargs=template_kwargs)
        return chat_text(model, entry, turns, layer_template=False, tools=tools,
                         add_generation_prompt=generation_prompt, template_kwargs=template_kwargs)

    text = render(messages)
    said = [c.strip() for m in messages if isinstance(c := m.get("content"), str) and c.strip()]
    if said and not any(c in text for c in said) and _renders_as(render, [], text):  # only when none shows
        raise RequestError(f"{model.name}'s chat template drops these turns (a system prompt it shows only "
                           "inside the first user turn?): send them with the user message that follows, in "
                           "'messages'", param="system" if messages[0].get("role") == "system" else "messages")
    return text


def _renders_as(render, turns: list[dict], text: str) -> bool:
    try:
        return render(turns) == text
    except CtxError:  # a template that refuses no turns at all: it cannot say, so no
        return False
