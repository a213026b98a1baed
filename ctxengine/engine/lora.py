"""LoRA adapters: GGUF files as llama.cpp writes them (``general.type =
adapter``, ``adapter.type = lora``, ``adapter.lora.alpha``, tensors
``blk.N.<matrix>.weight.lora_a`` / ``.lora_b``), checked against the loaded
model and handed to the native core, which adds ``scale * alpha / rank *
B (A x)`` to each targeted matmul at run time (native/models/lora.h).

An adapter's identity is the BLAKE3 of its file's bytes. What made a
context's KV is the base's weight id plus a ``LoraSet``: the (adapter id,
scale) pairs in one canonical order, which is also the order the core adds
them in, so two sets that compare equal compute the same bits.
"""
from __future__ import annotations

import math
import numbers
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import blake3
import gguf
import numpy as np

from .. import _core
from ..errors import ContextError, CorruptDataError, ModelFileError, WeightMismatchError
from .gguf_file import GGUFFile, open_gguf

TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
_TENSOR = re.compile(r"blk\.(0|[1-9]\d{0,8})\.([a-z_]+)\.weight\.lora_([ab])")  # as llama.cpp names them
_T = gguf.GGMLQuantizationType
_TYPES = {int(_T.F32), int(_T.F16), int(_T.BF16), int(_T.Q8_0)}


@dataclass(frozen=True, eq=False)
class LoraAdapter:
    """One adapter file, loaded for one engine."""

    name: str
    path: Path
    id: str             # hex BLAKE3 of the file's bytes
    alpha: float        # adapter.lora.alpha; 0: the scale is used as it is
    ranks: tuple[int, ...]
    n_matrices: int
    core: object = field(repr=False)

    def describe(self, scale: float = 1.0) -> dict:
        """As llama-server's /lora-adapters lists one."""
        return {"name": self.name, "path": str(self.path), "blake3": self.id, "scale": scale,
                "alpha": self.alpha, "ranks": list(self.ranks), "matrices": self.n_matrices}


def check_scale(scale: object, what: str = "LoRA scale") -> float:
    """A scale as the core uses it (float32), or a ValueError naming the bad one:
    a real number (not a bool, not a string) that is finite in float32."""
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real):
        raise ValueError(f"{what} must be a number, not {scale!r}")
    try:
        value = float(scale)
    except (OverflowError, TypeError, ValueError):
        value = math.inf
    with np.errstate(over="ignore"):  # a float32 overflow is the error below, not a warning
        single = float(np.float32(value)) if math.isfinite(value) else value
    if not math.isfinite(single):
        raise ValueError(f"{what} must be a finite number, not {_short(scale)}")
    return single


def _check_factor(adapter: LoraAdapter, scale: float) -> None:
    """Refuse a scale whose factor, scale * alpha / rank as the core computes it in
    float32 (lora.h), is not finite: every forward under it would be NaN."""
    if not adapter.alpha:
        return
    with np.errstate(over="ignore"):
        product = np.float32(scale) * np.float32(adapter.alpha)
    if not np.isfinite(product):
        raise ValueError(f"scale {scale_text(scale)} of LoRA adapter {adapter.name!r} times its alpha "
                         f"{scale_text(adapter.alpha)} overflows float32; use a smaller scale")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def scale_text(scale: float) -> str:
    """A scale as the core holds it, in the fewest digits that name that float32
    (1.0000001 is not 1): errors that compare two sets must show the difference."""
    return str(np.float32(scale))


