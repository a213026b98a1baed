"""Contexts over HTTP (our extension; docs/http-api.md): named, live contexts
shared with the gRPC face and the ``context`` field of generation requests.

    GET    /v1/contexts                      every named context
    POST   /v1/contexts                      create one (optionally with LoRA adapters, a system prompt,
                                             messages or text)
    GET    /v1/contexts/{name}               one, with its text (``?tokens=true``: and its token ids)
    DELETE /v1/contexts/{name}
    POST   /v1/contexts/{name}/append        text, messages or token ids; prefills only those
    POST   /v1/contexts/{name}/rewind        drop the last n tokens
    POST   /v1/contexts/{name}/fork          a copy-on-write branch, O(pages)
    POST   /v1/contexts/{name}/snapshot      into the store (only the pages it lacks), as the ref {name}
                                             unless it names another ("ref": null: none)
    POST   /v1/contexts/{name}/restore       a live context from a ref or snapshot id (default: the ref {name})

Names starting with "_" are the server's own (its prefix cache) and refused; a
stored response's (``responses/<id>``) may be read and forked, never changed.
In a fleet a named context is the fleet's ref of that name (docs/fleet.md):
creating one refuses a name the fleet holds, and deleting one deletes that ref.
"""
from __future__ import annotations

import anyio.to_thread
from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from ..serving.prompts import turns_text
from .errors import ApiError
from .fields import Fields, json_body, template_kwargs
from .openai import chat_messages


class _Contexts:
    """What the routes share: the runtime's sessions (serving/sessions.py), and how a
    context is shown and filled from a request's body."""

    def __init__(self, runtime):
        self.runtime = runtime
        self.sessions = runtime.sessions

    def card(self, ctx, *, text: bool = False, tokens: bool = False) -> dict:
        """What a context is now, read without waiting for a request that uses it (so a
        GET never stalls behind a generation): ``n_cached`` is null meanwhile."""
        ids = ctx.tokens
        out = {"object": "context", "name": ctx.name, "model": self.sessions.loaded_entry(ctx).entry.name,
               "weight_id": ctx.weight_id, "n_tokens": len(ids), "n_cached": ctx.cached_now(),
               "labels": ctx.labels, "snapshot_id": ctx.snapshot_id, "host": self.runtime.host_id,
               "lora": [{"name": a.name, "blake3": a.id, "scale": s} for a, s in ctx.lora.uses]}
        if text:
            out["text"] = ctx.engine.detokenize(ids)
        if tokens:
            out["tokens"] = ids
        return out

    def add_content(self, ctx, f: Fields) -> int:
        """Append what the body carries: a system prompt, messages, text or token ids."""
        loaded = self.sessions.loaded_entry(ctx)
        n = 0
        if "system" in f or "messages" in f:
            messages = ([{"role": "system", "content": f.str("system")}] if "system" in f else [])
            messages += chat_messages(f.list("messages", []))
            n += ctx.append(turns_text(loaded.model, loaded.entry, messages, ctx.tokens,
                                       generation_prompt=f.bool("generation_prompt", False),
                                       template_kwargs=template_kwargs(f, self.runtime.template_kwargs)),
                             parse_special=True)
        if "text" in f:
            n += ctx.append(f.str("text"), parse_special=f.bool("special", False))
        if "tokens" in f:
            n += ctx.append(f.int_list("tokens"))
        return n


async def _run(fn):
    return await anyio.to_thread.run_sync(fn)


def routes(runtime) -> APIRouter:
    router = APIRouter()
    contexts = _Contexts(runtime)
    _context_routes(router, contexts)
    _snapshot_routes(router, contexts)
    return router


def _context_routes(router: APIRouter, ops: _Contexts) -> None:
    runtime, sessions = ops.runtime, ops.sessions

    @router.get("/v1/contexts")
    async def list_contexts():
        return {"object": "list", "data": await _run(lambda: [ops.card(c) for c in runtime.contexts()])}

    @router.post("/v1/contexts")
    async def create(request: Request):
        f = Fields(await json_body(request))
        name = f.str("name", None)
        labels = f.obj("labels").data
        if not all(isinstance(v, str) for v in labels.values()):
            raise ApiError(400, "'labels' must map strings to strings", param="labels")

        def make():
            ctx = sessions.create(name, f.str("model", None), labels=labels, lora=f.data.get("lora"),
                                  fill=lambda c: ops.add_content(c, f))
            return ops.card(ctx)

        return JSONResponse(await _run(make), status_code=201)

    @router.post("/v1/contexts/{name:path}/append")
    async def append(name: str, request: Request):
        f = Fields(await json_body(request))

        def go():
            with sessions.hold(name) as ctx:
                n = ops.add_content(ctx, f)
            return {**ops.card(ctx), "n_appended": n}

        return await _run(go)

    @router.post("/v1/contexts/{name:path}/rewind")
    async def rewind(name: str, request: Request):
        f = Fields(await json_body(request))
        n = f.int("n", min=0)

        def go():
            with sessions.hold(name) as ctx:  # a change: never a stored response's
                ctx.rewind(n)
            return ops.card(ctx)

        return await _run(go)

    @router.post("/v1/contexts/{name:path}/fork")
    async def fork(name: str, request: Request):
        f = Fields(await json_body(request))
        ctx = sessions.find(name)
        new = f.str("name", None)
        return JSONResponse(ops.card(await _run(lambda: sessions.fork(ctx, new))), status_code=201)

    @router.get("/v1/contexts/{name:path}")
    async def get(name: str, tokens: bool = False):
        return await _run(lambda: ops.card(sessions.find(name), text=True, tokens=tokens))

    @router.delete("/v1/contexts/{name:path}")
    async def delete(name: str):
        await _run(lambda: sessions.delete(name))  # in a fleet, the fleet's ref of it too
        return {"object": "context.deleted", "name": name, "deleted": True}


def _snapshot_routes(router: APIRouter, ops: _Contexts) -> None:
    sessions = ops.sessions

    @router.post("/v1/contexts/{name:path}/snapshot")
    async def snapshot(name: str, request: Request):
        f = Fields(await json_body(request))
        ctx = sessions.find(name)
        sessions.store()
        ref = None if "ref" in f.data and f.data["ref"] is None else f.str("ref", name)
        labels = f.obj("labels").data

        def go():
            s = sessions.snapshot(ctx, ref, labels)
            return {"snapshot_id": s.snapshot_id, "ref": s.ref, "n_pages": s.n_pages, "pages_sent": s.pages_sent,
                    "bytes_sent": s.bytes_sent, "published": sessions.published(s)}

        return await _run(go)

    @router.post("/v1/contexts/{name:path}/restore")
    async def restore(name: str, request: Request):
        f = Fields(await json_body(request))
        ref = f.str("ref", name)
        await _run(lambda: sessions.new_name(name, restoring=ref))  # in a fleet it asks the fleet
        sessions.store()
        return JSONResponse(ops.card(await _run(lambda: sessions.restore(ref, name))), status_code=201)
