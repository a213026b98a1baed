"""The Python client of a ``ctx serve`` gRPC face.

    from ctxengine.rpc import Remote
    with Remote("hostb:11436", token="...", tls="ca.pem") as b:
        b.push(store, "main")                  # only the pages b lacks cross the wire
        c = b.restore("main", name="main")     # a RemoteContext: a live context on b
        c.append(" and then")
        for piece in c.generate(max_tokens=16, temperature=0.0):
            print(piece.text, end="")

A RemoteContext reads like a local Context (state/context.py): append,
generate (yielding the same Piece objects, and setting ``finish_reason``),
fork, rewind, snapshot (into the server's store), delete. Every failure the
server reports is a :class:`RemoteError` (a CtxError) carrying its status code.
"""
from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence

from ..errors import ContextError
from ..serving.exports import Piece, Store
from . import transfer
from .channel import Channel
from .v1 import context_pb2 as cpb
from .v1 import snapshot_pb2 as spb

_SAMPLING = set(cpb.SamplingParams.DESCRIPTOR.fields_by_name)


class Remote(Channel):
    """A ``ctx serve`` host's snapshot store and live contexts (see the module doc)."""

    # -- snapshots ------------------------------------------------------------------------
    def models(self) -> dict[str, str]:
        """weight_id -> model name, for every model the host serves."""
        return {m.weight_id: m.name for m in self.unary("snapshots", "Models", spb.ModelsRequest()).models}

    def refs(self, prefix: str = "") -> dict[str, str]:
        return dict(self.unary("snapshots", "ListRefs", spb.ListRefsRequest(prefix=prefix)).refs)

    def missing_pages(self, weight_id: str, keys: Sequence[str]) -> list[str]:
        """Which of these page keys the host lacks (refused if it lacks the weights)."""
        req = spb.MissingPagesRequest(weight_id=weight_id, keys=[bytes.fromhex(k) for k in keys])
        return [k.hex() for k in self.unary("snapshots", "MissingPages", req).missing]

    def push(self, store: Store, ref: str, *, as_ref: str | None = None, force: bool = False,
             chunk_bytes: int = transfer.DEFAULT_CHUNK_BYTES, progress=None) -> transfer.TransferResult:
        """Send a snapshot of a local store here (only the pages this host lacks). A ref of that name
        here moves only to a snapshot descending from where it points, unless ``force``."""
        return transfer.push(self, store, ref, as_ref=as_ref, force=force, chunk_bytes=chunk_bytes,
                             progress=progress)

    def pull(self, ref: str, store: Store, *, as_ref: str | None = None, force: bool = False,
             weight_ids: Collection[str] | None = None, chunk_bytes: int = transfer.DEFAULT_CHUNK_BYTES,
             progress=None) -> transfer.TransferResult:
        """Fetch a snapshot from here into a local store (only the pages it lacks). A ref of that
        name there moves only to a snapshot descending from where it points, unless ``force``."""
        return transfer.pull(self, ref, store, as_ref=as_ref, force=force, weight_ids=weight_ids,
                             chunk_bytes=chunk_bytes, progress=progress)

    # -- contexts -------------------------------------------------------------------------
    def create(self, name: str | None = None, *, model: str | None = None, system: str | None = None,
               labels: dict[str, str] | None = None, lora: dict[str, float] | None = None) -> "RemoteContext":
        """A new context; ``lora``: {adapter name: scale} it runs with for its life
        (None: the scales the server runs requests with by default)."""
        req = cpb.CreateRequest(model=model or "", name=name or "", system=system or "", labels=labels or {})
        if lora is not None:
            req.lora.SetInParent()  # set, even when empty: no adapters
            req.lora.uses.extend(cpb.LoraUse(name=n, scale=s) for n, s in lora.items())
        return RemoteContext(self, self.unary("contexts", "Create", req))

    def context(self, name: str) -> "RemoteContext":
        return RemoteContext(self, self.unary("contexts", "Get", cpb.GetRequest(name=name)))

    def contexts(self) -> list["RemoteContext"]:
        return [RemoteContext(self, i) for i in self.unary("contexts", "List", cpb.ListRequest()).contexts]

    def restore(self, ref: str, name: str | None = None) -> "RemoteContext":
        """A live context on this host from a snapshot in its store."""
        return RemoteContext(self, self.unary("contexts", "Restore", cpb.RestoreRequest(ref=ref, name=name or "")))


