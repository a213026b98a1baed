"""A structural check of data.mdb before LMDB maps it, and of values LMDB hands back.

LMDB (0.9) bounds the page numbers it follows by the transaction's last page, but
trusts everything inside a page: a node's offset, a key's size, a value's size, a
page's flags. A damaged one sends a read past the end of the file (SIGBUS) or of
the map (SIGSEGV), and a write into a page marked dirty on disk writes into the
read-only map (SIGSEGV). So before the store opens, :func:`check_file` walks the
newest transaction's B-trees the way LMDB would (the free-page tree, the main
tree and every named database under it) with plain file reads, and checks every
branch and leaf page: its number and flags, its bounds, each node's offset and
sizes, each child and overflow page number, each overflow run against the file's
end and the other pages. Overflow contents (our page and manifest records) are
not read: :func:`check_value` checks a value's place and its overflow header
when it is read. Layout from lmdb's mdb.c (MDB_page, MDB_node, MDB_db, MDB_meta;
64-bit page numbers, little-endian).
"""
from __future__ import annotations

import ctypes
import os
import struct
from typing import NamedTuple

import numpy as np

from ..errors import StoreError

PAGEHDRSZ = 16
NODESIZE = 8
P_BRANCH, P_LEAF, P_OVERFLOW, P_META = 0x01, 0x02, 0x04, 0x08
F_BIGDATA, F_SUBDATA = 0x01, 0x02
P_INVALID = (1 << 64) - 1
MAX_KEY = 511            # MDB_MAXKEYSIZE
MAX_DEPTH = 32           # CURSOR_STACK: the deepest tree LMDB walks
MAGIC, VERSION = 0xBEEFC0DE, 1
RETRIES = 4              # walks that another process's commits may spoil before we give up checking

_DB = struct.Struct("<IHHQQQQQ")  # MDB_db: pad, flags, depth, branch, leaf, overflow pages, entries, root
_META = struct.Struct("<10xH4xII16x48s48sQQ")  # page flags; magic, version; free db, main db; last page, txnid
_HDR = np.dtype([("pgno", "<u8"), ("pad", "<u2"), ("flags", "<u2"), ("lower", "<u2"), ("upper", "<u2")])
_OV = struct.Struct("<QHHI")  # an overflow page's header: pgno, pad, flags, page count


class Damage(Exception):
    """What is wrong with data.mdb, in words (check_file adds the path)."""


class Meta(NamedTuple):
    psize: int
    npages: int  # the newest transaction's last page + 1
    txnid: int
    free: tuple
    main: tuple


def read_meta(fd: int) -> Meta | None:
    """The meta LMDB would use (the higher transaction id, page 0 on a tie), or None if
    the file is no LMDB file (LMDB's own open says so).

    Each commit writes the next transaction id to meta page ``txnid % 2``, so the two
    pages hold consecutive ids (both 0 before the first commit), the newer on the page of
    its parity. A damaged id (a flipped bit) that makes the older page look newer would
    have LMDB open the transaction before the last, silently: that is refused (another
    process committing between our two reads is told apart by reading again)."""
    seen = None
    for _ in range(RETRIES):
        pair = _read_metas(fd)
        if pair is None:
            return None
        ids = (pair[0].txnid, pair[1].txnid)
        newer = pair[ids[0] < ids[1]]
        if ids == (0, 0) or (abs(ids[0] - ids[1]) == 1 and max(ids) % 2 == int(ids[0] < ids[1])):
            return newer
        if ids == seen:
            raise Damage(f"its meta pages hold transaction ids {ids[0]} and {ids[1]}, which no two "
                         f"consecutive commits write: one was damaged")
        seen = ids
    return newer  # it keeps changing: a writer commits all the while, and the walk checks what it reads


def _read_metas(fd: int) -> tuple[Meta, Meta] | None:
    head = os.pread(fd, 512, 0)
    if len(head) < _META.size:
        return None
    metas = []
    for off in (0, struct.unpack_from("<I", head, 40)[0]):
        raw = os.pread(fd, _META.size, off) if off else head
        if len(raw) < _META.size:
            return None
        flags, magic, version, free, main, last, txnid = _META.unpack_from(raw)
        if not flags & P_META or magic != MAGIC or version != VERSION:
            return None  # lmdb.open refuses it (MDB_INVALID, MDB_VERSION_MISMATCH)
        metas.append(Meta(_DB.unpack(free)[0], last + 1, txnid, _DB.unpack(free), _DB.unpack(main)))
    m = metas[metas[0].txnid < metas[1].txnid]
    if metas[0].psize != metas[1].psize or m.psize & (m.psize - 1) or not 512 <= m.psize <= 65536:
        raise Damage(f"its meta pages give page sizes {metas[0].psize} and {metas[1].psize}")
    return metas[0], metas[1]


