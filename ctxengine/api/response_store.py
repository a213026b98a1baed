"""Where the Responses API keeps its responses: each stored response is a
snapshot in the runtime's store, under the ref ``responses/<id>``, with the
response object itself in its labels (``ctx.response``), so a response
outlives the server and is read back by id.

A request with ``previous_response_id`` continues that response's context:
forked, copy-on-write, from the live context when it is still held (the last
LIVE responses are), else restored from its snapshot. Two requests with the
same previous id are therefore two branches sharing every page of the prefix,
in memory and in the store (pages are content-addressed).
"""
from __future__ import annotations

import json
import re
import secrets
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from ..errors import ContextError, CtxError, StoreError
from ..serving.sessions import RESPONSES_PREFIX
from .errors import ApiError

if TYPE_CHECKING:
    from ..serving.exports import Context
    from ..serving.runtime import Runtime

REF_PREFIX = RESPONSES_PREFIX  # a client may read these refs, never change them (serving/sessions.py)
LABEL = "ctx.response"
LIVE = 32                 # responses whose contexts stay live to fork from
_ID = re.compile(r"resp_[0-9a-f]{24}")


def new_id() -> str:
    return "resp_" + secrets.token_hex(12)


def context_name(rid: str) -> str:
    return f"_responses/{rid}"  # "_": the server's own, not listed as a client's context


class ResponseStore:
    def __init__(self, runtime: "Runtime"):
        self.runtime = runtime
        self.sessions = runtime.sessions  # its contexts are host-local: client=False
        self._live: OrderedDict[str, dict] = OrderedDict()  # id -> response object, LRU order
        self._lock = threading.Lock()

    # -- reading -------------------------------------------------------------------
    def get(self, rid: str) -> dict:
        """The response object; 404 if there is none with this id."""
        with self._lock:
            if rid in self._live:
                return self._live[rid]
        m = self._manifest(rid)
        try:
            return json.loads(m.labels[LABEL])
        except (KeyError, ValueError):
            raise ApiError(404, f"no response with id '{rid}'") from None

    def _manifest(self, rid: str):
        store = self.runtime.store
        if store is None or not _ID.fullmatch(rid):
            raise ApiError(404, f"no response with id '{rid}'")
        try:
            return store.get_manifest(store.resolve(REF_PREFIX + rid))
        except StoreError:
            raise ApiError(404, f"no response with id '{rid}'") from None

    # -- a new turn -----------------------------------------------------------------
    def open(self, rid: str, model: str | None, previous: str | None, lora: object = None) -> "Context":
        """The context for response ``rid``: a fork of ``previous``'s (whose adapters
        it keeps: a ``lora`` field that differs is refused with the turn), or a new
        empty one that runs with ``lora`` (serving/lora.py; None: the defaults)."""
        if previous is None:
            return self.sessions.create(context_name(rid), model, lora=lora, client=False)
        prev = self.get(previous)  # 404 first
        if model and model != prev["model"]:
            raise ApiError(400, f"response '{previous}' was made by model '{prev['model']}', not '{model}'",
                           param="model")
        try:
            with self.sessions.hold(context_name(previous), client=False) as ctx:
                return self.sessions.fork(ctx, context_name(rid), client=False)
        except ContextError:
            pass  # no longer live (evicted from the LRU, model unloaded, server restarted): restore it
        self._manifest(previous)  # 404 unless it is stored
        return self.sessions.restore(REF_PREFIX + previous, context_name(rid), client=False)

    def save(self, ctx: "Context", response: dict, *, store: bool) -> None:
        """With ``store``: snapshot the context with the response, and keep it live
        to fork from. Without: the context goes (store=false keeps nothing)."""
        if not store or self.runtime.store is None:
            self.discard(ctx)
            return
        rid = response["id"]
        try:
            self.sessions.snapshot(ctx, REF_PREFIX + rid, {LABEL: json.dumps(response, ensure_ascii=False)},
                                   client=False)
        except BaseException:
            self.discard(ctx)  # no response refers to it
            raise
        with self._lock:
            self._live[rid] = response
            old = list(self._live)[: max(0, len(self._live) - LIVE)]
            for k in old:
                self._live.pop(k)
        for k in old:
            self._drop_context(k)

    def discard(self, ctx: "Context") -> None:
        """A context no response keeps (a failed or unstored turn)."""
        try:
            ctx.delete()
        except CtxError:
            pass

    def discard_later(self, ctx: "Context") -> None:
        """``discard`` on a thread of its own: the generation may still hold the
        context's lock for its last token, and an event loop must not wait for it."""
        threading.Thread(target=self.discard, args=(ctx,), name="ctx-response-discard", daemon=True).start()

    def delete(self, rid: str) -> None:
        with self._lock:
            live = self._live.pop(rid, None)
        stored = False
        store = self.runtime.store
        if store is not None and _ID.fullmatch(rid):
            try:
                store.delete_ref(REF_PREFIX + rid)
                stored = True
            except StoreError:
                pass
        self._drop_context(rid)
        if live is None and not stored:
            raise ApiError(404, f"no response with id '{rid}'")

    def _drop_context(self, rid: str) -> None:
        try:
            self.sessions.find(context_name(rid), client=False).delete()
        except CtxError:
            pass