class RemoteContext:
    """A context living on a remote host; its fields are as of the last call."""

    def __init__(self, remote: Remote, info: cpb.ContextInfo):
        self._remote = remote
        self.finish_reason: str | None = None
        self.usage: cpb.Done | None = None   # of the last generate()
        self._set(info)

    def _set(self, info: cpb.ContextInfo) -> None:
        self.name = info.name
        self.model = info.model
        self.weight_id = info.weight_id
        self.n_tokens = info.n_tokens
        self.snapshot_id = info.snapshot_id or None
        self.labels = dict(info.labels)
        self.lora = {u.name: u.scale for u in info.lora}  # the adapters it runs with, by name

    def __repr__(self) -> str:
        return f"RemoteContext({self.name!r} on {self._remote.target}, {self.n_tokens} tokens)"

    def _call(self, method: str, request) -> cpb.ContextInfo:
        info = self._remote.unary("contexts", method, request)
        self._set(info)
        return info

    @property
    def tokens(self) -> list[int]:
        return list(self._call("Get", cpb.GetRequest(name=self.name, include_tokens=True)).token_ids)

    @property
    def text(self) -> str:
        return self._call("Get", cpb.GetRequest(name=self.name, include_tokens=True)).text

    def refresh(self) -> "RemoteContext":
        self._call("Get", cpb.GetRequest(name=self.name))
        return self

    def append(self, content: str | Sequence[int], *, parse_special: bool = False) -> int:
        if isinstance(content, str):
            req = cpb.AppendRequest(name=self.name, text=content, parse_special=parse_special)
        else:
            req = cpb.AppendRequest(name=self.name, ids=cpb.TokenIds(ids=[int(i) for i in content]),
                                    parse_special=parse_special)
        resp = self._remote.unary("contexts", "Append", req)
        self._set(resp.context)
        return resp.n_new

    def generate(self, max_tokens: int = 256, *, stop: Sequence[str] = (), **sampling) -> Iterator[Piece]:
        """Stream pieces as the host samples them; stopping early cancels the generation there."""
        unknown = set(sampling) - _SAMPLING
        if max_tokens < 0:
            raise ContextError("max_tokens must be >= 0")
        if unknown:
            raise ContextError(f"unknown sampling option(s): {', '.join(sorted(unknown))}")
        params = cpb.SamplingParams(**{k: v for k, v in sampling.items() if v is not None})
        req = cpb.GenerateRequest(name=self.name, max_tokens=max_tokens, stop=list(stop), sampling=params)
        self.finish_reason = self.usage = None
        for event in self._remote.stream("contexts", "Generate", req):
            if event.HasField("piece"):
                p = event.piece
                yield Piece(p.text, p.token_id if p.HasField("token_id") else None)
            else:
                self.usage = event.done
                self.finish_reason = event.done.finish_reason
                self.n_tokens = event.done.n_tokens

    def fork(self, name: str | None = None) -> "RemoteContext":
        info = self._remote.unary("contexts", "Fork", cpb.ForkRequest(name=self.name, new_name=name or ""))
        return RemoteContext(self._remote, info)

    def rewind(self, n: int) -> None:
        if n < 0:
            raise ContextError(f"cannot rewind {n} tokens")
        self._call("Rewind", cpb.RewindRequest(name=self.name, n=n))

    def snapshot(self, ref: str | None = None, *, labels: dict[str, str] | None = None) -> str:
        """Snapshot into the host's store, as ``ref`` (default: the context's name); the snapshot id."""
        req = cpb.SnapshotRequest(name=self.name, ref=ref or "", labels=labels or {})
        sid = self._remote.unary("contexts", "Snapshot", req).snapshot_id
        self.snapshot_id = sid
        return sid

    def delete(self) -> None:
        self._remote.unary("contexts", "Delete", cpb.DeleteRequest(name=self.name))
