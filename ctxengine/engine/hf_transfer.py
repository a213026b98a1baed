"""One Hub file's bytes into its ``.incomplete`` file: resumable, hashed as they
arrive, with huggingface_hub's progress bar; what the Hub resolved the file to
checked before (``check_resolved``), and the bytes' sha256 after (``verify``).

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
import re
import urllib.error
import urllib.parse
from pathlib import Path

from ..errors import CorruptDataError, CtxError
from .hashed_writer import hash_partial
from .http_fetch import Fetched, fetch, http_reason

SHA256 = re.compile(r"[0-9a-f]{64}")
ETAG = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # a git blob's sha1, or an LFS file's sha256: a blob's name
COMMIT = re.compile(r"[0-9a-f]{40}")  # a snapshot's folder name
MAX_SIZE = 1 << 50  # bytes: a PiB, past any model's file; a Hub that declares more (or < 0) is not believed


def not_understood(endpoint: str, what: str, why: str) -> CtxError:
    """The error for an answer of the Hub's that is not what a Hub answers (a proxy's page,
    a field of another type or form), on one line."""
    return CtxError(f"{endpoint}: the Hub's answer to {what} could not be understood ({' '.join(why.split())[:160]})")


def plausible_size(size) -> bool:
    return type(size) is int and 0 <= size <= MAX_SIZE


def check_resolved(meta, filename: str, commit: str, endpoint: str) -> None:
    """resolve/'s headers (``get_hf_file_metadata``) name a blob (the etag) and a snapshot (the
    commit) in the cache, and size the file: anything else is refused before it names a
    path or sizes a read."""
    if not isinstance(meta.etag, str) or not ETAG.fullmatch(meta.etag):
        raise CtxError(f"{endpoint} gave {filename} the etag {str(meta.etag)[:80]!r}, not a sha256 or git "
                       "hash: refusing to name a file in the cache after it")
    if meta.commit_hash != commit:  # asked for by its hash, the file is at that commit
        raise not_understood(endpoint, f"resolve/ for {filename!r}", f"X-Repo-Commit {str(meta.commit_hash)[:80]!r}, "
                             f"not the commit asked for, {commit}")
    if meta.size is not None and not plausible_size(meta.size):
        raise not_understood(endpoint, f"resolve/ for {filename!r}", f"X-Linked-Size {meta.size} is no file's size")


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
            raise CtxError(f"{host} answered HTTP {err.code} {http_reason(err)} for {name} (resolved by the Hub to "
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


def verify(partial: Path, filename: str, digest: str, expected: list[str | None]) -> None:
    """An LFS file's etag is its sha256, and model_info names it too: a mismatch with
    either deletes the partial file."""
    for want in expected:
        if want is not None and SHA256.fullmatch(want.lower()) and digest != want.lower():
            partial.unlink(missing_ok=True)
            raise CorruptDataError(f"{filename}: the downloaded bytes have sha256 {digest}, the Hub says "
                                   f"{want}; the partial download was deleted (run the pull again)")
