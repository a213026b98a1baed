"""The LMDB environment under a store: one per path per process, growing on demand.

LMDB gives us what a snapshot store needs — one writer and many readers across
processes, transactions that are all-or-nothing even under ``kill -9`` — but it
has three sharp edges this module hides:

* The map size is fixed when the environment opens. When a write finds the map
  full we abort, double the map and rerun the whole transaction (callers pass a
  function, not an open transaction, so it can be replayed). Big writes pass a
  size hint so we usually grow once up front instead of failing half-way.
* When *another* process has grown the map past ours, beginning a transaction
  fails with MapResizedError; we adopt the new size and retry.
* ``mdb_env_set_mapsize`` must not run while this process has any transaction
  open, and LMDB forbids opening one environment twice in a process. So every
  Store on a path shares one :class:`Env`, whose read/write helpers hold a
  shared lock and whose resizes take it exclusively.

Do not carry an open store across ``fork()``; open it in the child. Do not
call ``write`` inside a ``read`` block of the same Env: a resize would wait for
the shared lock that very block holds.
"""
from __future__ import annotations

import errno
import os
import stat
import struct
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

import lmdb

from ..errors import StorageError, StoreError
from .lmdb_check import check_file, check_value, map_range

T = TypeVar("T")
# What LMDB answers when a page it reads is damaged (LMDB's MDB_CORRUPTED, MDB_PAGE_NOTFOUND, ...),
# as opposed to the disk failing a write.
_DAMAGE = (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.PageFullError, lmdb.IncompatibleError,
           lmdb.BadValsizeError)

DB_NAMES = ("pages", "manifests", "refs", "reflog", "meta", "pending")
STORE_FORMAT = 1         # layout of the LMDB databases (meta b"format")


