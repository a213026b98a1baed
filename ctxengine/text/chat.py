"""Chat rendering: turns in, the text a model expects out, through one call.

    engine.chat.render(turns, system=None, tools=None, after=None,
                       closing=False, generation_prompt=True)

* ``system``: a system turn put first when the turns hold none (a context's
  system prompt, an Ollama entry's system layer).
* ``tools``: tool definitions, and turns may hold role "tool" and assistant
  ``tool_calls``: the template renders them when it knows tools, else they
  are described in the system message (text/tools.py).
* ``after``: the tokens a context already holds, so only what continues them
  is rendered. Templates render whole conversations (and may add a default
  system turn to a lone user turn), so a continuation is the rendering of
  [anchor] + turns minus that of [anchor], the anchor being a system turn.
* ``closing``: begin with what the template writes after an assistant reply
  (less the end-of-turn token the reply already ended with), so a context
  that holds a reply ends on a turn boundary. A continuation of a context
  that ends on an end-of-turn token, or inside an assistant turn (a reply
  cut short by its token limit), always gets it.
* ``generation_prompt``: end with the template's opening of an assistant turn.

The template itself (the GGUF's Jinja, sandboxed) is text/chat_template.py;
an Ollama Go template layer is the Ollama package's (ollama/template.py).
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Sequence

from ..errors import CtxError
from .tools import as_calls, as_tools, template_messages, tool_format

if TYPE_CHECKING:
    from .chat_template import ChatTemplate
    from .tokenizer import Tokenizer

# Stand-in turns to render a template around (continuations, closings): a system turn first,
# so that no default one is added, then a whole exchange, after which any turn may come (templates
# that make roles alternate, or that hold the system text for the first user turn, as Gemma's,
# render nothing for a system turn alone).
_ANCHOR = "ctx-anchor-3f9b1c"
_ASKED = "ctx-asked-6c1f0e"
_REPLY = "ctx-reply-8d2e4a"
_EXCHANGE = ({"role": "system", "content": _ANCHOR}, {"role": "user", "content": _ASKED},
             {"role": "assistant", "content": _REPLY})


def with_system(turns: Sequence[dict], system: str | None) -> list[dict]:
    """The turns with a system turn first, unless there is no system text or they hold one."""
    if system and not any(m.get("role") == "system" for m in turns if isinstance(m, dict)):
        return [{"role": "system", "content": system}, *turns]
    return turns


def as_turns(turns: Sequence) -> list:
    """Chat turns as the renderer takes them, from engine-shaped or OpenAI-shaped dicts:
    content given as ``{"type": "text"}`` parts is joined, an assistant's None content
    beside its tool calls is empty, tool calls given as dicts become ToolCalls, and a
    participant's ``name`` (which no template renders) is dropped; anything else is left
    for the template's check to refuse by name."""
    if not isinstance(turns, (list, tuple)):
        raise CtxError(f"messages must be a list of dicts, got {type(turns).__name__}")
    out = []
    for m in turns:
        if not isinstance(m, dict):
            out.append(m)
            continue
        m = dict(m)
        content = m.get("content")
        if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                             and isinstance(p.get("text"), str) for p in content):
            m["content"] = "".join(p["text"] for p in content)
        if m.get("tool_calls"):
            m["tool_calls"] = as_calls(m["tool_calls"])
            if content is None:
                m["content"] = ""
        elif "tool_calls" in m:
            del m["tool_calls"]  # an empty list, or None: no calls
        if m.get("role") != "tool":
            m.pop("name", None)
        out.append(m)
    return out


def _uses_tools(turns: Sequence[dict]) -> bool:
    return any(m.get("tool_calls") or m.get("role") == "tool" for m in turns if isinstance(m, dict))


