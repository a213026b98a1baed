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

import http.client
import logging
import queue
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import CtxError
from .disk import storage_error
from .hashed_writer import LIMIT, HashedWriter

CHUNK = 256 << 10              # bytes a read asks for: each buffer still in cache when hashed (4 MiB ran at 0.7x curl)
BUFFERS = LIMIT // CHUNK + 2   # the writer's slack, one being received, one being written
TIMEOUT = 60.0                 # seconds without a byte before the transfer counts as stalled
RETRIES = 5                    # times running a body may break off, with no byte in between, before we give up


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


def fetch(url: str, partial: Path, sha256, kept: int, *, size: int | None, headers: dict[str, str],
          progress: Callable[[int], None], retries: int = RETRIES, timeout: float = TIMEOUT) -> Fetched:
    """GET url into partial, which holds ``kept`` bytes whose hash is sha256 (hashed_writer.
    hash_partial); ``progress(n)`` after every n bytes written (negative when a server that
    ignored the range made us start over). A body that breaks off is asked for again from
    where it stopped, ``retries`` times running without a byte in between; then, or on a
    network error or ``timeout`` seconds without a byte, a CtxError says how much is kept. HTTP errors are raised as
    urllib.error.HTTPError, for the caller to word; disk errors are named."""
    free: queue.Queue = queue.Queue()
    for _ in range(BUFFERS):
        free.put(memoryview(bytearray(CHUNK)))
    pos, received, tries = kept, 0, retries
    try:
        with open(partial, "r+b" if kept else "wb") as out:
            out.truncate(kept)
            out.seek(kept)
            with HashedWriter(out, sha256, progress) as writer:
                while size is None or pos < size:
                    ranged = {**headers, "Range": f"bytes={pos}-"} if pos else headers
                    try:
                        with _OPENER.open(urllib.request.Request(url, headers=ranged), timeout=timeout) as response:
                            if pos and response.status != 206:  # the server ignored the range: start over
                                writer.rewind()
                                progress(-pos)
                                pos = kept = 0
                            while n := response.readinto(view := free.get()):
                                writer.write(view[:n], release=lambda view=view: free.put(view))
                                pos, received, tries = pos + n, received + n, retries
                            if response.length:  # closed short of its Content-Length: http.client just ends
                                raise http.client.IncompleteRead(b"", response.length)
                        break
                    except urllib.error.HTTPError as err:
                        err.close()  # its status and reason stay; its socket is not left for the GC
                        raise
                    except (urllib.error.URLError, http.client.HTTPException, TimeoutError, ConnectionError) as err:
                        reason = getattr(err, "reason", None) or err.__class__.__name__
                        if tries <= 0:
                            raise CtxError(f"download from {url} broke off ({reason}); {pos} bytes kept in "
                                           f"{partial}: run the pull again to resume") from None
                        logging.getLogger(__name__).warning("download from %s broke off (%s); asking for the "
                                                            "rest, from byte %d", url, reason, pos)
                        tries -= 1
                        time.sleep(1)
                writer.wait()
                digest = writer.sha256.hexdigest()
    except OSError as err:
        if isinstance(err, (urllib.error.URLError, ConnectionError, TimeoutError)):
            raise
        raise storage_error(err, partial.parent) from None
    if size is not None and pos != size:
        raise CtxError(f"{url} sent {pos} bytes of {size}; {pos} bytes kept in {partial}: run the pull again")
    return Fetched(kept, received, digest)
