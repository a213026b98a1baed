"""Ollama's store routes: ``/api/show`` (what a model's layers and file say) and
``/api/pull``, ``/api/delete`` (serving/pulls.py).

``/api/show`` answers as Ollama's GetModelInfo: ``parameters`` a line per
value, ``fmt.Sprintf("%-*s %#v", 30, k, v)`` (the params layer is JSON, so a
number prints as Go's float64 and a string Go-quoted), ``capabilities``
"completion" (or "embedding" for a model with a pooling type) and "tools"
when the template renders tools; ``model_info``'s arrays (the vocabulary,
merges) are null unless the request says ``"verbose": true``.

``/api/pull`` streams NDJSON progress lines as Ollama's server does
(``{"status": "pulling manifest"}``, ``{"status": "pulling <12 hex>",
"digest", "total", "completed"}`` while each blob comes in, ``{"status":
"success"}`` last), or with ``"stream": false`` answers the last line alone.
A failure once the stream has begun is a last line ``{"error": "..."}``, as
Ollama's; before it, an HTTP error. The pull runs on a thread of its own,
one a model: a second client asking for it joins it. A streaming client that
leaves leaves the pull, which stops once nobody waits for it (the partial blob
stays for a later pull); one that did not ask for a stream is waited for to
the end, as Ollama does. ``/api/delete`` answers 200 with no body, as Ollama's.
"""
from __future__ import annotations

import asyncio
import math
import re
from decimal import Decimal

import anyio.to_thread
from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from ..errors import CtxError
from ..serving import model_facts
from ..serving.pulls import DONE, Pulls, check_pull, delete_model
from ..text.chat_template import ChatTemplate
from ..text.tools import tool_format
from .errors import OLLAMA, ApiError, as_api_error, error_body
from .fields import Fields, json_body
from .ollama import iso, requested_model, untagged
from .streaming import ndjson


def routes(runtime, pulls: Pulls) -> APIRouter:
    router = APIRouter()

    @router.post("/api/show")
    async def show(request: Request):
        f = Fields(await json_body(request))
        entry = runtime.catalog.get(untagged(runtime.catalog, requested_model(f)))
        verbose = f.bool("verbose", False)
        if entry.path is None:
            raise ApiError(400, f"model '{entry.name}' cannot be served: {entry.error}")
        # off the event loop: a packaged model not assembled yet is assembled here (model_facts.py)
        return await anyio.to_thread.run_sync(lambda: _show(entry, verbose=verbose))

    @router.post("/api/pull")
    async def pull(request: Request):
        f = Fields(await json_body(request))
        name = requested_model(f)
        f.bool("insecure", False)  # accepted as Ollama's; a loopback registry is reached over http anyway
        check_pull(runtime, name)  # a bad name or no store to write: an HTTP error, before any line
        if f.bool("stream", True):
            return StreamingResponse(_lines(pulls, name), media_type="application/x-ndjson")
        last: dict = {}
        async for event in _events(pulls, name):  # a client that stops waiting does not stop it (as Ollama)
            last = event
        if "error" in last:
            raise as_api_error(last["error"])
        return last

    @router.delete("/api/delete")
    async def delete(request: Request):
        name = requested_model(Fields(await json_body(request)))
        await anyio.to_thread.run_sync(lambda: delete_model(runtime, name))
        return Response(status_code=200)

    return router


