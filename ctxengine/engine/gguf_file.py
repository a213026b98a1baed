"""Read a GGUF model file without trusting it.

The file is mapped read-only once; metadata is parsed into plain Python values
and every tensor becomes a zero-copy ``uint8`` view into the mapping.  Anything
malformed (truncation, lying counts, lengths or offsets, unknown types,
overlapping tensors) raises :class:`ModelFileError` naming the file and the
offending field, before any allocation sized by an unchecked number.

Why our own parser rather than ``gguf.GGUFReader``: GGUFReader builds a numpy
view per metadata item and per element of a string array (about 11 s for Gemma
3's 262k-token vocabulary on a 2-core machine, against well under a second
here), and it reads counts, lengths and offsets as given, so a hostile file
surfaces as a raw numpy/struct exception or a huge allocation.  The format is
small (a header, key/value pairs, tensor descriptors, aligned data), so one
bounds-checked cursor over one ``mmap`` is simpler than guarding GGUFReader.
We still take the ggml type table (ids, names, block sizes) from ``gguf``.

Layout (all little-endian; https://github.com/ggml-org/ggml/blob/master/docs/gguf.md):
  magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
  n_kv x (string key | u32 value type | value)
  n_tensors x (string name | u32 n_dims | n_dims x u64 dim | u32 ggml type | u64 offset)
  padding to general.alignment | tensor data (offsets are relative to here)
A string is a u64 byte length followed by UTF-8 bytes.
"""
from __future__ import annotations

import mmap
import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection

import gguf
import numpy as np

from ..errors import ModelFileError

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_TENSOR_NAME_BYTES = 63   # llama.cpp refuses names of GGML_MAX_NAME (64) bytes or more
MAX_KEY_BYTES = 65535        # the GGUF spec's limit on key length
MAX_ARRAY_DEPTH = 4          # arrays of arrays are legal; bound the recursion
# Python lists cost 8-60 bytes an element whatever the file spends on it, so the
# elements of all metadata arrays together are capped, not just bounded by the
# file size.  Real vocabularies need well under a million (Gemma 3: 3 x 262144).
MAX_METADATA_ELEMENTS = 1 << 24

_HEADER = struct.Struct("<4sIQQ")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

VT = gguf.GGUFValueType
_SCALARS: dict[int, struct.Struct] = {
    VT.UINT8: struct.Struct("<B"), VT.INT8: struct.Struct("<b"),
    VT.UINT16: struct.Struct("<H"), VT.INT16: struct.Struct("<h"),
    VT.UINT32: struct.Struct("<I"), VT.INT32: struct.Struct("<i"),
    VT.UINT64: struct.Struct("<Q"), VT.INT64: struct.Struct("<q"),
    VT.FLOAT32: struct.Struct("<f"), VT.FLOAT64: struct.Struct("<d"),
    VT.BOOL: struct.Struct("<?"),
}
# Numeric arrays are decoded in one numpy call (Gemma has 262k scores and token types).
# BOOL is read as bytes and compared with 0: numpy's bool dtype misbehaves on other bytes.
_ARRAY_DTYPES: dict[int, np.dtype] = {
    t: np.dtype(s.format).newbyteorder("<") for t, s in _SCALARS.items() if t != VT.BOOL
}
_ARRAY_DTYPES[VT.BOOL] = np.dtype(np.uint8)
# Smallest encoding of one array element: bounds an array's count by the bytes left.
_MIN_ELEMENT_BYTES = {**{t: s.size for t, s in _SCALARS.items()}, VT.STRING: 8, VT.ARRAY: 12}

# ggml type id -> (elements per block, bytes per block), from the gguf package.
QUANT_SIZES: dict[int, tuple[int, int]] = {int(t): v for t, v in gguf.GGML_QUANT_SIZES.items()}


@dataclass(frozen=True, eq=False)
class TensorInfo:
    name: str
    ggml_type: int
    type_name: str
    shape: tuple[int, ...]   # GGML order: shape[0] is the row length (n_in)
    offset: int              # absolute offset in the file
    nbytes: int
    data: np.ndarray = field(repr=False)  # uint8 view into the read-only mapping, no copy


class _Cursor:
    """Bounds-checked little-endian reads from the mapped header."""

    def __init__(self, buf: mmap.mmap, size: int, name: str):
        self.buf, self.size, self.pos, self.name = buf, size, 0, name
        self.array_elements = 0

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

    def string_array(self, count: int, what: str) -> list[str]:
        # The hot loop of opening a model (262k tokens for Gemma): locals only.
        buf, pos, size, unpack = self.buf, self.pos, self.size, _U64.unpack_from
        out = []
        for i in range(count):
            if size - pos < 8:
                self.pos = pos
                self.need(8, f"{what}[{i}] length")
            (n,) = unpack(buf, pos)
            pos += 8
            if n > size - pos:
                self.pos = pos
                self.need(n, f"{what}[{i}]")
            out.append(buf[pos:pos + n].decode("utf-8", "surrogateescape"))
            pos += n
        self.pos = pos
        return out


