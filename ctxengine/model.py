"""The public model object: what ``ctxengine.load`` returns.

It joins the engine (weights, tokenizer, forward) to the live context table,
so that ``model.context("main")`` reads as DESIGN.md shows.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from .engine.model import LoadedModel, LogProbs
from .errors import CtxError
from .engine.registry import resolve_model
from .state import Context, ContextTable


# Stand-in turn contents for rendering a template around (chat_continuation).
_ANCHOR = "ctx-anchor-3f9b1c"
_REPLY = "ctx-reply-8d2e4a"


class Model:
    def __init__(self, engine: LoadedModel):
        self.engine = engine
        self.contexts = ContextTable(engine)

    # -- identity ---------------------------------------------------------------
    @property
    def weight_id(self) -> str:
        return self.engine.weight_id

    @property
    def name(self) -> str:
        return self.engine.name

    @property
    def path(self) -> Path:
        return self.engine.path

    @property
    def config(self):
        return self.engine.config

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def chat_template(self):
        return self.engine.chat_template

    def __repr__(self) -> str:
        return f"Model({self.name!r}, {self.engine.config.arch}, weight_id={self.weight_id[:12]})"

    # -- tokens and logits --------------------------------------------------------
    def tokenize(self, text: str, *, add_bos: bool = False, parse_special: bool = False) -> list[int]:
        return self.engine.tokenize(text, add_bos=add_bos, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.engine.detokenize(ids)

    def logprobs(self, ids: Sequence[int], *, top: int = 40) -> LogProbs:
        return self.engine.logprobs(ids, top=top)

    # -- contexts ------------------------------------------------------------------
    def context(self, name: str | None = None) -> Context:
        """The live context with this name, created empty if it does not exist yet."""
        return self.contexts.open(name)

    def restore(self, store, ref: str, name: str | None = None) -> Context:
        """A live context from a stored snapshot (ref, id or id prefix); refuses other weights."""
        from .state.snapshots import restore

        return restore(self, store, ref, name=name)

    def chat_prompt(self, messages: list[dict], *, add_generation_prompt: bool = True, tools=None) -> str:
        """Render messages with the model's chat template (parse the result with parse_special=True).

        ``tools`` (engine.tools.Tool, or OpenAI-shaped dicts): rendered by the template
        when it knows tools, else described in the system message (engine/tools.py);
        messages may then hold role "tool" and assistant ``tool_calls`` (ToolCall lists)."""
        if self.chat_template is None:
            raise CtxError(f"{self.name} has no chat template")
        if tools is None and not any(m.get("tool_calls") or m.get("role") == "tool" for m in messages
                                     if isinstance(m, dict)):
            return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt)
        from .engine.tools import as_tools, template_messages, tool_format

        fmt = tool_format(self.chat_template)
        rendered, variables = template_messages(messages, as_tools(tools or []), fmt)
        return self.chat_template.render(rendered, add_generation_prompt=add_generation_prompt, **variables)

    def chat_continuation(self, messages: list[dict], after: Sequence[int] = (), *,
                          add_generation_prompt: bool = True, tools=None) -> str:
        """The text that continues a conversation already held as the tokens
        ``after`` with more ``messages``.

        Templates render whole conversations (and may add a default system
        turn to a lone user turn), so this is the rendering of [anchor] +
        messages minus that of [anchor], the anchor being a system turn; a
        context ending on an end-of-turn token first gets what the template
        writes after it (see chat_turn_closing). ``tools`` as chat_prompt takes them."""
        anchor = [{"role": "system", "content": _ANCHOR}]
        before = self.chat_prompt(anchor, add_generation_prompt=False, tools=tools)
        full = self.chat_prompt(anchor + messages, add_generation_prompt=add_generation_prompt, tools=tools)
        if not full.startswith(before):
            raise CtxError(f"{self.name}'s chat template cannot render turns on their own; "
                           "append the turns as text instead")
        last = after[-1] if len(after) else None
        opening = self.chat_turn_closing(last) if last in self.tokenizer.eog_ids else ""
        return opening + full[len(before):]

    def chat_turn_closing(self, last_token: int | None) -> str:
        """What the template writes after an assistant reply, less the end-of-turn
        token the reply already ended with (if it did)."""
        anchor = [{"role": "system", "content": _ANCHOR}, {"role": "assistant", "content": _REPLY}]
        try:
            text = self.chat_prompt(anchor, add_generation_prompt=False)
        except CtxError:
            return ""  # a template that refuses this shape: leave the turn as the reply left it
        closing = text[text.index(_REPLY) + len(_REPLY):] if _REPLY in text else ""
        if last_token is not None and last_token in self.tokenizer.eog_ids:
            ended = self.detokenize([last_token])
            if closing.startswith(ended):
                closing = closing[len(ended):]
        return closing

    def close(self) -> None:
        for name in self.contexts.names():
            self.contexts.remove(name)
        self.engine.close()


def load(model: str | os.PathLike | None = None, *, threads: int | None = None, kv: str = "f16",
         n_ctx: int | None = None) -> Model:
    """Load a model: the packaged default (None or "smollm2"), a .gguf path, or a known name.

    ``kv`` is the KV cache dtype: "f16", "q8" (K and V in 8-bit blocks) or
    "vq8" (V only); contexts restore only into a model loaded with theirs.
    """
    return Model(LoadedModel(resolve_model(model), threads=threads, kv=kv, n_ctx=n_ctx))
