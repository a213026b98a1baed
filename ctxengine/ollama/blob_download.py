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
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..engine.disk import storage_error
from ..engine.hashed_writer import LIMIT, HashedWriter, hash_partial
from ..errors import CorruptDataError, CtxError

CHUNK = 256 << 10        # bytes a read asks for: few reads, each still in cache when hashed (4 MiB ran at 0.7x curl)
BUFFERS = LIMIT // CHUNK + 2  # the writer's slack, one being received, one being written
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
    h, have = hash_partial(partial, size)
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


def _stream(response, partial: Path, have: int, h: "hashlib._Hash", progress: Callable[[int], None]) -> int:
    """Append the response body to the partial file (truncated to ``have``); bytes received.

    This thread receives into one of BUFFERS reused buffers (no allocation per
    read) while a HashedWriter hashes and writes the ones before it."""
    free: queue.Queue = queue.Queue()
    for _ in range(BUFFERS):
        free.put(memoryview(bytearray(CHUNK)))
    received = 0
    try:
        with open(partial, "r+b" if have else "wb") as out:
            out.truncate(have)
            out.seek(have)
            with HashedWriter(out, h, progress) as writer:
                while n := response.readinto(view := free.get()):
                    writer.write(view[:n], release=lambda view=view: free.put(view))
                    received += n
    except OSError as err:
        if isinstance(err, (ConnectionError, TimeoutError)):
            raise
        raise storage_error(err, partial.parent) from None
    return received
