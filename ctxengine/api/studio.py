"""The studio (docs/studio.md): a web page at ``/studio`` where a person sees and
steers contexts, and the few JSON routes it needs that no other route gives.

    GET    /studio, /studio/*                 the page: static files from ./static/studio, no data
    GET    /v1/studio/info                    version, KV dtype, the default model, whether a store is set
    GET    /v1/studio/tree                    every context and snapshot ref, per model, as a prefix tree
    GET    /v1/studio/contexts/{name}/messages  a context's turns with their token ranges
    GET    /v1/studio/models                  every model: served, loaded, memory, or why it cannot be served
    GET    /v1/studio/store                   store stats (pages, bytes, dedup ratio)
    POST   /v1/studio/store/gc                collect what no ref reaches
    DELETE /v1/studio/refs/{ref}              drop a ref (its snapshots go at the next gc)
    GET    /v1/studio/refs/{ref}/messages     a snapshot's turns (read with the model whose weights made it)
    GET    /v1/studio/refs/{ref}/export       the snapshot as a portable file (``ctx import`` reads it)

The page itself is open (ops.Guard lets ``/studio`` through): it holds no
data, and asks for the API key before it calls anything else. Everything
it shows comes from the routes above and the public API (contexts, chat
completions, /metrics), each of which wants the key when one is set.
"""
from __future__ import annotations

import io
from importlib import resources

import anyio.to_thread
from fastapi import APIRouter, FastAPI, Request
from starlette.responses import FileResponse, Response
from starlette.staticfiles import StaticFiles

from ..errors import CtxError
from ..serving.exports import __version__, client_name, is_host_local
from ..serving.runtime import Runtime
from .errors import ApiError
from .studio_tree import Item, build_tree, dumps, messages

STATIC = resources.files("ctxengine.api") / "static" / "studio"
# The page runs only its own files: no inline script, nothing from elsewhere, not framed.
_PAGE_HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; "
                                            "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
                 "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
                 "Cache-Control": "no-cache"}
MAX_TREE_SNAPSHOTS = 500  # refs drawn in the tree (their manifests are read at every request)


def mount(app: FastAPI, runtime: Runtime) -> None:
    """The page's files and its JSON routes."""
    static = _PageFiles(directory=str(STATIC))

    @app.get("/studio", include_in_schema=False)
    async def page():
        return FileResponse(str(STATIC / "index.html"), headers=_PAGE_HEADERS)

    app.mount("/studio", static, name="studio")
    app.include_router(routes(runtime))


