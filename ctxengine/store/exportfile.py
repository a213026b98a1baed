"""Portable snapshot files: one snapshot and its pages in a self-checking stream.

Layout (format 1, integers little-endian; see docs/store-format.md)::

    header    8s magic b"CTXSNAP\\0", u32 version (1)
    manifest  u32 length, canonical manifest bytes
    pages     u32 count, then per distinct page in first-use order:
              32s key (raw BLAKE3 digest), u32 record length, page record
    trailer   8s magic b"CTXSEND\\0", 32s BLAKE3 of every byte before the trailer

Import reads and verifies the whole file first (structure, manifest, every
page against its key, the checksum, nothing after the trailer) and only then
writes, in one transaction, so a truncated or tampered file stores nothing.

Both work on the store's LMDB environment, writing as records.py does, so
``Store.export`` / ``Store.import_file`` call down here and nothing here knows
the Store.
"""
from __future__ import annotations

import os
import stat
import struct
import time
from pathlib import Path
from typing import BinaryIO, Callable

import blake3

from ..errors import CorruptDataError, StoreError
from . import pages as codec, records as records_, refs as refs_
from .lmdbenv import Env
from .manifest import Manifest
from .names import validate_name

MAGIC = b"CTXSNAP\0"
TRAILER_MAGIC = b"CTXSEND\0"
VERSION = 1
_HEAD = struct.Struct("<8sI")
_U32 = struct.Struct("<I")
_PAGE = struct.Struct("<32sI")
_TRAILER = struct.Struct("<8s32s")
_CHUNK = 1 << 20  # read in bounded pieces: a tampered length must not allocate gigabytes

Progress = Callable[[int, int], None] | None


