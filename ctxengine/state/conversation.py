"""A conversation held in a context: turns rendered with the model's chat
template, only what continues the tokens the context already holds.

``Context.chat`` is what the HTTP ``context`` field does (api/generation.py):
the new turns are rendered after the context's tokens (an assistant reply
left open is closed first), the reply is generated, and the assistant's turn
is closed after it, so the next turn continues a well-formed conversation.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ..errors import ContextError

if TYPE_CHECKING:
    from .context import Context


def as_turns(messages: "str | Sequence[dict]") -> list[dict]:
    """A user's text, or chat messages ({"role", "content"} dicts), as turns."""
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    turns = list(messages)
    for i, m in enumerate(turns):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ContextError(f"messages[{i}] must be a dict with a 'role', got {m!r}"[:200])
    return turns


def append_turns(ctx: "Context", messages: "str | Sequence[dict]", *, tools=None,
                 generation_prompt: bool = True) -> int:
    """Render the turns after what ``ctx`` holds and append them; the number of new tokens.

    An empty context gets the whole conversation (with the template's default
    system prompt, if it has one); a context that holds one gets only the new
    turns, after closing an assistant reply it ends on."""
    turns = as_turns(messages)
    chat = ctx.engine.chat
    if ctx.n_tokens == 0:
        text = chat.render(turns, tools=tools, generation_prompt=generation_prompt)
    else:
        text = chat.render(turns, tools=tools, after=ctx.tokens, generation_prompt=generation_prompt)
    return ctx.append(text, parse_special=True) if text else 0


def close_turn(ctx: "Context") -> int:
    """Append what the template writes after an assistant reply (its end of turn), if missing."""
    closing = ctx.engine.chat.render(after=ctx.tokens, closing=True, generation_prompt=False)
    return ctx.append(closing, parse_special=True) if closing else 0


def chat(ctx: "Context", messages: "str | Sequence[dict]", max_tokens: int = 256, *, tools=None,
         **generate) -> str:
    """One exchange: append the turns, generate the reply, close the turn; the reply's text."""
    append_turns(ctx, messages, tools=tools)
    try:
        return "".join(p.text for p in ctx.generate(max_tokens, **generate))
    finally:
        close_turn(ctx)