def check_file(data: str) -> None:
    """Walk data.mdb's newest transaction; a StoreError naming the file says what is damaged.

    Another process may commit while we read: LMDB reuses a page two commits after the
    one that freed it, so a walk that finds damage is believed only if the newest
    transaction is still the one walked; else it walks again (a store that keeps
    changing under every try is let through: its writers read it without harm)."""
    try:
        fd = os.open(data, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return
    except OSError as e:
        raise StoreError(f"cannot read {data}: {e.strerror or e}") from None
    try:
        for _ in range(RETRIES):
            try:
                meta = read_meta(fd)
                if meta is None:
                    return
                _Walk(fd, meta).run()
                return
            except Damage as e:
                again = _quiet(read_meta, fd)
                if again is None or again.txnid == getattr(meta, "txnid", None) or "meta pages" in str(e):
                    raise StoreError(f"{data}: {e}; the store is damaged: restore it from a backup") from None
    except OSError as e:
        raise StoreError(f"cannot read {data}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def _quiet(fn, *args):
    try:
        return fn(*args)
    except Damage:
        return None


class _Walk:
    """One breadth-first pass over every tree, a level of pages at a time (numpy over all
    the nodes of a level: a store of 100k records has some 1,500 leaf pages)."""

    def __init__(self, fd: int, meta: Meta) -> None:
        self.fd, self.psize, self.npages = fd, meta.psize, meta.npages
        self.names = ["the free-page tree", "the main tree"]
        self.depths = [meta.free[2], meta.main[2]]
        self.seen = np.zeros(self.npages, bool)  # tree pages visited
        self.runs: list[tuple[np.ndarray, np.ndarray]] = []  # (first page, count) of every page and overflow run
        self.level: list[tuple[int, int, int]] = []  # (page, tree, depth) to read next
        self.free_values: list[tuple[int, bytes]] = []  # the free-page tree's records: (page, data)
        for tree, db in enumerate((meta.free, meta.main)):
            self._root(tree, db, "its meta page")

    def _root(self, tree: int, db: tuple, where: str) -> None:
        root, depth = db[7], db[2]
        if root == P_INVALID:
            return
        if not 1 <= depth <= MAX_DEPTH:
            raise Damage(f"{where} gives {self.names[tree]} a depth of {depth}")
        self.level.append((self._pgno(root, where), tree, 1))

    def _pgno(self, pgno: int, where: str) -> int:
        if not 2 <= pgno < self.npages:
            raise Damage(f"{where} names page {pgno} past the file's {self.npages} pages" if pgno >= self.npages
                         else f"{where} names meta page {pgno} as a tree page")
        return pgno

    def run(self) -> None:
        while self.level:
            level, self.level = self.level, []
            self._visit(level)
        self._check_free_list()
        self._check_overlaps()

    def _visit(self, level: list[tuple[int, int, int]]) -> None:
        pgnos = np.array([p for p, _, _ in level], np.int64)
        trees = np.array([t for _, t, _ in level], np.int64)
        depths = np.array([d for _, _, d in level], np.int64)
        order = np.sort(pgnos)
        again = np.flatnonzero(self.seen[pgnos] | np.isin(pgnos, order[1:][order[1:] == order[:-1]]))
        if len(again):
            raise Damage(f"page {pgnos[again[0]]} is reached twice (by two nodes, or a tree that loops)")
        self.seen[pgnos] = True
        self.runs.append((pgnos, np.ones_like(pgnos)))
        pages = self._read(pgnos)
        hdr = pages[:, :PAGEHDRSZ].copy().view(_HDR).ravel()
        nkeys = self._check_headers(pgnos, trees, depths, hdr)
        n = len(pgnos)
        page_of = np.repeat(np.arange(n), nkeys)
        slot = np.arange(len(page_of)) - np.repeat(np.cumsum(nkeys) - nkeys, nkeys)
        flat = pages.reshape(-1)
        words = flat.view("<u2")  # pointers and node headers sit at even offsets (checked before use)
        base = page_of * self.psize
        ptr = words[(base >> 1) + PAGEHDRSZ // 2 + slot].astype(np.int64)
        bad = (ptr < hdr["upper"][page_of]) | (ptr > self.psize - NODESIZE) | (ptr & 1 == 1)
        self._fail(bad, lambda i: f"page {pgnos[page_of[i]]} puts node {slot[i]} at offset {ptr[i]}, outside "
                   f"its node area ({hdr['upper'][page_of[i]]}..{self.psize})")
        node = base + ptr
        lo, hi, fl, ks = words[(node >> 1)[:, None] + np.arange(4)].astype(np.int64).T
        leaf = hdr["flags"][page_of] == P_LEAF
        end = ptr + NODESIZE + ks
        bad = (end > self.psize) | (ks > MAX_KEY) | ((ks == 0) & (leaf | (slot > 0)))
        self._fail(bad, lambda i: f"page {pgnos[page_of[i]]} node {slot[i]} has a key of {ks[i]} bytes")
        b = ~leaf
        self._branches(pgnos[page_of[b]], trees[page_of[b]], depths[page_of[b]],
                       lo[b] | (hi[b] << 16) | (fl[b] << 32))
        self._leaves(flat, pgnos[page_of[leaf]], trees[page_of[leaf]], slot[leaf], end[leaf], node[leaf],
                     fl[leaf], lo[leaf] | (hi[leaf] << 16))

    def _check_headers(self, pgnos, trees, depths, hdr) -> np.ndarray:
        psize = self.psize

        def at(i) -> str:
            return f"page {pgnos[i]} (of {self.names[trees[i]]})"

        self._fail(hdr["pgno"] != pgnos, lambda i: f"{at(i)} says it is page {hdr['pgno'][i]}")
        tree_depth = np.array(self.depths)[trees]
        want = np.where(depths == tree_depth, P_LEAF, P_BRANCH)
        self._fail(hdr["flags"] != want, lambda i: f"{at(i)} has flags {hdr['flags'][i]:#x} at depth {depths[i]} "
                   f"of {tree_depth[i]}, where a {'leaf' if want[i] == P_LEAF else 'branch'} page belongs")
        lower, upper = hdr["lower"].astype(np.int64), hdr["upper"].astype(np.int64)
        self._fail((lower < PAGEHDRSZ) | (lower > upper) | (upper > psize) | (lower & 1 == 1),
                   lambda i: f"{at(i)} has its free space at {lower[i]}..{upper[i]} of {psize} bytes")
        nkeys = (lower - PAGEHDRSZ) // 2
        self._fail(nkeys < np.where(want == P_LEAF, 1, 1 + (trees > 0)),
                   lambda i: f"{at(i)} holds {nkeys[i]} nodes")
        return nkeys

    def _branches(self, pgnos, trees, depths, child) -> None:
        bad = (child < 2) | (child >= self.npages)
        self._fail(bad, lambda i: f"page {pgnos[i]} names page {child[i]} past the file's {self.npages} pages"
                   if child[i] >= self.npages else f"page {pgnos[i]} names meta page {child[i]} as a child")
        self.level.extend(zip(child.tolist(), trees.tolist(), (depths + 1).tolist()))

    def _leaves(self, flat, pgnos, trees, slot, end, node, fl, size) -> None:
        main = trees == 1
        big = fl == F_BIGDATA
        self._fail(np.where(main, fl != F_SUBDATA, (fl != 0) & ~big),
                   lambda i: f"page {pgnos[i]} node {slot[i]} has flags {fl[i]:#x}")
        self._fail(main & (size != _DB.size), lambda i: f"page {pgnos[i]} node {slot[i]} describes a database "
                   f"in {size[i]} bytes, not {_DB.size}")
        self._fail(end + np.where(big, 8, size) > self.psize, lambda i: f"page {pgnos[i]} node {slot[i]} has a "
                   f"value of {size[i]} bytes, past the page's end")
        data = node + (end - node % self.psize)  # where each value (or its overflow page number) starts in flat
        first = _u64(flat, data[big]) if big.any() else np.zeros(0, np.int64)
        if big.any():
            self._overflow(pgnos[big], slot[big], first, size[big])
        first_of = dict(zip(np.flatnonzero(big).tolist(), first.tolist()))
        for i in np.flatnonzero(trees == 0).tolist():
            at = first_of[i] * self.psize + PAGEHDRSZ if big[i] else None
            self.free_values.append((int(pgnos[i]), flat[data[i]:data[i] + size[i]].tobytes() if at is None
                                     else os.pread(self.fd, int(size[i]), at)))
        for i in np.flatnonzero(main).tolist():
            key = flat[node[i] + NODESIZE:data[i]].tobytes()
            db = _DB.unpack(flat[data[i]:data[i] + _DB.size].tobytes())
            self.names.append(f"database {key.decode(errors='replace')!r}")
            self.depths.append(db[2])
            if db[1] & 0x74:  # MDB_DUPSORT, DUPFIXED, INTEGERDUP, REVERSEDUP: sub-pages the store never makes
                raise Damage(f"page {pgnos[i]} gives {self.names[-1]} flags {db[1]:#x}")
            self._root(len(self.names) - 1, db, f"page {pgnos[i]} ({self.names[-1]})")

    def _overflow(self, pgnos, slot, first, size) -> None:
        count = (PAGEHDRSZ - 1 + size) // self.psize + 1  # OVPAGES
        bad = (first < 2) | (first >= self.npages) | (first + count > self.npages)
        self._fail(bad, lambda i: f"page {pgnos[i]} node {slot[i]} names overflow pages {first[i]}.."
                   f"{first[i] + count[i] - 1}, past the file's {self.npages} pages")
        self.runs.append((first, count))

    def _check_free_list(self) -> None:
        """Each record of the free-page tree is a count and that many page numbers (a
        writer copies them all): the count must fit the record, and the pages the file."""
        for pgno, data in self.free_values:
            count = struct.unpack_from("<Q", data)[0] if len(data) >= 8 else -1
            if not 0 <= count < len(data) // 8:
                raise Damage(f"page {pgno} holds a free-page list of {count} pages in {len(data)} bytes")
            ids = np.frombuffer(data, "<u8", count, 8)
            if count and (int(ids.max()) >= self.npages or int(ids.min()) < 2):
                raise Damage(f"page {pgno} lists free pages {ids.min()}..{ids.max()} of the file's {self.npages}")

    def _check_overlaps(self) -> None:
        first = np.concatenate([f for f, _ in self.runs])
        count = np.concatenate([c for _, c in self.runs])
        used = np.bincount(first, minlength=self.npages + 1) - np.bincount(first + count, minlength=self.npages + 1)
        twice = np.flatnonzero(np.cumsum(used) > 1)
        if len(twice):
            raise Damage(f"page {twice[0]} is used twice (two records name overlapping overflow pages)")

    def _read(self, pgnos: np.ndarray) -> np.ndarray:
        psize = self.psize
        out = bytearray(len(pgnos) * psize)
        for i, p in enumerate(pgnos.tolist()):
            chunk = os.pread(self.fd, psize, p * psize)
            if len(chunk) < psize:
                raise Damage(f"page {p} lies past the end of the file")
            out[i * psize:(i + 1) * psize] = chunk
        return np.frombuffer(out, np.uint8).reshape(len(pgnos), psize)

    @staticmethod
    def _fail(bad: np.ndarray, say) -> None:
        if bad.any():
            raise Damage(say(int(np.flatnonzero(bad)[0])))


def _u64(flat: np.ndarray, at: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(flat[at[:, None] + np.arange(8)]).view("<u8").ravel().astype(np.int64)


def value_address(value) -> int:
    """Where a memoryview LMDB handed back (``buffers=True``) starts in memory."""
    return np.frombuffer(value, np.uint8).__array_interface__["data"][0] if len(value) else 0


def check_value(value, map_addr: int, map_end: int, file_size: int, psize: int) -> str | None:
    """What is wrong with a value LMDB returned as a memoryview, or None.

    One that starts in the map must end inside the file's part of it (one outside
    the map is a page a write transaction copied to the heap: LMDB's own); one that starts an overflow run
    (16 bytes into a page) must have that page's header: its own page number, the
    overflow flag alone, and enough pages for the value (a delete frees that many)."""
    addr = value_address(value) if len(value) else -1
    if not map_addr <= addr < map_end:
        return None
    start = addr - map_addr
    end = start + len(value)
    if end > file_size:
        return f"a value of {len(value)} bytes at offset {start} lies outside the file's {file_size} bytes"
    if start % psize != PAGEHDRSZ:
        return None
    pgno = start // psize
    mp_pgno, _, flags, pages = _OV.unpack(ctypes.string_at(map_addr + pgno * psize, _OV.size))
    if mp_pgno != pgno or flags != P_OVERFLOW or pages * psize < PAGEHDRSZ + len(value) \
            or (pgno + pages) * psize > file_size:
        return (f"overflow page {pgno} has the header of page {mp_pgno} with flags {flags:#x} and {pages} pages, "
                f"for a value of {len(value)} bytes")
    return None


def map_range(data: str) -> tuple[int, int]:
    """Where this process maps ``data`` (LMDB's map of data.mdb): its first and end address,
    from /proc/self/maps; (-1, -1) where there is none to read (then check_value passes all)."""
    try:
        ino = os.stat(data).st_ino
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split(None, 5)
                if len(fields) == 6 and fields[2] == "00000000" and int(fields[4]) == ino \
                        and os.path.realpath(fields[5].strip()) == os.path.realpath(data):
                    start, end = fields[0].split("-")
                    return int(start, 16), int(end, 16)
    except (OSError, ValueError):
        pass
    return -1, -1