def export(env: Env, sid: str, file, progress: Progress) -> None:
    """Write the snapshot to ``file``, a binary stream or a path. A path is written whole or not
    at all: through ``<name>.partial``, renamed over the name. It must name a regular file or
    nothing: a FIFO, device, directory or socket is refused rather than replaced by a file, and
    so is a symbolic link, even to a regular file: the rename would replace the link, not its
    target, and a link in a shared directory is how a write gets aimed at a file it must not touch."""
    if not isinstance(file, (str, os.PathLike)):
        _write(env, sid, file, progress)
        return
    path = Path(file)
    if not path.name:  # "" (which Path reads as ".") or "/"
        raise StoreError(f"cannot write {os.fspath(file)!r}: it names no file")
    tmp = path.with_name(path.name + ".partial")
    _check_writable(path)
    _check_writable(tmp)
    try:
        # O_NOFOLLOW: a link planted at the .partial name since the check must not be followed.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o666)
    except OSError as e:
        raise StoreError(f"cannot write {path}: {e}") from None
    try:
        with open(fd, "wb") as f:
            _write(env, sid, f, progress)
            f.flush()
            os.fsync(f.fileno())
        _check_writable(path)  # it may have appeared while the file was written
        os.replace(tmp, path)  # never leave a half-written file under the real name
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise StoreError(f"cannot write {path}: {e}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _check_writable(path: Path) -> None:
    """Refuse a path that names something other than a regular file (export's docstring says why)."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise StoreError(f"cannot write {path}: {e}") from None
    if not stat.S_ISREG(mode):
        raise StoreError(f"cannot write {path}: it is {_KINDS.get(stat.S_IFMT(mode), 'something else')}, "
                         "not a regular file")


_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symbolic link", stat.S_IFIFO: "a FIFO",
          stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


def _write(env: Env, sid: str, f: BinaryIO, progress: Progress) -> None:
    hasher = blake3.blake3()

    def out(b) -> None:
        hasher.update(b)
        f.write(b)

    dbs = env.dbs
    # One read transaction: the file is a consistent picture even if gc runs meanwhile.
    with env.read(buffers=True) as txn:
        record = env.checked(txn.get(bytes.fromhex(sid), db=dbs["manifests"]), f"snapshot {sid}")
        if record is None:
            raise StoreError(f"snapshot {sid} is not in the store")
        data = codec.decode(sid, record, what="snapshot")
        m = Manifest.from_bytes(data, what=f"snapshot {sid}")
        keys = list(dict.fromkeys(m.page_keys))
        out(_HEAD.pack(MAGIC, VERSION))
        out(_U32.pack(len(data)))
        out(data)
        out(_U32.pack(len(keys)))
        for i, key in enumerate(keys):
            kb = bytes.fromhex(key)
            rec = env.checked(txn.get(kb, db=dbs["pages"]), f"page {key}")
            if rec is None:
                raise StoreError(f"snapshot {sid} names page {key}, which the store lacks")
            codec.decode(key, rec)  # never ship a page that is already corrupt
            out(_PAGE.pack(kb, len(rec)))
            out(rec)
            if progress:
                progress(i + 1, len(keys))
    f.write(_TRAILER.pack(TRAILER_MAGIC, hasher.digest()))


class _Reader:
    """Reads exact byte counts, hashing them; a short read is a truncated file."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.hasher = blake3.blake3()

    def read(self, n: int, what: str, hashed: bool = True) -> bytes:
        parts, left = [], n
        while left:
            chunk = self.f.read(min(left, _CHUNK))
            if not chunk:
                raise CorruptDataError(f"snapshot file is truncated (in {what})")
            parts.append(chunk)
            left -= len(chunk)
        data = b"".join(parts)
        if hashed:
            self.hasher.update(data)
        return data


def import_file(env: Env, file, ref: str | None, progress: Progress) -> str:
    if ref is not None:
        validate_name(ref, "ref")
    if isinstance(file, (str, os.PathLike)):
        try:
            f = open(file, "rb")
        except OSError as e:
            raise StoreError(f"cannot read {file}: {e}") from None
        with f:
            return _import(env, f, ref, progress)
    return _import(env, file, ref, progress)


def _import(env: Env, f: BinaryIO, ref: str | None, progress: Progress) -> str:
    # Pass 1: verify everything, keeping (for the pages the store lacks) the
    # record itself, or only its offset when the file can be re-read.
    r = _Reader(f)
    magic, version = _HEAD.unpack(r.read(_HEAD.size, "the header"))
    if magic != MAGIC:
        raise CorruptDataError("not a ctx snapshot file (bad magic number)")
    if version != VERSION:
        raise CorruptDataError(f"snapshot file format {version} is not supported (this ctxengine reads {VERSION})")
    (mlen,) = _U32.unpack(r.read(_U32.size, "the manifest length"))
    data = r.read(mlen, "the manifest")
    m = Manifest.from_bytes(data, what="the manifest in the snapshot file")
    sid = codec.page_key(data)
    keys = list(dict.fromkeys(m.page_keys))
    (count,) = _U32.unpack(r.read(_U32.size, "the page count"))
    if count != len(keys):
        raise CorruptDataError(f"snapshot file holds {count} pages; its manifest names {len(keys)}")
    missing = set(records_.missing_pages(env, keys))
    try:
        seekable = f.seekable()
    except (AttributeError, OSError):
        seekable = False
    kept: dict[str, bytes | tuple[int, int]] = {}
    for i, key in enumerate(keys):
        kb, rlen = _PAGE.unpack(r.read(_PAGE.size, f"page {i + 1} of {count}"))
        if kb.hex() != key:
            raise CorruptDataError(f"page {i + 1} of the snapshot file is {kb.hex()}, expected {key}")
        offset = f.tell() if seekable else 0
        rec = r.read(rlen, f"page {key}")
        codec.decode(key, rec)
        if key in missing:
            kept[key] = (offset, rlen) if seekable else rec
        if progress:
            progress(i + 1, count)
    digest = r.hasher.digest()
    tmagic, tdigest = _TRAILER.unpack(r.read(_TRAILER.size, "the trailer", hashed=False))
    if tmagic != TRAILER_MAGIC:
        raise CorruptDataError("snapshot file has a bad trailer")
    if tdigest != digest:
        raise CorruptDataError("snapshot file checksum does not match its contents")
    if f.read(1):
        raise CorruptDataError("snapshot file has extra bytes after its trailer")

    # Pass 2: one write transaction. Re-read records are verified again, as the
    # file could have changed since pass 1.
    record = codec.encode(data)
    now = time.time()

    def write(txn) -> None:
        for key, where in kept.items():
            if isinstance(where, tuple):
                f.seek(where[0])
                rec = _Reader(f).read(where[1], f"page {key}", hashed=False)
                codec.decode(key, rec)
            else:
                rec = where
            txn.put(bytes.fromhex(key), rec, db=env.dbs["pages"], overwrite=False)
        records_.put_manifest(txn, env.dbs, sid, record, m.page_keys, {})
        if ref is not None:
            refs_.set_ref(txn, env.dbs, ref, bytes.fromhex(sid), now)

    size = sum(w[1] if isinstance(w, tuple) else len(w) for w in kept.values())
    env.write(write, size_hint=size + len(record))
    return sid
