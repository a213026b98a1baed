"""One Hub file's bytes into its ``.incomplete`` file: resumable, hashed as they
arrive, with huggingface_hub's progress bar.

huggingface_hub decides what to fetch and with which headers
(``get_hf_file_metadata``: ``HF_ENDPOINT``, the token, the redirect to the
CDN; ``build_hf_headers``) and owns the cache; the bytes of the URL it
resolved move through engine/http_fetch.py, as the registries' blobs do, and
not through huggingface_hub's ``http_get`` or its httpx2 client, for speed
alone. ``http_get`` reads the body with ``iter_bytes(chunk_size=10 MB)``,
which re-chunks 64 KiB reads through a BytesIO that shrinks to nothing after
every chunk and is regrown (copied, its fresh pages faulted in) some 40 times
per 10 MB: 0.4-0.5x curl on loopback before any hashing. Reading the same
client's ``iter_raw()`` instead still costs 1.6x curl's CPU per byte (h11
copies each 64 KiB read three times, with Python around each), against
http_fetch's 0.9x, sha256 included; on a busy machine that CPU is the speed
(docs/PERFORMANCE.md, docs/pull.md). A body broken off is asked for again
from where it stopped, up to 5 times running, as ``http_get`` does.
"""
from __future__ import annotations

import logging
import urllib.error
import urllib.parse
from pathlib import Path

from ..errors import CtxError
from .hashed_writer import hash_partial
from .http_fetch import Fetched, fetch


def download(url: str, partial: Path, *, size: int | None, headers: dict[str, str], name: str) -> Fetched:
    """Fetch url into partial, after the bytes an earlier pull left there."""
    from huggingface_hub import constants

    sha, kept = hash_partial(partial, size)
    with _bar(size, kept, name) as bar:
        try:  # HF_HUB_DOWNLOAD_TIMEOUT: seconds without a byte, as for huggingface_hub's own downloads
            return fetch(url, partial, sha, kept, size=size, headers=headers, progress=bar.update,
                         timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT)
        except urllib.error.HTTPError as err:
            host = urllib.parse.urlsplit(url).netloc
            raise CtxError(f"{host} answered HTTP {err.code} {err.reason} for {name} (resolved by the Hub to "
                           f"{url}); run the pull again") from None


def _bar(size: int | None, kept: int, name: str):
    """huggingface_hub's own download bar (bytes, rate and time left on a terminal), named
    as ``http_get``'s so ``HF_HUB_DISABLE_PROGRESS_BARS`` and ``disable_progress_bars()``
    silence it."""
    from huggingface_hub.utils import is_tqdm_disabled, tqdm

    level = logging.getLogger("huggingface_hub.file_download").getEffectiveLevel()
    shown = name if len(name) <= 40 else f"(…){name[-40:]}"
    return tqdm(unit="B", unit_scale=True, total=size, initial=kept, desc=shown, name="huggingface_hub.http_get",
                disable=is_tqdm_disabled(level))
