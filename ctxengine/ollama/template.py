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

``render_go_template`` takes what a request has (messages, or a system and a
prompt as /api/generate does) and returns the prompt text.  Templates outside
the subset go_template_parse covers raise UnsupportedTemplateError, so a
caller can use the GGUF's Jinja template instead.
"""
from __future__ import annotations

import json
from copy import copy
from typing import Any, Iterable, Sequence

from ..errors import UnsupportedTemplateError
from .go_template_exec import execute
from .go_template_values import GoStruct, JSONList, JSONMap, StructJSON, go_any
from .go_template_parse import Action, Branch, Command, Field, Pipe, Variable, parse_go_template

_RESPONSE = Action(Pipe([Command([Field(("Response",))])]))


class OllamaTemplate:
    def __init__(self, source: str):
        self.source = source
        self.nodes = parse_go_template(source.replace("\r\n", "\n"))
        self.vars = identifiers(self.nodes)
        if "messages" not in self.vars and "response" not in self.vars:
            self.nodes = [*self.nodes, _RESPONSE]

    @property
    def uses_messages(self) -> bool:
        return "messages" in self.vars

    @property
    def renders_tools(self) -> bool:
        """Whether it shows offered tools (Ollama's tools capability: it mentions .Tools)."""
        return "tools" in self.vars

    def execute(self, messages: Sequence[dict], *, tools: Sequence[dict] | None = None,
                think: bool = False) -> str:
        system, collated = collate(messages)
        flags = {"Think": think, "ThinkLevel": "", "IsThinkSet": False}
        if self.uses_messages:
            return execute(self.nodes, {"System": system, "Messages": [_message(m) for m in collated],
                                        "Tools": _tools(tools), "Response": "", **flags})
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
                       tools: Sequence[dict] | None = None) -> str:
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
    return OllamaTemplate(template).execute(msgs, tools=tools)


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


def _message(m: dict) -> GoStruct:
    """api.Message as Ollama's templateMessage struct."""
    calls = [_tool_call(c) for c in m.get("tool_calls") or ()]
    return GoStruct({"Role": m["role"], "Content": m["content"], "Thinking": m.get("thinking") or "",
                     "Images": list(m.get("images") or ()), "ToolCalls": calls,
                     "ToolName": m.get("tool_name") or m.get("name") or "",
                     "ToolCallID": m.get("tool_call_id") or ""})


def _tool_call(call: Any) -> GoStruct:
    """templateToolCall: its Arguments print as their JSON (templateArgs.String: a Go map,
    so keys sorted, and numbers float64s as Go's decoder reads them)."""
    if not isinstance(call, dict):  # text.tools.ToolCall
        call = {"id": call.id, "function": {"name": call.name, "arguments": call.arguments}}
    fn = call.get("function") or {}
    args = fn.get("arguments") or {}
    if isinstance(args, str):  # OpenAI sends the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            raise UnsupportedTemplateError("tool call arguments are not JSON") from None
    if not isinstance(args, dict):
        raise UnsupportedTemplateError("tool call arguments are not a JSON object")
    return GoStruct({"ID": call.get("id") or "", "Function": GoStruct(
        {"Index": fn.get("index") or 0, "Name": fn.get("name") or "", "Arguments": JSONMap(go_any(args))})})


def _tools(tools: Sequence[Any] | None) -> JSONList | None:
    if not tools:
        return None
    return JSONList(_tool(t if isinstance(t, dict) else t.openai()) for t in tools)  # dicts or text.tools.Tool


def _tool(tool: dict) -> GoStruct:
    """templateTool.  It, its Function and the Parameters print as their JSON: Ollama's
    templateTool.String, and for {{ .Function }} (qwen2.5, qwen3) api.ToolFunction.String;
    the template structs Ollama v0.14+ passes lack the latter two, printing Go struct
    syntax there, a regression (ollama/ollama#14601) that we do not copy."""
    fn = tool.get("function") or {}
    params = fn.get("parameters") or {}
    props = JSONMap({k: _property(v) for k, v in (params.get("properties") or {}).items()})
    required = list(params.get("required") or ())
    params_json = StructJSON(type=params.get("type") or "", **_present(params, "$defs", "items"),
                             **({"required": required} if required else {}),
                             properties=props if params.get("properties") is not None else None)
    parameters = GoStruct({"Type": params_json["type"], "Defs": go_any(params.get("$defs")),
                           "Items": go_any(params.get("items")), "Required": required, "Properties": props},
                          json=params_json)
    function = GoStruct({"Name": fn.get("name") or "", "Description": fn.get("description") or "",
                         "Parameters": parameters})
    function.json = StructJSON(name=function.fields["Name"], description=function.fields["Description"],
                               parameters=parameters)
    as_json = StructJSON(type=tool.get("type") or "", **_present(tool, "items"), function=function)
    return GoStruct({"Type": as_json["type"], "Items": go_any(tool.get("items")), "Function": function},
                    json=as_json)


def _property(prop: dict) -> GoStruct:
    """api.ToolProperty; its Type prints as the one type name (PropertyType.String)."""
    types = prop.get("type")
    types = [types] if isinstance(types, str) else list(types or ())
    type_text = types[0] if len(types) == 1 else ("[" + " ".join(types) + "]" if types else "")
    any_of = [_property(p) for p in prop.get("anyOf") or () if isinstance(p, dict)]
    nested = prop.get("properties")
    as_json = StructJSON()  # ToolProperty's fields in order, each omitted when empty
    if any_of:
        as_json["anyOf"] = any_of
    if types:
        as_json["type"] = types[0] if len(types) == 1 else types  # PropertyType marshals one type as a string
    as_json.update(_present(prop, "items"))
    for key in ("description", "enum"):
        if prop.get(key):
            as_json[key] = go_any(prop[key])
    if isinstance(nested, dict):  # an ordered map (ToolPropertiesMap): insertion order
        as_json["properties"] = StructJSON((k, _property(v)) for k, v in nested.items() if isinstance(v, dict))
    if prop.get("required"):
        as_json["required"] = list(prop["required"])
    return GoStruct({"Type": type_text, "Items": go_any(prop.get("items")),
                     "Description": prop.get("description") or "",
                     "Enum": go_any(list(prop.get("enum") or ())), "AnyOf": any_of,
                     "Properties": nested, "Required": list(prop.get("required") or ())},
                    json=as_json)


def _present(d: dict, *keys: str) -> dict:
    """The keys whose value is not nil (``omitempty`` on an ``any`` field), as Go holds them."""
    return {k: go_any(d[k]) for k in keys if d.get(k) is not None}