@dataclass(frozen=True, eq=False)
class LoraSet:
    """The adapters a context runs with and their scales, in canonical order
    (by adapter id): part of what made its KV. Two sets are equal when their
    (adapter id, scale) pairs are, whatever names the adapters were loaded under."""

    uses: tuple[tuple[LoraAdapter, float], ...] = ()

    @classmethod
    def of(cls, uses: Iterable[tuple[LoraAdapter, object]]) -> "LoraSet":
        pairs, seen = [], {}
        for adapter, scale in uses:
            if adapter.id in seen:
                first = seen[adapter.id]
                raise ValueError(f"LoRA adapter {adapter.name!r} is listed twice" if first == adapter.name else
                                 f"LoRA adapters {first!r} and {adapter.name!r} are the same file "
                                 f"(BLAKE3 {adapter.id[:12]}); list it once")
            seen[adapter.id] = adapter.name
            value = check_scale(scale, f"scale of LoRA adapter {adapter.name!r}")
            _check_factor(adapter, value)
            if value != 0.0:  # a zero scale adds exactly nothing: the same KV as without it
                pairs.append((adapter, value))
        return cls(tuple(sorted(pairs, key=lambda p: p[0].id)))

    @classmethod
    def recorded(cls, adapters: Iterable[LoraAdapter], identity: list) -> "LoraSet":
        """The set a snapshot records ([[id, scale], ...]) from these loaded adapters;
        ContextError naming the first one that is not loaded."""
        by_id = {a.id: a for a in adapters}
        missing = [i for i, _ in identity if i not in by_id]
        if missing:
            raise ContextError(f"it was made with LoRA adapter {missing[0]}, which is not loaded here")
        return cls.of((by_id[i], s) for i, s in identity)

    def __bool__(self) -> bool:
        return bool(self.uses)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LoraSet) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def identity(self) -> list[list]:
        """[[adapter id, scale], ...]: what a snapshot records and caches key by."""
        return [[a.id, s] for a, s in self.uses]

    @property
    def key(self) -> tuple:
        return tuple((a.id, s) for a, s in self.uses)

    def native(self) -> list | None:
        """The forward item's adapter list (None: none)."""
        return [(a.core, s) for a, s in self.uses] or None

    def describe(self) -> str:
        return ", ".join(f"{a.name} ({a.id[:12]}) x {scale_text(s)}" for a, s in self.uses) or "no adapters"


NO_LORA = LoraSet()


def check_finite(logits: np.ndarray, lora: LoraSet) -> None:
    """A ContextError for logits a forward pass under ``lora`` gave that hold NaN or
    +inf (-inf is a masked token), naming the adapters' scales as the likely cause."""
    if np.all(logits < np.inf):  # False for NaN too
        return
    if lora:
        raise ContextError(f"the logits are not finite under LoRA {lora.describe()}: the adapters' output "
                           "overflows float32 at these scales; use smaller ones")
    raise ContextError("the logits are not finite (NaN or +inf): the forward pass overflowed")


def describe_identity(identity: list) -> str:
    """A recorded [[id, scale], ...] in words, for errors."""
    return ", ".join(f"{i[:12]} x {scale_text(s)}" for i, s in identity) or "no adapters"


def continuing_set(made_with: list, loaded: Iterable[LoraAdapter], lora: LoraSet | None, what: str) -> LoraSet:
    """The adapters a restore of KV made with ``made_with`` continues with: ``lora`` if
    it is that set, or (None) that set from the ``loaded`` adapters; else
    WeightMismatchError naming both."""
    loaded = list(loaded)
    if not isinstance(made_with, list) or not all(
            isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], (int, float))
            and not isinstance(p[1], bool) for p in made_with):
        raise CorruptDataError(f"{what} records its LoRA adapters as {made_with!r}, not [[id, scale], ...]")
    if lora is None:
        try:
            return LoraSet.recorded(loaded, made_with)
        except ContextError:
            have = ", ".join(f"{a.name} ({a.id[:12]})" for a in loaded) or "none"
            raise WeightMismatchError(
                f"{what} was made with LoRA {describe_identity(made_with)}, but the model has not loaded "
                f"them (loaded adapters: {have}); refusing to continue its KV without them") from None
    if made_with != lora.identity:
        raise WeightMismatchError(
            f"{what} was made with LoRA {describe_identity(made_with)}, but the restore asks for "
            f"{lora.describe()}; refusing to continue its KV under other adapters")
    return lora


def file_id(path: Path) -> str:
    h = blake3.blake3()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


_known_ids: dict[tuple, str] = {}


def cached_file_id(path: str | Path) -> str:
    """file_id, hashed once per (file, size, mtime, inode): a fleet host names the
    adapters it can load in every heartbeat without reading them again (OSError if
    the file cannot be read)."""
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ino)
    found = _known_ids.get(key)
    if found is None:
        found = _known_ids[key] = file_id(Path(path))
    return found


def adapter_ids(identity: object) -> tuple[str, ...]:
    """The adapter ids of a recorded set ([[id, scale], ...], a manifest's
    ``arch.lora``), sorted; () when it names none or is malformed (restore then
    refuses it with the reason: continuing_set)."""
    if not isinstance(identity, list):
        return ()
    return tuple(sorted({p[0] for p in identity if isinstance(p, list) and p and isinstance(p[0], str)}))


def load_adapter(core_model, arch: str, path: str | Path, name: str) -> LoraAdapter:
    """Read and check an adapter file for this model; nothing is kept if it fails."""
    path = Path(path)
    f = open_gguf(path)
    try:
        alpha, core, ranks = _build(core_model, arch, f, path.name)
        return LoraAdapter(name=name, path=path, id=file_id(path), alpha=alpha, ranks=tuple(sorted(ranks)),
                           n_matrices=core.n_matrices, core=core)
    finally:
        f.close()


