"""Moving a snapshot between a local store and a remote host (the client side).

Both directions follow one rule: the receiver says which page keys it lacks,
only those cross, each is verified against its key as it is stored, and the
manifest (with its ref) is written last, in one transaction that is refused
while any page is missing. So an interrupted transfer leaves no half
snapshot, and running it again sends only what is still missing: pages that
arrived are kept, and protected from gc for an hour (store/maintenance.py).

* push: MissingPages (the receiver refuses other weights here, before any
  page moves) -> PutPages in calls of about ``chunk_bytes``, two in flight so
  the receiver stores one while the next arrives -> PutManifest.
* pull: GetManifest -> our weights check -> our store's missing pages ->
  GetPages in calls of about ``chunk_bytes``, each call's pages stored (on
  another thread) while the next call's arrive -> manifest.

A ref that exists on the receiving side moves only forward (to a snapshot
that descends from the one it points at, through the manifests' ``parent``
chain) unless ``force``; else the receiver refuses (docs/grpc.md). A push
sends the ids its own store shows the snapshot descends from, since the
receiver may lack those manifests; a pull follows the parents here, then on
the host, and refuses before any page moves.

Bytes on the wire are counted as the serialized size of every message of the
transfer, both directions (HTTP/2 framing adds a few bytes per message).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import CorruptDataError, StoreError, WeightMismatchError
from ..serving.exports import MIN_PREFIX, Manifest, client_name, page_key, validate_name
from .errors import Code, RemoteError
from .v1 import snapshot_pb2 as pb

if TYPE_CHECKING:
    from ..serving.exports import Store
    from .channel import Channel

DEFAULT_CHUNK_BYTES = 8 << 20   # page records per PutPages/GetPages call
PIPELINE = 2                    # PutPages calls in flight: the receiver stores one as the next arrives
MAX_HOPS = 10_000               # parents a ref move follows, looking for where the ref points
REMOTE_HOPS = 1_000             # of those, manifests a pull may fetch from the host to follow them
Progress = Callable[[int, int], None] | None


@dataclass(frozen=True)
class TransferResult:
    snapshot_id: str
    ref: str | None      # the ref moved on the receiving side (None: none)
    n_pages: int         # distinct pages the snapshot names
    pages_sent: int      # pages that crossed the wire
    pages_skipped: int   # pages the receiver already had
    page_bytes: int      # bytes of those page records (as stored: maybe zstd)
    wire_bytes: int      # serialized bytes of every message, both directions
    seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.wire_bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


class _Meter:
    """Counts what a transfer sends and receives (from several threads)."""

    def __init__(self):
        self.wire = self.pages = self.page_bytes = self.stored = 0
        self._lock = threading.Lock()

    def message(self, msg):
        with self._lock:
            self.wire += msg.ByteSize()
        return msg

    def page(self, msg: pb.Page) -> pb.Page:
        with self._lock:
            self.pages += 1
            self.page_bytes += len(msg.record)
        return self.message(msg)

    def pages_done(self, n: int) -> int:
        """Pages whose calls have ended (for progress), after ``n`` more."""
        with self._lock:
            self.stored += n
            return self.stored


def push(remote: "Channel", store: "Store", ref: str, *, as_ref: str | None = None, force: bool = False,
         chunk_bytes: int = DEFAULT_CHUNK_BYTES, progress: Progress = None) -> TransferResult:
    """Send snapshot ``ref`` of ``store`` to the remote host; its ref ``as_ref`` (default: the same
    name when ``ref`` is a ref) points at it afterwards. Where that ref exists and the snapshot does
    not descend from where it points, the host refuses (RemoteError, FAILED_PRECONDITION; the pages
    sent stay there) unless ``force``."""
    t0 = time.perf_counter()
    sid = store.resolve(ref)
    m = store.get_manifest(sid)
    target = as_ref or (ref if ref in store.refs() else None)
    if target is not None:
        client_name(target, "ref")  # before any page moves
    keys = list(dict.fromkeys(m.page_keys))
    meter = _Meter()
    asked = meter.message(pb.MissingPagesRequest(weight_id=m.weight_id, keys=[bytes.fromhex(k) for k in keys]))
    missing = [k.hex() for k in meter.message(remote.unary("snapshots", "MissingPages", asked)).missing]
    if not set(missing) <= set(keys):
        raise CorruptDataError(f"{remote.target} asked for pages snapshot {sid[:16]} does not name")
    with ThreadPoolExecutor(PIPELINE, thread_name_prefix="ctx-push") as pool:
        in_flight: deque = deque()

        def finish_one() -> None:
            done = in_flight.popleft().result()  # raises the receiver's refusal
            if progress:
                progress(meter.pages_done(done.received), len(missing))

        for chunk in _chunks(store, missing, chunk_bytes):
            in_flight.append(pool.submit(remote.client_stream, "snapshots", "PutPages",
                                         [meter.page(p) for p in chunk], meter.message))
            if len(in_flight) >= PIPELINE:
                finish_one()
        while in_flight:
            finish_one()
    ancestors = _ancestors_there(remote, store, sid, m, target, meter) if target and not force else []
    put = meter.message(pb.PutManifestRequest(manifest=m.canonical_bytes(), ref=target or "", snapshot_id=sid,
                                              force=force, ancestors=ancestors))
    meter.message(remote.unary("snapshots", "PutManifest", put))
    return _result(sid, target, len(keys), meter, t0)


def pull(remote: "Channel", ref: str, store: "Store", *, as_ref: str | None = None, force: bool = False,
         weight_ids: Collection[str] | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
         progress: Progress = None) -> TransferResult:
    """Fetch snapshot ``ref`` from the remote host into ``store`` (ref ``as_ref``, default the same
    name when ``ref`` is a ref there). With ``weight_ids``, refuse before any page moves a snapshot
    made by weights not among them; without ``force``, one that does not descend from where that
    ref points here (StoreError)."""
    t0 = time.perf_counter()
    meter = _Meter()
    got = meter.message(remote.unary("snapshots", "GetManifest", meter.message(pb.GetManifestRequest(ref=ref))))
    sid = got.snapshot_id
    if page_key(got.manifest) != sid:
        raise CorruptDataError(f"{remote.target} sent a manifest that does not hash to snapshot {sid}")
    m = Manifest.from_bytes(got.manifest, what=f"snapshot {sid[:16]} from {remote.target}")
    if weight_ids is not None and m.weight_id not in weight_ids:
        raise WeightMismatchError(f"snapshot {sid[:16]} was made by weights {m.weight_id} ({m.model_name}); "
                                  f"no model here has them, so it could not be restored (nothing was fetched)")
    # What the remote resolved as a snapshot id (a prefix of 8 or more hex digits) names no ref;
    # anything shorter it could only take as a ref ("7" or "cafe" may well begin its own id).
    by_id = len(ref) >= MIN_PREFIX and sid.startswith(ref.lower())
    target = as_ref or (None if by_id else ref)
    move = {}
    if target is not None:
        validate_name(target, "ref")
        move = _local_move(remote, store, target, sid, m, force, meter)
    keys = list(dict.fromkeys(m.page_keys))
    missing = store.missing_pages(keys)
    per_call = max(1, chunk_bytes // max(1, m.page_size))
    with ThreadPoolExecutor(1, thread_name_prefix="ctx-pull") as writer:
        writing = None  # the previous call's pages are stored while the next ones arrive
        for i in range(0, len(missing), per_call):
            records = _fetch(remote, missing[i:i + per_call], meter)
            if writing is not None:
                writing.result()
            writing = writer.submit(store.put_page_records, records)  # all verified before any is stored
            if progress:
                progress(meter.pages, len(missing))
        if writing is not None:
            writing.result()
    store.snapshot(m, {}, ref=target, **move)  # manifest and ref last: refused if a page is missing
    return _result(sid, target, len(keys), meter, t0)


def ancestry(parent: str | None, manifest_of: Callable[[str], Manifest | None], *,
             until: str | None = None, hops: int = MAX_HOPS) -> list[str]:
    """The ids a snapshot whose parent is ``parent`` descends from, nearest first: the parent, its
    parent, ... as far as ``manifest_of`` has their manifests (None: it lacks one), stopping
    after ``until``, after ``hops`` ids, or where the chain would loop."""
    chain: list[str] = []
    seen: set[str] = set()
    cur = parent
    while cur is not None and cur not in seen and len(chain) < hops:
        chain.append(cur)
        seen.add(cur)
        if cur == until:
            break
        m = manifest_of(cur)
        cur = None if m is None else m.parent
    return chain


def stored_manifest(store: "Store") -> Callable[[str], Manifest | None]:
    """``store``'s manifest of a snapshot id, or None where it has none (damage is raised)."""
    def get(sid: str) -> Manifest | None:
        try:
            return store.get_manifest(sid)
        except CorruptDataError:
            raise
        except StoreError:
            return None
    return get


