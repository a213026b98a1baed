"""The fleet tier of the snapshot store: pages, manifests and refs shared by
several hosts through Redis Cluster, with the local LMDB store as the cache in
front of it (docs/fleet.md).

Keys (pages and manifests spread over every slot; a ref and its log share one
slot through the ``{name}`` hash tag, so one Lua script moves both):

    ctx:p:<page key>      page record, as stored locally (write-once, SET NX)
    ctx:m:<snapshot id>   manifest record (write-once, SET NX)
    ctx:pm:<snapshot id>  the same manifest while it is being published (expires
                          after the gc grace): its pages are live for fleet gc
    ctx:r:{<ref>}         snapshot id          ctx:rl:{<ref>}  the ref's log
    ctx:rx:{<ref>}        a deleted ref's tombstone (fleet_refs.py), for TOMBSTONE_S
    ctx:host:<host>       a host's heartbeat   ctx:w:<weight id>  hosts serving it
    ctx:wl:<weight id>:<adapter id>   hosts serving those weights with that LoRA adapter

Publishing a snapshot (after it is committed locally) goes pages, manifest,
ref, each step acknowledged by a replica (WAIT) before the next: a reader
that finds a ref finds its manifest, and a manifest's pages, even across a
master's failover; a publish cut short leaves at most pages and a pending
marker, which no ref reaches. Every record read back is verified against its
key (BLAKE3), and pages read from the fleet are kept in the local store.
"""
from __future__ import annotations

import functools
import threading
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

from ..errors import CorruptDataError, StoreError
from . import fleet_refs, maintenance, pages as codec
from .fleet_cluster import Cluster, FleetCorrupt, FleetError, FleetUnavailable
from .fleet_refs import MANIFEST, PAGE, PENDING
from .manifest import Manifest
from .names import default_host_id, validate_host_id

SEND_CHUNK_BYTES = 16 << 20    # page records per write pipeline (per master)
ANCESTRY = 64                  # how far back a ref move looks for the ref's current snapshot

__all__ = ["Fleet", "FleetCorrupt", "FleetError", "FleetStats", "FleetUnavailable", "parse_url"]


@dataclass
class FleetStats:
    """What crossed between this process and the fleet (both directions)."""

    pages_sent: int = 0
    page_bytes_sent: int = 0       # page records as stored (maybe zstd), without Redis framing
    pages_fetched: int = 0
    page_bytes_fetched: int = 0
    manifests_sent: int = 0
    refs_moved: int = 0
    conflicts: int = 0
    retries: int = 0               # pipelines sent again after a failover
    records_skipped: int = 0       # fleet records listings left out, not being ctx's (a hand-written key)

    def as_dict(self) -> dict:
        return asdict(self)


def parse_url(url: str) -> list[tuple[str, int]]:
    """``redis://host:port[,host:port...]`` (the scheme may be left out) -> [(host, port)]."""
    if not isinstance(url, str) or not url.strip():
        raise FleetError(f"fleet address must be redis://host:port[,host:port...], got {url!r}")
    text = url.strip()
    if "://" in text:
        scheme, text = text.split("://", 1)
        if scheme != "redis":
            raise FleetError(f"fleet address {url!r}: only redis:// is supported")
    nodes = []
    for part in text.rstrip("/").split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise FleetError(f"fleet address {url!r}: {part.strip()!r} is not host:port")
        nodes.append((host.strip("[]"), int(port)))
    return nodes


def _or_local(default):
    """While the fleet is unreachable, the method answers ``default`` (local-only work;
    the cluster has already said so, once), unless called with ``or_local=False``:
    then FleetUnavailable reaches the caller (a server refuses what only the fleet
    can answer rather than fork a conversation from a stale copy)."""
    def wrap(fn):
        @functools.wraps(fn)
        def method(self, *args, or_local: bool = True, **kwargs):
            try:
                return fn(self, *args, **kwargs)
            except FleetUnavailable:
                if not or_local:
                    raise
                return default() if callable(default) else default
        return method
    return wrap


