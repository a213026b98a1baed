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
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..engine.disk import storage_error
from ..errors import CorruptDataError, CtxError

CHUNK = 4 << 20          # bytes a read asks for; large reads keep loopback near memcpy speed
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
        except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
            reason = getattr(err, "reason", err)
            raise CtxError(f"download of {final.name} from {url} broke off ({reason}); "
                           f"{have + received} bytes kept in {partial.name}: run the pull again to resume") from None
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
    """Append the response body to the partial file (truncated to ``have``); bytes received."""
    received = 0
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    try:
        with open(partial, "r+b" if have else "wb") as out:
            out.truncate(have)
            out.seek(have)
            while n := response.readinto(view):
                chunk = view[:n]
                h.update(chunk)  # releases the GIL for large buffers
                out.write(chunk)
                received += n
                progress(n)
    except OSError as err:
        raise storage_error(err, partial.parent) from None
    return received
