"""Contexts over HTTP (our extension; docs/http-api.md): named, live contexts
shared with the gRPC face and the ``context`` field of generation requests.

    GET    /v1/contexts                      every named context
    POST   /v1/contexts                      create one (optionally with a system prompt, messages or text)
    GET    /v1/contexts/{name}               one, with its text (``?tokens=true``: and its token ids)
    DELETE /v1/contexts/{name}
    POST   /v1/contexts/{name}/append        text, messages or token ids; prefills only those
    POST   /v1/contexts/{name}/rewind        drop the last n tokens
    POST   /v1/contexts/{name}/fork          a copy-on-write branch, O(pages)
    POST   /v1/contexts/{name}/snapshot      into the store (only the pages it lacks), as the ref {name}
                                             unless it names another ("ref": null: none)
    POST   /v1/contexts/{name}/restore       a live context from a ref or snapshot id (default: the ref {name})

Names starting with "_" are the server's own (its prefix cache) and refused.
"""
from __future__ import annotations

import anyio.to_thread
from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from ..state.snapshots import take_snapshot
from .errors import ApiError
from .fields import Fields, json_body
from .openai import chat_messages
from .prompts import chat_text


class _Contexts:
    """What the routes share: the runtime, and how a context is found, shown and filled."""

    def __init__(self, runtime):
        self.runtime = runtime

    def entry_of(self, ctx):
        for e in self.runtime.loaded():
            if e.model.engine is ctx.engine:
                return e.entry
        raise ApiError(404, f"context '{ctx.name}' belongs to a model that is no longer loaded")

    def card(self, ctx, *, text: bool = False, tokens: bool = False) -> dict:
        out = {"object": "context", "name": ctx.name, "model": self.entry_of(ctx).name, "weight_id": ctx.weight_id,
               "n_tokens": ctx.n_tokens, "n_cached": ctx.n_cached, "labels": ctx.labels,
               "snapshot_id": ctx.snapshot_id, "host": self.runtime.host_id}
        if text:
            out["text"] = ctx.text
        if tokens:
            out["tokens"] = ctx.tokens
        return out

    def named(self, name: str):
        return self.runtime.find_context(_client_name(name))

    def require_absent(self, name: str) -> None:
        if any(c.name == name for c in self.runtime.contexts()):
            raise ApiError(409, f"a context named '{name}' already exists; delete it or choose another name")

    def add_content(self, ctx, f: Fields) -> int:
        """Append what the body carries: a system prompt, messages, text or token ids."""
        entry = self.entry_of(ctx)
        model = self.runtime.model(entry.name)
        n = 0
        if "system" in f or "messages" in f:
            messages = ([{"role": "system", "content": f.str("system")}] if "system" in f else [])
            messages += chat_messages(f.list("messages", []))
            n += ctx.append(chat_text(model, entry, messages, add_generation_prompt=f.bool("generation_prompt", False),
                                      layer_template=False), parse_special=True)
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
    runtime = ops.runtime

    @router.get("/v1/contexts")
    async def list_contexts():
        return {"object": "list", "data": [ops.card(c) for c in runtime.contexts()]}

    @router.post("/v1/contexts")
    async def create(request: Request):
        f = Fields(await json_body(request))
        name = f.str("name", None)
        if name is not None:
            _client_name(name)
        labels = f.obj("labels").data
        if not all(isinstance(v, str) for v in labels.values()):
            raise ApiError(400, "'labels' must map strings to strings", param="labels")

        def make():
            ctx = runtime.create_context(name, f.str("model", None))
            ctx.labels.update(labels)
            try:
                ops.add_content(ctx, f)
            except BaseException:
                ctx.delete()  # refused content leaves no half-made context behind
                raise
            return ops.card(ctx)

        return JSONResponse(await _run(make), status_code=201)

    @router.post("/v1/contexts/{name:path}/append")
    async def append(name: str, request: Request):
        f = Fields(await json_body(request))
        ctx = ops.named(name)

        def go():
            with runtime.hold_context(ctx.name):
                n = ops.add_content(ctx, f)
            return {**ops.card(ctx), "n_appended": n}

        return await _run(go)

    @router.post("/v1/contexts/{name:path}/rewind")
    async def rewind(name: str, request: Request):
        f = Fields(await json_body(request))
        ctx = ops.named(name)
        n = f.int("n", min=0)
        await _run(lambda: ctx.rewind(n))
        return ops.card(ctx)

    @router.post("/v1/contexts/{name:path}/fork")
    async def fork(name: str, request: Request):
        f = Fields(await json_body(request))
        ctx = ops.named(name)
        new = f.str("name", None)
        if new is not None:
            ops.require_absent(_client_name(new))
        return JSONResponse(ops.card(await _run(lambda: ctx.fork(new))), status_code=201)

    @router.get("/v1/contexts/{name:path}")
    async def get(name: str, tokens: bool = False):
        return ops.card(ops.named(name), text=True, tokens=tokens)

    @router.delete("/v1/contexts/{name:path}")
    async def delete(name: str):
        ctx = ops.named(name)
        await _run(ctx.delete)
        return {"object": "context.deleted", "name": name, "deleted": True}


def _snapshot_routes(router: APIRouter, ops: _Contexts) -> None:
    runtime = ops.runtime

    @router.post("/v1/contexts/{name:path}/snapshot")
    async def snapshot(name: str, request: Request):
        f = Fields(await json_body(request))
        ctx = ops.named(name)
        store = _store(runtime)
        ref = None if "ref" in f.data and f.data["ref"] is None else f.str("ref", name)
        labels = f.obj("labels").data
        def go():
            result = take_snapshot(ctx, store, ref=ref, labels=labels or None)
            # In a fleet: whether the fleet holds it (and the ref at it) as we reply, acknowledged
            # by a replica; false: kept here only, published before the context's next use.
            published = store.fleet.holds(result.snapshot_id, ref) if store.fleet is not None else None
            return {"snapshot_id": result.snapshot_id, "ref": ref, "n_pages": result.n_pages,
                    "pages_sent": result.pages_sent, "bytes_sent": result.bytes_sent, "published": published}

        return await _run(go)

    @router.post("/v1/contexts/{name:path}/restore")
    async def restore(name: str, request: Request):
        f = Fields(await json_body(request))
        ops.require_absent(_client_name(name))
        store = _store(runtime)
        ref = f.str("ref", name)

        def go():
            if runtime.fleet is not None:
                runtime.fleet.require_ref(ref)  # 503 rather than this host's older ref
            manifest = store.get_manifest(store.resolve(ref))
            model = runtime.model_for_weight_id(manifest.weight_id)
            return ops.card(model.restore(store, ref, name=name))

        return JSONResponse(await _run(go), status_code=201)


def _client_name(name: str) -> str:
    if name.startswith("_"):
        raise ApiError(400, f"context names starting with '_' are reserved for the server: '{name}'")
    return name


def _store(runtime):
    if runtime.store is None:
        raise ApiError(400, "this server has no snapshot store")
    return runtime.store