def _ancestors_there(remote: "Channel", store: "Store", sid: str, m: Manifest, target: str,
                     meter: _Meter) -> list[str]:
    """For a push: the ids from ``m``'s parent back to where ``target`` points on the host, as this
    store shows them (the host may lack those manifests); [] where that is not among them."""
    try:
        got = remote.unary("snapshots", "GetRef", meter.message(pb.GetRefRequest(name=target)))
    except RemoteError as err:
        if err.code == Code.NOT_FOUND:
            return []  # no such ref there (yet): the push creates it
        raise
    there = meter.message(got).snapshot_id
    if there == sid:
        return []
    chain = ancestry(m.parent, stored_manifest(store), until=there)
    return chain if chain and chain[-1] == there else []


def _local_move(remote: "Channel", store: "Store", target: str, sid: str, m: Manifest, force: bool,
                meter: _Meter) -> dict:
    """For a pull: refuse, before any page moves, to move ``target`` here to a snapshot that does not
    continue it, unless ``force``; the ``expect`` of the move (none on a fleet, which checks itself)."""
    here = store.refs().get(target)
    unguarded = getattr(store, "fleet", None) is not None
    if here is None or here == sid:
        return {} if unguarded else {"expect": here}
    local, fetched = stored_manifest(store), []

    def manifest_of(pid: str) -> Manifest | None:  # this store's, else the host's (verified)
        found = local(pid)
        if found is None and len(fetched) < REMOTE_HOPS:
            fetched.append(pid)
            found = _remote_manifest(remote, pid, meter)
        return found

    if here in ancestry(m.parent, manifest_of, until=here):
        return {} if unguarded else {"expect": here}
    if force:
        return {}
    raise StoreError(f"ref '{target}' in {store.path} points at {here[:12]}, and snapshot {sid[:12]} from "
                     f"{remote.target} does not continue it (it does not descend from it); nothing was fetched "
                     f"and the ref is left as it is: pull with --force to move it anyway, or with --as NAME to "
                     f"keep it under another name")