class ChatRenderer:
    """A model's chat template bound to its tokenizer (for end-of-turn tokens)."""

    def __init__(self, template: "ChatTemplate | None", tokenizer: "Tokenizer", model_name: str):
        self.template = template
        self.tokenizer = tokenizer
        self.model_name = model_name

    def render(self, turns: Sequence[dict] = (), *, system: str | None = None, tools=None,
               after: Sequence[int] | None = None, closing: bool = False,
               generation_prompt: bool = True) -> str:
        """The text for these turns (engine- or OpenAI-shaped: text/tools.py as_turns; see the
        module doc for each flag); parse it with parse_special=True."""
        turns = with_system(as_turns(turns), system)
        if after is None:
            return self._whole(turns, tools, generation_prompt)
        last = after[-1] if len(after) else None
        in_reply = self._in_reply(after)
        ended = closing or last in self.tokenizer.eog_ids or in_reply
        opening = self._closing(last) if ended else ""
        if not turns and not generation_prompt:
            return opening
        if not turns and in_reply and not closing:
            return ""  # a reply open (its prompt alone, or cut): a generation with no new turns goes on with it
        return opening + self._continuation(turns, tools, generation_prompt)

    def _continuation(self, turns: list[dict], tools, generation_prompt: bool) -> str:
        """The turns as they continue a conversation: the rendering of [anchor] + turns minus
        that of [anchor], where no stand-in text is left (else the next, shorter anchor)."""
        first = turns[0].get("role") if turns and isinstance(turns[0], dict) else None  # none: the prompt alone
        anchors = [_EXCHANGE[:2], _EXCHANGE[:1]] if first == "assistant" else [_EXCHANGE, _EXCHANGE[:1]]
        for anchor in map(list, anchors):
            try:
                before = self._whole(anchor, tools, False)
                full = self._whole(anchor + turns, tools, generation_prompt)
            except CtxError:
                continue  # a shape this template refuses (roles out of turn): the next anchor
            rest = full[len(before):]
            if full.startswith(before) and not any(s in rest for s in (_ANCHOR, _ASKED, _REPLY)):
                return rest
        # one more rendering, with no anchor, says why when the turns themselves are refused
        self._whole(turns, tools, generation_prompt)
        raise CtxError(f"{self.model_name}'s chat template cannot render turns on their own; "
                       "append the turns as text instead")

    def _whole(self, turns: list[dict], tools, generation_prompt: bool) -> str:
        """A whole conversation through the template."""
        if self.template is None:
            raise CtxError(f"{self.model_name} has no chat template")
        if tools is None and not _uses_tools(turns):
            return self.template.render(turns, add_generation_prompt=generation_prompt)
        fmt = tool_format(self.template)
        rendered, variables = template_messages(turns, as_tools(tools or []), fmt)
        return self.template.render(rendered, add_generation_prompt=generation_prompt, **variables)

    def _in_reply(self, tokens: Sequence[int]) -> bool:
        """Whether tokens end inside an assistant turn (a reply cut short, or not begun):
        the template's opening of one comes after their last end-of-turn token."""
        opening, eog = self._reply_opening, self.tokenizer.eog_ids
        if not opening:
            return False
        for i in range(len(tokens) - 1, -1, -1):
            if tokens[i] in eog:
                return False
            if tokens[i] == opening[0] and list(tokens[i:i + len(opening)]) == opening:
                return True
        return False

    @functools.cached_property
    def _reply_opening(self) -> list[int]:
        """The tokens of the template's opening of an assistant turn (its generation prompt)."""
        asked = list(_EXCHANGE[:2])
        try:
            bare, prompted = self._whole(asked, None, False), self._whole(asked, None, True)
        except CtxError:
            return []
        if not prompted.startswith(bare) or prompted == bare:
            return []
        return self.tokenizer.encode(prompted[len(bare):], parse_special=True)

    def _closing(self, last_token: int | None) -> str:
        """What the template writes after an assistant reply, less the end-of-turn
        token the reply already ended with (if it did)."""
        try:
            text = self._whole(list(_EXCHANGE), None, False)
        except CtxError:
            return ""  # a template that refuses this shape: leave the turn as the reply left it
        closing = text[text.index(_REPLY) + len(_REPLY):] if _REPLY in text else ""
        if last_token is not None and last_token in self.tokenizer.eog_ids:
            ended = self.tokenizer.decode([last_token])
            if closing.startswith(ended):
                closing = closing[len(ended):]
        return closing
