"""Downloaded bytes hashed and written on a thread of their own.

A pull has three things to do with every buffer: receive it, sha256 it and
write it. Done one after the other on one thread, a download runs at the
speed of their sum; here the receiving thread only hands each buffer over
and reads on, while a writer thread hashes and writes the buffers before it,
so the download runs at the speed of the slowest of the three. Socket reads,
``hashlib`` on buffers over 2 KiB and file writes all release the GIL, so the
two threads do run at once. http_fetch.py, the loop both pulls share, uses it.
"""
from __future__ import annotations

import hashlib
import os
import threading
from collections import deque
from pathlib import Path
from typing import BinaryIO, Callable

# Bytes handed to the writer and not yet written before write() waits. The slack only
# absorbs jitter (the writer, hashing and writing, sets the pace); each MiB of it the
# writer falls behind is 256 pages the process faults in fresh, which a guest whose host
# reclaims its idle memory pays dearly: 16 MiB took a 790 MB pull 1.48-1.58 s where 4 MiB
# took 1.26-1.35 s, alternated (docs/PERFORMANCE.md, session 33).
LIMIT = 4 << 20
READ = 8 << 20    # bytes a read of an earlier pull's partial file asks for


def hash_partial(partial: Path, size: int | None) -> tuple["hashlib._Hash", int]:
    """The sha256 of the bytes an interrupted pull left in partial, and how many there
    are (0 when there is none; a partial longer than the whole file cannot be right
    and is deleted)."""
    h, have = hashlib.sha256(), 0
    try:
        with open(partial, "rb") as f:
            while chunk := f.read(READ):
                h.update(chunk)
                have += len(chunk)
    except FileNotFoundError:
        return h, 0
    if size is not None and have > size:
        os.truncate(partial, 0)  # the same file, so that a lock held on it (http_fetch.claimed) still holds
        return hashlib.sha256(), 0
    return h, have


class HashedWriter:
    """``write(data)`` hands data over and returns; the writer thread appends it to ``out``
    (at its position), hashes it into ``sha256`` and calls ``progress(len(data))``, then
    ``release()`` if one was given (to reuse the buffer). At most LIMIT bytes wait for the
    writer: slack enough that neither thread often sleeps on the other, which on a busy
    machine costs a wake-up each time. ``wait()`` returns once all that was handed over is
    written; the first write error (a full disk), or exception from ``progress`` (a
    server's pull whose client left), is raised by the next ``write``, ``wait`` or
    ``close``, and nothing after it is written (buffers are still released). Use it as
    a context manager: leaving it (even by an exception) writes what was handed over and
    stops the thread, so a broken-off download keeps every byte it received."""

    def __init__(self, out: BinaryIO, sha256: "hashlib._Hash", progress: Callable[[int], None] | None = None):
        self.out, self.sha256, self.progress = out, sha256, progress
        self._pending: deque = deque()   # (data, release) handed over and not yet taken by the writer
        self._held = 0                   # bytes handed over and not yet written
        self._closing = False
        self._failed: Exception | None = None
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="hashed-writer", daemon=True)
        self._thread.start()

    def write(self, data, release: Callable[[], None] | None = None) -> int:
        with self._cond:
            while self._held >= LIMIT:
                self._cond.wait()
            self._raise_failed()
            self._pending.append((data, release))
            self._held += len(data)
            self._cond.notify_all()
        return len(data)

    def wait(self) -> None:
        with self._cond:
            while self._held:
                self._cond.wait()
        self._raise_failed()

    def rewind(self) -> None:
        """Start the file and the hash over (a server that ignored a range request)."""
        self.wait()
        self.out.seek(0)
        self.out.truncate()
        self.sha256 = hashlib.sha256()

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
        self._raise_failed()

    def __enter__(self) -> HashedWriter:
        return self

    def __exit__(self, kind, err, tb) -> None:
        if kind is None:
            self.close()
            return
        try:
            self.close()
        except OSError:
            pass  # the exception on its way out says more than a write error after it

    def _raise_failed(self) -> None:
        if self._failed is not None:
            raise self._failed

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if not self._pending:
                    return  # closing, and everything handed over is written
                batch = list(self._pending)  # all there is: one wake-up for many buffers
                self._pending.clear()
            for data, release in batch:
                self._put(data, release)

    def _put(self, data, release: Callable[[], None] | None) -> None:
        try:
            if self._failed is None:
                self.sha256.update(data)
                self.out.write(data)
                if self.progress is not None:
                    self.progress(len(data))
        except Exception as err:  # noqa: BLE001 - raised again on the thread that hands buffers over
            self._failed = err
        finally:
            if release is not None:
                release()
            with self._cond:
                self._held -= len(data)
                self._cond.notify_all()