def _build(core_model, arch: str, f: GGUFFile, label: str):
    def bad(message: str) -> ModelFileError:
        return ModelFileError(f"{label}: {message}")

    if f.get("general.type") != "adapter" or f.get("adapter.type") != "lora":
        raise bad(f"not a LoRA adapter (general.type {f.get('general.type')!r}, "
                  f"adapter.type {f.get('adapter.type')!r})")
    if f.arch != arch:
        raise bad(f"an adapter for architecture {f.arch!r}, and this model is {arch!r}")
    alpha = f.get("adapter.lora.alpha", 0.0)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) \
            or abs(alpha) > float(np.finfo(np.float32).max):  # the core holds it in float32
        raise bad(f"adapter.lora.alpha is {alpha!r}, not a finite number in float32")
    pairs: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for t in f.tensors.values():
        m = _TENSOR.fullmatch(t.name)
        if m is None:
            raise bad(f"tensor {t.name} is not a LoRA matrix this engine applies "
                      f"(blk.N.<{'|'.join(TARGETS)}>.weight.lora_a/_b)")
        if m[2] not in TARGETS:
            raise bad(f"LoRA on {m[2]} ({t.name}) is not supported (only {', '.join(TARGETS)})")
        pair = pairs.setdefault((int(m[1]), m[2]), {})
        if m[3] in pair:
            raise bad(f"blk.{int(m[1])}.{m[2]} has two lora_{m[3]} tensors (one is {t.name})")
        pair[m[3]] = _matrix(t, bad, m[3])
    if not pairs:
        raise bad("the adapter holds no LoRA matrices")
    core = _core.LoraAdapter(core_model, float(alpha))
    ranks = set()
    for (layer, target), ab in sorted(pairs.items()):
        what = f"blk.{layer}.{target}"
        if set(ab) != {"a", "b"}:
            raise bad(f"{what} has lora_{''.join(ab)} without its pair")
        (a, a_type), (b, b_type) = ab["a"], ab["b"]
        if a.shape[0] != b.shape[1]:
            raise bad(f"{what}: lora_a has rank {a.shape[0]} and lora_b rank {b.shape[1]}")
        if layer >= core_model.n_layer:
            raise bad(f"{what}: the model has {core_model.n_layer} layers")
        try:
            core.set(layer, target, a, a_type, b, b_type)
        except ValueError as err:
            raise bad(f"not made for this model: {err}") from None
        ranks.add(a.shape[0])
    return float(alpha), core, ranks


def _matrix(t, bad, side: str) -> tuple[np.ndarray, int]:
    """A tensor as a (ne1, ne0) matrix and the ggml type the core keeps it in: as the
    file holds it (F32, F16, BF16 as uint16 bits, and an A's Q8_0 as its raw blocks,
    one row of bytes per rank), every value widened exactly where the core reads it.
    A Q8_0 B (a rank that is a multiple of 32) is widened here to F32, exactly."""
    if len(t.shape) != 2:
        raise bad(f"tensor {t.name} has {len(t.shape)} dimensions, a LoRA matrix has 2")
    if t.ggml_type not in _TYPES:
        raise bad(f"tensor {t.name} has type {t.type_name}; LoRA matrices may be F32, F16, BF16 or Q8_0")
    n_in, n_out = t.shape  # never 0: the GGUF reader refuses empty dimensions (so a rank of 0)
    kind = t.ggml_type
    if kind == int(_T.F16):
        m = np.frombuffer(t.data, dtype=np.float16).reshape(n_out, n_in)
        finite = np.isfinite(m).all()
    elif kind == int(_T.BF16):
        m = np.frombuffer(t.data, dtype=np.uint16).reshape(n_out, n_in)
        finite = not ((m & 0x7F80) == 0x7F80).any()  # exponent all ones: inf or NaN
    elif kind == int(_T.Q8_0) and side == "a":
        m = np.frombuffer(t.data, dtype=np.uint8).reshape(n_out, -1)  # blocks: f16 d, then 32 int8
        d = m.reshape(-1, 34)[:, :2].copy().view(np.float16)
        finite = np.isfinite(d).all()
    else:
        m = np.asarray(gguf.quants.dequantize(t.data, _T(kind)), dtype=np.float32).reshape(n_out, n_in)
        finite = np.isfinite(m).all()
        kind = int(_T.F32)
    if not finite:
        raise bad(f"tensor {t.name} holds values that are not finite")
    return m, kind
