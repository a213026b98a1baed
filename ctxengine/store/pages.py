"""Page keys and the page record codec (the form a page is stored and shipped in).

A page is an opaque byte string; its key is the hex BLAKE3 of those raw bytes.
The stored *record* is a 12-byte header followed by the payload:

    offset size  field
    0      4     magic  b"CTXP"
    4      1     record version (1)
    5      1     codec: 0 = raw, 1 = zstd (one frame)
    6      2     reserved, must be 0
    8      4     raw length, little-endian u32
    12     ...   payload (raw bytes, or the zstd frame)

KV pages barely compress (f16 noise), so we try zstd at a fast level and keep
the compressed form only when it saves more than 3%; otherwise decoding would
cost time for nothing. Every decode re-hashes the raw bytes and compares them
with the key, so a flipped bit on disk or on the wire can never turn into a
silently wrong KV cache.
"""
from __future__ import annotations

import struct
import threading

import blake3
import zstandard

from ..errors import CorruptDataError, StoreError

RECORD_MAGIC = b"CTXP"
RECORD_VERSION = 1
CODEC_RAW = 0
CODEC_ZSTD = 1
CODEC_NAMES = {CODEC_RAW: "raw", CODEC_ZSTD: "zstd"}

_HEADER = struct.Struct("<4sBBHI")
HEADER_SIZE = _HEADER.size  # 12
# The most a record may hold: a page is 16 tokens of every layer's K and V (a
# 70B model's: 5 MiB in f16), a manifest a snapshot's token ids and page keys
# (a million tokens: about 11 MB). A header may not declare more, so a hostile
# record costs at most this much memory to refuse (its zstd frame could
# otherwise expand to the u32 field's 4 GiB before the hash check).
MAX_RAW_LEN = 64 << 20

ZSTD_LEVEL = 1          # level 1 compresses KV pages as well as 3 here, and faster
MIN_SAVING = 0.03       # keep zstd only if it saves more than this fraction

KEY_HEX_LEN = 64        # 32-byte BLAKE3 digest
_HEX = frozenset("0123456789abcdef")

# Compressor/decompressor objects are not safe to share between threads, and
# building one per page costs more than the compression of a small page.
_local = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    c = getattr(_local, "cctx", None)
    if c is None:
        c = _local.cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    return c


def _decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "dctx", None)
    if d is None:
        d = _local.dctx = zstandard.ZstdDecompressor()
    return d


def page_key(raw: bytes) -> str:
    """The key of a page: hex BLAKE3 of its raw bytes."""
    return blake3.blake3(raw).hexdigest()


def key_bytes(key: object, what: str = "page key") -> bytes:
    """Parse a hex key (64 hex digits, any case) into its 32 stored bytes."""
    # (bytes.fromhex alone would accept spaces, hence the explicit alphabet check)
    if not isinstance(key, str) or len(key) != KEY_HEX_LEN or not set(key.lower()) <= _HEX:
        raise StoreError(f"{what} must be {KEY_HEX_LEN} hex digits, got {key!r}")
    return bytes.fromhex(key)


def encode(raw: bytes) -> bytes:
    """Encode raw page bytes into a record, compressing only when it pays."""
    raw = bytes(raw)
    if len(raw) > MAX_RAW_LEN:
        raise StoreError(f"page of {len(raw)} bytes: more than a record may hold ({MAX_RAW_LEN})")
    codec, payload = CODEC_RAW, raw
    if raw:
        packed = _compressor().compress(raw)
        if len(packed) < len(raw) * (1.0 - MIN_SAVING):
            codec, payload = CODEC_ZSTD, packed
    return _HEADER.pack(RECORD_MAGIC, RECORD_VERSION, codec, 0, len(raw)) + payload


def parse_header(key: str, record, what: str = "page") -> tuple[int, int]:
    """Check a record's header; return (codec, raw length). Cheap: no payload work."""
    if len(record) < HEADER_SIZE:
        raise CorruptDataError(f"{what} {key}: record of {len(record)} bytes is shorter than its header")
    magic, version, codec, reserved, raw_len = _HEADER.unpack_from(record, 0)
    if magic != RECORD_MAGIC:
        raise CorruptDataError(f"{what} {key}: record has a bad magic number")
    if version != RECORD_VERSION:
        raise CorruptDataError(f"{what} {key}: unknown record version {version}")
    if codec not in CODEC_NAMES or reserved != 0:
        raise CorruptDataError(f"{what} {key}: unknown codec {codec} (reserved={reserved})")
    if raw_len > MAX_RAW_LEN:
        raise CorruptDataError(f"{what} {key}: its header says {raw_len} bytes, more than a record may hold "
                               f"({MAX_RAW_LEN})")
    return codec, raw_len


def raw_length(key: str, record) -> int:
    """Raw size of the page a record holds, from its header alone."""
    return parse_header(key, record)[1]


def decode(key: str, record, what: str = "page") -> bytes:
    """Decode a record and verify it against ``key``; CorruptDataError names the key.

    Manifests are stored in the same record form (``what="snapshot"``), their key
    being the snapshot id, i.e. the BLAKE3 of their canonical bytes.
    """
    codec, raw_len = parse_header(key, record, what)
    payload = memoryview(record)[HEADER_SIZE:]
    if codec == CODEC_RAW:
        raw = bytes(payload)
    else:
        try:  # a frame that declares its size is allocated at that size: it must be the header's
            declared = zstandard.frame_content_size(payload)
            if declared not in (-1, raw_len):
                raise CorruptDataError(f"{what} {key}: its zstd frame says {declared} bytes, its header {raw_len}")
            raw = _decompressor().decompress(payload, max_output_size=raw_len)
        except (zstandard.ZstdError, MemoryError) as e:
            raise CorruptDataError(f"{what} {key}: zstd payload does not decode ({e!r})") from None
    if len(raw) != raw_len:
        raise CorruptDataError(f"{what} {key}: decoded {len(raw)} bytes, header says {raw_len}")
    if page_key(raw) != key.lower():
        raise CorruptDataError(f"{what} {key}: content does not match its key (BLAKE3 mismatch)")
    return raw


def codec_of(record) -> str:
    """'raw' or 'zstd' (for tests and stats)."""
    return CODEC_NAMES[parse_header("?", record)[0]]