def _remote_manifest(remote: "Channel", sid: str, meter: _Meter) -> Manifest | None:
    """The host's manifest of snapshot ``sid``, verified against it; None where it has none."""
    try:
        got = remote.unary("snapshots", "GetManifest", meter.message(pb.GetManifestRequest(ref=sid)))
    except RemoteError as err:
        if err.code == Code.NOT_FOUND:
            return None
        raise
    meter.message(got)
    if got.snapshot_id != sid or page_key(got.manifest) != sid:
        return None  # a ref there named like the id answered: not this snapshot's
    return Manifest.from_bytes(got.manifest, what=f"snapshot {sid[:16]} from {remote.target}")


def _fetch(remote: "Channel", asked: list[str], meter: _Meter) -> dict[str, bytes]:
    """One GetPages call: the records of ``asked``, in that order, or CorruptDataError."""
    request = meter.message(pb.GetPagesRequest(keys=[bytes.fromhex(k) for k in asked]))
    records = {}
    for page in remote.stream("snapshots", "GetPages", request):
        meter.page(page)
        key = page.key.hex()
        if len(records) >= len(asked) or key != asked[len(records)]:
            raise CorruptDataError(f"{remote.target} sent page {key}, which was not the one asked for")
        records[key] = page.record
    if len(records) != len(asked):
        raise CorruptDataError(f"{remote.target} sent {len(records)} of the {len(asked)} pages asked for")
    return records


def _chunks(store: "Store", keys: list[str], chunk_bytes: int) -> Iterator[list[pb.Page]]:
    """Page messages for ``keys``, in lists of about ``chunk_bytes`` of records."""
    chunk, size = [], 0
    for key in keys:
        record = store.get_page_record(key)
        chunk.append(pb.Page(key=bytes.fromhex(key), record=record))
        size += len(record)
        if size >= chunk_bytes:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _result(sid: str, ref: str | None, n_pages: int, meter: _Meter, t0: float) -> TransferResult:
    return TransferResult(snapshot_id=sid, ref=ref, n_pages=n_pages, pages_sent=meter.pages,
                          pages_skipped=n_pages - meter.pages, page_bytes=meter.page_bytes,
                          wire_bytes=meter.wire, seconds=time.perf_counter() - t0)