class _RWLock:
    """Many shared holders or one exclusive holder (threads of this process)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive or self._shared:
                self._cond.wait()
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


# LMDB's meta pages (pages 0 and 1; lmdb's mdb.c, MDB_page then MDB_meta, 64-bit): the
# magic, the page size (the free list's md_pad), the last page used and the transaction.
_META_MAGIC = 0xBEEFC0DE
_META = struct.Struct("<16xII16xI92xQQ")  # magic, version, psize, last_pgno, txnid
EMPTY_WAIT_S = 2.0  # how long an empty data.mdb may take to get its meta pages (a store being created)


def check_store_files(path: str) -> None:
    """Refuse a store whose data.mdb or lock.mdb is not a regular file (a FIFO would hang
    the open, a device or directory would fail deep inside LMDB), then check data.mdb."""
    for name in ("lock.mdb", "data.mdb"):
        _check_regular(os.path.join(path, name))
    check_data_file(os.path.join(path, "data.mdb"))
    check_file(os.path.join(path, "data.mdb"))  # every page number, node and size LMDB will follow


def _check_regular(file: str) -> None:
    try:
        st = os.stat(file)  # stat opens nothing, so a FIFO cannot block here
    except FileNotFoundError:
        return  # a new store: LMDB creates it
    except OSError as e:
        raise StoreError(f"cannot read {file}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise StoreError(f"{file} is not a regular file (a snapshot store keeps LMDB's data.mdb and lock.mdb "
                         "as plain files)")


def _read_head(data: str, n: int) -> tuple[bytes, int] | None:
    """The first ``n`` bytes of ``data`` and its size; None if it does not exist."""
    # O_NONBLOCK: a FIFO swapped in since _check_regular must not hang the open (no effect on files).
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(data, flags)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StoreError(f"cannot read {data}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(f"{data} is not a regular file")
        return os.read(fd, n), st.st_size
    except OSError as e:
        raise StoreError(f"cannot read {data}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def check_data_file(data: str) -> None:
    """Refuse a data.mdb shorter than its newest meta page says it is (a partial copy, a
    disk that filled): LMDB maps it and trusts its page numbers, so reading a page past
    the end kills the process with SIGBUS, where this is a StoreError."""
    found = _read_head(data, 64 << 10)
    if found is None:
        return  # a new store: LMDB creates it
    head, size = found
    waited = 0.0
    while size == 0 and waited < EMPTY_WAIT_S:  # another process creating the store writes its metas now
        time.sleep(0.05)
        waited += 0.05
        head, size = _read_head(data, 64 << 10) or (b"", 0)
    if size == 0:
        # LMDB would start a new store on it in silence, as though it never held anything
        raise StoreError(f"{data} is empty (truncated to nothing, or its creation was cut off): it holds no "
                         "snapshots; restore it from a backup, or remove it to start a new store")
    metas = []
    if len(head) >= _META.size:
        metas.append(_META.unpack_from(head, 0))
        psize = metas[0][2]
        if metas[0][0] == _META_MAGIC and 512 <= psize <= len(head) - _META.size:
            metas.append(_META.unpack_from(head, psize))
    valid = [m for m in metas if m[0] == _META_MAGIC]
    if size and not valid:
        return  # not an LMDB file at all: lmdb.open names it (MDB_INVALID)
    if valid:
        magic, _, psize, last_pgno, _ = max(valid, key=lambda m: m[4])
        need = (last_pgno + 1) * metas[0][2]
        if size < need:
            raise StoreError(f"{data} is truncated: {size:,} bytes, but its last transaction uses {need:,} "
                             "(a partial copy, or a disk that filled?): restore it from a backup or copy it again")


MAX_READERS = 256
# lock.mdb's bytes: LMDB's reader table (64 bytes a reader slot) and its header, with room over.
LOCK_BYTES = 64 * MAX_READERS + 4096


def reserve_lock_file(path: str) -> None:
    """Allocate lock.mdb's bytes on disk before LMDB maps it. LMDB sizes the file with
    ftruncate, which reserves nothing, and writes its reader slots through the mapping: on
    a full filesystem the first write into a page with no room was a SIGBUS, and the process
    died without a word (opening or making a store, and a reader taking a fresh slot). A
    full disk is now a StorageError naming the store, before LMDB touches the file."""
    lock = os.path.join(path, "lock.mdb")
    try:
        os.makedirs(path, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return  # not ours to word: lmdb.open says what is wrong with the path
    try:
        os.posix_fallocate(fd, 0, LOCK_BYTES)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StorageError(f"cannot open snapshot store at {path}: no room for its lock file ({e.strerror}: "
                               "is its disk full?)") from None
        # else (a filesystem that cannot allocate ahead) LMDB goes on as it always did
    finally:
        os.close(fd)


class Env:
    _registry: dict[str, "Env"] = {}
    _registry_lock = threading.Lock()

    @classmethod
    def acquire(cls, path: str, map_size: int) -> "Env":
        """The shared Env for ``path`` (opened on first use), with one more user."""
        key = os.path.realpath(path)
        with cls._registry_lock:
            env = cls._registry.get(key)
            if env is None:
                env = cls._registry[key] = cls(key, map_size)
            env._users += 1
            return env

    def __init__(self, path: str, map_size: int) -> None:
        self.path = path
        self._users = 0
        self._lock = _RWLock()
        self._map: tuple[int, ...] | None = None  # data.mdb's map (first, end address), file size, page size
        check_store_files(path)
        reserve_lock_file(path)
        try:
            # readahead off: pages are read at random, and a large store would
            # otherwise pull neighbouring (unwanted) pages into the page cache.
            self.env = lmdb.open(path, map_size=max(int(map_size), 1 << 16), subdir=True,
                                 max_dbs=len(DB_NAMES) + 2, readahead=False, max_readers=MAX_READERS)
        except lmdb.Error as e:
            raise StoreError(f"cannot open snapshot store at {path}: {e}") from None
        try:
            # Free reader slots left by processes that died (kill -9) holding a read
            # transaction; until then LMDB could not reuse the pages they pinned.
            self.env.reader_check()
            for _ in range(8):  # another process may be growing the map right now
                try:
                    self.dbs = {name: self.env.open_db(name.encode()) for name in DB_NAMES}
                    break
                except lmdb.MapResizedError:
                    self.env.set_mapsize(0)
            else:
                raise StoreError(f"cannot open snapshot store at {path}: its map keeps changing size")
        except BaseException as e:
            self.env.close()  # else LMDB would refuse to open this path again in this process
            if isinstance(e, lmdb.Error):
                raise StoreError(f"cannot open snapshot store at {path}: {e}") from None
            raise

    def release(self) -> None:
        with self._registry_lock:
            self._users -= 1
            if self._users > 0:
                return
            del self._registry[self.path]
        with self._lock.exclusive():
            self.env.close()

    # -- transactions ---------------------------------------------------------

    def checked(self, value, what: str):
        """``value`` as a read with ``buffers=True`` returned it (a memoryview onto the map, or
        None), once it is known to lie inside data.mdb with a sound overflow header: a value
        damaged to reach past the file's end was a SIGBUS when copied. Call it inside the
        read or write block that produced the value."""
        if not isinstance(value, memoryview) or not len(value):
            return value
        wrong = check_value(value, *(self._map or self._find_map()))
        if wrong and (wrong := check_value(value, *self._find_map())):  # the map moved, or the file grew
            raise StoreError(f"snapshot store {self.path}: {what}: {wrong}; the store is damaged: "
                             "restore it from a backup")
        return value

    def _find_map(self) -> tuple[int, ...]:
        data = os.path.join(self.path, "data.mdb")
        self._map = (*map_range(data), os.stat(data).st_size, self.env.stat()["psize"])
        return self._map

    @contextmanager
    def read(self, buffers: bool = False) -> Iterator[lmdb.Transaction]:
        """A read transaction (a consistent snapshot of the whole store).

        With ``buffers=True`` values are memoryviews valid only inside the block.
        """
        while True:
            with self._lock.shared():
                try:
                    txn = self.env.begin(buffers=buffers)
                except lmdb.MapResizedError:
                    txn = None
                except lmdb.Error as e:
                    raise StoreError(f"snapshot store {self.path}: {e}") from None
                if txn is not None:
                    try:
                        yield txn
                    except lmdb.Error as e:
                        raise StoreError(f"snapshot store {self.path}: {e}") from None
                    finally:
                        txn.abort()
                    return
            self._adopt_size()

    def write(self, fn: Callable[[lmdb.Transaction], T], size_hint: int = 0,
              buffers: bool = False) -> T:
        """Run ``fn(txn)`` in one write transaction and commit; replayed if the map fills.

        ``fn`` must have no effects outside the transaction (it may run several
        times). Any exception it raises aborts the transaction: nothing is written.
        With ``buffers=True`` values read are memoryviews that the next write in
        the transaction invalidates.
        """
        self._reserve(size_hint)
        while True:
            with self._lock.shared():
                try:
                    with self.env.begin(write=True, buffers=buffers) as txn:
                        return fn(txn)
                except lmdb.MapFullError:
                    resized = False
                except lmdb.MapResizedError:
                    resized = True
                except _DAMAGE as e:
                    raise StoreError(f"snapshot store {self.path}: a write found the store damaged ({e}); nothing "
                                     "of it kept: restore the store from a backup") from None
                except lmdb.Error as e:  # the commit's disk (full, failing), not the caller's input
                    raise StorageError(f"snapshot store {self.path}: a write failed, nothing of it kept ({e}): "
                                       "is its disk full?") from None
            if resized:
                self._adopt_size()
            else:
                self._grow(self.map_size() * 2)

    # -- map size -------------------------------------------------------------

    # env.info() / env.stat() must not run while another thread resizes the
    # map (LMDB answers EINVAL), so they read under the shared lock.
    def map_size(self) -> int:
        with self._lock.shared():
            return self._map_size_unlocked()

    def used_bytes(self) -> int:
        with self._lock.shared():
            return (self.env.info()["last_pgno"] + 1) * self.env.stat()["psize"]

    def _map_size_unlocked(self) -> int:
        return self.env.info()["map_size"]

    def _reserve(self, size_hint: int) -> None:
        """Grow before a big write so it does not fill the map half-way and replay."""
        if size_hint <= 0:
            return
        # B-tree and free-list overhead on top of the values; generous on purpose.
        need = self.used_bytes() + int(size_hint * 1.25) + (1 << 20)
        size = self.map_size()
        if need > size:
            while size < need:
                size *= 2
            self._grow(size)

    def _grow(self, new_size: int) -> None:
        with self._lock.exclusive():
            self._map = None  # the map moves
            if new_size > self._map_size_unlocked():  # another thread may have grown it already
                try:
                    self.env.set_mapsize(new_size)
                except lmdb.Error as e:
                    raise StoreError(f"cannot grow snapshot store {self.path} to "
                                     f"{new_size} bytes: {e}") from None

    def _adopt_size(self) -> None:
        """Another process grew the map: take its size (0 means 'as recorded on disk')."""
        with self._lock.exclusive():
            self._map = None
            self.env.set_mapsize(0)


def check_format(env: "Env", path) -> None:
    """Stamp a new store with STORE_FORMAT; refuse one written in another format."""
    with env.read() as txn:
        found = txn.get(b"format", db=env.dbs["meta"])
    if found is None:  # a new store (or one whose creator died before this line)
        env.write(lambda txn: txn.put(b"format", str(STORE_FORMAT).encode(), db=env.dbs["meta"], overwrite=False))
        return
    if found != str(STORE_FORMAT).encode():
        raise StoreError(f"snapshot store {path} has format {found.decode(errors='replace')}; "
                         f"this ctxengine reads format {STORE_FORMAT}")
