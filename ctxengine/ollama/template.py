"""Render an Ollama model's TEMPLATE layer (Go text/template) as Ollama does.

Follows ollama/ollama ``template/template.go``:

* ``Parse``: a template that mentions neither ``.Messages`` nor ``.Response``
  gets ``{{ .Response }}`` appended.
* ``Execute``: messages are first collated (consecutive messages of one role
  merged with a blank line, except tool results; every system message also
  joined into ``.System``).  A template that mentions ``.Messages`` runs once
  with ``.System``, ``.Messages``, ``.Tools`` and an empty ``.Response``.
  A legacy template (``.System``/``.Prompt``/``.Response`` only) runs turn by
  turn: a system message, a prompt and a response fill one turn, and the turn
  is rendered when the next message would overwrite one of them.  The last
  turn is rendered with everything after its ``{{ .Response }}`` cut off, so
  a trailing assistant message is continued rather than closed.

Every run also gets ``.Think``, ``.ThinkLevel`` and ``.IsThinkSet`` from the
request's ``think`` (None, a bool, or "high"/"medium"/"low"/"max"), as
server/prompt.go renderPrompt fills template.Values; ``request_think`` is what
Ollama's chat and generate handlers make of an unset one (a template that shows
thinking thinks).  The template's text is used as is: Ollama does not turn its
CRLF line endings into LF.

``render_go_template`` takes what a request has (messages, or a system and a
prompt as /api/generate does) and returns the prompt text.  Templates outside
the subset go_template_parse covers raise UnsupportedTemplateError, so a
caller can use the GGUF's Jinja template instead.
"""
from __future__ import annotations

from copy import copy
from typing import Any, Iterable, Sequence

from ..errors import UnsupportedTemplateError
from .go_template_exec import execute
from .go_template_parse import Action, Branch, Command, Field, Pipe, Text, Variable, parse_go_template
from .template_structs import message, tools as template_tools

_RESPONSE = Action(Pipe([Command([Field(("Response",))])]))
THINK_LEVELS = ("high", "medium", "low", "max")  # api.ThinkValue's strings


class OllamaTemplate:
    def __init__(self, source: str):
        self.source = source
        try:
            self.nodes = parse_go_template(source)
            self.vars = identifiers(self.nodes)
        except RecursionError:  # the parser caps nesting; this is the backstop
            raise UnsupportedTemplateError("template: nested too deeply to render") from None
        if "messages" not in self.vars and "response" not in self.vars:
            self.nodes = [*self.nodes, _RESPONSE]

    @property
    def uses_messages(self) -> bool:
        return "messages" in self.vars

    @property
    def renders_tools(self) -> bool:
        """Whether it shows offered tools (Ollama's tools capability: it mentions .Tools)."""
        return "tools" in self.vars

    @property
    def thinks(self) -> bool:
        """Ollama's thinking capability for a template layer: thinking.InferTags finds its tags."""
        return all(thinking_tags(self.nodes))

    def request_think(self, think: bool | str | None) -> bool | str | None:
        """The think value Ollama's chat and generate handlers render a request with: a model
        with the thinking capability thinks when the request does not say (routes.go)."""
        return True if think is None and self.thinks else think

    def execute(self, messages: Sequence[dict], *, tools: Sequence[dict] | None = None,
                think: bool | str | None = None) -> str:
        system, collated = collate(messages)
        flags = think_values(think)
        if self.uses_messages:
            return execute(self.nodes, {"System": system, "Messages": [message(m) for m in collated],
                                        "Tools": template_tools(tools), "Response": "", **flags})
        out: list[str] = []
        turn = {"System": "", "Prompt": "", "Response": ""}
        for m in collated:
            role, content = m["role"], m["content"]
            if role == "system":
                if turn["Prompt"] or turn["Response"]:
                    out.append(execute(self.nodes, {**turn, **flags}))
                    turn = dict.fromkeys(turn, "")
                turn["System"] = content
            elif role == "user":
                if turn["Response"]:
                    out.append(execute(self.nodes, {**turn, **flags}))
                    turn = dict.fromkeys(turn, "")
                turn["Prompt"] = content
            elif role == "assistant":
                turn["Response"] = content
        out.append(execute(cut_after_response(self.nodes), {**turn, **flags}))
        return "".join(out)


def render_go_template(template: str, *, system: str | None = None, prompt: str | None = None,
                       messages: Sequence[dict] | None = None, response: str = "",
                       tools: Sequence[dict] | None = None, think: bool | str | None = None) -> str:
    """The prompt Ollama builds from a Go template.

    `messages` are chat messages ({"role", "content", ...}); `system` is put
    first as a system message when the messages have none (what Ollama does
    with a model's SYSTEM layer), `prompt` is added as a user message and a
    non-empty `response` as an assistant message to be continued.
    """
    msgs = [dict(m) for m in (messages or ())]
    if system and not any(m.get("role") == "system" for m in msgs):
        msgs.insert(0, {"role": "system", "content": system})
    if prompt:
        msgs.append({"role": "user", "content": prompt})
    if response:
        msgs.append({"role": "assistant", "content": response})
    return OllamaTemplate(template).execute(msgs, tools=tools, think=think)


