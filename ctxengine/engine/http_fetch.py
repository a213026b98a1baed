"""A file's bytes over HTTP into a partial file, the one streaming loop of both
pulls (hf_transfer.py for the Hub's files, ollama/blob_download.py for
registry blobs): resumed with a range request after what an interrupted pull
left there, hashed (sha256) as they arrive, and asked for again from where
they stopped when a body breaks off.

The standard library's http.client reads the body straight into reused
256 KiB buffers (one copy, the kernel's) and a HashedWriter hashes and writes
them on a thread of its own, so a pull costs about the CPU of curl, sha256
included: what decides its speed on a busy machine (docs/PERFORMANCE.md).
Redirects are followed; a token does not follow one to another host.
"""
from __future__ import annotations

import contextlib
import fcntl
import http.client
import logging
import os
import queue
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ..errors import CorruptDataError, CtxError
from .disk import storage_error
from .hashed_writer import LIMIT, HashedWriter

CHUNK = 256 << 10              # bytes a read asks for: each buffer still in cache when hashed (4 MiB ran at 0.7x curl)
BUFFERS = LIMIT // CHUNK + 2   # the writer's slack, one being received, one being written
TIMEOUT = 60.0                 # seconds without a byte before the transfer counts as stalled
RETRIES = 5                    # times running a body may break off without getting further before we give up


@dataclass
class Fetched:
    kept: int        # bytes an earlier pull had left in the partial file (0 when the server made us start over)
    received: int    # bytes this pull took from the network
    sha256: str      # hex, of the whole file


class _TokenStaysHome(urllib.request.HTTPRedirectHandler):
    """Follow redirects, but send no Authorization header to another host (a CDN)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


_OPENER = urllib.request.build_opener(_TokenStaysHome)  # with the default handlers: *_proxy, https
_CONTENT_RANGE = re.compile(r"bytes (\d+)-")


def http_reason(err: urllib.error.HTTPError) -> str:
    """The reason of an HTTP error, on one line: urllib words a redirect loop over three
    ("... would lead to an infinite loop.\nThe last 30x error message was:\nFound")."""
    reason = str(err.reason)
    if reason.startswith(urllib.request.HTTPRedirectHandler.inf_msg):
        return f"{' '.join(reason[len(urllib.request.HTTPRedirectHandler.inf_msg):].split())} (a redirect loop)"
    return " ".join(reason.split())


@contextlib.contextmanager
def claimed(partial: Path, final: Path, what: str | None = None) -> Iterator[None]:
    """Hold ``partial`` for this pull alone until the block ends (rename it into place
    inside the block): an exclusive lock (flock) on the file itself, so a second pull of
    the same file says that one is running instead of truncating or appending to the
    bytes this one writes. The lock is taken on the name's current file: one that the
    pull before us renamed into place (or deleted) while we waited is let go. ``what``
    names the file for the user (a model's file, not a blob's hash)."""
    while True:
        try:
            fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise storage_error(err, partial.parent) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise CtxError(f"another pull is downloading {what or final.name} into {partial.parent} right now: "
                           f"let it finish (or stop it), then pull again") from None
        except OSError:  # a file system without locks (some network ones): the size check before the rename remains
            pass
        try:
            current = os.stat(partial)
        except FileNotFoundError:
            current = None
        if current is not None and os.path.samestat(os.fstat(fd), current):
            break
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):  # an empty partial (a failed first request) is not left behind
            if os.fstat(fd).st_size == 0 and os.path.samestat(os.fstat(fd), os.stat(partial)):
                partial.unlink()
        os.close(fd)


def install(partial: Path, final: Path, size: int | None, what: str) -> None:
    """Rename a verified partial into place, after the last check: the file on disk holds
    as many bytes as were hashed (a writer that ignored the lock would show here)."""
    if size is not None and (have := partial.stat().st_size) != size:
        partial.unlink(missing_ok=True)
        raise CorruptDataError(f"{what}: the partial download holds {have} bytes on disk, not the {size} that were "
                               f"verified (something else wrote to it); it was deleted: run the pull again")
    os.replace(partial, final)


def fetch(url: str, partial: Path, sha256, kept: int, *, size: int | None, headers: dict[str, str],
          progress: Callable[[int], None], retries: int = RETRIES, timeout: float = TIMEOUT) -> Fetched:
    """GET url into partial, which holds ``kept`` bytes whose hash is sha256 (hashed_writer.
    hash_partial); ``progress(n)`` after every n bytes written (negative when a server that
    ignored the range made us start over). A body that breaks off is asked for again from
    where it stopped, ``retries`` times running without getting further; then, or on a
    network error or ``timeout`` seconds without a byte, a CtxError says how much is kept.
    HTTP errors are raised as urllib.error.HTTPError, for the caller to word; disk errors
    are named."""
    try:
        # Opened as it is, not truncated to 0 (which "wb" would do): ext4 writes a file truncated
        # to 0 back to disk when it is closed (auto_da_alloc), 0.25-0.3 s of a 790 MB pull waited
        # for at the end, which a download into a new file (curl's) never pays.
        with open(os.open(partial, os.O_RDWR | os.O_CREAT, 0o644), "r+b") as out:
            if os.fstat(out.fileno()).st_size != kept:
                out.truncate(kept)
            out.seek(kept)
            with HashedWriter(out, sha256, progress) as writer:
                body = _Body(url, headers, timeout, writer, kept, size)
                tries, furthest = retries, kept
                while size is None or body.pos < size:
                    try:
                        body.get()
                        break
                    except (urllib.error.URLError, http.client.HTTPException, TimeoutError, ConnectionError) as err:
                        if isinstance(err, urllib.error.HTTPError):
                            err.close()  # its status and reason stay; its socket is not left for the GC
                            if err.code == 416 and body.pos:
                                raise _Wrong(f"answered 416 (range not satisfiable) for the bytes from "
                                             f"{body.pos}: what is kept is not the start of its file") from None
                            raise
                        # only a request that got past every earlier one counts as progress: a server
                        # that ignores the range and breaks off each time would otherwise go on forever
                        tries = (retries if body.pos > furthest else tries) - 1
                        furthest = max(furthest, body.pos)
                        body.broke_off(err, partial, last=tries < 0)
                writer.wait()
                digest = writer.sha256.hexdigest()
    except _Wrong as err:
        partial.unlink(missing_ok=True)
        raise CorruptDataError(f"{url} {err}; the partial download was deleted (run the pull again)") from None
    except OSError as err:
        if isinstance(err, (urllib.error.URLError, ConnectionError, TimeoutError)):
            raise
        raise storage_error(err, partial.parent) from None
    if size is not None and body.pos != size and (body.whole or not body.moved and body.kept):
        partial.unlink(missing_ok=True)  # a whole answer (or none past what is kept): the file is shorter
        raise CorruptDataError(f"{url} has {body.pos} bytes, not the {size} declared for it; the partial "
                               "download was deleted")
    if size is not None and body.pos != size:
        raise CtxError(f"{url} sent {body.pos} bytes of {size}; they are kept in {partial}: run the pull again")
    return Fetched(body.kept, body.received, digest)


class _Wrong(Exception):
    """A server's answer that cannot be part of the file: the partial is deleted."""


