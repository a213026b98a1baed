"""Downloaded bytes hashed and written on a thread of their own.

A pull has three things to do with every buffer: receive it, sha256 it and
write it. Done one after the other on one thread, a download runs at the
speed of their sum; here the receiving thread only hands each buffer over
and reads on, while a writer thread hashes and writes the buffers before it,
so the download runs at the speed of the slowest of the three. Socket reads,
``hashlib`` on buffers over 2 KiB and file writes all release the GIL, so the
two threads do run at once. Both pulls use it (hf_transfer.py for the Hub,
ollama/blob_download.py for registries).
"""
from __future__ import annotations

import hashlib
import queue
import threading
from pathlib import Path
from typing import BinaryIO, Callable

DEPTH = 16       # buffers queued for the writer before write() waits (a few MiB): bounds the memory held
READ = 8 << 20   # bytes a read of an earlier pull's partial file asks for


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
        partial.unlink()
        return hashlib.sha256(), 0
    return h, have


class HashedWriter:
    """``write(data)`` queues data and returns; the writer thread appends it to ``out``
    (at its position), hashes it into ``sha256`` and calls ``progress(len(data))``, then
    ``release()`` if one was given (to reuse the buffer). ``wait()`` returns once all that
    was queued is written; the first write error (a full disk) is raised by the next
    ``write``, ``wait`` or ``close``, and nothing after it is written. Use it as a context
    manager: leaving it (even by an exception) writes what was queued and stops the thread,
    so a broken-off download keeps every byte it received."""

    def __init__(self, out: BinaryIO, sha256: "hashlib._Hash", progress: Callable[[int], None] | None = None):
        self.out, self.sha256, self.progress = out, sha256, progress
        self._queue: queue.Queue = queue.Queue(maxsize=DEPTH)
        self._failed: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="hashed-writer", daemon=True)
        self._thread.start()

    def write(self, data, release: Callable[[], None] | None = None) -> int:
        self._raise_failed()
        self._queue.put((data, release))
        return len(data)

    def wait(self) -> None:
        self._queue.join()
        self._raise_failed()

    def rewind(self) -> None:
        """Start the file and the hash over (a server that ignored a range request)."""
        self.wait()
        self.out.seek(0)
        self.out.truncate()
        self.sha256 = hashlib.sha256()

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
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
            item = self._queue.get()
            if item is None:
                self._queue.task_done()
                return
            data, release = item
            try:
                if self._failed is None:
                    self.sha256.update(data)
                    self.out.write(data)
                    if self.progress is not None:
                        self.progress(len(data))
            except OSError as err:
                self._failed = err
            finally:
                if release is not None:
                    release()
                self._queue.task_done()
