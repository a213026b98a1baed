"""One blob fetched over HTTP into a store, verified by its sha256, resumable.

The bytes go to ``<final>-partial`` (Ollama's own name for a blob in
transit): a name no reader of the store looks up, so a partial blob never
looks complete. A later pull finds the partial, hashes what it holds and asks
only for the rest (``Range: bytes=N-``); a server that answers 200 instead
of 206 starts it over. Only a blob whose sha256 matches its digest is
renamed into place; a mismatch deletes the partial and says so.
"""
from __future__ import annotations

import hashlib
import http.client
import os
import queue
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..engine.disk import storage_error
from ..errors import CorruptDataError, CtxError

CHUNK = 4 << 20          # bytes a read asks for; large reads keep loopback near memcpy speed
BUFFERS = 3              # in flight between receiving and hashing/writing
TIMEOUT = 60.0           # seconds without a byte before the transfer counts as stalled


@dataclass
class Fetched:
    path: Path
    resumed_from: int    # bytes already on disk from an earlier, interrupted pull
    received: int        # bytes this pull took from the network


def partial_path(final: Path) -> Path:
    return final.with_name(final.name + "-partial")


def fetch_blob(url: str, final: Path, sha256_hex: str, size: int | None, *, headers: dict[str, str],
               progress: Callable[[int], None], describe: Callable[[urllib.error.HTTPError], CtxError]) -> Fetched:
    """Download url into final unless final is there; ``progress(n)`` after every n bytes
    (those resumed from a partial included); ``describe`` words an HTTP error."""
    if final.is_file():
        progress(final.stat().st_size)
        return Fetched(final, 0, 0)
    partial = partial_path(final)
    h, have = _hash_existing(partial, size)
    progress(have)
    received = 0
    if size is None or have < size:
        request = urllib.request.Request(url, headers={**headers, **({"Range": f"bytes={have}-"} if have else {})})
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
                if have and response.status != 206:  # the server ignored the range: start over
                    h, have = hashlib.sha256(), 0
                    progress(-os.path.getsize(partial))
                received = _stream(response, partial, have, h, progress)
        except urllib.error.HTTPError as err:
            raise describe(err) from None
        except (urllib.error.URLError, http.client.HTTPException, TimeoutError, ConnectionError) as err:
            reason = getattr(err, "reason", None) or err.__class__.__name__
            kept = partial.stat().st_size if partial.exists() else 0
            raise CtxError(f"download of {final.name} from {url} broke off ({reason}); "
                           f"{kept} bytes kept in {partial.name}: run the pull again to resume") from None
    got = h.hexdigest()
    if got != sha256_hex:
        partial.unlink(missing_ok=True)
        raise CorruptDataError(f"{final.name}: the downloaded bytes have sha256 {got}, not the digest the "
                               f"manifest names; the partial download was deleted (run the pull again)")
    os.replace(partial, final)
    return Fetched(final, have, received)


def _hash_existing(partial: Path, size: int | None):
    """The sha256 of an earlier pull's partial bytes, and how many there were (a
    partial longer than the blob cannot be right and is dropped)."""
    h, have = hashlib.sha256(), 0
    try:
        with open(partial, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
                have += len(chunk)
    except FileNotFoundError:
        return h, 0
    if size is not None and have > size:
        partial.unlink()
        return hashlib.sha256(), 0
    return h, have


def _stream(response, partial: Path, have: int, h: "hashlib._Hash", progress: Callable[[int], None]) -> int:
    """Append the response body to the partial file (truncated to ``have``); bytes received.

    Two stages overlap: this thread receives into one of BUFFERS buffers while
    another hashes and writes the one before (socket reads, sha256 of large
    buffers and file writes all release the GIL), so a fast link is not slowed
    to the sum of the three."""
    free: queue.Queue = queue.Queue()
    full: queue.Queue = queue.Queue()
    for _ in range(BUFFERS):
        free.put(memoryview(bytearray(CHUNK)))
    failed: list[OSError] = []
    received = 0

    def hash_and_write(out) -> None:
        while (item := full.get()) is not None:
            view, n = item
            if not failed:
                try:
                    h.update(view[:n])
                    out.write(view[:n])
                    progress(n)
                except OSError as err:
                    failed.append(err)
            free.put(view)

    try:
        with open(partial, "r+b" if have else "wb") as out:
            out.truncate(have)
            out.seek(have)
            writer = threading.Thread(target=hash_and_write, args=(out,), name="blob-write", daemon=True)
            writer.start()
            try:
                while not failed:
                    view = free.get()
                    n = response.readinto(view)
                    if not n:
                        break
                    full.put((view, n))
                    received += n
            finally:
                full.put(None)
                writer.join()
            if failed:
                raise failed[0]
    except OSError as err:
        if isinstance(err, (ConnectionError, TimeoutError)):
            raise
        raise storage_error(err, partial.parent) from None
    return received
