"""The snapshot store: content-addressed pages, manifests and refs in one LMDB.

Invariants every write keeps (each write is one LMDB transaction, so they hold
even if the process is killed at any instant):

* a page is stored under the BLAKE3 of its raw bytes, and every read checks it;
* a manifest is stored under the BLAKE3 of its canonical bytes, and only once
  every page it names is present;
* a ref only ever points at a stored manifest.

The store knows nothing about models: pages are opaque bytes from the layer
above. See docs/store-format.md for the on-disk and export formats.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import BinaryIO, Callable

from ..errors import CorruptDataError, InvalidNameError, StoreError
from . import exportfile, maintenance, pages as codec, records as records_, refs as refs_
from .lmdbenv import Env, check_format
from .manifest import Manifest
from .maintenance import GCResult, StoreStats
from .names import is_host_local, validate_name
from .refs import RefLogEntry

Progress = Callable[[int, int], None] | None


def default_store_path() -> Path:
    """$CTX_STORE, else $XDG_DATA_HOME/ctxengine/store (~/.local/share/ctxengine/store)."""
    if os.environ.get("CTX_STORE"):
        return Path(os.environ["CTX_STORE"]).expanduser()
    data = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data).expanduser() / "ctxengine" / "store"


class Store:
    def __init__(self, path: str | os.PathLike | None = None, *, map_size: int = 1 << 30,
                 fleet: str | None = None, host_id: str | None = None):
        """``fleet``: redis://host:port[,...] of a Redis Cluster shared with other hosts,
        this store being its local cache (store/fleet.py, docs/fleet.md)."""
        if path is not None and not os.fspath(path):
            # Path("") is ".": a store would appear in whatever directory the process runs in.
            raise StoreError("the snapshot store path is empty: name a directory, or give none for the default "
                             "($CTX_STORE, else the XDG data dir)")
        self.path = Path(path).expanduser() if path is not None else default_store_path()
        self.fleet = None
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create snapshot store directory {self.path}: {e}") from None
        self._env: Env | None = Env.acquire(str(self.path), map_size)
        try:
            check_format(self._env, self.path)
            if fleet is not None:
                from .fleet import Fleet  # imports redis only for a store that uses a fleet

                self.fleet = Fleet(fleet, self, host_id=host_id)
        except BaseException:
            self.close()
            raise

    @property
    def env(self) -> Env:
        if self._env is None:
            raise StoreError("the snapshot store is closed")
        return self._env

    @property
    def dbs(self) -> dict:
        return self.env.dbs

    def close(self) -> None:
        if self.fleet is not None:
            fleet, self.fleet = self.fleet, None
            fleet.close()
        if self._env is not None:
            env, self._env = self._env, None
            env.release()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r})"

    # -- pages ----------------------------------------------------------------

    def missing_pages(self, keys: Iterable[str]) -> list[str]:
        """The keys (lowercased, first occurrence order, no duplicates) not stored."""
        return records_.missing_pages(self.env, keys)

    def put_pages(self, pages: Iterable[bytes]) -> list[str]:
        """Store pages (only those absent); return every page's key, in order."""
        raws = [bytes(p) for p in pages]
        keys = [codec.page_key(r) for r in raws]
        records = self._encode_missing(dict(zip(keys, raws)))
        self.env.write(lambda txn: self._put_records(txn, records, pending=keys),
                       size_hint=sum(map(len, records.values())))
        return keys

    def put_page(self, key: str, raw: bytes) -> bool:
        """Store one page after checking BLAKE3(raw) == key; True if it was new."""
        raw = bytes(raw)
        if codec.page_key(raw) != str(key).lower():
            raise CorruptDataError(f"page {key}: content does not match its key (BLAKE3 mismatch)")
        return self._put_one(key.lower(), codec.encode(raw))

    def get_page(self, key: str) -> bytes:
        """The raw bytes of a page, verified against its key."""
        kb = codec.key_bytes(key)
        with self.env.read(buffers=True) as txn:
            record = self.env.checked(txn.get(kb, db=self.dbs["pages"]), f"page {key}")
            if record is None:
                raise StoreError(f"page {key} is not in the store")
            return codec.decode(key.lower(), record)

    def get_pages(self, keys: Iterable[str]) -> list[bytes]:
        """Several pages from one consistent read (restore reads a whole page table)."""
        keys = [k.lower() for k in keys]
        # Pages only the fleet holds are copied here first (and verified once, there).
        fetched = self.fleet.fetch_pages(keys) if self.fleet is not None else {}
        with self.env.read(buffers=True) as txn:
            return [fetched[k] if k in fetched else self._decode_stored(txn, k) for k in keys]

    def get_page_record(self, key: str) -> bytes:
        """The stored (encoded) form of a page, for transfer; the receiver verifies it."""
        kb = codec.key_bytes(key)
        with self.env.read(buffers=True) as txn:
            record = self.env.checked(txn.get(kb, db=self.dbs["pages"]), f"page {key}")
            record = None if record is None else bytes(record)
        if record is None:
            raise StoreError(f"page {key} is not in the store")
        codec.parse_header(key, record)
        return record

    def put_page_record(self, key: str, record: bytes) -> bool:
        """Store an encoded page (from get_page_record elsewhere) after verifying it."""
        record = bytes(record)
        codec.decode(str(key).lower(), record)
        return self._put_one(key.lower(), record)

    def put_page_records(self, records: Mapping[str, bytes]) -> int:
        """Store encoded pages in one transaction, every one verified first: a
        record that fails stores none of them. Returns how many were new."""
        checked = {}
        for key, record in records.items():
            key, record = str(key).lower(), bytes(record)
            codec.decode(key, record)
            checked[key] = record
        if not checked:
            return 0
        return self.env.write(lambda txn: self._put_records(txn, checked, pending=list(checked)),
                              size_hint=sum(map(len, checked.values())))

    def put_verified_records(self, records: Mapping[str, bytes]) -> int:
        """put_page_records for records the caller has just decoded against their keys."""
        return self.env.write(lambda txn: self._put_records(txn, dict(records), pending=list(records)),
                              size_hint=sum(map(len, records.values()))) if records else 0

    def page_keys(self) -> list[str]:
        with self.env.read() as txn:
            cur = txn.cursor(db=self.dbs["pages"])
            return [bytes(k).hex() for k in cur.iternext(keys=True, values=False)]

    # -- manifests and snapshots ----------------------------------------------

    def put_manifest(self, m: Manifest) -> str:
        """Store a manifest whose pages are all present; return its snapshot id."""
        data = m.canonical_bytes()  # validates, so page_keys are hex strings below
        sid = codec.page_key(data)
        record = codec.encode(data)
        keys = [k.lower() for k in m.page_keys]
        self.env.write(lambda txn: records_.put_manifest(txn, self.dbs, sid, record, keys, {}))
        return sid

    def get_manifest(self, snapshot_id: str) -> Manifest:
        """The manifest stored under a full snapshot id (use resolve() for refs/prefixes),
        here or, failing that, on the fleet."""
        try:
            return self.get_local_manifest(snapshot_id)
        except CorruptDataError:
            raise
        except StoreError:
            found = self.fleet.get_manifest(snapshot_id.lower()) if self.fleet is not None else None
            if found is None:
                raise
            return found

    def get_local_manifest(self, snapshot_id: str) -> Manifest:
        kb = codec.key_bytes(snapshot_id, "snapshot id")
        with self.env.read(buffers=True) as txn:
            record = self.env.checked(txn.get(kb, db=self.dbs["manifests"]), f"snapshot {snapshot_id}")
            if record is None:
                raise StoreError(f"snapshot {snapshot_id} is not in the store")
            data = codec.decode(snapshot_id.lower(), record, what="snapshot")
        return Manifest.from_bytes(data, what=f"snapshot {snapshot_id}")

    def snapshot(self, m: Manifest, pages: Mapping[str, bytes] | Iterable[bytes],
                 ref: str | None = None, *, expect: str | None | object = refs_.ANY) -> str:
        """Write the missing pages, the manifest and (optionally) move ``ref``: all or nothing.

        ``pages`` may be {key: raw} or just raw pages; each must hash to its key.
        Pages the store already has may be left out; pages the manifest does not
        name are ignored. ``expect`` makes the move a compare-and-set (see set_ref):
        refused, nothing at all is stored. Returns the snapshot id.
        """
        if ref is not None:
            validate_name(ref, "ref")
        want = _expected(ref, expect)
        data = m.canonical_bytes()  # validates, so page_keys are hex strings below
        sid = codec.page_key(data)
        keys = [k.lower() for k in m.page_keys]
        if isinstance(pages, Mapping):
            given = {}
            for key, raw in pages.items():
                raw = bytes(raw)
                if codec.page_key(raw) != str(key).lower():
                    raise CorruptDataError(f"page {key}: content does not match its key")
                given[key.lower()] = raw
        else:
            given = {codec.page_key(r): r for r in map(bytes, pages)}
        named = set(keys)
        given = {k: r for k, r in given.items() if k in named}
        # Compress outside the write transaction: other writers wait while it is open.
        records = self._encode_missing(given)
        record = codec.encode(data)
        now = time.time()

        def write(txn):
            self._put_records(txn, records)
            records_.put_manifest(txn, self.dbs, sid, record, keys, given)
            if ref is not None:
                refs_.set_ref(txn, self.dbs, ref, bytes.fromhex(sid), now, want)

        self.env.write(write, size_hint=sum(map(len, records.values())) + len(record))
        if self.fleet is not None and not is_host_local(ref or ""):  # a host's own refs stay here
            self.fleet.publish(sid, m, ref)
        return sid

    def snapshots(self) -> list[str]:
        """Every stored snapshot id (sorted)."""
        with self.env.read() as txn:
            cur = txn.cursor(db=self.dbs["manifests"])
            return [bytes(k).hex() for k in cur.iternext(keys=True, values=False)]

    # -- refs -----------------------------------------------------------------

    def set_ref(self, name: str, snapshot_id: str, *, expect: str | None | object = refs_.ANY) -> None:
        """Point ref ``name`` at a stored snapshot, appending (time, old, new) to its log.

        ``expect``: the snapshot id this store's ref must hold now, or None for "must
        not exist"; else RefConflictError and nothing moves. A writer that read the
        ref passes what it read, so it cannot overwrite a move made since (leave it out
        for a move made regardless, like a server's moves of its own refs).
        """
        validate_name(name, "ref")
        sid = codec.key_bytes(snapshot_id, "snapshot id")
        want = _expected(name, expect)
        now = time.time()

        def write(txn):
            if txn.get(sid, db=self.dbs["manifests"]) is None:
                return False
            refs_.set_ref(txn, self.dbs, name, sid, now, want)
            return True

        here = self.env.write(write)
        if self.fleet is not None and not is_host_local(name) and self.fleet.set_ref(name, sid.hex(), here):
            return
        if not here:
            raise StoreError(f"cannot point ref {name!r} at {snapshot_id}: no such snapshot")

    def resolve(self, ref_or_id: str) -> str:
        """A ref name, a full snapshot id, or a unique prefix (>= 8 hex digits) → snapshot id.

        A ref wins over an id prefix spelled the same way.
        """
        if not isinstance(ref_or_id, str) or not ref_or_id:
            raise StoreError(f"not a ref or snapshot id: {ref_or_id!r}")
        text = ref_or_id
        try:
            validate_name(text)
        except InvalidNameError:
            raise StoreError(f"no ref or snapshot named {text!r}") from None
        found = self.fleet.get_ref(text) if self.fleet is not None else None
        if found is not None:  # the fleet's refs are the truth while it is reachable
            return found
        with self.env.read() as txn:
            found = refs_.resolve_here(txn, self.dbs, text)
        if found is not None:
            return found
        if self.fleet is not None and self.fleet.has_manifest(text.lower()):
            return text.lower()  # the full id of a snapshot only the fleet holds
        raise StoreError(f"no ref or snapshot named {text!r}")

    def refs(self) -> dict[str, str]:
        """Every ref: this store's, and the fleet's (which win) while it is reachable."""
        with self.env.read() as txn:
            here = {n: sid.hex() for n, sid in refs_.all_refs(txn, self.dbs).items()}
        return {**here, **(self.fleet.refs() if self.fleet is not None else {})}

    def ref_log(self, name: str) -> list[RefLogEntry]:
        """Every move of ref ``name``, oldest first."""
        validate_name(name, "ref")
        with self.env.read() as txn:
            if refs_.get_ref(txn, self.dbs, name) is None:
                raise StoreError(f"no ref named {name!r}")
            return refs_.log(txn, self.dbs, name)

    def delete_ref(self, name: str) -> None:
        """Remove a ref and its log; its snapshots stay until gc() finds them unreachable."""
        validate_name(name, "ref")

        here = self.env.write(lambda txn: refs_.delete_ref(txn, self.dbs, name))
        there = self.fleet is not None and not is_host_local(name) and self.fleet.delete_ref(name)
        if not (here or there):
            raise StoreError(f"no ref named {name!r}")

    # -- maintenance and files --------------------------------------------------

    def gc(self, progress: Progress = None, *, grace: float = maintenance.PENDING_GRACE_S) -> GCResult:
        """Remove snapshots no ref reaches (through parents) and pages no kept snapshot names.

        Pages written by put_page*/put_pages that no manifest names yet survive
        for ``grace`` seconds, so a transfer in progress is not collected under it.
        """
        return maintenance.gc(self.env, progress, grace)

    def stats(self) -> StoreStats:
        return maintenance.stats(self.env, self.path)

    def export(self, ref_or_id: str, file: str | os.PathLike | BinaryIO, progress: Progress = None) -> None:
        """Write one snapshot and its pages as a self-checking portable file."""
        exportfile.export(self.env, self.resolve(ref_or_id), file, progress)

    def import_file(self, file: str | os.PathLike | BinaryIO, ref: str | None = None,
                    progress: Progress = None) -> str:
        """Verify a whole export file, then store it in one transaction; return its id."""
        return exportfile.import_file(self.env, file, ref, progress)

    # -- internals (used inside write transactions; no effects outside them) -----

    def _encode_missing(self, raws: dict[str, bytes]) -> dict[str, bytes]:
        """Records for the pages not stored yet (compressing only those)."""
        if not raws:
            return {}
        return {k: codec.encode(raws[k]) for k in self.missing_pages(raws)}

    def _put_one(self, key: str, record: bytes) -> bool:
        return self.env.write(lambda txn: bool(self._put_records(txn, {key: record}, pending=[key])),
                              size_hint=len(record))

    def _put_records(self, txn, records: dict[str, bytes], pending: Iterable[str] = ()) -> int:
        return records_.put_pages(txn, self.dbs, records, pending)

    def _decode_stored(self, txn, key: str) -> bytes:
        record = self.env.checked(txn.get(codec.key_bytes(key), db=self.dbs["pages"]), f"page {key}")
        if record is None:
            raise StoreError(f"page {key} is not in the store")
        return codec.decode(key, record)


def _expected(ref: str | None, expect: str | None | object) -> bytes | None | object:
    """``expect`` as refs.set_ref takes it: the 32-byte id, None, or refs.ANY."""
    if expect is refs_.ANY:
        return expect
    if ref is None:
        raise ValueError("expect= is a condition on a ref's move: give the ref too")
    return None if expect is None else codec.key_bytes(expect, "expected snapshot id")
