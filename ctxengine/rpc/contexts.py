"""ContextService: the runtime's live contexts, driven remotely.

Each method is the matching session call (serving/sessions.py) or Context
call (state/context.py) on the shared Runtime, so a context made here is the
one the HTTP face and every other client sees. Generate streams as it samples; a client that cancels stops it
before the next token is sampled (one still queued for the context's lock samples none).
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ..serving.exports import cancelled_when
from .errors import Code, Refused, guarded
from .v1 import context_pb2 as pb
from .v1 import context_pb2_grpc

if TYPE_CHECKING:
    from ..serving.exports import Context
    from ..serving.runtime import Runtime

DEFAULT_MAX_TOKENS = 256
_SAMPLING = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n",
             "presence_penalty", "frequency_penalty", "seed")


class ContextServicer(context_pb2_grpc.ContextServiceServicer):
    def __init__(self, runtime: "Runtime"):
        self.runtime = runtime
        self.sessions = runtime.sessions

    @guarded
    def Create(self, request, context):
        fill = (lambda c: c.append_system(request.system)) if request.system else None
        lora = [{"name": u.name, "scale": u.scale} for u in request.lora.uses] if request.HasField("lora") else None
        ctx = self.sessions.create(request.name, request.model or None, labels=request.labels, lora=lora,
                                   fill=fill)
        return self._info(ctx)

    @guarded
    def Append(self, request, context):
        which = request.WhichOneof("content")
        if which is None:
            raise Refused(Code.INVALID_ARGUMENT, "append needs text or ids")
        content = request.text if which == "text" else list(request.ids.ids)
        # a client gone stops a long prefill at the scheduler's next step, the context as it was
        with self.sessions.hold(request.name) as ctx, cancelled_when(lambda: not context.is_active()):
            n_new = ctx.append(content, parse_special=request.parse_special)
        return pb.AppendResponse(n_new=n_new, context=self._info(ctx))

    @guarded
    def Generate(self, request, context):
        sampling = {f: getattr(request.sampling, f) for f in _SAMPLING if request.sampling.HasField(f)}
        max_tokens = request.max_tokens if request.HasField("max_tokens") else DEFAULT_MAX_TOKENS
        stop = list(request.stop)
        if not all(stop):
            raise Refused(Code.INVALID_ARGUMENT, "stop strings must be non-empty")
        cancelled = threading.Event()
        context.add_callback(cancelled.set)  # runs when the call ends, however it ends
        # The context's lock (reentrant, so generate() takes it again) is held from here to the
        # count: a call queued behind another waits here, and another call's tokens are not ours.
        with self.sessions.hold(request.name) as ctx:  # a change: never a stored response's
            if cancelled.is_set():
                return  # the client went away while this call waited: take nothing into the context
            before = ctx.n_tokens
            stream = ctx.generate(max_tokens, stop=stop, **sampling)
            try:
                while not cancelled.is_set():  # asked before each token is sampled
                    piece = next(stream, None)
                    if piece is None:
                        break
                    yield pb.GenerateEvent(piece=pb.Piece(text=piece.text, token_id=piece.token_id))
            finally:
                stream.close()  # here, in this thread: it releases the context's lock
            after, finish = ctx.n_tokens, ctx.finish_reason or "length"
        if cancelled.is_set():
            return  # the client went away: sample no more
        self.sessions.turn_done(ctx)  # in a fleet: published, so any host continues it
        yield pb.GenerateEvent(done=pb.Done(finish_reason=finish, prompt_tokens=before,
                                            completion_tokens=after - before, n_tokens=after))

    @guarded
    def Fork(self, request, context):
        src = self.sessions.find(request.name)
        return self._info(self.sessions.fork(src, request.new_name))

    @guarded
    def Rewind(self, request, context):
        with self.sessions.hold(request.name) as ctx:  # a change: never a stored response's
            ctx.rewind(request.n)
        return self._info(ctx)

    @guarded
    def Snapshot(self, request, context):
        ctx = self.sessions.find(request.name)
        s = self.sessions.snapshot(ctx, request.ref or ctx.name, dict(request.labels))
        return pb.SnapshotResponse(snapshot_id=s.snapshot_id, n_pages=s.n_pages, pages_written=s.pages_sent,
                                   ref=s.ref)

    @guarded
    def Restore(self, request, context):
        return self._info(self.sessions.restore(request.ref, request.name))

    @guarded
    def Delete(self, request, context):
        self.sessions.delete(request.name)  # in a fleet, the fleet's ref of it too
        return pb.DeleteResponse()

    @guarded
    def List(self, request, context):
        names = self._model_names()
        return pb.ListResponse(contexts=[self._info(c, names=names)
                                         for c in sorted(self.runtime.contexts(), key=lambda c: c.name)])

    @guarded
    def Get(self, request, context):
        return self._info(self.sessions.find(request.name), tokens=request.include_tokens)

    # -- helpers ----------------------------------------------------------------------
    def _model_names(self) -> dict[int, str]:
        """id(Engine) -> catalog name, for the models loaded now."""
        return {id(e.model.engine): e.entry.name for e in self.runtime.loaded()}

    def _info(self, ctx: "Context", *, tokens: bool = False, names: dict[int, str] | None = None) -> pb.ContextInfo:
        names = self._model_names() if names is None else names
        ids = ctx.tokens
        info = pb.ContextInfo(name=ctx.name, model=names.get(id(ctx.engine), ctx.engine.name),
                              weight_id=ctx.weight_id, n_tokens=len(ids), snapshot_id=ctx.snapshot_id or "",
                              labels=ctx.labels,
                              lora=[pb.LoraUse(name=a.name, scale=s, blake3=a.id) for a, s in ctx.lora.uses])
        if tokens:
            info.token_ids.extend(ids)
            info.text = ctx.engine.detokenize(ids)
        return info