def think_values(think: bool | str | None) -> dict:
    """template.Values' Think, ThinkLevel and IsThinkSet for a request's think, as renderPrompt
    sets them from api.ThinkValue (Bool and String): true is the level "medium"."""
    if think is None:
        return {"Think": False, "ThinkLevel": "", "IsThinkSet": False}
    if isinstance(think, bool):
        return {"Think": think, "ThinkLevel": "medium" if think else "", "IsThinkSet": True}
    if think in THINK_LEVELS:
        return {"Think": True, "ThinkLevel": think, "IsThinkSet": True}
    raise UnsupportedTemplateError(f"think must be a boolean or one of {', '.join(THINK_LEVELS)}")


# -- Ollama's helpers -------------------------------------------------------------------
def collate(messages: Iterable[dict]) -> tuple[str, list[dict]]:
    """template.go collate: merge consecutive same-role messages (not tool results)."""
    system: list[str] = []
    out: list[dict] = []
    for raw in messages:
        if not isinstance(raw, dict) or not isinstance(raw.get("role"), str):
            raise UnsupportedTemplateError("every message needs a string 'role'")
        m = {**raw, "content": _content(raw.get("content"))}
        if m["role"] == "system":
            system.append(m["content"])
        if out and out[-1]["role"] == m["role"] and m["role"] != "tool":
            out[-1] = {**out[-1], "content": out[-1]["content"] + "\n\n" + m["content"]}
        else:
            out.append(m)
    return "\n\n".join(system), out


def _content(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    raise UnsupportedTemplateError("a Go template takes text message content")


def identifiers(nodes: list) -> set[str]:
    """Lower-cased field and variable names anywhere in the tree (template.go Vars)."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for n in node:
                walk(n)
        elif isinstance(node, Action):
            walk(node.pipe)
        elif isinstance(node, Branch):
            walk(node.pipe)
            walk(node.body)
            walk(node.else_body or [])
        elif isinstance(node, Pipe):
            for cmd in node.cmds:
                walk(cmd.args)
        elif isinstance(node, Field):
            found.update(i.lower() for i in node.idents)
        elif isinstance(node, Variable):
            found.update(i.lower() for i in (node.name, *node.idents))

    walk(nodes)
    return found


def cut_after_response(nodes: list) -> list:
    """template.go deleteNode: keep the tree up to the first {{ .Response }} field
    (pre-order; an if/range/with condition is not looked into) and drop the rest."""
    cut = False

    def keep(node: Any) -> Any:
        nonlocal cut
        if cut:
            return None
        if isinstance(node, Field) and "Response" in node.idents:
            cut = True
            return node
        if isinstance(node, Branch):
            node = copy(node)
            node.body = keep_list(node.body)
            if node.else_body is not None:
                node.else_body = keep_list(node.else_body) if not cut else []
            return node
        if isinstance(node, Action):
            pipe = keep(node.pipe)
            return None if pipe is None else Action(pipe)
        if isinstance(node, Pipe):
            cmds = []
            for cmd in node.cmds:
                args = [a for a in (keep(arg) for arg in cmd.args) if a is not None]
                if not args:
                    return None
                cmds.append(Command(args))
            return Pipe(cmds, node.decl, node.is_assign)
        return node

    def keep_list(items: list) -> list:
        return [n for n in (keep(item) for item in items) if n is not None]

    return keep_list(nodes)


def thinking_tags(nodes: list) -> tuple[str, str]:
    """thinking.InferTags: for each .Thinking field under a range over .Messages, the first
    and last text of the node list holding it (stripped) are the opening and closing tags;
    a later match overwrites, and a list that does not start or end with text keeps the
    previous tag.  Go's walk, like this one, does not look into (pipeline).Field chains."""
    tags = ["", ""]
    ancestors: list = []  # Branches, Pipes, Commands and node lists (Go's ListNodes) above us

    def visit(node: Any) -> None:
        ancestors.append(node)
        if isinstance(node, Field) and node.idents[0] == "Thinking":
            ranges = [a for a in ancestors if isinstance(a, Branch) and a.kind == "range"]
            if ranges and _uses_field(ranges[-1].pipe, "Messages"):
                holder = next(a for a in reversed(ancestors) if isinstance(a, list))
                if isinstance(holder[0], Text):
                    tags[0] = holder[0].text.strip()
                if isinstance(holder[-1], Text):
                    tags[1] = holder[-1].text.strip()
        for child in _children(node):
            visit(child)
        ancestors.pop()

    visit(nodes)
    return tags[0], tags[1]


def _children(node: Any) -> list:
    if isinstance(node, list):
        return node
    if isinstance(node, Branch):
        return [node.pipe, node.body] + ([node.else_body] if node.else_body is not None else [])
    if isinstance(node, Action):
        return [node.pipe]
    if isinstance(node, Pipe):
        return node.cmds
    if isinstance(node, Command):
        return node.args
    return []


def _uses_field(pipe: Pipe, name: str) -> bool:
    """thinking.rangeUsesField: a field starting with `name` anywhere in the range's pipeline."""
    stack: list = [pipe]
    while stack:
        node = stack.pop()
        if isinstance(node, Field) and node.idents[0] == name:
            return True
        stack.extend(_children(node))
    return False
