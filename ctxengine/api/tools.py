"""Tool calls in each dialect's shape, onto text/tools.py's Tool, ToolCall, ToolChoice and ToolUse.

* OpenAI chat: ``tools`` ``[{"type": "function", "function": {name, description,
  parameters}}]``, ``tool_choice`` "auto" / "none" / "required" /
  ``{"type": "function", "function": {"name"}}``; assistant ``tool_calls``
  (arguments as a JSON string) and ``role: "tool"`` results;
* OpenAI Responses: ``tools`` ``[{"type": "function", name, description, parameters}]``,
  ``tool_choice`` as above or ``{"type": "function", "name"}``;
  ``function_call`` / ``function_call_output`` input items;
* Anthropic: ``tools`` ``[{name, description, input_schema}]``, ``tool_choice``
  ``{"type": "auto" | "any" | "tool" | "none", "name"}``; ``tool_use`` and
  ``tool_result`` content blocks;
* Ollama: ``tools`` as OpenAI's; assistant ``tool_calls`` with arguments as an
  object; ``role: "tool"`` results (their ``tool_name``: the engine message's
  ``name``, as OpenAI's legacy ``name``). Ollama has no tool_choice: ours (OpenAI's
  values) is an extension, auto when absent.

A forced choice (required, any, a named tool) is generated under a grammar,
so its call always parses (text/tools.py). The generation splits the calls
out of the reply (serving/generation.py); the shapes they go out in are here.
"""
from __future__ import annotations

import json

from ..text.grammar import Grammar, GrammarError
from ..text.tools import NO_PARAMETERS, Tool, ToolCall, ToolChoice, ToolUse, forced_call_grammar, not_an_object
from .errors import ApiError
from .fields import Fields, text_content
from .structured import checked, refuse_unenforced


_FUNCTION_KEYS = ("name", "description", "parameters", "strict")


def _tool(f: Fields, schema_key: str) -> Tool:
    params = f.data.get(schema_key)
    if params is not None and not isinstance(params, dict):
        raise ApiError(400, f"'{f.where}{schema_key}' must be a JSON schema object", param="tools")
    if params is not None and (wrong := not_an_object(params)) is not None:
        raise ApiError(400, f"'{f.where}{schema_key}' {wrong}", param="tools")
    # The function as the client wrote it, for the template to render as given (``strict`` kept,
    # nothing made up): OpenAI's function keys, Anthropic's input_schema as parameters.
    spec = {k: f.data[k] for k in _FUNCTION_KEYS if k in f.data}
    if params is not None:
        spec["parameters"] = params
    return Tool(f.str("name"), f.str("description", ""), params or dict(NO_PARAMETERS), spec)


def _strict(tool: Tool, f: Fields) -> Tool:
    """An OpenAI function with ``strict: true`` may not use keywords sampling cannot enforce."""
    if not isinstance(f.data.get("strict", False), bool) and f.data["strict"] is not None:
        raise ApiError(400, f"'{f.where}strict' must be a boolean", param="tools")
    if f.data.get("strict") is True:
        refuse_unenforced(checked(lambda: Grammar.json_schema(tool.parameters), "tools"), "tools")
    return tool


def _checked(tools: list[Tool], choice: ToolChoice, parallel: bool = True) -> ToolUse | None:
    if not tools:
        if choice.forced:
            # in no dialect's own words for the mode (OpenAI's "required" is Anthropic's "any")
            raise ApiError(400, "a tool_choice that forces a call needs 'tools'", param="tool_choice")
        return None
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise ApiError(400, "tool names must be unique", param="tools")
    if choice.mode == "named" and choice.name not in names:
        raise ApiError(400, f"tool_choice names '{choice.name}', which is not in 'tools'", param="tool_choice")
    if choice.forced:
        try:
            forced_call_grammar(tools, choice, "fallback").compiled()
        except GrammarError as err:
            raise ApiError(400, f"'tools': a parameters schema cannot be used: {err}", param="tools") from None
    return ToolUse(tools, choice, parallel)


def _openai_choice(value, flat: bool) -> ToolChoice:
    if value is None or value == "auto":
        return ToolChoice("auto")
    if value in ("none", "required"):
        return ToolChoice(value)
    if isinstance(value, dict) and value.get("type") == "function":
        f = Fields(value, "tool_choice.")
        return ToolChoice("named", f.str("name") if flat else f.obj("function").str("name"))
    raise ApiError(400, f"'tool_choice' must be auto, none, required or a function, got {value!r}"[:200],
                   param="tool_choice")


def openai_tool_use(f: Fields) -> ToolUse | None:
    tools = []
    for i, t in enumerate(f.list("tools", [])):
        tf = Fields(t, f"tools[{i}].")
        if tf.str("type", "function") != "function":
            raise ApiError(400, f"'tools[{i}].type' must be 'function'", param="tools")
        tools.append(_strict(_tool(tf.obj("function"), "parameters"), tf.obj("function")))
    return _checked(tools, _openai_choice(f.data.get("tool_choice"), flat=False), f.bool("parallel_tool_calls", True))


def responses_tool_use(f: Fields) -> ToolUse | None:
    tools = []
    for i, t in enumerate(f.list("tools", [])):
        tf = Fields(t, f"tools[{i}].")
        kind = tf.str("type")
        if kind != "function":
            raise ApiError(400, f"'tools[{i}].type' is '{kind}': only function tools are supported", param="tools")
        tools.append(_strict(_tool(tf, "parameters"), tf))
    return _checked(tools, _openai_choice(f.data.get("tool_choice"), flat=True), f.bool("parallel_tool_calls", True))


