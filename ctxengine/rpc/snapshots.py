"""SnapshotService: the server's snapshot store, page by page, for transfers.

The receiving side of a push and the sending side of a pull. Nothing here
trusts the client: keys are checked for shape, every page is verified against
its key before any of its call is stored, manifests must be canonical and
name only pages already present, and a host that serves no model with a
snapshot's weights refuses it before a page moves (docs/grpc.md).
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import CorruptDataError, StoreError
from ..serving.exports import Manifest, client_name, is_host_local, page_key
from .errors import Code, Refused, guarded
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
        # All or nothing: refused (naming a missing page) unless every page is stored.
        return pb.PutManifestResponse(snapshot_id=self.store.snapshot(m, {}, ref=ref))

    @guarded
    def GetManifest(self, request, context):
        sid = self.store.resolve(request.ref)  # "" is not a ref or snapshot id: INVALID_ARGUMENT (errors.py)
        m = self.store.get_manifest(sid)  # verified against sid as it is read
        return pb.GetManifestResponse(snapshot_id=sid, manifest=m.canonical_bytes())

    @guarded
    def SetRef(self, request, context):
        # a malformed id is INVALID_ARGUMENT, one not stored NOT_FOUND (errors.py, by the store's words)
        self.store.set_ref(client_name(request.name, "ref"), request.snapshot_id)
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
