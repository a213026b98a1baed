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
  that ends on an end-of-turn token always gets it.
* ``generation_prompt``: end with the template's opening of an assistant turn.

The template itself (the GGUF's Jinja, sandboxed) is text/chat_template.py;
an Ollama Go template layer is the Ollama package's (ollama/template.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ..errors import CtxError
from .tools import as_calls, as_tools, template_messages, tool_format

if TYPE_CHECKING:
    from .chat_template import ChatTemplate
    from .tokenizer import Tokenizer

# Stand-in turn contents for rendering a template around (continuations, closings).
_ANCHOR = "ctx-anchor-3f9b1c"
_REPLY = "ctx-reply-8d2e4a"


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
        return turns  # refused by the template's check
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
        opening = self._closing(last) if closing or last in self.tokenizer.eog_ids else ""
        if not turns and not generation_prompt:
            return opening
        anchor = [{"role": "system", "content": _ANCHOR}]
        before = self._whole(anchor, tools, False)
        full = self._whole(anchor + turns, tools, generation_prompt)
        if not full.startswith(before):
            raise CtxError(f"{self.model_name}'s chat template cannot render turns on their own; "
                           "append the turns as text instead")
        return opening + full[len(before):]

    def _whole(self, turns: list[dict], tools, generation_prompt: bool) -> str:
        """A whole conversation through the template."""
        if self.template is None:
            raise CtxError(f"{self.model_name} has no chat template")
        if tools is None and not _uses_tools(turns):
            return self.template.render(turns, add_generation_prompt=generation_prompt)
        fmt = tool_format(self.template)
        rendered, variables = template_messages(turns, as_tools(tools or []), fmt)
        return self.template.render(rendered, add_generation_prompt=generation_prompt, **variables)

    def _closing(self, last_token: int | None) -> str:
        """What the template writes after an assistant reply, less the end-of-turn
        token the reply already ended with (if it did)."""
        anchor = [{"role": "system", "content": _ANCHOR}, {"role": "assistant", "content": _REPLY}]
        try:
            text = self._whole(anchor, None, False)
        except CtxError:
            return ""  # a template that refuses this shape: leave the turn as the reply left it
        closing = text[text.index(_REPLY) + len(_REPLY):] if _REPLY in text else ""
        if last_token is not None and last_token in self.tokenizer.eog_ids:
            ended = self.tokenizer.decode([last_token])
            if closing.startswith(ended):
                closing = closing[len(ended):]
        return closing
