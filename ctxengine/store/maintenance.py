"""Garbage collection and statistics.

What gc keeps (the *live* set):

* every snapshot a ref points at, and its ``parent``, the parent's parent, ...
  as far as those are stored (an imported snapshot's parent may live elsewhere);
* every page a live snapshot names;
* pages stored with put_page/put_pages/put_page_record that no manifest names
  yet, for ``grace`` seconds after they were written: the transfer protocol
  sends pages first and the manifest last, and a gc in between must not
  collect them.

Everything else goes. Reflogs are *not* roots: they have no expiry here, so
counting them would mean a moved ref never frees anything; an old log entry
may therefore name a collected snapshot. Parent chains *are* roots because a
conversation's snapshots share almost all their pages, so keeping its history
costs little, and a branch's ancestry is what users walk back through.

GC runs in one write transaction: it sees a consistent store and either
finishes or leaves it untouched; writers wait meanwhile, readers do not.
A live snapshot that fails to decode, a ref whose snapshot is missing, or a
page a live snapshot names that is missing stops gc with CorruptDataError
rather than letting it delete what that damage hides (see _mark).
"""
from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import CorruptDataError
from . import pages as codec
from .lmdbenv import Env
from .manifest import Manifest

PENDING_GRACE_S = 3600.0
_TIME = struct.Struct(">d")


@dataclass(frozen=True)
class GCResult:
    manifests_removed: int
    pages_removed: int
    bytes_freed: int          # encoded (stored) bytes of the removed pages
    manifests_kept: int
    pages_kept: int


@dataclass(frozen=True)
class StoreStats:
    n_pages: int
    n_manifests: int
    n_refs: int
    stored_bytes: int         # page records as stored (after compression, with headers)
    logical_bytes: int        # sum over snapshots of their pages' raw sizes (shared pages counted each time)
    unique_raw_bytes: int     # raw size of every stored page, each once
    dedup_ratio: float        # logical / unique raw (1.0 for an empty store)
    compression_ratio: float  # unique raw / stored (>1 means zstd saved space)
    file_bytes: int           # size of the LMDB data file (includes free pages)


def _manifest(txn, env: Env, sid: bytes) -> Manifest | None:
    record = env.checked(txn.get(sid, db=env.dbs["manifests"]), f"snapshot {sid.hex()}")
    if record is None:
        return None
    return Manifest.from_bytes(codec.decode(sid.hex(), record, what="snapshot"),
                               what=f"snapshot {sid.hex()}")


def _mark(txn, env: Env) -> tuple[set[bytes], set[bytes]]:
    """The live snapshots and the pages they name; CorruptDataError for damage.

    A ref always points at a stored manifest and a stored manifest's pages are all
    present (every write keeps both), so a missing one is damage (a lost record, a
    flipped bit in its key), not something to collect around: sweeping would delete
    the misplaced record and every page only it names. A missing *parent* is not
    damage: an imported or transferred snapshot's parent may live elsewhere.
    """
    dbs = env.dbs
    live_manifests: set[bytes] = set()
    live_pages: set[bytes] = set()
    stack = []
    for name, sid in txn.cursor(db=dbs["refs"]).iternext():
        sid = bytes(sid)
        if txn.get(sid, db=dbs["manifests"]) is None:
            raise CorruptDataError(f"ref {bytes(name).decode('utf-8', 'replace')!r} points at snapshot {sid.hex()}, "
                                   "which is not in the store (its manifest record is lost or its key damaged); "
                                   "gc stopped and removed nothing")
        stack.append(sid)
    pages = txn.cursor(db=dbs["pages"])
    while stack:
        sid = stack.pop()
        if sid in live_manifests:
            continue
        m = _manifest(txn, env, sid)
        if m is None:
            continue  # a parent not stored here (only refs were checked above)
        live_manifests.add(sid)
        for key in dict.fromkeys(m.page_keys):
            kb = bytes.fromhex(key)
            if kb not in live_pages and not pages.set_key(kb):
                raise CorruptDataError(f"snapshot {sid.hex()} names page {key}, which is not in the store "
                                       "(its record is lost or its key damaged); gc stopped and removed nothing")
            live_pages.add(kb)
        if m.parent is not None:
            stack.append(bytes.fromhex(m.parent))
    return live_manifests, live_pages


def gc(env: Env, progress: Callable[[int, int], None] | None, grace: float) -> GCResult:
    dbs = env.dbs

    def run(txn) -> GCResult:
        # 1. Mark: refs, then parent chains.
        live_manifests, live_pages = _mark(txn, env)

        # Pages still waiting for their manifest are live until the grace period ends.
        cutoff = time.time() - grace
        stale_pending = []
        for k, v in txn.cursor(db=dbs["pending"]).iternext():
            k = bytes(k)
            if _TIME.unpack(bytes(v))[0] >= cutoff:
                live_pages.add(k)
            else:
                stale_pending.append(k)

        # 2. Sweep. Collect first, delete after: deleting moves cursors.
        all_manifests = [bytes(k) for k in txn.cursor(db=dbs["manifests"]).iternext(values=False)]
        n_pages = txn.stat(dbs["pages"])["entries"]
        total, done = len(all_manifests) + n_pages, 0
        dead_manifests = []
        for sid in all_manifests:
            if sid not in live_manifests:
                dead_manifests.append(sid)
            done += 1
            if progress:
                progress(done, total)
        dead_pages, freed = [], 0
        for k, v in txn.cursor(db=dbs["pages"]).iternext():
            k = bytes(k)
            if k not in live_pages:
                dead_pages.append(k)  # its overflow header checked: a delete frees the pages it counts
                freed += len(env.checked(v, f"page {k.hex()}"))  # a memoryview into the map: no copy
            done += 1
            if progress:
                progress(done, total)
        for sid in dead_manifests:
            env.checked(txn.get(sid, db=dbs["manifests"]), f"snapshot {sid.hex()}")
            txn.delete(sid, db=dbs["manifests"])
        for k in dead_pages:
            txn.delete(k, db=dbs["pages"])
        for k in stale_pending:
            txn.delete(k, db=dbs["pending"])
        return GCResult(len(dead_manifests), len(dead_pages), freed,
                        len(all_manifests) - len(dead_manifests), n_pages - len(dead_pages))

    return env.write(run, buffers=True)


def stats(env: Env, path: Path) -> StoreStats:
    dbs = env.dbs
    with env.read(buffers=True) as txn:
        raw_len: dict[bytes, int] = {}
        stored = 0
        for k, v in txn.cursor(db=dbs["pages"]).iternext():
            raw_len[bytes(k)] = codec.raw_length(bytes(k).hex(), env.checked(v, f"page {bytes(k).hex()}"))
            stored += len(v)
        logical = n_manifests = 0
        for sid in txn.cursor(db=dbs["manifests"]).iternext(values=False):
            m = _manifest(txn, env, bytes(sid))
            n_manifests += 1
            logical += sum(raw_len.get(bytes.fromhex(k), 0) for k in m.page_keys)
        n_refs = txn.stat(dbs["refs"])["entries"]
    unique = sum(raw_len.values())
    try:
        file_bytes = os.path.getsize(path / "data.mdb")
    except OSError:
        file_bytes = 0
    return StoreStats(
        n_pages=len(raw_len), n_manifests=n_manifests, n_refs=n_refs, stored_bytes=stored,
        logical_bytes=logical, unique_raw_bytes=unique,
        dedup_ratio=logical / unique if unique else 1.0,
        compression_ratio=unique / stored if stored else 1.0,
        file_bytes=file_bytes,
    )