class Fleet:
    """One store's view of the fleet. ``store`` is the local cache in front."""

    def __init__(self, url: str, store, *, host_id: str | None = None):
        self.url = url
        self.store = store
        self.host_id = validate_host_id(host_id) if host_id else default_host_id()
        self.cluster = Cluster(url, parse_url(url))
        self._stats = FleetStats()
        self._lock = threading.Lock()

    def close(self) -> None:
        self.cluster.close()

    @property
    def online(self) -> bool:
        """Whether the fleet is reachable now (never waits: a cluster found down is tried
        again in the background)."""
        try:
            self.cluster.client()
        except FleetUnavailable:
            return False
        return True

    def stats(self) -> FleetStats:
        with self._lock:
            self._stats.retries = self.cluster.retries
            return FleetStats(**asdict(self._stats))

    def _count(self, **added: int) -> None:
        with self._lock:
            for name, n in added.items():
                setattr(self._stats, name, getattr(self._stats, name) + n)

    # -- pages ------------------------------------------------------------------------
    def missing_pages(self, keys: Iterable[str]) -> list[str]:
        """The keys the fleet lacks (one pipelined EXISTS per master, masters in parallel)."""
        keys = list(dict.fromkeys(k.lower() for k in keys))
        found = self.cluster.grouped([PAGE + k for k in keys], lambda p, k: p.exists(k))
        return [k for k in keys if not found[PAGE + k]]

    def send_pages(self, keys: list[str]) -> int:
        """Copy these pages from the local store to the fleet (write-once); bytes sent."""
        sent, chunk, size = 0, {}, 0
        for key in keys:
            record = self.store.get_page_record(key)
            chunk[PAGE + key] = record
            size += len(record)
            if size >= SEND_CHUNK_BYTES:
                sent += self._write_records(chunk)
                chunk, size = {}, 0
        if chunk:
            sent += self._write_records(chunk)
        self._count(pages_sent=len(keys), page_bytes_sent=sent)
        return sent

    def _write_records(self, records: dict[str, bytes]) -> int:
        self.cluster.grouped(list(records), lambda p, k: p.set(k, records[k], nx=True), wait=True)
        return sum(map(len, records.values()))

    @_or_local(dict)
    def fetch_pages(self, keys: list[str]) -> dict[str, bytes]:
        """Copy the pages the local store lacks from the fleet into it, each verified
        against its key first; {key: raw bytes} of those copied. FleetCorrupt names a
        page neither holds."""
        want = self.store.missing_pages(keys)
        if not want:
            return {}
        replies = self.cluster.grouped([PAGE + k for k in want], lambda p, k: p.get(k))
        records, raws = {}, {}
        for key in want:
            record = replies[PAGE + key]
            if record is None:  # a manifest names it, so the fleet lost it: damage, not the caller's doing
                raise FleetCorrupt(f"page {key} is in neither the local store nor the fleet")
            try:
                raws[key] = codec.decode(key, record)
            except CorruptDataError as e:
                raise CorruptDataError(f"fleet {self.url}: {e}") from None
            records[key] = bytes(record)
        self.store.put_verified_records(records)
        self._count(pages_fetched=len(records), page_bytes_fetched=sum(map(len, records.values())))
        return raws

    # -- manifests ----------------------------------------------------------------------
    @_or_local(None)
    def get_manifest(self, sid: str) -> Manifest | None:
        """A manifest from the fleet, verified against its id (None: the fleet lacks it)."""
        record = self.cluster.on_key(MANIFEST + sid, lambda p, k: p.get(k))
        if record is None:
            return None
        data = codec.decode(sid, bytes(record), what="snapshot")
        return Manifest.from_bytes(data, what=f"snapshot {sid} (fleet)")

    @_or_local(False)
    def has_manifest(self, sid: str) -> bool:
        if len(sid) != codec.KEY_HEX_LEN or not set(sid) <= set("0123456789abcdef"):
            return False
        return bool(self.cluster.on_key(MANIFEST + sid, lambda p, k: p.exists(k)))

    @_or_local(False)
    def holds(self, sid: str, ref: str | None = None) -> bool:
        """Whether the fleet holds snapshot ``sid`` now, acknowledged by a replica (and
        ``ref`` at it): what a caller may count on after a master fails over."""
        if not self.has_manifest(sid, or_local=False):
            return False
        return ref is None or self.get_ref(ref, or_local=False) == sid

    # -- publishing ---------------------------------------------------------------------
    @_or_local(None)
    def publish(self, sid: str, m: Manifest, ref: str | None = None) -> int:
        """Publish a snapshot stored locally: the pages the fleet lacks, the manifest,
        then (optionally) move ``ref`` to it. Returns how many pages crossed.

        RefConflictError if another host moved ``ref`` to a snapshot this one does
        not descend from; the snapshot itself stays published (and local)."""
        record = codec.encode(m.canonical_bytes())
        grace = int(maintenance.PENDING_GRACE_S)
        # The marker first: fleet gc keeps its pages while the rest is written.
        self.cluster.on_key(PENDING + sid, lambda p, k: p.set(k, record, ex=grace))
        try:
            missing = self.missing_pages(m.page_keys)
            self.send_pages(missing)
            self.cluster.on_key(MANIFEST + sid, lambda p, k: p.set(k, record, nx=True), wait=True)
            self._count(manifests_sent=1)
            if ref is not None:
                self.move_ref(ref, sid)
        finally:
            try:
                self.cluster.on_key(PENDING + sid, lambda p, k: p.delete(k))
            except FleetUnavailable:
                pass  # it expires after the grace period anyway
        return len(missing)

    def ancestry(self, sid: str) -> list[str]:
        """Snapshot ids the fleet may find a ref at, for a move to ``sid``: its parent,
        the parent's parent, ... as far as the local store (or the fleet) has them."""
        chain, cur = [], sid
        for _ in range(ANCESTRY):
            m = self._manifest_anywhere(cur)
            if m is None or m.parent is None:
                break
            chain.append(m.parent)
            cur = m.parent
        return chain

    def _manifest_anywhere(self, sid: str) -> Manifest | None:
        try:
            return self.store.get_local_manifest(sid)
        except StoreError:
            return self.get_manifest(sid)

    # -- refs ---------------------------------------------------------------------------
    @_or_local(None)
    def get_ref(self, name: str) -> str | None:
        return fleet_refs.get_ref(self.cluster, name)

    def move_ref(self, name: str, sid: str) -> None:
        """Compare-and-set: move ``name`` to ``sid`` if it is absent, already there, or at
        one of ``sid``'s ancestors (a fast-forward); else RefConflictError."""
        try:
            fleet_refs.move_ref(self.cluster, name, sid, self.ancestry(sid), self.host_id)
        except fleet_refs.RefConflictError:
            self._count(conflicts=1)
            raise
        self._count(refs_moved=1)

    @_or_local(False)
    def set_ref(self, name: str, sid: str, local: bool) -> bool:
        """Point ``name`` at ``sid`` on the fleet (publishing it first if it is only
        ``local``); whether the fleet holds the ref now."""
        if self.has_manifest(sid):
            self.move_ref(name, sid)
        elif local:
            self.publish(sid, self.store.get_local_manifest(sid), name)
        else:
            return False
        return True

    @_or_local(False)
    def delete_ref(self, name: str) -> bool:
        return fleet_refs.delete_ref(self.cluster, name, self.host_id)

    @_or_local(False)
    def deleted(self, name: str) -> bool:
        """Whether ref ``name`` was deleted on the fleet and not made again since."""
        return fleet_refs.deleted(self.cluster, name)

    @_or_local(None)
    def forget_deleted(self, name: str) -> None:
        fleet_refs.forget_deleted(self.cluster, name)

    @_or_local(dict)
    def refs(self) -> dict[str, str]:
        return fleet_refs.all_refs(self.cluster)

    def ref_log(self, name: str) -> list[dict]:
        return fleet_refs.ref_log(self.cluster, name)

    # -- hosts and retention ------------------------------------------------------------
    @_or_local(None)
    def heartbeat(self, info: dict, served: Mapping[str, Iterable[str]], ttl: float) -> None:
        """``served``: weight id -> ids of the LoRA adapters this host runs with them."""
        fleet_refs.heartbeat(self.cluster, self.host_id, info, served, ttl)

    @_or_local(list)
    def hosts(self) -> list[dict]:
        found, skipped = fleet_refs.hosts(self.cluster)
        self._count(records_skipped=len(skipped))
        return found

    @_or_local(list)
    def hosts_serving(self, weight_id: str, adapters: Iterable[str] = ()) -> list[str]:
        """Hosts that can restore a snapshot of these weights made with these LoRA adapters."""
        return fleet_refs.hosts_serving(self.cluster, weight_id, adapters)

    def gc(self, grace: float = maintenance.PENDING_GRACE_S) -> maintenance.GCResult:
        """Fleet gc: the local store's roots (refs, parent chains) and grace rule."""
        return fleet_refs.gc(self.cluster, grace)
