"""Refs (named pointers to snapshots, like git branches) and their logs.

Layout in LMDB (all inside the caller's transaction, so a ref move commits
together with the snapshot it points at):

* ``refs``:   key = name (UTF-8), value = 32-byte snapshot id.
* ``reflog``: key = name + b"\\0" + 8-byte big-endian sequence number, value =
  ``>d32s32s`` (unix time, old id or 32 zero bytes for "none", new id).
  Names never contain NUL, so ``name + b"\\0"`` is a prefix no other ref's log
  shares, and big-endian sequence numbers keep a ref's entries in order.

The log is history, not a GC root: see maintenance.gc for why.

A move may be conditional (``expect``): a compare-and-set made in the same
transaction as the move, so two writers that read the same ref cannot both
move it, the second overwriting the first without knowing.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import lmdb

from ..errors import CorruptDataError, RefConflictError, StoreError

MIN_PREFIX = 8           # shortest snapshot-id prefix Store.resolve() accepts
_ENTRY = struct.Struct(">d32s32s")
_NO_ID = bytes(32)
ANY = object()           # set_ref's ``expect`` for a move made wherever the ref is


@dataclass(frozen=True)
class RefLogEntry:
    """One move of a ref: when, from which snapshot (None when created), to which."""

    time: float
    old: str | None
    new: str


def _log_prefix(name: str) -> bytes:
    return name.encode("utf-8") + b"\0"


def get_ref(txn: lmdb.Transaction, dbs: dict, name: str) -> bytes | None:
    value = txn.get(name.encode("utf-8"), db=dbs["refs"])
    return None if value is None else bytes(value)


def set_ref(txn: lmdb.Transaction, dbs: dict, name: str, sid: bytes, now: float,
            expect: bytes | None | object = ANY) -> None:
    """Point ``name`` at ``sid`` and log the move (a no-op move is not logged).

    ``expect``: the id ``name`` must hold now (None: it must not exist), else
    RefConflictError before anything is written, so a refused move leaves no log entry.
    """
    old = get_ref(txn, dbs, name)
    if expect is not ANY and old != expect:
        now_at = f"is at {old.hex()[:12]}" if old is not None else "does not exist"
        wanted = expect.hex()[:12] if expect is not None else "no ref"
        raise RefConflictError(f"ref '{name}' {now_at} (this move expected {wanted}): another writer "
                               "changed it meanwhile, and it was left as it is")
    if old == sid:
        return
    txn.put(name.encode("utf-8"), sid, db=dbs["refs"])
    prefix = _log_prefix(name)
    seq = 0
    cur = txn.cursor(db=dbs["reflog"])
    # Last entry of this ref: position past the prefix range, then step back.
    if cur.set_range(prefix + b"\xff" * 8 + b"\x00"):
        found = cur.prev()
    else:
        found = cur.last()
    if found and bytes(cur.key()).startswith(prefix):
        seq = int.from_bytes(bytes(cur.key())[len(prefix):], "big") + 1
    txn.put(prefix + seq.to_bytes(8, "big"), _ENTRY.pack(now, old or _NO_ID, sid),
            db=dbs["reflog"])


def delete_ref(txn: lmdb.Transaction, dbs: dict, name: str) -> bool:
    """Remove the ref and its whole log (like deleting a git branch). False if absent."""
    if not txn.delete(name.encode("utf-8"), db=dbs["refs"]):
        return False
    prefix = _log_prefix(name)
    cur = txn.cursor(db=dbs["reflog"])
    dead = []
    if cur.set_range(prefix):
        for key in cur.iternext(keys=True, values=False):
            if not bytes(key).startswith(prefix):
                break
            dead.append(bytes(key))
    for key in dead:
        txn.delete(key, db=dbs["reflog"])
    return True


def all_refs(txn: lmdb.Transaction, dbs: dict) -> dict[str, bytes]:
    cur = txn.cursor(db=dbs["refs"])
    return {_ref_name(bytes(k)): bytes(v) for k, v in cur.iternext()}


def _ref_name(key: bytes) -> str:
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:  # names are written as UTF-8: these bytes were damaged on disk
        raise CorruptDataError(f"a ref's name is not UTF-8 ({key[:64]!r}); the store is damaged") from None


def log(txn: lmdb.Transaction, dbs: dict, name: str) -> list[RefLogEntry]:
    prefix = _log_prefix(name)
    out = []
    cur = txn.cursor(db=dbs["reflog"])
    if cur.set_range(prefix):
        for key, value in cur.iternext():
            if not bytes(key).startswith(prefix):
                break
            t, old, new = _ENTRY.unpack(bytes(value))
            out.append(RefLogEntry(t, None if old == _NO_ID else old.hex(), new.hex()))
    return out


def resolve_here(txn: lmdb.Transaction, dbs: dict, text: str) -> str | None:
    """A ref of this store, else a unique prefix (>= MIN_PREFIX hex digits) of a
    stored snapshot id: the snapshot id; None if neither. An ambiguous prefix is an error."""
    sid = get_ref(txn, dbs, text)
    if sid is not None:
        return sid.hex()
    hexed = text.lower()
    if len(hexed) < MIN_PREFIX or not set(hexed) <= set("0123456789abcdef"):
        return None
    found = _ids_with_prefix(txn, dbs, hexed)
    if len(found) > 1:
        shown = ", ".join(f[:16] for f in found[:4])
        raise StoreError(f"snapshot id prefix {text!r} is ambiguous ({shown}, ...)")
    return found[0] if found else None


def _ids_with_prefix(txn: lmdb.Transaction, dbs: dict, prefix: str) -> list[str]:
    cur = txn.cursor(db=dbs["manifests"])
    start = bytes.fromhex(prefix[: len(prefix) // 2 * 2])
    found = []
    if cur.set_range(start):
        for k in cur.iternext(keys=True, values=False):
            h = bytes(k).hex()
            if not h.startswith(prefix):
                break
            found.append(h)
            if len(found) > 4:
                break
    return found
