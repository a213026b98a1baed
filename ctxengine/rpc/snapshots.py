"""SnapshotService: the server's snapshot store, page by page, for transfers.

The receiving side of a push and the sending side of a pull. Nothing here
trusts the client: keys are checked for shape, every page is verified against
its key before any of its call is stored, manifests must be canonical and
name only pages already present, and a host that serves no model with a
snapshot's weights refuses it before a page moves (docs/grpc.md). A ref that
exists moves only forward (to a snapshot descending from where it points)
unless the client says ``force``: a push must not silently replace what the
ref held, such as this host's own conversation.
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import CorruptDataError, StoreError
from ..serving.exports import Manifest, client_name, is_host_local, page_key
from .errors import Code, Refused, guarded
from .transfer import MAX_HOPS, ancestry, stored_manifest
from .v1 import snapshot_pb2 as pb
from .v1 import snapshot_pb2_grpc

if TYPE_CHECKING:
    from ..serving.exports import Store
    from ..serving.runtime import Runtime

KEY_BYTES = 32
SLOT_POLL_S = 0.25  # how often a PutPages waiting for a slot asks whether its call is still on


@dataclass(frozen=True)
class Limits:
    max_message_bytes: int = 16 << 20   # one gRPC message (a page record must fit)
    max_pages: int = 65536              # keys in one request, pages in one manifest
    max_call_bytes: int = 64 << 20      # records in one PutPages call (held until it ends)
    max_put_calls: int = 8              # PutPages calls buffering at once (the rest wait): bounds memory


class SnapshotServicer(snapshot_pb2_grpc.SnapshotServiceServicer):
    def __init__(self, runtime: "Runtime", limits: Limits):
        self.runtime = runtime
        self.limits = limits
        self._put_slots = threading.BoundedSemaphore(limits.max_put_calls)

    @property
    def store(self) -> "Store":
        return self.runtime.sessions.store()

    @guarded
    def Models(self, request, context):
        loaded = {e.entry.name for e in self.runtime.loaded()}
        models = [pb.ServedModel(weight_id=wid, name=name, loaded=name in loaded)
                  for wid, name in self.runtime.weight_ids().items()]
        return pb.ModelsResponse(models=models, kv_dtype=self.runtime.kv)

    @guarded
    def MissingPages(self, request, context):
        if not request.weight_id:
            raise Refused(Code.INVALID_ARGUMENT, "weight_id is required: the weights of the snapshot "
                                                 "these pages belong to")
        self.runtime.served_name(request.weight_id)
        keys = self._keys(request.keys)
        return pb.MissingPagesResponse(missing=[bytes.fromhex(k) for k in self.store.missing_pages(keys)])

    @guarded
    def PutPages(self, request_iterator, context):
        pages = iter(request_iterator)
        first = next(pages, None)  # no slot is held while a sender is silent: only pages buffered count
        if first is None:
            return pb.PutPagesResponse(received=0, stored=0)
        self._take_put_slot(context)
        try:
            return self._put_pages(itertools.chain([first], pages))
        finally:
            self._put_slots.release()

    def _take_put_slot(self, context) -> None:
        """Wait for one of the max_put_calls slots, but not past the end of this call."""
        while not self._put_slots.acquire(timeout=SLOT_POLL_S):
            if not context.is_active():
                raise Refused(Code.CANCELLED, "the call ended while it waited to buffer its pages")

    def _put_pages(self, pages) -> pb.PutPagesResponse:
        records: dict[str, bytes] = {}
        size = received = 0
        for page in pages:
            key = self._key(page.key)
            received += 1
            size += len(page.record)
            if received > self.limits.max_pages or size > self.limits.max_call_bytes:
                raise Refused(Code.RESOURCE_EXHAUSTED,
                              f"a PutPages call may carry at most {self.limits.max_pages} pages and "
                              f"{self.limits.max_call_bytes >> 20} MiB; send the rest in another call")
            if records.setdefault(key, page.record) != page.record:
                # Keeping either record would drop the other unverified: refuse them both.
                raise Refused(Code.INVALID_ARGUMENT, f"page {key} came twice in one call with different "
                                                     "records; nothing from this call was stored")
        try:  # every record is verified before any is written, in one transaction
            stored = self.store.put_page_records(records)
        except CorruptDataError as err:
            raise CorruptDataError(f"{err}; nothing from this call was stored") from None
        return pb.PutPagesResponse(received=received, stored=stored)

    @guarded
    def GetPages(self, request, context):
        keys = self._keys(request.keys)
        store = self.store
        for key in keys:
            if not context.is_active():
                return  # the client went away: read no more
            yield pb.Page(key=bytes.fromhex(key), record=store.get_page_record(key))

    @guarded
    def PutManifest(self, request, context):
        try:
            m = Manifest.from_bytes(request.manifest, what="manifest")
        except CorruptDataError as err:
            raise Refused(Code.INVALID_ARGUMENT, str(err)) from None
        sid = page_key(request.manifest)
        if request.snapshot_id and request.snapshot_id.lower() != sid:
            raise Refused(Code.INVALID_ARGUMENT, f"manifest hashes to {sid}, not {request.snapshot_id}")
        if len(m.page_keys) > self.limits.max_pages:
            raise Refused(Code.RESOURCE_EXHAUSTED,
                          f"manifest names {len(m.page_keys)} pages; the limit is {self.limits.max_pages}")
        ref = client_name(request.ref, "ref") if request.ref else None
        self.runtime.served_name(m.weight_id)
        move = {}
        if ref is not None:
            claimed = [a.lower() for a in request.ancestors[:MAX_HOPS]]
            move = self._ref_move(ref, self.store.refs().get(ref), sid, m.parent, request.force, claimed)
        # All or nothing: refused (naming a missing page) unless every page is stored.
        return pb.PutManifestResponse(snapshot_id=self.store.snapshot(m, {}, ref=ref, **move))

    @guarded
    def GetManifest(self, request, context):
        sid = self.store.resolve(request.ref)  # "" is not a ref or snapshot id: INVALID_ARGUMENT (errors.py)
        m = self.store.get_manifest(sid)  # verified against sid as it is read
        return pb.GetManifestResponse(snapshot_id=sid, manifest=m.canonical_bytes())

    @guarded
    def SetRef(self, request, context):
        # a malformed id is INVALID_ARGUMENT, one not stored NOT_FOUND (errors.py, by the store's words)
        name, sid = client_name(request.name, "ref"), request.snapshot_id
        at = self.store.refs().get(name)
        parent = None
        if at is not None and at != sid.lower() and not request.force:
            parent = self.store.get_manifest(sid).parent  # (where the id is malformed or not stored: refused)
        self.store.set_ref(name, sid, **self._ref_move(name, at, sid.lower(), parent, request.force, []))
        return pb.SetRefResponse()

    @guarded
    def GetRef(self, request, context):
        name = client_name(request.name, "ref")
        sid = self.store.refs().get(name)
        if sid is None:
            raise StoreError(f"no ref named {name!r}")
        return pb.GetRefResponse(snapshot_id=sid)

    @guarded
    def ListRefs(self, request, context):
        refs = {n: sid for n, sid in self.store.refs().items()
                if n.startswith(request.prefix) and not is_host_local(n)}
        return pb.ListRefsResponse(refs=refs)

    # -- checks ---------------------------------------------------------------------
    def _ref_move(self, name: str, at: str | None, sid: str, parent: str | None, force: bool,
                  claimed: list[str]) -> dict:
        """Refuse to move ref ``name``, now ``at``, to snapshot ``sid`` (whose parent is ``parent``)
        unless it is absent, at ``sid``, at one of ``sid``'s ancestors (found through this store's
        manifests, or ``claimed`` by the client, nearest first), or ``force``; return the move's
        ``expect``: where the ref was seen, so a move made meanwhile is not overwritten. A fleet's
        refs move by its own compare-and-set with ancestry (store/fleet_refs.py), which sees only
        the manifests stored, and refuses what ``force`` allows here: refused here first."""
        store = self.store
        fleet = store.fleet is not None  # (client refs are never a host's own, which stay local)
        if at is None or at == sid or (at in claimed and not fleet) \
                or at in ancestry(parent, stored_manifest(store), until=at):
            return {} if fleet else {"expect": at}
        if at in claimed:  # forward, but the fleet would not see it so
            lacking = [a for a in claimed[:claimed.index(at)] if stored_manifest(store)(a) is None]
            raise Refused(Code.FAILED_PRECONDITION,
                          f"snapshot {sid[:12]} continues this server's ref '{name}' (at {at[:12]}), but the "
                          f"server's fleet moves a ref only through snapshots it holds, and it lacks "
                          f"{len(lacking)} in between: push them first, oldest first "
                          f"({', '.join(a[:12] for a in reversed(lacking[-8:]))}), then this again")
        if force and not fleet:
            return {}
        if force:
            raise Refused(Code.FAILED_PRECONDITION,
                          f"this server's ref '{name}' points at {at[:12]} on its fleet, where refs move only "
                          f"forward, and snapshot {sid[:12]} does not continue it (it does not descend from it): "
                          f"not even --force moves it there; push it under another name (--as NAME)")
        raise Refused(Code.FAILED_PRECONDITION,
                      f"this server's ref '{name}' points at {at[:12]}, and snapshot {sid[:12]} does not "
                      f"continue it (it does not descend from it), so the ref was left as it is: push with --force "
                      f"to move it anyway, or with --as NAME to push under another name")

    def _keys(self, raw_keys) -> list[str]:
        if len(raw_keys) > self.limits.max_pages:
            raise Refused(Code.RESOURCE_EXHAUSTED, f"{len(raw_keys)} page keys in one request; "
                                                   f"the limit is {self.limits.max_pages}")
        return [self._key(k) for k in raw_keys]

    @staticmethod
    def _key(raw: bytes) -> str:
        if len(raw) != KEY_BYTES:
            raise Refused(Code.INVALID_ARGUMENT, f"a page key is {KEY_BYTES} bytes (BLAKE3), got {len(raw)}")
        return raw.hex()
