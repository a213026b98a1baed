"""Reading request bodies: JSON objects and their typed fields.

Routes read the fields they know with these helpers, so a wrongly typed
field is a 400 that names it; fields a route does not know are ignored
(clients send many we have no use for).
"""
from __future__ import annotations

import json
import math
import numbers
from typing import Any

from starlette.requests import ClientDisconnect, Request

from ..text.chat_template import check_template_kwargs
from .errors import ApiError

_MISSING = object()


MAX_NESTING = 128  # arrays and objects within each other: a deep tool schema is a few dozen


def parse_json(raw: bytes) -> Any:
    """A request body's JSON value; a 400 when it is malformed or nested deeper than
    MAX_NESTING (what reads it afterwards, a schema compiler say, recurses)."""
    try:
        value = json.loads(raw)
    except RecursionError:
        value = None
        depth = MAX_NESTING + 1
    except (ValueError, UnicodeDecodeError) as err:
        raise ApiError(400, f"malformed JSON in the request body: {err}") from None
    else:
        depth = _nesting(value)
    if depth > MAX_NESTING:
        raise ApiError(400, f"the request body nests arrays and objects more than {MAX_NESTING} deep")
    return value


def _nesting(value: Any) -> int:
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, dict):
            v = list(v.values())
        if isinstance(v, list):
            deepest = max(deepest, d)
            if d <= MAX_NESTING:
                todo.extend((x, d + 1) for x in v)
    return deepest


async def read_body(request: Request) -> bytes:
    """The body's bytes; a client that leaves before it has sent them all is a 499 (nginx's
    "client closed request"), not a server error with a traceback in the log."""
    try:
        return await request.body()
    except ClientDisconnect:
        raise ApiError(499, "the client closed the connection before its request body arrived") from None


async def json_body(request: Request) -> dict:
    """The request body as a JSON object (400 when it is not one)."""
    raw = await read_body(request)
    if not raw.strip():
        raise ApiError(400, "the request body is empty; expected a JSON object")
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, not {type(body).__name__}")
    return body


