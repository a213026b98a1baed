"""One blob fetched over HTTP into a store, verified by its sha256, resumable.

The bytes go to ``<final>-partial`` (Ollama's own name for a blob in
transit): a name no reader of the store looks up, so a partial blob never
looks complete. A later pull finds the partial, hashes what it holds and asks
only for the rest (``Range: bytes=N-``); a server that answers 200 instead
of 206 starts it over. Only a blob whose sha256 matches its digest is
renamed into place; a mismatch deletes the partial and says so. The bytes
move through engine/http_fetch.py, as the Hub's do.
"""
from __future__ import annotations

import logging
import urllib.error
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..engine.hashed_writer import hash_partial
from ..engine.http_fetch import claimed, fetch, install
from ..errors import CorruptDataError, CtxError


@dataclass
class Fetched:
    path: Path
    resumed_from: int    # bytes already on disk from an earlier, interrupted pull
    received: int        # bytes this pull took from the network


def partial_path(final: Path) -> Path:
    return final.with_name(final.name + "-partial")


def fetch_blob(url: str, final: Path, sha256_hex: str, size: int | None, *, headers: dict[str, str],
               progress: Callable[[int], None], describe: Callable[[urllib.error.HTTPError], CtxError],
               what: str | None = None) -> Fetched:
    """Download url into final unless final is there, whole (its sha256 checked, where
    Ollama's pull takes any file of that name as whole: a re-pull of a 790 MB model
    reads it again, 0.65 s on a 2-core machine; a damaged one is deleted and fetched
    again, a whole one of another size than ``size`` refused, never deleted);
    ``progress(n)`` after every n bytes (those resumed from a partial included);
    ``describe`` words an HTTP error; ``what`` names the blob for the user (which
    model's layer)."""
    if _intact(final, sha256_hex, size, what):
        progress(final.stat().st_size)
        return Fetched(final, 0, 0)
    partial = partial_path(final)
    with claimed(partial, final, what):
        if _intact(final, sha256_hex, size, what):  # another pull finished it while this one waited to claim it
            progress(final.stat().st_size)
            return Fetched(final, 0, 0)
        h, have = hash_partial(partial, size)
        progress(have)
        try:
            got = fetch(url, partial, h, have, size=size, headers=headers, progress=progress)
        except urllib.error.HTTPError as err:
            raise describe(err) from None
        if got.sha256 != sha256_hex:
            partial.unlink(missing_ok=True)
            raise CorruptDataError(f"{final.name}: the downloaded bytes have sha256 {got.sha256}, not the digest "
                                   f"the manifest names; the partial download was deleted (run the pull again)")
        install(partial, final, size, final.name)
    return Fetched(final, got.kept, got.received)


def _intact(final: Path, sha256_hex: str, size: int | None, what: str | None) -> bool:
    """Whether the blob is there with its digest's bytes; one that is not (truncated, or
    changed on disk) is deleted, so that the pull fetches it again. One that is, but of
    another size than the manifest says, is kept (other models may use it) and the pull
    refused: the manifest is wrong, not the blob."""
    try:
        have = final.stat().st_size
        h, _ = hash_partial(final, None)  # all of it, whatever size the manifest claims
        if h.hexdigest() == sha256_hex:
            if size is not None and have != size:
                raise CtxError(f"{what or final.name} is {size} bytes by its manifest, but the blob of that digest "
                               f"in {final.parent} holds {have}, its sha256 checked: the manifest's size is wrong; "
                               f"the blob is kept and nothing was pulled")
            return True
        final.unlink()
    except FileNotFoundError:
        return False
    except OSError as err:
        raise CtxError(f"{final}: a damaged blob (not the bytes of its digest) cannot be deleted "
                       f"({err.strerror or err}): delete it, then run the pull again") from None
    logging.getLogger(__name__).warning("%s was damaged (not the bytes of its digest): deleted, fetched again",
                                        final.name)
    return False
