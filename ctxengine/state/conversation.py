"""A conversation held in a context: turns rendered with the model's chat
template, only what continues the tokens the context already holds.

``Context.chat`` is what the HTTP ``context`` field does (serving/generation.py):
the new turns are rendered after the context's tokens (an assistant reply
left open is closed first), the reply is generated, and the assistant's turn
is closed after it, so the next turn continues a well-formed conversation.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Protocol, Sequence

from ..errors import ContextError, RequestError
from .piece import Piece

if TYPE_CHECKING:
    from ..engine.engine import Engine


class Conversant(Protocol):
    """What a conversation uses of the context holding it: state/context.py's
    Context, which imports this module (its ``chat`` and ``append_turns``)."""

    @property
    def engine(self) -> Engine: ...
    @property
    def n_tokens(self) -> int: ...
    @property
    def tokens(self) -> list[int]: ...
    def append(self, content: str | Sequence[int], *, parse_special: bool = False) -> int: ...
    def generate(self, max_tokens: int = 256, **options) -> Iterator[Piece]: ...


def as_turns(messages: "str | Sequence[dict]") -> list[dict]:
    """A user's text, or chat messages ({"role", "content"} dicts), as turns."""
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    turns = list(messages)
    for i, m in enumerate(turns):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ContextError(f"messages[{i}] must be a dict with a 'role', got {m!r}"[:200])
    return turns


def append_turns(ctx: Conversant, messages: "str | Sequence[dict]", *, tools=None,
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


def append_system(ctx: Conversant, text: str) -> int:
    """Append a system turn, as the template renders it (plain text without one)."""
    if ctx.engine.chat_template is None:
        return ctx.append(text)
    return ctx.append(system_turn(ctx.engine, text), parse_special=True)


def system_turn(engine: Engine, text: str, after: Sequence[int] | None = None) -> str:
    """The template's text for one system message (after the tokens ``after``, if given).
    RequestError where the template drops it: Gemma's has no system turn and shows a
    system prompt only inside the first user turn, so one given alone would vanish
    without a word (serving/prompts.py refuses the HTTP face's the same way)."""
    turn = [{"role": "system", "content": text}]
    rendered = engine.chat.render(turn, after=after, generation_prompt=False)
    said = text.strip()
    if said and said not in rendered and rendered == engine.chat.render(after=after, generation_prompt=False):
        raise RequestError(f"{engine.name}'s chat template has no system turn: it shows a system message only "
                           "inside the first user turn, so one given alone would be dropped; give it with the "
                           "first user message instead (both in one list of messages, or its text at the start "
                           "of the user's)", param="system")
    return rendered


def close_turn(ctx: Conversant) -> int:
    """Append what the template writes after an assistant reply (its end of turn), if missing."""
    closing = ctx.engine.chat.render(after=ctx.tokens, closing=True, generation_prompt=False)
    return ctx.append(closing, parse_special=True) if closing else 0


def chat(ctx: Conversant, messages: "str | Sequence[dict]", max_tokens: int = 256, *, tools=None,
         **generate) -> str:
    """One exchange: append the turns, generate the reply, close the turn; the reply's text."""
    append_turns(ctx, messages, tools=tools)
    try:
        return "".join(p.text for p in ctx.generate(max_tokens, **generate))
    finally:
        close_turn(ctx)
