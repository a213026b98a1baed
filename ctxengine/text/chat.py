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
  [anchor] + turns minus that of [anchor], the anchor a stand-in conversation:
  a system turn then an exchange, a system turn alone, else (templates that
  refuse a system turn, as Gemma 2's, or move its text to the last user turn,
  as Mistral Nemo's) an exchange alone. Where [anchor] is not a prefix of
  [anchor] + turns, what follows the anchor's last stand-in text is compared
  instead: the part both share up to a token boundary is what the context
  already holds (the closing of the turn before), and what [anchor] alone has
  past it must be text the template writes at the end of every unprompted
  conversation (Phi-3's end-of-text token, Command R7B's opening of the
  model's turn): that trailer is never put in a context, since the turns that
  follow would not have it. How the template renders the anchor itself does
  not matter (Nemotron renders a last assistant turn otherwise than an
  earlier one). The KV cannot be rewritten, so where a template renders the
  earlier turns otherwise once more follow (a system prompt moved to the last
  user turn, thinking stripped from earlier replies), the context keeps them
  as first rendered and only the new turns are appended, as the template
  renders them after an exchange.
* ``closing``: begin with what the template writes after an assistant reply
  when a turn follows (less the end-of-turn token the reply already ended
  with, and less any end-of-conversation trailer, as above), so a context
  that holds a reply ends on a turn boundary. A continuation of a context
  that ends on an end-of-turn token, or inside an assistant turn (a reply
  cut short by its token limit), always gets it.
* ``generation_prompt``: end with the template's opening of an assistant turn.
* ``template_kwargs``: more template variables (``{"enable_thinking": False}`` for
  Qwen3), checked by chat_template.check_template_kwargs; every rendering of the
  call, its anchors' included, gets them, so a continuation is what the template
  writes for the whole conversation with them.

The template itself (the GGUF's Jinja, sandboxed) is text/chat_template.py;
an Ollama Go template layer is the Ollama package's (ollama/template.py).
"""
from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from ..errors import CtxError
from .chat_template import check_template_kwargs
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
_NEXT = {"role": "user", "content": "ctx-next-2b7d5e"}  # a turn after the exchange (closings)
_STAND_INS = (_ANCHOR, _ASKED, _REPLY)
_PROBES_KEPT = 32  # the template kwargs whose reply opening and end are kept (a client may send any)


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
        self._probes: dict[tuple[str, str], Any] = {}  # (what, kwargs as JSON): _reply_opening's, _reply_end's
        self._probes_lock = threading.Lock()

    def render(self, turns: Sequence[dict] = (), *, system: str | None = None, tools=None,
               after: Sequence[int] | None = None, closing: bool = False,
               generation_prompt: bool = True, template_kwargs: Mapping[str, Any] | None = None) -> str:
        """The text for these turns (engine- or OpenAI-shaped: text/tools.py as_turns; see the
        module doc for each flag); parse it with parse_special=True."""
        kw = check_template_kwargs(template_kwargs)
        turns = with_system(as_turns(turns), system)
        if after is None:
            return self._whole(turns, tools, generation_prompt, kw)
        last = after[-1] if len(after) else None
        in_reply = self._in_reply(after, kw)
        ended = closing or last in self.tokenizer.eog_ids or in_reply
        opening = self._closing(last, kw) if ended else ""
        if not turns and not generation_prompt:
            return opening
        if not turns and in_reply and not closing:
            return ""  # a reply open (its prompt alone, or cut): a generation with no new turns goes on with it
        return opening + self._continuation(turns, tools, generation_prompt, kw)

    def _continuation(self, turns: list[dict], tools, generation_prompt: bool, kw: dict) -> str:
        """The turns as they continue a conversation: the rendering of [anchor] + turns minus
        that of [anchor], where no stand-in text is left (else the next anchor); where no
        anchor renders as a prefix, what follows its last stand-in text (module doc)."""
        first = turns[0].get("role") if turns and isinstance(turns[0], dict) else None  # none: the prompt alone
        if first == "assistant":
            anchors = [_EXCHANGE[:2], _EXCHANGE[:1], _EXCHANGE[1:2]]
        else:
            anchors = [_EXCHANGE, _EXCHANGE[:1], _EXCHANGE[1:]]
        rendered = []
        for anchor in map(list, anchors):
            try:
                before = self._whole(anchor, tools, False, kw)
                full = self._whole(anchor + turns, tools, generation_prompt, kw)
            except CtxError:
                continue  # a shape this template refuses (roles out of turn): the next anchor
            if full.startswith(before):
                trailer = self._reply_end(kw)[1]  # a context never holds it: the turns come before it
                trailer = trailer if before.endswith(trailer) else ""
                rest = self._rest(trailer + full[len(before):], trailer, generation_prompt)
                if rest is not None:
                    return rest
            rendered.append((anchor, before, full))
        for anchor, before, full in rendered:
            rest = self._past_trailer(anchor, before, full, turns, tools, generation_prompt, kw)
            if rest is not None:
                return rest
        # one more rendering, with no anchor, says why when the turns themselves are refused
        self._whole(turns, tools, generation_prompt, kw)
        raise CtxError(f"{self.model_name}'s chat template cannot render turns on their own; "
                       "append the turns as text instead")

    @staticmethod
    def _rest(rest: str, trailer: str, generation_prompt: bool) -> str | None:
        """A continuation, less the end-of-conversation trailer a context never holds; None
        where stand-in text is left in it."""
        if any(s in rest for s in _STAND_INS):
            return None
        if trailer and not generation_prompt and rest.endswith(trailer):
            rest = rest[:-len(trailer)]
        return rest

    def _past_trailer(self, anchor: list[dict], before: str, full: str, turns: list[dict], tools,
                      generation_prompt: bool, kw: dict) -> str | None:
        """What [anchor] + turns renders past the anchor's last stand-in text and the closing
        after it, where [anchor] alone renders past that closing only an end-of-conversation
        trailer (module doc); None where it does not."""
        mark = anchor[-1]["content"]
        if mark == _REPLY:  # past the closing a context holds after a reply (_reply_end)
            closing, trailer = self._reply_end(kw)
            more = full[full.index(mark) + len(mark):] if full.count(mark) == 1 else None
            if more is None or not more.startswith(closing):
                return None
            return self._rest(more[len(closing):], trailer, generation_prompt)
        split = self._split(before, full, mark)
        if split is None:
            return None
        _, trailer, rest = split
        if trailer:
            try:
                unprompted = full if not generation_prompt else self._whole(anchor + turns, tools, False, kw)
            except CtxError:
                return None
            if not unprompted.endswith(trailer):
                return None  # not the text every conversation ends with: text the turns moved
        return self._rest(rest, trailer, generation_prompt)

    def _split(self, before: str, full: str, mark: str) -> tuple[str, str, str] | None:
        """(kept, trailer, rest): what follows ``mark`` (once in each text) in ``before`` is
        kept + trailer, in ``full`` kept + rest, kept ending on a token boundary."""
        if before.count(mark) != 1 or full.count(mark) != 1:
            return None
        tail = before[before.index(mark) + len(mark):]
        more = full[full.index(mark) + len(mark):]
        if more.startswith(tail):
            return tail, "", more[len(tail):]
        n = 0
        while n < min(len(tail), len(more)) and tail[n] == more[n]:
            n += 1
        n = self._boundary(tail, n)
        return tail[:n], tail[n:], more[n:]

    def _boundary(self, text: str, n: int) -> int:
        """The last token boundary of ``text`` at or before character ``n`` (a shared prefix
        may end inside a control token's text: "<|end|>\n<|" of "<|endoftext|>", "<|user|>")."""
        ids = self.tokenizer.encode(text, parse_special=True)
        for i in range(n, 0, -1):
            head = self.tokenizer.encode(text[:i], parse_special=True)
            if ids[:len(head)] == head:
                return i
        return 0

    def _whole(self, turns: list[dict], tools, generation_prompt: bool, kw: dict) -> str:
        """A whole conversation through the template."""
        if self.template is None:
            raise CtxError(f"{self.model_name} has no chat template")
        if tools is None and not _uses_tools(turns):
            return self.template.render(turns, add_generation_prompt=generation_prompt, template_kwargs=kw)
        fmt = tool_format(self.template)
        rendered, variables = template_messages(turns, as_tools(tools or []), fmt)
        return self.template.render(rendered, add_generation_prompt=generation_prompt, template_kwargs=kw,
                                    **variables)

    def _probed(self, what: str, kw: dict, probe: Callable[[dict], Any]) -> Any:
        """``probe(kw)``, kept for the last _PROBES_KEPT kwargs (the template may write other
        text with them: Qwen3's opening of a reply with enable_thinking false)."""
        key = (what, json.dumps(kw, sort_keys=True))
        value = self._probes.get(key)
        if value is None:
            value = probe(kw)
            with self._probes_lock:
                if len(self._probes) >= 2 * _PROBES_KEPT:
                    del self._probes[next(iter(self._probes))]
                self._probes[key] = value
        return value

    def _in_reply(self, tokens: Sequence[int], kw: dict) -> bool:
        """Whether tokens end inside an assistant turn (a reply cut short, or not begun):
        the template's opening of one comes after their last end-of-turn token. The opening
        under these template variables or under none: a context opened by one face (OpenAI's:
        Qwen3's "<|im_start|>assistant\n") may go on under another's (Anthropic's, thinking
        off: that and "<think>\n\n</think>\n\n"), and either opening marks the reply open."""
        eog = self.tokenizer.eog_ids
        openings = [o for o in {tuple(self._reply_opening(kw)), tuple(self._reply_opening({}))} if o]
        for i in range(len(tokens) - 1, -1, -1):
            if tokens[i] in eog:
                return False
            if any(tokens[i] == o[0] and tuple(tokens[i:i + len(o)]) == o for o in openings):
                return True
        return False

    def _reply_opening(self, kw: dict) -> list[int]:
        """The tokens of the template's opening of an assistant turn (its generation prompt)."""
        return self._probed("opening", kw, self._probe_opening)

    def _probe_opening(self, kw: dict) -> list[int]:
        for asked in (list(_EXCHANGE[:2]), list(_EXCHANGE[1:2])):  # a template may refuse a system turn
            try:
                bare, prompted = self._whole(asked, None, False, kw), self._whole(asked, None, True, kw)
            except CtxError:
                continue
            if prompted == bare:  # an opening written unasked (Command R7B's): the trailer
                trailer = self._reply_end(kw)[1]
                opening = trailer if trailer and bare.endswith(trailer) else ""
            elif prompted.startswith(bare):
                opening = prompted[len(bare):]
            else:  # past an end-of-conversation trailer (module doc)
                split = self._split(bare, prompted, _ASKED)
                opening = split[2] if split else ""
            return self.tokenizer.encode(opening, parse_special=True) if opening else []
        return []

    def _reply_end(self, kw: dict) -> tuple[str, str]:
        """(closing, trailer): what the template writes after an assistant reply that a turn
        follows, and what a conversation that ends on the reply has past that (module doc)."""
        return self._probed("end", kw, self._probe_end)

    def _probe_end(self, kw: dict) -> tuple[str, str]:
        for exchange in (list(_EXCHANGE), list(_EXCHANGE[1:])):  # a template may refuse a system turn
            try:
                text = self._whole(exchange, None, False, kw)
            except CtxError:
                continue
            if _REPLY not in text:
                return "", ""
            closing = text[text.index(_REPLY) + len(_REPLY):]
            try:
                more = self._whole(exchange + [_NEXT], None, False, kw)
            except CtxError:
                return closing, ""  # no turn may follow: what ends the conversation
            split = self._split(text, more, _REPLY)
            if split is None or (split[1] and not more.endswith(split[1])):
                return closing, ""
            return split[0], split[1]
        return "", ""  # a template that refuses this shape: leave the turn as the reply left it

    def _closing(self, last_token: int | None, kw: dict) -> str:
        """What the template writes after an assistant reply, less the end-of-turn
        token the reply already ended with (if it did)."""
        closing = self._reply_end(kw)[0]
        if last_token is not None and last_token in self.tokenizer.eog_ids:
            ended = self.tokenizer.decode([last_token])
            if closing.startswith(ended):
                closing = closing[len(ended):]
        return closing
