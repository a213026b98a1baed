"""What a request's messages and tools are to an Ollama template: template.go's
templateMessage, templateToolCall and templateTool structs (convertMessagesForTemplate,
convertToolsForTemplate) built from api.Message and api.Tool, as Go values
(go_template_values).

What Go leaves nil stays nil: a message's Images and ToolCalls when it has none,
a request's Tools when it offers none (``{{ .Tools }}`` prints ``null``, ``len``
is 0), a tool's Properties when its parameters have none (printed ``{}``, JSON
``null``), and a property's slices.  A property (api.ToolProperty) has no String
method, so it prints as Go prints a struct, and a missing one is the zero
ToolProperty; its Type is api.PropertyType, a list of type names.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

from ..errors import UnsupportedTemplateError
from .go_template_values import GoStruct, JSONList, JSONMap, PropertyType, Slice, StructJSON, go_any


def message(m: dict) -> GoStruct:
    """api.Message as Ollama's templateMessage struct (a pointer, in Go's []*templateMessage)."""
    calls = [tool_call(c) for c in m.get("tool_calls") or ()]
    images = m.get("images")
    return GoStruct({"Role": m["role"], "Content": m["content"], "Thinking": m.get("thinking") or "",
                     "Images": Slice(images or (), nil=images is None), "ToolCalls": Slice(calls, nil=True),
                     "ToolName": m.get("tool_name") or m.get("name") or "",
                     "ToolCallID": m.get("tool_call_id") or ""}, pointer=True)


def tool_call(call: Any) -> GoStruct:
    """templateToolCall: its Arguments print as their JSON (templateArgs.String: a Go map,
    so keys sorted, and numbers float64s as Go's decoder reads them)."""
    if not isinstance(call, dict):  # text.tools.ToolCall
        call = {"id": call.id, "function": {"name": call.name, "arguments": call.arguments}}
    fn = call.get("function") or {}
    args = fn.get("arguments")
    if isinstance(args, str):  # OpenAI sends the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            raise UnsupportedTemplateError("tool call arguments are not JSON") from None
    if not isinstance(args, (dict, type(None))):
        raise UnsupportedTemplateError("tool call arguments are not a JSON object")
    arguments = JSONMap(go_any(args or {}), nil=args is None)  # absent: nil, printed {} but JSON null
    return GoStruct({"ID": call.get("id") or "", "Function": GoStruct(
        {"Index": fn.get("index") or 0, "Name": fn.get("name") or "", "Arguments": arguments})})


def tools(offered: Sequence[Any] | None) -> JSONList:
    """templateTools: nil (JSON null) when the request offers none."""
    if offered is None:
        return JSONList(nil=True)
    return JSONList(tool(t if isinstance(t, dict) else t.openai()) for t in offered)  # dicts or text.tools.Tool


def tool(spec: dict) -> GoStruct:
    """templateTool.  It, its Function and the Parameters print as their JSON: Ollama's
    templateTool.String, and for {{ .Function }} (qwen2.5, qwen3) api.ToolFunction.String;
    the template structs Ollama v0.14+ passes lack the latter two, printing Go struct
    syntax there, a regression (ollama/ollama#14601) that we do not copy."""
    fn = spec.get("function") or {}
    params = fn.get("parameters") or {}
    given = params.get("properties")
    props = JSONMap({k: _property(v) for k, v in (given or {}).items()}, nil=given is None, zero=_ZERO_PROPERTY)
    required = Slice(params.get("required") or (), nil=True)
    params_json = StructJSON(type=params.get("type") or "", **_present(params, "$defs", "items"),
                             **({"required": required} if required else {}), properties=props)
    parameters = GoStruct({"Type": params_json["type"], "Defs": go_any(params.get("$defs")),
                           "Items": go_any(params.get("items")), "Required": required, "Properties": props},
                          json=params_json)
    function = GoStruct({"Name": fn.get("name") or "", "Description": fn.get("description") or "",
                         "Parameters": parameters})
    function.json = StructJSON(name=function.fields["Name"], description=function.fields["Description"],
                               parameters=parameters)
    function.string = True
    as_json = StructJSON(type=spec.get("type") or "", **_present(spec, "items"), function=function)
    return GoStruct({"Type": as_json["type"], "Items": go_any(spec.get("items")), "Function": function},
                    json=as_json)


def _property(prop: dict) -> GoStruct:
    """api.ToolProperty, its fields in Go's order; JSON omits the empty ones."""
    types = _property_type(prop)
    any_of = Slice((_property(p) for p in prop.get("anyOf") or () if isinstance(p, dict)), nil=True)
    enum = Slice(go_any(list(prop.get("enum") or ())), nil=True)
    required = Slice(prop.get("required") or (), nil=True)
    nested = prop.get("properties")
    nested_map = None
    if isinstance(nested, dict):  # a *ToolPropertiesMap: ordered JSON, printed as an address
        nested_map = GoStruct({}, json=StructJSON((k, _property(v)) for k, v in nested.items() if isinstance(v, dict)),
                              string=False, printable=False)
    as_json = StructJSON()  # omitempty: empty slices and strings, nil interfaces and pointers
    for key, value, empty in (("anyOf", any_of, not any_of), ("type", types, not types),
                              ("items", go_any(prop.get("items")), prop.get("items") is None),
                              ("description", prop.get("description") or "", not prop.get("description")),
                              ("enum", enum, not enum), ("properties", nested_map, nested_map is None),
                              ("required", required, not required)):
        if not empty:
            as_json[key] = value
    return GoStruct({"AnyOf": any_of, "Type": types, "Items": go_any(prop.get("items")),
                     "Description": prop.get("description") or "", "Enum": enum, "Properties": nested_map,
                     "Required": required}, json=as_json, string=False)


def _property_type(prop: dict) -> PropertyType:
    """PropertyType.UnmarshalJSON: a string is a list of one (JSON null reads as the string "")."""
    if "type" not in prop:
        return PropertyType(nil=True)
    types = prop["type"]
    if types is None or isinstance(types, str):
        return PropertyType([types or ""])
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise UnsupportedTemplateError("a tool property's type is neither a string nor a list of strings")
    return PropertyType(types)


_ZERO_PROPERTY = _property({})


def _present(d: dict, *keys: str) -> dict:
    """The keys whose value is not nil (``omitempty`` on an ``any`` field), as Go holds them."""
    return {k: go_any(d[k]) for k in keys if d.get(k) is not None}
