"""Page and manifest records as one write transaction puts them: the rules
every writer of the store keeps (``Store`` and export-file import alike).

* a page record goes in once, under its key; pages stored ahead of their
  manifest are marked pending, so gc spares them for a grace period;
* a manifest record goes in only once every page it names is present, and
  then its pages are no longer pending.

Functions of an open transaction and the environment's databases, with no
effect outside that transaction (docs/store-format.md).
"""
from __future__ import annotations

import struct
import time
from collections.abc import Iterable, Mapping

from ..errors import StoreError
from . import pages as codec
from .lmdbenv import Env

_TIME = struct.Struct(">d")


def missing_pages(env: Env, keys: Iterable[str]) -> list[str]:
    """The keys (lowercased, first occurrence order, no duplicates) not stored."""
    wanted = list(dict.fromkeys(k.lower() if isinstance(k, str) else k for k in keys))
    raw_keys = [codec.key_bytes(k) for k in wanted]
    with env.read() as txn:
        cur = txn.cursor(db=env.dbs["pages"])
        return [k for k, kb in zip(wanted, raw_keys) if not cur.set_key(kb)]


def put_pages(txn, dbs: dict, records: Mapping[str, bytes], pending: Iterable[str] = ()) -> int:
    """Write the records absent from the store; return how many were new.

    Keys in ``pending`` (pages stored ahead of their manifest) are protected
    from gc for a grace period, whether or not they were new: a page already
    present may belong only to snapshots the next gc would collect.
    """
    written = 0
    for key, record in records.items():
        if txn.put(bytes.fromhex(key), record, db=dbs["pages"], overwrite=False):
            written += 1
    now = _TIME.pack(time.time())
    for key in pending:
        txn.put(bytes.fromhex(key), now, db=dbs["pending"])
    return written


def put_manifest(txn, dbs: dict, sid: str, record: bytes, page_keys: list[str],
                 raws: Mapping[str, bytes]) -> None:
    """Store a manifest record once all its pages are present.

    A page that vanished since we checked (a concurrent gc) is rewritten from
    ``raws`` when we have it; otherwise the manifest is refused.
    """
    cur = txn.cursor(db=dbs["pages"])
    missing = []
    for key in dict.fromkeys(page_keys):
        kb = bytes.fromhex(key)
        if not cur.set_key(kb):
            if key in raws:
                txn.put(kb, codec.encode(raws[key]), db=dbs["pages"])
            else:
                missing.append(key)
        txn.delete(kb, db=dbs["pending"])  # now referenced: gc's rules apply
    if missing:
        raise StoreError(f"snapshot {sid} names {len(missing)} page(s) the store lacks, "
                         f"e.g. {missing[0]}; store the pages first")
    txn.put(bytes.fromhex(sid), record, db=dbs["manifests"], overwrite=False)