async def _events(pulls: Pulls, name: str):
    """A pull's events as they happen (serving/pulls.py), handed over from its thread
    without holding a worker thread while it waits; the client leaving leaves the pull."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()

    def tell(event) -> None:
        try:
            loop.call_soon_threadsafe(events.put_nowait, event)
        except RuntimeError:
            pass  # the server's loop has closed

    ticket = pulls.join(name, tell)
    try:
        while (event := await events.get()) is not DONE:
            yield event
    finally:
        ticket.leave()


async def _lines(pulls: Pulls, name: str):
    async for event in _events(pulls, name):
        yield ndjson(error_body(OLLAMA, as_api_error(event["error"])) if "error" in event else event)


# -- what /api/show says of a model (its file's facts: serving/model_facts.py) -----------
def _show(entry, *, verbose: bool = False) -> dict:
    """``verbose``: model_info's arrays (the vocabulary, merges) in full, as ``ollama show --verbose``."""
    details, info = model_facts.facts(entry, verbose=verbose)
    values = [(k, v) for k, vs in entry.params.items() for v in (vs if isinstance(vs, list) else [vs])]
    template = model_facts.chat_template(entry)
    lines = [f"FROM {entry.path}", f'TEMPLATE """{template}"""']
    if entry.system:
        lines.append(f'SYSTEM """{entry.system}"""')
    lines += [f"PARAMETER {k} {v if isinstance(v, str) else go_value(v)}" for k, v in values]
    # Ollama's GetModelInfo: fmt.Sprintf("%-*s %#v", 30, k, v), a line a value
    params = "\n".join(f"{k:<30} {go_value(v, quoted=True)}" for k, v in values)
    out = {"modelfile": "\n".join(lines) + "\n", "parameters": params, "template": template, "details": details,
           "model_info": info, "capabilities": _capabilities(entry, template, info),
           "modified_at": iso(entry.modified or None)}
    if entry.system:
        out["system"] = entry.system
    if entry.license:
        out["license"] = entry.license
    return out


def _capabilities(entry, template: str, info: dict) -> list[str]:
    """As Ollama's Model.Capabilities: "embedding" for a model with a pooling type (else
    "completion"), and "tools" when its template renders tools: a Go template that uses
    ``.Tools``, a GGUF's Jinja template that writes the tools it is given (text/tools.py)."""
    caps = ["embedding" if any(k.endswith(".pooling_type") for k in info) else "completion"]
    if entry.template is not None:
        tools = re.search(r"\.Tools\b", template) is not None
    else:
        try:
            tools = bool(template) and tool_format(ChatTemplate(template)) != "fallback"
        except CtxError:  # a template that does not compile renders no tools
            tools = False
    return caps + ["tools"] if tools else caps


def go_value(v, *, quoted: bool = False) -> str:
    """A params layer's value as Go's fmt prints it (%v; %#v with ``quoted``): the layer is
    JSON, so a number is a float64 (shortest %g: 0.7, 512, 1e+06), a string %q-quoted."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return _go_float(float(v))
    if isinstance(v, str):
        return _go_quote(v) if quoted else v
    return str(v)


def _go_float(v: float) -> str:
    """strconv.FormatFloat(v, 'g', -1, 64)."""
    if math.isnan(v) or math.isinf(v):
        return "NaN" if math.isnan(v) else "+Inf" if v > 0 else "-Inf"
    sign, digits, exp = Decimal(repr(v)).normalize().as_tuple()
    point = len(digits) + exp - 1  # the decimal exponent
    if point < -4 or point >= 6:  # %e, its exponent at least two digits
        mantissa = str(digits[0]) + ("." + "".join(map(str, digits[1:])) if len(digits) > 1 else "")
        return f"{'-' if sign else ''}{mantissa}e{'-' if point < 0 else '+'}{abs(point):02d}"
    return format(Decimal(repr(v)).normalize(), "f")


def _go_quote(s: str) -> str:
    """strconv.Quote: Go's double-quoted string, escapes as Go writes them."""
    out = []
    for ch in s:
        c = ord(ch)
        if ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ch.isprintable() or ch == " ":
            out.append(ch)
        elif c < 0x80:
            out.append(f"\\x{c:02x}")
        else:
            out.append(f"\\u{c:04x}" if c < 0x10000 else f"\\U{c:08x}")
    return '"' + "".join(out) + '"'


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
               "\v": "\\v", "\\": "\\\\", '"': '\\"'}