def anthropic_tool_use(f: Fields) -> ToolUse | None:
    tools = []
    for i, t in enumerate(f.list("tools", [])):
        tf = Fields(t, f"tools[{i}].")
        kind = tf.str("type", "custom")
        if kind != "custom":  # Anthropic's own tools (web_search_..., bash_..., text_editor_...) run on its servers
            raise ApiError(400, f"'tools[{i}].type' is '{kind}': only custom tools (a name and an input_schema) "
                                "are supported")
        if "input_schema" not in tf:
            raise ApiError(400, f"'tools[{i}].input_schema' is required")
        tools.append(_tool(tf, "input_schema"))
    c = f.obj("tool_choice")
    kind = c.str("type", "auto")
    modes = {"auto": "auto", "none": "none", "any": "required", "tool": "named"}
    if kind not in modes:
        raise ApiError(400, f"'tool_choice.type' is '{kind}'; expected auto, any, tool or none", param="tool_choice")
    return _checked(tools, ToolChoice(modes[kind], c.str("name") if kind == "tool" else None),
                    not c.bool("disable_parallel_tool_use", False))


def ollama_tool_use(f: Fields) -> ToolUse | None:
    tools = [_tool(Fields(t, f"tools[{i}].").obj("function"), "parameters") for i, t in enumerate(f.list("tools", []))]
    return _checked(tools, _openai_choice(f.data.get("tool_choice"), flat=False))


# -- messages in ------------------------------------------------------------------
def _arguments(value, where: str) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            raise ApiError(400, f"'{where}' is not valid JSON") from None
    if not isinstance(value, dict):
        raise ApiError(400, f"'{where}' must be a JSON object")
    return value


def openai_message(f: Fields, role: str) -> dict:
    """An OpenAI (or Ollama) chat message with its tool calls or tool result, engine-shaped."""
    content = f.data.get("content")
    if role == "tool":
        text = content if isinstance(content, str) else text_content(content, f"{f.where}content")
        out = {"role": "tool", "content": text}
        if "tool_call_id" in f:
            out["tool_call_id"] = f.str("tool_call_id")
        # The tool that answered (Ollama's tool_name, OpenAI's legacy name): templates show it
        # (a Go template's .ToolName, a Jinja template's message.name)
        name = f.str("tool_name", None) or f.str("name", None)
        if name:
            out["name"] = name
        return out
    calls = []
    for i, c in enumerate(f.list("tool_calls", []) if role == "assistant" else []):
        cf = Fields(c, f"{f.where}tool_calls[{i}].")
        fn = cf.obj("function")
        call = ToolCall(fn.str("name"), _arguments(fn.data.get("arguments", {}), f"{fn.where}arguments"))
        if "id" in cf:
            call.id = cf.str("id")
        calls.append(call)
    text = "" if content is None and calls else text_content(content, f"{f.where}content")
    return {"role": role, "content": text, "tool_calls": calls} if calls else {"role": role, "content": text}


def anthropic_messages(mf: Fields, role: str) -> list[dict]:
    """One Anthropic message as engine messages: text, tool_use calls, tool_result turns."""
    content = mf.data.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise ApiError(400, f"'{mf.where}content' must be a string or a list of content blocks")
    texts, calls, results = [], [], []
    for i, block in enumerate(content):
        b = Fields(block, f"{mf.where}content[{i}].")
        kind = b.str("type")
        if kind == "text":
            texts.append(b.str("text"))
        elif kind == "tool_use" and role == "assistant":
            call = ToolCall(b.str("name"), _arguments(b.data.get("input", {}), f"{b.where}input"))
            call.id = b.str("id", call.id)
            calls.append(call)
        elif kind == "tool_result" and role == "user":
            inner = b.data.get("content", "")
            text = inner if isinstance(inner, str) else text_content(inner, f"{b.where}content", "content blocks")
            failed = b.data.get("is_error", False)
            if not isinstance(failed, bool):
                raise ApiError(400, f"'{b.where}is_error' must be a boolean")
            if failed and not text.lstrip().lower().startswith("error"):  # the model told, in the result's words
                text = f"Error: {text}"
            results.append({"role": "tool", "content": text, "tool_call_id": b.str("tool_use_id")})
        else:
            raise ApiError(400, f"'{b.where}type' is '{kind}': supported are text, tool_use (assistant) "
                                "and tool_result (user)")
    out = list(results)
    if calls:
        out.append({"role": role, "content": "".join(texts), "tool_calls": calls})
    elif texts or not results:
        out.append({"role": role, "content": "".join(texts)})
    return out


# -- calls out --------------------------------------------------------------------
def openai_calls(calls: list[ToolCall]) -> list[dict]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json}}
            for c in calls]


def anthropic_blocks(text: str, calls: list[ToolCall], empty_text: bool = True) -> list[dict]:
    """Content blocks: the text (an empty one only where ``empty_text`` and there is no call: Anthropic
    refuses an empty text block sent back), then a tool_use block per call."""
    blocks = [{"type": "text", "text": text}] if text or (empty_text and not calls) else []
    return blocks + [{"type": "tool_use", "id": "toolu_" + c.id.removeprefix("call_"), "name": c.name,
                      "input": c.arguments} for c in calls]


def ollama_calls(calls: list[ToolCall]) -> list[dict]:
    return [{"function": {"name": c.name, "arguments": c.arguments}} for c in calls]
