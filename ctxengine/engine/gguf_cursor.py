"""Bounds-checked reads of a GGUF header: scalars, strings and (nested)
arrays of metadata values, from a read-only mapping (gguf_file.py parses the
file with it). Every length and count is checked against the bytes left
before anything sized by it is allocated.
"""
from __future__ import annotations

import mmap
import struct
from typing import Any

from .. import _core
from ..errors import ModelFileError
from .gguf_types import ValueType

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

MAX_ARRAY_DEPTH = 4          # arrays of arrays are legal; bound the recursion
# Python lists cost 8-60 bytes an element whatever the file spends on it, so the
# elements of all metadata arrays together are capped, not just bounded by the
# file size.  Real vocabularies need well under a million (Gemma 3: 3 x 262144).
MAX_METADATA_ELEMENTS = 1 << 24

VT = ValueType
_SCALARS: dict[int, struct.Struct] = {
    VT.UINT8: struct.Struct("<B"), VT.INT8: struct.Struct("<b"),
    VT.UINT16: struct.Struct("<H"), VT.INT16: struct.Struct("<h"),
    VT.UINT32: struct.Struct("<I"), VT.INT32: struct.Struct("<i"),
    VT.UINT64: struct.Struct("<Q"), VT.INT64: struct.Struct("<q"),
    VT.FLOAT32: struct.Struct("<f"), VT.FLOAT64: struct.Struct("<d"),
    VT.BOOL: struct.Struct("<?"),
}
# Numeric arrays are decoded in one struct call (Gemma has 262k scores and token types:
# 10 ms each, as numpy took, which a header read then need not import). BOOL is read as
# bytes and compared with 0, so that any nonzero byte is true.
_ARRAY_CODES: dict[int, str] = {t: s.format[1:] for t, s in _SCALARS.items()}
_ARRAY_CODES[VT.BOOL] = "B"
# Smallest encoding of one array element: bounds an array's count by the bytes left.
_MIN_ELEMENT_BYTES = {**{t: s.size for t, s in _SCALARS.items()}, VT.STRING: 8, VT.ARRAY: 12}


# A header-only read (GGUFFile(..., header_only=True)) leaves string arrays longer
# than this undecoded: a vocabulary's tokens and merges, which no header check
# reads and which take most of the parse (0.25 s for Gemma 3's 262k tokens).
UNREAD_STRINGS_ABOVE = 256


class UnreadStrings:
    """A string array a header-only read walked (its lengths checked) but did not decode."""

    def __init__(self, count: int):
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i):
        raise TypeError("this GGUF file was opened for its header only: its long string arrays were not read")

    def __repr__(self) -> str:
        return f"<{self.count} strings, not read>"


class Cursor:
    """Bounds-checked little-endian reads from the mapped header."""

    def __init__(self, buf: mmap.mmap, size: int, name: str, *, header_only: bool = False):
        self.buf, self.size, self.pos, self.name = buf, size, 0, name
        self.array_elements = 0
        self.header_only = header_only

    def error(self, message: str) -> ModelFileError:
        return ModelFileError(f"{self.name}: {message}")

    @property
    def left(self) -> int:
        return self.size - self.pos

    def need(self, n: int, what: str) -> None:
        if n > self.left:
            raise self.error(f"truncated: {what} at offset {self.pos} needs {n} bytes, "
                             f"the file has {self.left} left (the file is {self.size} bytes; "
                             f"it needs at least {self.pos + n})")

    def scalar(self, st: struct.Struct, what: str):
        self.need(st.size, what)
        (value,) = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return value

    def u32(self, what: str) -> int:
        return self.scalar(_U32, what)

    def u64(self, what: str) -> int:
        return self.scalar(_U64, what)

    def raw_string(self, what: str, limit: int | None = None) -> bytes:
        n = self.u64(f"{what} length")
        if limit is not None and n > limit:
            raise self.error(f"{what} is {n} bytes long (at most {limit} allowed)")
        self.need(n, what)
        data = self.buf[self.pos:self.pos + n]
        self.pos += n
        return data

    def name_string(self, what: str, limit: int) -> str:
        """Keys and tensor names: must be valid UTF-8 (they are looked up by value)."""
        data = self.raw_string(what, limit)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise self.error(f"{what} is not valid UTF-8: {data[:40]!r}") from None

    def value_string(self, what: str) -> str:
        # Values keep undecodable bytes as surrogates: llama.cpp accepts any bytes
        # in a string value (some vocabularies hold byte fragments), and the
        # tokenizer can recover them with .encode("utf-8", "surrogateescape").
        return self.raw_string(what).decode("utf-8", "surrogateescape")

    def string_array(self, count: int, what: str) -> list[str] | UnreadStrings:
        # The hot loop of opening a model (262k tokens for Gemma): locals only.
        # A header-only read checks a long array's lengths and decodes nothing.
        decode = not (self.header_only and count > UNREAD_STRINGS_ABOVE)
        buf, pos, size, unpack = self.buf, self.pos, self.size, _U64.unpack_from
        out = []
        first = 0
        if not decode:  # the native walk (Gemma's 262k tokens: 1 ms, not 0.1 s); a string that
            pos, first = _core.gguf_skip_strings(buf, size, pos, count)  # does not fit is worded below
        for i in range(first, count):
            if size - pos < 8:
                self.pos = pos
                self.need(8, f"{what}[{i}] length")
            (n,) = unpack(buf, pos)
            pos += 8
            if n > size - pos:
                self.pos = pos
                self.need(n, f"{what}[{i}]")
            if decode:
                out.append(buf[pos:pos + n].decode("utf-8", "surrogateescape"))
            pos += n
        self.pos = pos
        return out if decode else UnreadStrings(count)


def read_value(cur: Cursor, vtype: int, what: str, depth: int = 0) -> Any:
    if vtype in _SCALARS:
        return cur.scalar(_SCALARS[vtype], what)
    if vtype == VT.STRING:
        return cur.value_string(what)
    if vtype == VT.ARRAY:
        return _array(cur, what, depth)
    raise cur.error(f"{what} has unknown value type {vtype}")


def _array(cur: Cursor, what: str, depth: int) -> list:
    if depth >= MAX_ARRAY_DEPTH:
        raise cur.error(f"{what}: arrays nested more than {MAX_ARRAY_DEPTH} deep")
    etype = cur.u32(f"{what} element type")
    count = cur.u64(f"{what} length")
    if etype not in _MIN_ELEMENT_BYTES:
        raise cur.error(f"{what} has unknown array element type {etype}")
    if count * _MIN_ELEMENT_BYTES[etype] > cur.left:
        raise cur.error(f"{what}: an array of {count} elements cannot fit in the {cur.left} bytes left: "
                        f"the file is truncated or corrupt (it is {cur.size} bytes; that array needs at least "
                        f"{cur.pos + count * _MIN_ELEMENT_BYTES[etype]})")
    cur.array_elements += count
    if cur.array_elements > MAX_METADATA_ELEMENTS:
        raise cur.error(f"{what}: metadata arrays hold more than {MAX_METADATA_ELEMENTS} elements in all")
    if etype in _ARRAY_CODES:
        layout = struct.Struct(f"<{count}{_ARRAY_CODES[etype]}")
        values = layout.unpack_from(cur.buf, cur.pos)
        cur.pos += layout.size
        return [v != 0 for v in values] if etype == VT.BOOL else list(values)
    if etype == VT.STRING:
        return cur.string_array(count, what)
    return [read_value(cur, VT.ARRAY, f"{what}[{i}]", depth + 1) for i in range(count)]
