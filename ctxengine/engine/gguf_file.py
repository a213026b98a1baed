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
(The cursor and the metadata value readers are gguf_cursor.py; a model split
into several files, opened by its first part, is joined here: gguf_split.py.)
The ggml type table (ids, names, block sizes) is gguf_types.py's.

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
from typing import TYPE_CHECKING, Any, Collection

from ..errors import ModelFileError
from .gguf_cursor import Cursor, read_value
from .gguf_split import check_later_part, check_tensor_total, later_part_paths, split_count
from .gguf_types import ValueType, tensor_type

if TYPE_CHECKING:
    import numpy as np

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_TENSOR_NAME_BYTES = 63   # llama.cpp refuses names of GGML_MAX_NAME (64) bytes or more
MAX_KEY_BYTES = 65535        # the GGUF spec's limit on key length
# BPE merges a vocabulary may list, per token: each joins two tokens into a third, and
# a token may be reached by several (Llama 3: 280,147 for 128,256 tokens). A file with
# millions more (16.6M for SmolLM2's 49k tokens) took 7.5 GB and two minutes to open.
MAX_MERGES_PER_TOKEN = 8

_HEADER = struct.Struct("<4sIQQ")


@dataclass(frozen=True, eq=False)
class TensorInfo:
    name: str
    ggml_type: int
    type_name: str
    shape: tuple[int, ...]   # GGML order: shape[0] is the row length (n_in)
    offset: int              # absolute offset in the file
    nbytes: int
    data: np.ndarray | None = field(repr=False)  # uint8 view into the read-only mapping, no copy (None:
                                                 # a header-only read, which imports no numpy)


@dataclass
class _RawTensor:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    rel_offset: int


def _tensor_info(cur: Cursor, index: int) -> _RawTensor:
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


def _check_merges_count(cur: Cursor, vtype: int, tokens: Any) -> None:
    """Refuse a merges array longer than MAX_MERGES_PER_TOKEN a token of the vocabulary
    read before it, from its length alone (before its strings are decoded)."""
    if vtype != ValueType.ARRAY or cur.left < 12 or not isinstance(tokens, list):
        return  # not an array (the tokenizer names it), or cut short (read_value names it)
    count = struct.unpack_from("<Q", cur.buf, cur.pos + 4)[0]
    if count > MAX_MERGES_PER_TOKEN * len(tokens) + 1024:
        raise cur.error(f"tokenizer.ggml.merges lists {count:,} merges for a vocabulary of {len(tokens):,} tokens, "
                        f"more than {MAX_MERGES_PER_TOKEN} a token: the file is damaged or not a real tokenizer")


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
    parts: list["GGUFFile"]  # a split model's later parts (gguf_split.py); their tensors are in tensors

    def __init__(self, path: str | os.PathLike, *, part: int = 0, header_only: bool = False):
        self.path = Path(path)
        self.header_only = header_only
        self.parts = []
        self._mmap, self.size = _map_readonly(self.path)
        self._bytes: np.ndarray | None = None
        try:
            self._parse(later_part=part > 0)
        except BaseException:
            self.close()
            raise

    # -- parsing --------------------------------------------------------------
    def _parse(self, later_part: bool) -> None:
        cur = Cursor(self._mmap, self.size, self.path.name, header_only=self.header_only)
        n_tensors, n_kv = self._header(cur)
        self.metadata = self._read_metadata(cur, n_kv)
        count = 1 if later_part else split_count(self.metadata, self.path.name)
        self.arch = str(self.metadata.get("general.architecture", "")) if later_part else self._architecture(cur)
        self.alignment = self._alignment(cur)
        raw = [_tensor_info(cur, i) for i in range(n_tensors)]
        self.data_offset = -(-cur.pos // self.alignment) * self.alignment
        self._bytes = None if self.header_only else _byte_view(self._mmap)
        self.tensors = self._place_tensors(cur, raw)
        if count > 1:
            self._join_parts(count)

    def _join_parts(self, count: int) -> None:
        """A split model's later parts: their tensors follow this file's, in part order."""
        for no, path in enumerate(later_part_paths(self.path, count), start=1):
            self.parts.append(part := GGUFFile(path, part=no, header_only=self.header_only))
            check_later_part(part.metadata, no, count, path.name)
            for name, t in part.tensors.items():
                if self.tensors.setdefault(name, t) is not t:
                    raise ModelFileError(f"{path.name}: tensor {name!r} is also in an earlier part")
        check_tensor_total(self.metadata, len(self.tensors), self.path.name)

    def _header(self, cur: Cursor) -> tuple[int, int]:
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
    def _read_metadata(cur: Cursor, n_kv: int) -> dict[str, Any]:
        metadata: dict[str, Any] = {}
        for i in range(n_kv):
            key = cur.name_string(f"metadata key {i}", MAX_KEY_BYTES)
            if not key:
                raise cur.error(f"metadata key {i} is empty")
            if key in metadata:
                raise cur.error(f"metadata key {key!r} appears twice")
            vtype = cur.u32(f"type of {key!r}")
            if key == "tokenizer.ggml.merges":
                _check_merges_count(cur, vtype, metadata.get("tokenizer.ggml.tokens"))
            try:
                metadata[key] = read_value(cur, vtype, f"value of {key!r}")
            except MemoryError:
                raise cur.error(f"the value of {key!r} does not fit in memory (its arrays hold "
                                f"{cur.array_elements:,} elements)") from None
        return metadata

    def _architecture(self, cur: Cursor) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str) or not arch:
            raise cur.error("metadata lacks general.architecture")
        return arch

    def _alignment(self, cur: Cursor) -> int:
        align = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if type(align) is not int or align <= 0 or align & (align - 1):
            raise cur.error(f"general.alignment must be a positive power of two, not {align!r}")
        return align

    def _place_tensors(self, cur: Cursor, raw: list[_RawTensor]) -> dict[str, TensorInfo]:
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

    def _checked_tensor(self, cur: Cursor, t: _RawTensor) -> TensorInfo:
        what = f"tensor {t.name!r}"
        known = tensor_type(t.ggml_type)
        if known is None:
            raise cur.error(f"{what} has unknown ggml type id {t.ggml_type}")
        type_name, block, block_bytes = known
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
                          None if self._bytes is None else self._bytes[start:start + nbytes])

    @staticmethod
    def _check_no_overlap(cur: Cursor, tensors: Collection[TensorInfo]) -> None:
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

    def mappings(self) -> list[tuple[int, int, Path]]:
        """(address, size, path) of the mapped bytes of this file and its later parts."""
        own = [] if self._bytes is None else [(self._bytes.ctypes.data, self.size, self.path)]
        return own + [m for part in self.parts for m in part.mappings()]

    def close(self) -> None:
        for part in self.parts:
            part.close()
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


def _byte_view(m: mmap.mmap) -> np.ndarray:
    import numpy as np  # here, not at the top: a header-only read (a pull's check, a catalog scan) does without

    return np.frombuffer(m, dtype=np.uint8)


def open_gguf(path: str | os.PathLike, *, header_only: bool = False) -> GGUFFile:
    """Open, parse and validate a GGUF file (raises ModelFileError if it is malformed).
    header_only: for checks that read no vocabulary (is it a GGUF, can the engine run
    it): long string arrays are bounds-checked but not decoded (gguf_cursor.UnreadStrings),
    which makes Gemma 3's open 0.25 s faster. Nothing that hashes or tokenizes may use it."""
    return GGUFFile(path, header_only=header_only)
