"""One Hub file's bytes into its ``.incomplete`` file: resumable, hashed as they
arrive, through huggingface_hub's own HTTP session.

Not through huggingface_hub's ``http_get``, for speed: it reads the body with
``iter_bytes(chunk_size=DOWNLOAD_CHUNK_SIZE)``, which re-chunks the
transport's 64 KiB reads into 10 MB through a BytesIO that shrinks to nothing
after each chunk and is regrown (copied, its fresh pages faulted in) some 40
times per 10 MB; on loopback that loop alone ran at 0.4-0.5x curl, before
any hashing (docs/PERFORMANCE.md). Everything else is huggingface_hub's: the
request is opened by ``http_stream_backoff`` (its retries on 429/5xx and
network errors) on its shared client (``get_session()``, with its request
hooks and whatever ``set_client_factory`` installed), errors are mapped by
``hf_raise_for_status``, and the bar is its ``tqdm``, named as ``http_get``'s
so ``HF_HUB_DISABLE_PROGRESS_BARS`` and ``disable_progress_bars()`` silence
it. The body is read with ``iter_raw()`` (the transport's reads as they come,
no re-chunking; no content decoding is asked for, so none is done) and a
HashedWriter hashes and writes it on its own thread. A body broken off
mid-way is asked for again from where it stopped, as ``http_get`` does.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

from ..errors import CtxError
from .hashed_writer import HashedWriter, hash_partial

RETRIES = 5   # a body that breaks off this many times running, with no byte in between, is given up


def download(url: str, partial: Path, *, size: int | None, headers: dict[str, str],
             name: str) -> tuple[int, int, str]:
    """Fetch url into partial, after the bytes an earlier pull left there;
    (bytes kept from before, bytes received, sha256 hex of the whole file)."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.utils import hf_raise_for_status, http_stream_backoff

    sha, kept = hash_partial(partial, size)
    pos, received, tries = kept, 0, RETRIES
    with open(partial, "r+b" if kept else "wb") as out, _bar(size, kept, name) as bar:
        out.truncate(kept)
        out.seek(kept)
        with HashedWriter(out, sha, bar.update) as writer:
            while size is None or pos < size:
                ranged = {**headers, "Range": f"bytes={pos}-"} if pos else headers
                try:
                    with http_stream_backoff("GET", url, headers=ranged, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT,
                                             retry_on_exceptions=(), retry_on_status_codes=(408, 429)) as response:
                        hf_raise_for_status(response)
                        if pos and response.status_code == 200:  # the server ignored the range: start over
                            writer.rewind()
                            bar.update(-pos)
                            pos = kept = 0
                        for chunk in response.iter_raw():
                            writer.write(chunk)
                            pos += len(chunk)
                            received += len(chunk)
                            tries = RETRIES
                    break
                except (httpx2.ConnectError, httpx2.TimeoutException, httpx2.RemoteProtocolError) as err:
                    tries -= 1
                    if tries <= 0:
                        raise
                    logging.getLogger(__name__).warning("download of %s broke off (%s); resuming at byte %d",
                                                        name, err, pos)
                    time.sleep(1)
            writer.wait()
            digest = writer.sha256.hexdigest()
    if size is not None and pos != size:
        raise CtxError(f"{name}: the Hub said {size} bytes and sent {pos}; run the pull again to resume")
    return kept, received, digest


def _bar(size: int | None, kept: int, name: str):
    """huggingface_hub's own download bar: bytes, rate and time left on a terminal."""
    from huggingface_hub.utils import is_tqdm_disabled, tqdm

    level = logging.getLogger("huggingface_hub.file_download").getEffectiveLevel()
    shown = name if len(name) <= 40 else f"(…){name[-40:]}"
    return tqdm(unit="B", unit_scale=True, total=size, initial=kept, desc=shown, name="huggingface_hub.http_get",
                disable=is_tqdm_disabled(level))
