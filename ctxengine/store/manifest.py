"""Snapshot manifests and their canonical bytes.

A manifest says everything needed to rebuild a context except the KV bytes
themselves, which it names by page key. Its *canonical bytes* (format 1) are
UTF-8 JSON produced by::

    json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
               allow_nan=False)

where ``obj`` holds exactly the 14 fields of :class:`Manifest` (15 in format 2,
with ``released_pages``), ``created``
always as a float and ``page_keys``/``parent`` as lowercase hex. The snapshot id
is the hex BLAKE3 of those bytes, so two hosts that snapshot the same context
state agree on the id. Parsing requires the bytes to *be* canonical (we re-encode
and compare), otherwise one manifest could hide behind several ids.
See docs/store-format.md.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import blake3

from ..errors import CorruptDataError, StoreError
from .pages import KEY_HEX_LEN

MANIFEST_FORMAT = 2
MAX_TOKEN_ID = 2**31 - 1
MAX_DEPTH = 64  # nesting of arch / sampler_state (ours: 3 at most); deeper is a hostile manifest

_FIELDS_V1 = (
    "format_version", "weight_id", "model_name", "arch", "kv_dtype", "page_tokens",
    "token_ids", "page_keys", "page_size", "n_tokens", "sampler_state", "parent",
    "created", "labels",
)
# Format 2 adds `released_pages`: how many leading pages hold only the
# full-attention layers of a sliding-window model (their local layers were
# released). A manifest without released pages is written in format 1, byte
# for byte as before, so its snapshot id does not change and older readers
# still read it.
_FIELDS = {1: _FIELDS_V1, 2: (*_FIELDS_V1, "released_pages")}
_HEX = frozenset("0123456789abcdef")


@dataclass(kw_only=True)
class Manifest:
    """What a snapshot records. ``n_tokens`` is how many positions have KV; it may be
    less than ``len(token_ids)`` (tokens not prefilled yet), never more."""

    format_version: int = MANIFEST_FORMAT
    weight_id: str
    model_name: str
    arch: dict[str, Any] = field(default_factory=dict)
    kv_dtype: str
    page_tokens: int
    token_ids: list[int]
    page_keys: list[str]
    page_size: int
    n_tokens: int
    sampler_state: dict[str, Any] = field(default_factory=dict)
    parent: str | None = None
    created: float = field(default_factory=time.time)
    labels: dict[str, str] = field(default_factory=dict)
    released_pages: int = 0

    def __post_init__(self):
        # The format follows from the content (see _FIELDS).
        if self.format_version in _FIELDS:
            self.format_version = 2 if self.released_pages else 1

    def canonical_bytes(self) -> bytes:
        """The bytes the snapshot id hashes; StoreError if the manifest is malformed."""
        obj = dataclasses.asdict(self)
        if obj["format_version"] == 1 and obj["released_pages"] == 0:
            del obj["released_pages"]  # format 1 has no such field (anything else fails below)
        return json.dumps(
            _checked(obj, StoreError),
            sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
        ).encode("utf-8")

    def snapshot_id(self) -> str:
        return blake3.blake3(self.canonical_bytes()).hexdigest()

    @classmethod
    def from_bytes(cls, data: bytes, what: str = "manifest") -> Manifest:
        """Parse canonical bytes; CorruptDataError if they are not a valid, canonical manifest."""
        try:
            obj = json.loads(bytes(data).decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise CorruptDataError(f"{what} is not valid UTF-8 JSON ({e})") from None
        except RecursionError:
            raise CorruptDataError(f"{what} is JSON nested too deep to read") from None
        if not isinstance(obj, dict):
            raise CorruptDataError(f"{what} is not a JSON object")
        m = cls(**_checked(obj, CorruptDataError, what))
        if m.canonical_bytes() != bytes(data):
            raise CorruptDataError(f"{what} is not in canonical form")
        return m


def _checked(obj: dict, err: type[StoreError], what: str = "manifest") -> dict:
    """Validate every field and return a normalized copy (tuples → lists, created → float)."""

    def fail(msg: str):
        raise err(f"{what}: {msg}")

    v = obj.get("format_version")
    if not _is_int(v) or v not in _FIELDS:
        fail(f"unknown format version {v!r}; this ctxengine reads {', '.join(map(str, _FIELDS))}")
    keys, fields = set(obj), set(_FIELDS[v])
    if keys != fields:
        missing, extra = sorted(fields - keys), sorted(keys - fields)
        fail(f"fields differ from format {v} (missing {missing}, unknown {extra})")
    out: dict[str, Any] = {"format_version": v}
    for name in ("weight_id", "model_name", "kv_dtype"):
        if not isinstance(obj[name], str) or not obj[name] or not _is_text(obj[name]):
            fail(f"{name} must be a non-empty string, got {obj[name]!r}")
        out[name] = obj[name]
    for name, lo in (("page_tokens", 1), ("page_size", 1), ("n_tokens", 0)):
        if not _is_int(obj[name]) or obj[name] < lo:
            fail(f"{name} must be an integer >= {lo}, got {obj[name]!r}")
        out[name] = obj[name]

    tokens = obj["token_ids"]
    if not isinstance(tokens, (list, tuple)):
        fail("token_ids must be a list of integers")
    tokens = list(tokens)
    if not all(_is_int(t) and 0 <= t <= MAX_TOKEN_ID for t in tokens):
        bad = next(t for t in tokens if not (_is_int(t) and 0 <= t <= MAX_TOKEN_ID))
        fail(f"token_ids holds {bad!r}; token ids are integers in [0, 2^31)")
    out["token_ids"] = tokens

    keys_ = obj["page_keys"]
    if not isinstance(keys_, (list, tuple)) or not all(_is_hex_id(k) for k in keys_):
        fail(f"page_keys must be a list of {KEY_HEX_LEN}-digit hex strings")
    out["page_keys"] = [k.lower() for k in keys_]

    if out["n_tokens"] > len(tokens):
        fail(f"n_tokens {out['n_tokens']} exceeds the {len(tokens)} token ids")
    want_pages = -(-out["n_tokens"] // out["page_tokens"])
    if len(out["page_keys"]) != want_pages:
        fail(f"{len(out['page_keys'])} pages for {out['n_tokens']} tokens at "
             f"{out['page_tokens']} tokens a page (expected {want_pages})")
    if v >= 2:
        released = obj["released_pages"]
        full_pages = out["n_tokens"] // out["page_tokens"]
        if not _is_int(released) or not 1 <= released <= full_pages:
            fail(f"released_pages must be an integer in 1..{full_pages} (the full pages), got {released!r}")
        out["released_pages"] = released

    parent = obj["parent"]
    if parent is not None and not _is_hex_id(parent):
        fail(f"parent must be a snapshot id or null, got {parent!r}")
    out["parent"] = parent.lower() if parent is not None else None

    created = obj["created"]
    if not (_is_int(created) or isinstance(created, float)) or not math.isfinite(created):
        fail(f"created must be a finite number (unix time), got {created!r}")
    out["created"] = float(created)

    if not isinstance(obj["labels"], dict):
        fail("labels must map strings to strings")
    try:
        out["labels"] = checked_labels(obj["labels"])
    except StoreError as e:
        fail(str(e))

    for name in ("arch", "sampler_state"):
        if not isinstance(obj[name], dict):
            fail(f"{name} must be a JSON object (dict)")
        out[name] = _json_data(obj[name], name, fail)
    return out


def checked_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    """Labels as a manifest holds them (StoreError otherwise): strings to strings,
    each one Unicode text that UTF-8 can write (a lone surrogate, ``"\\udcff"``,
    cannot: it failed every later snapshot of the context holding it, and so the
    eviction of any context that had to make room for it)."""
    if labels is None:
        return {}
    if not isinstance(labels, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                  for k, v in labels.items()):
        raise StoreError("labels must map strings to strings")
    for k, v in labels.items():
        if not (_is_text(k) and _is_text(v)):
            raise StoreError(f"label {k!r}: {v!r} is not Unicode text (a lone surrogate cannot be stored)")
    return dict(labels)


# Labels a request may set at once, in UTF-8 bytes of keys and values: they travel in every
# listing (gRPC's List, the studio's tree), so three contexts of 0.9 MB labels each once put
# List past a 1 MiB message limit for everyone.
MAX_NEW_LABELS_BYTES = 64 << 10


def new_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    """Labels a caller sets (checked_labels), at most MAX_NEW_LABELS_BYTES of them. Labels
    already stored are read whatever their size: an old snapshot stays restorable."""
    out = checked_labels(labels)
    size = sum(len(k.encode()) + len(v.encode()) for k, v in out.items())
    if size > MAX_NEW_LABELS_BYTES:
        raise StoreError(f"labels of {size:,} bytes are more than the {MAX_NEW_LABELS_BYTES:,} a request may set")
    return out


def _is_text(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_hex_id(v) -> bool:
    return isinstance(v, str) and len(v) == KEY_HEX_LEN and set(v.lower()) <= _HEX


def _json_data(v, path: str, fail, depth: int = 0):
    """Copy ``v`` if it is plain JSON data that round-trips exactly (else ``fail``)."""
    if depth > MAX_DEPTH:
        fail(f"{path.split('[')[0].split('.')[0]} is nested more than {MAX_DEPTH} deep")
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, str) and not _is_text(v):
        fail(f"{path} holds {v!r}, not Unicode text (a lone surrogate)")
    if isinstance(v, (int, str)):
        return int(v) if isinstance(v, int) else str(v)  # drop subclasses (IntEnum...)
    if isinstance(v, float):
        if not math.isfinite(v):
            fail(f"{path} holds {v!r}; JSON has no NaN or infinity")
        return float(v)
    if isinstance(v, (list, tuple)):
        return [_json_data(x, f"{path}[{i}]", fail, depth + 1) for i, x in enumerate(v)]
    if isinstance(v, dict):
        for k in v:
            if not isinstance(k, str) or not _is_text(k):
                fail(f"{path} has a non-string key {k!r} (keys are strings of Unicode text)")
        return {k: _json_data(x, f"{path}.{k}", fail, depth + 1) for k, x in v.items()}
    fail(f"{path} holds a {type(v).__name__}; only JSON data is allowed")
