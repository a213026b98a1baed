"""Weight identity: one BLAKE3 digest of everything that decides what a model computes.

A snapshot's KV pages are only valid on the weights that made them, so the
store tags snapshots with ``weight_id`` and refuses to restore across ids.
What counts, and the exact byte encoding, are specified in
docs/weight-identity.md; change either only together with ENCODING.

Hashing a 250 MB model takes a while, so ``cached_weight_id`` remembers ids in
``$XDG_CACHE_HOME/ctxengine/weight-ids.json``, keyed by (realpath, size,
mtime_ns, inode); ``verify_weight_id`` recomputes for ``ctx models verify``.
The first hashing of a file also checks its weights for inf and NaN
(finite_weights.py); an entry records that the file passed, and only a file
that passed gets one.
"""
from __future__ import annotations

import json
import os
import struct
import tempfile
from pathlib import Path
from typing import Any

import blake3

from .. import paths
from ..errors import CtxError, ModelFileError
from .gguf_file import GGUFFile, open_gguf
from .gguf_split import split_set_paths

ENCODING = b"ctxengine-weights-v1"
CACHE_FILE = "weight-ids.json"
MAX_CACHE_ENTRIES = 256   # keeps the file small; the oldest entries go first
# Set in an entry whose file passed check_finite_weights; one without it (written
# before the check existed) is not trusted: its file is checked and hashed again.
CHECKED_FLAG = "weights_finite"

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


# -- the canonical encoding (docs/weight-identity.md) -----------------------------
def _bytes_field(data: bytes) -> bytes:
    return _U64.pack(len(data)) + data


def _encode_value(value: Any) -> bytes:
    # By Python type, not GGUF type: a u32 and a u64 holding 8192 (or an f32 and
    # an f64 holding 0.5) mean the same hyperparameter and hash the same.
    if isinstance(value, bool):
        return b"b" + bytes([value])
    if isinstance(value, int):
        return b"i" + value.to_bytes(16, "little", signed=True)
    if isinstance(value, float):
        return b"f" + struct.pack("<d", value)
    if isinstance(value, str):
        return b"s" + _bytes_field(value.encode("utf-8", "surrogateescape"))
    if isinstance(value, list):
        return b"l" + _U64.pack(len(value)) + b"".join(_encode_value(v) for v in value)
    raise TypeError(f"no canonical encoding for {type(value).__name__}")


def identity_metadata(f: GGUFFile) -> dict[str, Any]:
    """The metadata that counts: general.architecture and every {arch}.* key, sorted.

    Names, licences, tokenizer and chat template are left out: they change how
    text becomes token ids, never what the weights compute from those ids.
    """
    prefix = f"{f.arch}."
    keys = ["general.architecture"] + sorted(k for k in f.metadata if k.startswith(prefix))
    return {k: f.metadata[k] for k in keys}


def weight_id(f: GGUFFile) -> str:
    """Hex BLAKE3 of the identity metadata and every tensor (name, type, shape, bytes)."""
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    h.update(_bytes_field(ENCODING))
    meta = identity_metadata(f)
    h.update(_U64.pack(len(meta)))
    for key, value in meta.items():
        h.update(_bytes_field(key.encode("utf-8")) + _encode_value(value))
    h.update(_U64.pack(len(f.tensors)))
    for t in f.tensors.values():
        h.update(_bytes_field(t.name.encode("utf-8")) + _U32.pack(t.ggml_type)
                 + _U32.pack(len(t.shape)) + b"".join(_U64.pack(d) for d in t.shape)
                 + _U64.pack(t.nbytes))
        h.update(t.data)  # straight from the mapping; large inputs hash on all cores
    return h.hexdigest()


# -- the cache ----------------------------------------------------------------------
def _stamp(path: str | os.PathLike) -> tuple[str, dict[str, int]]:
    """The cache key: the resolved path, and what changes when the file (or any
    part of a split model, gguf_split.py) is rewritten."""
    real = os.path.realpath(path)
    try:
        stats = [os.stat(p) for p in split_set_paths(path)]
    except OSError as err:
        raise ModelFileError(f"{err.filename}: cannot open: {err.strerror}") from None
    return real, {"size": sum(st.st_size for st in stats), "mtime_ns": max(st.st_mtime_ns for st in stats),
                  "inode": stats[0].st_ino}