class _PageFiles(StaticFiles):
    """The page's files, each sent with the page's headers: ``/studio/index.html`` is the
    page too, and must not be framed by another site any more than ``/studio``."""

    async def get_response(self, path: str, scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(_PAGE_HEADERS)
        return response


def routes(runtime: Runtime) -> APIRouter:
    router = APIRouter(prefix="/v1/studio")
    _model_routes(router, runtime)
    _store_routes(router, runtime)
    return router


async def _run(fn):
    return await anyio.to_thread.run_sync(fn)


def _model_routes(router: APIRouter, runtime: Runtime) -> None:
    @router.get("/info")
    async def info():
        default = runtime.catalog.default
        return {"version": __version__, "kv": runtime.kv, "default_model": default.name if default else None,
                "models": [e.name for e in runtime.catalog.entries() if e.servable],
                "store": runtime.store is not None}

    @router.get("/tree")
    async def tree():
        def go():
            models, n_left_out = _forest(runtime)
            return dumps({"object": "tree", "models": models, "n_refs_left_out": n_left_out})

        # dumps, not the JSON response: a chain of forks nests deeper than json.dumps goes
        return Response(await _run(go), media_type="application/json")

    @router.get("/contexts/{name:path}/messages")
    async def context_messages(name: str):
        ctx = runtime.sessions.find(name)
        loaded = runtime.sessions.loaded_entry(ctx)
        tokens = ctx.tokens
        return {"object": "context.messages", "name": ctx.name, "model": loaded.entry.name, "n_tokens": len(tokens),
                "messages": await _run(lambda: messages(loaded.model, tokens))}

    @router.get("/models")
    async def models():
        loaded = {e.entry.name: e for e in runtime.loaded()}
        data = []
        for entry in runtime.catalog.entries():
            card = {"name": entry.name, "source": entry.source, "servable": entry.servable, "error": entry.error,
                    "file_bytes": entry.size, "loaded": entry.name in loaded}
            e = loaded.get(entry.name)
            if e is not None:
                pool = e.model.engine.pool
                card.update(memory_bytes=e.memory_bytes, kv=e.model.engine.kv_dtype, kv_pages_in_use=pool.n_used,
                            kv_pages_max=pool.max_pages, page_bytes=pool.page_bytes,
                            n_contexts=sum(not is_host_local(n) for n in e.model.contexts.names()))
            data.append(card)
        return {"object": "list", "memory_budget": runtime.memory_budget, "data": data}


def _store_routes(router: APIRouter, runtime: Runtime) -> None:
    @router.get("/store")
    async def store_stats():
        s = await _run(runtime.sessions.store().stats)
        return {"object": "store.stats", "path": str(runtime.sessions.store().path), **vars(s)}

    @router.post("/store/gc")
    async def gc(request: Request):
        # A body-less POST is a "simple" request any web page may send to localhost; asking
        # for JSON makes a browser ask first (CORS preflight), which other sites fail.
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            raise ApiError(400, "send gc with 'Content-Type: application/json' (and a body of {})")
        return {"object": "store.gc", **vars(await _run(runtime.sessions.store().gc))}

    @router.delete("/refs/{ref:path}")
    async def delete_ref(ref: str):
        client_name(ref, "ref")
        await _run(lambda: runtime.sessions.store().delete_ref(ref))
        return {"object": "ref.deleted", "ref": ref, "deleted": True}

    @router.get("/refs/{ref:path}/messages")
    async def ref_messages(ref: str):
        client_name(ref, "ref")
        store = runtime.sessions.store()

        def go():
            sid = store.resolve(ref)
            m = store.get_manifest(sid)
            name = runtime.weight_ids().get(m.weight_id)
            model = runtime.model_for_weight_id(m.weight_id)  # its tokenizer reads the tokens
            return {"object": "snapshot.messages", "ref": ref, "snapshot_id": sid, "model": name,
                    "n_tokens": len(m.token_ids), "created": m.created, "messages": messages(model, m.token_ids)}

        return await _run(go)

    @router.get("/refs/{ref:path}/export")
    async def export(ref: str):
        client_name(ref, "ref")
        buf = io.BytesIO()
        await _run(lambda: runtime.sessions.store().export(ref, buf))
        filename = ref.replace("/", "_") + ".ctxsnap"
        return Response(buf.getvalue(), media_type="application/octet-stream",
                        headers={"Content-Disposition": f'attachment; filename="{filename}"'})


def _forest(runtime: Runtime) -> tuple[list[dict], int]:
    """One prefix tree per weight_id: its live contexts and its snapshot refs; and how many
    refs were left out (past MAX_TREE_SNAPSHOTS)."""
    groups: dict[str, dict] = {}

    def group(weight_id: str, model: str, served: bool) -> dict:
        return groups.setdefault(weight_id, {"weight_id": weight_id, "model": model, "served": served, "items": []})

    for e in runtime.loaded():
        g = group(e.model.weight_id, e.entry.name, True)
        for name in e.model.contexts.names():
            if is_host_local(name):
                continue  # the server's own (prefix cache)
            try:
                ctx = e.model.contexts.get(name)
            except Exception:  # deleted since names() was read
                continue
            pages = ctx.page_ids()
            g["items"].append(Item(ctx.tokens, {"kind": "context", "name": ctx.name, "n_tokens": ctx.n_tokens,
                                                "snapshot_id": ctx.snapshot_id, "labels": ctx.labels,
                                                "busy": pages is None, "n_pages": len(pages or ())},
                                   pages=None if pages is None else frozenset(pages)))
    refs = []
    if runtime.store is not None:
        served = runtime.weight_ids()
        refs = sorted((n, sid) for n, sid in runtime.store.refs().items() if not is_host_local(n))
        for ref, sid in refs[:MAX_TREE_SNAPSHOTS]:
            try:
                m = runtime.store.get_manifest(sid)
            except CtxError as err:  # a corrupt snapshot is shown with its error, not hidden
                group("?", "unreadable snapshots", False)["items"].append(
                    Item((), {"kind": "snapshot", "ref": ref, "snapshot_id": sid, "n_tokens": 0, "error": str(err)}))
                continue
            g = group(m.weight_id, served.get(m.weight_id, m.model_name), m.weight_id in served)
            g["items"].append(Item(m.token_ids, {"kind": "snapshot", "ref": ref, "snapshot_id": sid,
                                                 "n_tokens": len(m.token_ids), "n_pages": len(m.page_keys),
                                                 "created": m.created, "parent": m.parent, "kv": m.kv_dtype,
                                                 "labels": m.labels},
                                   page_keys=frozenset(m.page_keys)))
    out = []
    for g in groups.values():
        items = g.pop("items")
        out.append({**g, "n_items": len(items), "root": build_tree(items).as_json()})
    return sorted(out, key=lambda g: (not g["served"], g["model"])), max(0, len(refs) - MAX_TREE_SNAPSHOTS)