def _value(cur: _Cursor, vtype: int, what: str, depth: int = 0) -> Any:
    if vtype in _SCALARS:
        return cur.scalar(_SCALARS[vtype], what)
    if vtype == VT.STRING:
        return cur.value_string(what)
    if vtype == VT.ARRAY:
        return _array(cur, what, depth)
    raise cur.error(f"{what} has unknown value type {vtype}")


def _array(cur: _Cursor, what: str, depth: int) -> list:
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
    if etype in _ARRAY_DTYPES:
        dtype = _ARRAY_DTYPES[etype]
        values = np.frombuffer(cur.buf, dtype=dtype, count=count, offset=cur.pos)
        cur.pos += count * dtype.itemsize
        return (values != 0).tolist() if etype == VT.BOOL else values.tolist()
    if etype == VT.STRING:
        return cur.string_array(count, what)
    return [_value(cur, VT.ARRAY, f"{what}[{i}]", depth + 1) for i in range(count)]


@dataclass
class _RawTensor:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    rel_offset: int


def _tensor_info(cur: _Cursor, index: int) -> _RawTensor:
    name = cur.name_string(f"tensor {index} name", MAX_TENSOR_NAME_BYTES)
    what = f"tensor {name!r}"
    n_dims = cur.u32(f"{what} dimension count")
    if not 1 <= n_dims <= MAX_DIMS:
        raise cur.error(f"{what} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
    cur.need(8 * n_dims, f"{what} shape")
    shape = struct.unpack_from(f"<{n_dims}Q", cur.buf, cur.pos)
    cur.pos += 8 * n_dims
    if 0 in shape:
        raise cur.error(f"{what} has an empty dimension: shape {shape}")
    ggml_type = cur.u32(f"{what} type")
    rel_offset = cur.u64(f"{what} offset")
    return _RawTensor(name, shape, ggml_type, rel_offset)


def _map_readonly(path: Path) -> tuple[mmap.mmap, int]:
    # O_NONBLOCK: opening a FIFO must not hang waiting for a writer (no effect on files).
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        raise ModelFileError(f"{path}: cannot open: {err.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ModelFileError(f"{path}: not a regular file")
        if st.st_size < _HEADER.size:
            raise ModelFileError(f"{path.name}: too small to be a GGUF file ({st.st_size} bytes)")
        try:
            return mmap.mmap(fd, 0, access=mmap.ACCESS_READ), st.st_size
        except (OSError, ValueError) as err:
            raise ModelFileError(f"{path}: cannot map: {err}") from None
    finally:
        os.close(fd)  # the mapping keeps its own reference to the file


class GGUFFile:
    """A parsed, validated GGUF file whose tensor data stays in a read-only mapping.

    Keep it open while anything uses tensor data.  ``close()`` unmaps at once
    when no tensor view is still referenced; otherwise the mapping lives on
    until the last view is garbage-collected (never a dangling view).
    """

    path: Path
    version: int
    arch: str
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    alignment: int
    data_offset: int   # absolute offset of the tensor data section
    size: int          # of the file, in bytes

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._mmap, self.size = _map_readonly(self.path)
        self._bytes: np.ndarray | None = None
        try:
            self._parse()
        except BaseException:
            self.close()
            raise

    # -- parsing --------------------------------------------------------------
    def _parse(self) -> None:
        cur = _Cursor(self._mmap, self.size, self.path.name)
        n_tensors, n_kv = self._header(cur)
        self.metadata = self._read_metadata(cur, n_kv)
        self.arch = self._architecture(cur)
        self.alignment = self._alignment(cur)
        raw = [_tensor_info(cur, i) for i in range(n_tensors)]
        self.data_offset = -(-cur.pos // self.alignment) * self.alignment
        self._bytes = np.frombuffer(self._mmap, dtype=np.uint8)
        self.tensors = self._place_tensors(cur, raw)

    def _header(self, cur: _Cursor) -> tuple[int, int]:
        magic, version, n_tensors, n_kv = _HEADER.unpack_from(self._mmap, 0)
        cur.pos = _HEADER.size
        if magic != MAGIC:
            raise cur.error(f"not a GGUF file (starts with {magic!r}, expected {MAGIC!r})")
        if version in (v << 24 for v in SUPPORTED_VERSIONS):  # read byte-swapped
            raise cur.error("big-endian GGUF files are not supported")
        if version not in SUPPORTED_VERSIONS:
            raise cur.error(f"GGUF version {version} is not supported (only 2 and 3; "
                            "re-convert the model with a current llama.cpp)")
        # Each key/value takes at least 13 bytes and each tensor descriptor 32.
        if n_kv * 13 + n_tensors * 32 > cur.left:
            raise cur.error(f"header claims {n_tensors} tensors and {n_kv} metadata entries, "
                            f"more than a {self.size}-byte file can hold (truncated or corrupt)")
        self.version = version
        return n_tensors, n_kv

    @staticmethod
    def _read_metadata(cur: _Cursor, n_kv: int) -> dict[str, Any]:
        metadata: dict[str, Any] = {}
        for i in range(n_kv):
            key = cur.name_string(f"metadata key {i}", MAX_KEY_BYTES)
            if not key:
                raise cur.error(f"metadata key {i} is empty")
            if key in metadata:
                raise cur.error(f"metadata key {key!r} appears twice")
            vtype = cur.u32(f"type of {key!r}")
            metadata[key] = _value(cur, vtype, f"value of {key!r}")
        return metadata

    def _architecture(self, cur: _Cursor) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str) or not arch:
            raise cur.error("metadata lacks general.architecture")
        return arch

    def _alignment(self, cur: _Cursor) -> int:
        align = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if type(align) is not int or align <= 0 or align & (align - 1):
            raise cur.error(f"general.alignment must be a positive power of two, not {align!r}")
        return align

    def _place_tensors(self, cur: _Cursor, raw: list[_RawTensor]) -> dict[str, TensorInfo]:
        if raw and self.data_offset > self.size:
            raise cur.error(f"truncated: the tensor data would start at offset {self.data_offset}, "
                            f"past the end of the {self.size}-byte file")
        tensors: dict[str, TensorInfo] = {}
        for t in raw:
            if t.name in tensors:
                raise cur.error(f"tensor {t.name!r} appears twice")
            tensors[t.name] = self._checked_tensor(cur, t)
        self._check_no_overlap(cur, tensors.values())
        return tensors

    def _checked_tensor(self, cur: _Cursor, t: _RawTensor) -> TensorInfo:
        what = f"tensor {t.name!r}"
        if t.ggml_type not in QUANT_SIZES:
            raise cur.error(f"{what} has unknown ggml type id {t.ggml_type}")
        type_name = gguf.GGMLQuantizationType(t.ggml_type).name
        block, block_bytes = QUANT_SIZES[t.ggml_type]
        if t.shape[0] % block:
            raise cur.error(f"{what}: row length {t.shape[0]} is not a multiple of "
                            f"{type_name}'s block size {block}")
        if t.rel_offset % self.alignment:
            raise cur.error(f"{what}: data offset {t.rel_offset} is not aligned to {self.alignment}")
        n_elements = 1
        for d in t.shape:
            n_elements *= d
        nbytes = n_elements // block * block_bytes
        start = self.data_offset + t.rel_offset
        if start + nbytes > self.size:
            raise cur.error(f"{what}: data [{start}, {start + nbytes}) lies beyond the end of "
                            f"the {self.size}-byte file (truncated or lying offset)")
        return TensorInfo(t.name, t.ggml_type, type_name, t.shape, start, nbytes,
                          self._bytes[start:start + nbytes])

    @staticmethod
    def _check_no_overlap(cur: _Cursor, tensors: Collection[TensorInfo]) -> None:
        previous = None
        for t in sorted(tensors, key=lambda t: t.offset):
            if previous is not None and t.offset < previous.offset + previous.nbytes:
                raise cur.error(f"tensors {previous.name!r} and {t.name!r} overlap")
            previous = t

    # -- access ---------------------------------------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def arch_key(self, suffix: str, default: Any = None) -> Any:
        """An architecture hyperparameter: metadata[f"{arch}.{suffix}"]."""
        return self.metadata.get(f"{self.arch}.{suffix}", default)

    def unsupported_tensors(self, supported_types: Collection[int]) -> list[TensorInfo]:
        """Tensors whose ggml type is not in supported_types, in file order."""
        return [t for t in self.tensors.values() if t.ggml_type not in supported_types]

    def close(self) -> None:
        self.tensors = {}
        self._bytes = None
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:
                pass  # a tensor view is still alive: the mapping goes with the last one
            self._mmap = None

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, arch={getattr(self, 'arch', '?')!r}, tensors={len(self.tensors)})"


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    """Open, parse and validate a GGUF file (raises ModelFileError if it is malformed)."""
    return GGUFFile(path)