class _Body:
    """The response body as it arrives, over as many requests as it takes: where it is
    (``pos``), how much came from the network, and the reused buffers it is read into."""

    def __init__(self, url: str, headers: dict[str, str], timeout: float, writer: HashedWriter, kept: int,
                 size: int | None):
        self.url, self.headers, self.timeout, self.writer, self.size = url, headers, timeout, writer, size
        self.pos = self.kept = kept
        self.received = 0
        self.moved = False   # whether the last request brought a byte
        self.whole = False   # whether it ended where the server meant it to end
        self.free: queue.Queue = queue.Queue()
        self.made = 0  # buffers made so far: as the writer falls behind, up to BUFFERS

    def get(self) -> None:
        """One request, from pos to the end."""
        self.moved = self.whole = False
        ranged = {**self.headers, "Range": f"bytes={self.pos}-"} if self.pos else self.headers
        with _OPENER.open(urllib.request.Request(self.url, headers=ranged), timeout=self.timeout) as response:
            if self.pos and response.status != 206:  # the server ignored the range: start over
                self.writer.rewind()
                self.writer.progress(-self.pos)
                self.pos = self.kept = 0
            elif self.pos and (m := _CONTENT_RANGE.match(response.headers.get("Content-Range", ""))) \
                    and int(m[1]) != self.pos:
                raise _Wrong(f"answered the range from byte {self.pos} with bytes from {m[1]}")
            # A read never takes more than one byte past the declared size: a server that
            # sends more (a hostile one would fill the disk) is refused at that byte.
            while n := self._read(response, view := self._buffer()):
                self.writer.write(view[:n], release=lambda view=view: self.free.put(view))
                self.pos, self.received, self.moved = self.pos + n, self.received + n, True
            if response.length:  # closed short of its Content-Length: http.client just ends
                raise http.client.IncompleteRead(b"", response.length)
            # All the server meant to send (a length or chunks, whole), not a connection that just closed.
            self.whole = response.getheader("Content-Length") is not None or response.chunked

    def _buffer(self) -> memoryview:
        """A free buffer, made when none is free and fewer than BUFFERS exist: a writer that
        keeps up needs a few, and bytearray() zeroes each of its 256 KiB (all of them up front
        cost a pull 0.03 s when there were 16 MiB)."""
        try:
            return self.free.get_nowait()
        except queue.Empty:
            if self.made < BUFFERS:
                self.made += 1
                return memoryview(bytearray(CHUNK))
            return self.free.get()

    def _read(self, response, view: memoryview) -> int:
        """Bytes read into view, or 0 at the end, when view goes back to the free ones."""
        try:
            n = response.readinto(view if self.size is None else view[: min(CHUNK, self.size - self.pos + 1)])
            if self.size is not None and self.pos + n > self.size:
                raise _Wrong(f"sent more than the {self.size} bytes declared for it")
        except BaseException:
            self.free.put(view)
            raise
        if not n:
            self.free.put(view)
        return n

    def broke_off(self, err: Exception, partial: Path, *, last: bool) -> None:
        """Say so, and wait a moment before the next request (or give up)."""
        reason = getattr(err, "reason", None) or err.__class__.__name__
        if last:
            raise CtxError(f"download from {self.url} broke off ({reason}); {self.pos} bytes kept in "
                           f"{partial}: run the pull again to resume") from None
        logging.getLogger(__name__).warning("download from %s broke off (%s); asking for the rest, from byte %d",
                                            self.url, reason, self.pos)
        time.sleep(1)