def _cache_path() -> Path:
    return paths.cache_dir() / CACHE_FILE


def _load_entries() -> dict[str, dict]:
    """The cached entries; an unreadable, corrupt or other-version cache counts as empty."""
    try:
        data = json.loads(_cache_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("encoding") != ENCODING.decode():
        return {}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


def _lookup(entries: dict[str, dict], real: str, stamp: dict[str, int]) -> str | None:
    entry = entries.get(real)
    if not isinstance(entry, dict) or any(entry.get(k) != v for k, v in stamp.items()):
        return None
    if entry.get(CHECKED_FLAG) is not True:
        return None
    wid = entry.get("weight_id")
    return wid if isinstance(wid, str) else None


def _remember(real: str, stamp: dict[str, int], wid: str) -> None:
    # Re-read first so entries other processes added meanwhile survive; if two
    # write at once the last one wins, which at worst costs a recomputation.
    entries = _load_entries()
    entries.pop(real, None)
    entries[real] = {**stamp, "weight_id": wid, CHECKED_FLAG: True}
    for old in list(entries)[:-MAX_CACHE_ENTRIES]:
        del entries[old]
    text = json.dumps({"encoding": ENCODING.decode(), "entries": entries}, indent=1)
    target = _cache_path()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{CACHE_FILE}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
            os.replace(tmp, target)  # readers see the old file or the new one, never half
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass  # a read-only or full cache dir only costs recomputation next time


def check_finite_weights(f: GGUFFile) -> None:
    """finite_weights.check_finite_weights, imported when a file is first hashed (it needs numpy
    and gguf), not for the ids a listing finds remembered."""
    from .finite_weights import check_finite_weights as check

    check(f)


def _compute_and_remember(path: str | os.PathLike, real: str, stamp: dict[str, int]) -> str:
    # Opened by the name given: a split model's parts are found by the first part's
    # name (a cache may keep them as symlinks to blobs named otherwise).
    key = (real, tuple(sorted(stamp.items())))
    with open_gguf(path) as f:
        try:
            check_finite_weights(f)  # inf or NaN in the weights: raised, and nothing remembered
        except CtxError as err:
            _failed[key] = (type(err), str(err))
            raise
        _failed.pop(key, None)
        wid = weight_id(f)
    # A file rewritten while we hashed it gets no entry: its id is not that of either version.
    if _stamp(path) == (real, stamp):
        _remember(real, stamp, wid)
    return wid


# What this process already knows, so a server asked which weights it serves
# on every transfer stats its files but does not re-read the cache file.
_known: dict[tuple[str, tuple], str] = {}
# Files whose weights failed check_finite_weights, by the same key: asked again, the same
# error without reading the whole file again (a server lists its models often).
_failed: dict[tuple[str, tuple], tuple[type[CtxError], str]] = {}


def cached_weight_id(path: str | os.PathLike) -> str:
    """weight_id of the file at path, from the cache when the file is unchanged; the first
    time, its weights are checked for inf and NaN too (ModelFileError names the first)."""
    real, stamp = _stamp(path)
    key = (real, tuple(sorted(stamp.items())))
    wid = _known.get(key)
    if wid is None and key in _failed:
        cls, message = _failed[key]
        raise cls(message)
    if wid is None:
        wid = _known[key] = _lookup(_load_entries(), real, stamp) or _compute_and_remember(path, real, stamp)
    return wid


def verify_weight_id(path: str | os.PathLike) -> tuple[str | None, str]:
    """(cached id or None, freshly computed id); the cache is corrected to the latter.
    The weights are checked again: inf or NaN raises ModelFileError, as on load."""
    real, stamp = _stamp(path)
    cached = _lookup(_load_entries(), real, stamp)
    fresh = _known[(real, tuple(sorted(stamp.items())))] = _compute_and_remember(path, real, stamp)
    return cached, fresh