class Fields:
    """Typed access to one JSON object; ``where`` prefixes field names in messages."""

    def __init__(self, data: Any, where: str = ""):
        if not isinstance(data, dict):
            raise ApiError(400, f"{where.rstrip('.') or 'body'} must be an object, not {_kind(data)}")
        self.data = data
        self.where = where

    def __contains__(self, name: str) -> bool:
        return self.data.get(name) is not None

    def _get(self, name: str, default: Any) -> Any:
        value = self.data.get(name, _MISSING)
        if value is _MISSING or value is None:
            if default is _MISSING:
                raise ApiError(400, f"'{self.where}{name}' is required", param=name)
            return default
        return value

    def _bad(self, name: str, what: str, value: Any) -> ApiError:
        return ApiError(400, f"'{self.where}{name}' must be {what}, got {_kind(value)}", param=name)

    def str(self, name: str, default: Any = _MISSING) -> Any:
        value = self._get(name, default)
        if value is not default and not isinstance(value, str):
            raise self._bad(name, "a string", value)
        return value

    def bool(self, name: str, default: Any = _MISSING) -> Any:
        value = self._get(name, default)
        if value is not default and not isinstance(value, bool):
            raise self._bad(name, "true or false", value)
        return value

    def int(self, name: str, default: Any = _MISSING, *, min: int | None = None) -> Any:
        value = self._get(name, default)
        if value is default:
            return value
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # some clients send 64.0
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._bad(name, "an integer", value)
        if min is not None and value < min:
            raise ApiError(400, f"'{self.where}{name}' must be >= {min}, got {value}", param=name)
        return value

    def float(self, name: str, default: Any = _MISSING, *, within: tuple[float, float] | None = None) -> Any:
        """A finite number; ``within``: the range [lo, hi] a dialect documents for it."""
        value = self._get(name, default)
        if value is default:
            return value
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not finite(value):
            raise self._bad(name, "a finite number", value)
        if within is not None and not within[0] <= value <= within[1]:
            raise ApiError(400, f"'{self.where}{name}' must be in [{within[0]:g}, {within[1]:g}], got {value}",
                           param=name)
        return float(value)

    def str_list(self, name: str, default: Any = _MISSING, *, one: bool = True) -> Any:
        """A list of strings; ``one``: a lone string counts as a list of one."""
        value = self._get(name, default)
        if value is default:
            return value
        if one and isinstance(value, str):
            return [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._bad(name, "a list of strings" + (" or a string" if one else ""), value)
        return list(value)

    def int_list(self, name: str, default: Any = _MISSING) -> Any:
        value = self._get(name, default)
        if value is default:
            return value
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise self._bad(name, "a list of integers", value)
        return list(value)

    def obj(self, name: str) -> "Fields":
        """A nested object (empty when absent)."""
        return Fields(self._get(name, {}), f"{self.where}{name}.")

    def list(self, name: str, default: Any = _MISSING) -> Any:
        value = self._get(name, default)
        if value is not default and not isinstance(value, list):
            raise self._bad(name, "a list", value)
        return value

    def refuse(self, name: str, why: str, *, zero: bool = False) -> None:
        """400 if the field is set to anything but null, false or empty; ``zero``: 0 is unset
        too (a count of none). (0 == False in Python: OpenAI's ``logprobs: 0``, a request for
        the chosen tokens' log-probabilities, was taken as unset and answered with none.)"""
        value = self.data.get(name)
        unset = value is None or value is False or (type(value) in (list, dict, str) and not value) \
            or (zero and type(value) in (int, float) and value == 0)
        if not unset:
            raise ApiError(400, f"'{self.where}{name}' is not supported: {why}", param=name)


def finite(value: numbers.Real) -> bool:
    """Whether a JSON number is finite as a float (an integer of 400 digits is not: it has none)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def messages_of(f: Fields) -> list:
    """A chat request's ``messages``: at least one, unless it continues a named ``context``
    (as OpenAI and Anthropic refuse an empty list)."""
    messages = f.list("messages")
    if not messages and f.str("context", None) is None:
        raise ApiError(400, "'messages' is empty: send at least one message (or name a 'context' to continue)",
                       param="messages")
    return messages


def template_kwargs(f: Fields, defaults: dict | None = None) -> dict | None:
    """A chat request's ``chat_template_kwargs`` (more variables for the model's Jinja chat
    template, llama-server's and vLLM's field) over the server's ``defaults`` (``ctx serve
    --chat-template-kwargs``); None where neither sets any. A 400 naming the field where it is
    not an object or sets a variable the renderer sets itself (text/chat_template.py)."""
    value = f.data.get("chat_template_kwargs")
    if value is not None and not isinstance(value, dict):
        raise f._bad("chat_template_kwargs", "an object", value)
    return {**(defaults or {}), **check_template_kwargs(value, "chat_template_kwargs")} or None


def text_content(value: Any, where: str, what: str = "text parts") -> str:
    """Message content as OpenAI and Anthropic send it: a string, or a list of
    ``{"type": "text", "text": ...}`` parts (joined); anything else is refused."""
    if isinstance(value, str):
        return value
    if value is None:
        raise ApiError(400, f"'{where}' is required")
    if not isinstance(value, list):
        raise ApiError(400, f"'{where}' must be a string or a list of {what}")
    texts = []
    for i, part in enumerate(value):
        p = Fields(part, f"{where}[{i}].")
        kind = p.str("type")
        if kind != "text":
            raise ApiError(400, f"'{p.where}type' is '{kind}': only text content is supported")
        texts.append(p.str("text"))
    return "".join(texts)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # nan, inf, -inf (JSON's NaN and Infinity)
    return {bool: "a boolean", str: "a string", int: "an integer", float: "a number",
            list: "a list", dict: "an object"}.get(type(value), type(value).__name__)
