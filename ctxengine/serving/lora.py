"""LoRA adapters as a server offers them, after llama-server: adapters given
at start (``ctx serve --lora name=path[:scale]``) are loaded into each model
they fit, numbered in that order; every request runs with the model's current
scales (``GET`` / ``POST /lora-adapters``) unless it names its own in a
``lora`` field, ``[{"id": 0, "scale": 0.5}]`` or ``[{"name": "x", "scale": 1}]``,
where adapters it does not list get scale 0. An Ollama model's ADAPTER layers
come first, named "adapter" (or "adapter0", ...), at scale 1, as Ollama
always applies them: a request or POST /lora-adapters may list them (at 1)
or leave them out, and they still apply; another scale is refused.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ..engine.lora import LoraAdapter, LoraSet, cached_file_id, check_scale
from ..errors import CtxError, ModelFileError, RequestError

if TYPE_CHECKING:
    from ..state.model import Model


@dataclass(frozen=True)
class LoraSpec:
    """One adapter to serve: a name, its file, its scale until changed."""

    name: str
    path: Path
    scale: float = 1.0

    @classmethod
    def parse(cls, text: str, *, need_file: bool = False) -> "LoraSpec":
        """``name=path[:scale]`` (a path alone is named after its file); ``need_file``:
        refused unless the file can be opened (``ctx run`` and ``ctx serve`` at start)."""
        spec = cls._parse(text)
        if need_file:
            try:
                with open(spec.path, "rb"):
                    pass
            except OSError as err:
                form = "" if "=" in text else " (expected NAME=PATH[:SCALE], or an adapter file's path)"
                raise CtxError(f"--lora {text!r}: cannot open {spec.path}: {err.strerror}{form}") from None
        return spec

    @classmethod
    def _parse(cls, text: str) -> "LoraSpec":
        name, eq, rest = text.partition("=")
        if not eq:
            name, rest = Path(text).stem, text
        path, colon, tail = rest.rpartition(":")
        scale = 1.0
        if colon and path:
            try:
                scale = float(tail)
            except ValueError:
                path = rest  # a colon inside the path
        else:
            path = rest
        if not name or not path:
            raise CtxError(f"--lora {text!r}: expected name=path[:scale]")
        try:
            scale = check_scale(scale)
        except ValueError as err:
            raise CtxError(f"--lora {text!r}: {err}") from None
        return cls(name, Path(path), scale)


class ServedLoras:
    """One loaded model's adapters: numbered, with the scales requests get by default."""

    def __init__(self, model: "Model", specs: Sequence[LoraSpec], own: Sequence[Path] = ()):
        """``specs``: the server's adapters, each loaded if it fits the model; ``own``:
        the model's own (Ollama ADAPTER layers), which must load, at scale 1."""
        self.adapters: list[LoraAdapter] = []
        self.scales: list[float] = []
        self.skipped: dict[str, str] = {}  # name -> why this model could not take it
        self._lock = threading.Lock()
        self.n_own = len(own)  # the first n_own adapters are the model's own: always at scale 1
        for i, path in enumerate(own):
            adapter = model.load_lora(f"adapter{i}" if len(own) > 1 else "adapter", path)
            same = [a.name for a in self.adapters if a.id == adapter.id]
            if same:  # the same weights listed twice: which scale the model means is not ours to guess
                raise ModelFileError(f"{path}: the model lists this ADAPTER layer twice ({same[0]} and "
                                     f"{adapter.name}, BLAKE3 {adapter.id[:12]})")
            self.adapters.append(adapter)
            self.scales.append(1.0)
        for spec in specs:
            try:
                scale = check_scale(spec.scale)
                spec_id = cached_file_id(spec.path)
                same = [a.name for a in self.adapters if a.id == spec_id]
                if same:
                    raise CtxError(f"{spec.path} is the same file as adapter {same[0]!r}")
                adapter = model.load_lora(spec.name, spec.path)
            except (CtxError, OSError, ValueError) as err:
                self.skipped[spec.name] = str(err)
                continue
            self.adapters.append(adapter)
            self.scales.append(scale)

    def describe(self) -> list[dict]:
        """GET /lora-adapters: llama-server's fields (id, path, scale) and ours."""
        with self._lock:
            return [dict(a.describe(s), id=i) for i, (a, s) in enumerate(zip(self.adapters, self.scales))]

    def set_scales(self, entries: object) -> None:
        """POST /lora-adapters: the listed adapters' scales; the others become 0."""
        scales = self._parse(entries)
        with self._lock:
            self.scales = scales

    def default(self) -> LoraSet:
        with self._lock:
            return LoraSet.of(zip(self.adapters, self.scales))

    def for_request(self, entries: object | None) -> LoraSet:
        """The adapters a request (or a named context) runs with: its own ``lora``
        list, or the defaults; a RequestError naming the bad entry."""
        if entries is None:
            return self.default()
        try:
            return LoraSet.of(zip(self.adapters, self._parse(entries)))
        except ValueError as err:
            raise RequestError(str(err), param="lora") from None

    def _parse(self, entries: object) -> list[float]:
        """[{"id" | "name", "scale"}] as one scale per adapter; ValueError naming the bad entry."""
        if not isinstance(entries, list):
            raise ValueError("'lora' must be a list of {\"id\" or \"name\", \"scale\"} objects")
        scales = [1.0] * self.n_own + [0.0] * (len(self.adapters) - self.n_own)
        names = {a.name: i for i, a in enumerate(self.adapters)}
        listed: dict[int, int] = {}
        for n, entry in enumerate(entries):
            where = f"lora[{n}]"
            if not isinstance(entry, dict):
                raise ValueError(f"{where} must be an object with \"id\" or \"name\" and \"scale\"")
            i = self._index(entry, names, where)
            if i in listed:
                raise ValueError(f"{where}: adapter {i} ({self.adapters[i].name!r}) is already listed in "
                                 f"lora[{listed[i]}]")
            listed[i] = n
            scales[i] = check_scale(entry.get("scale", 1.0), f"{where}.scale")
            if i < self.n_own and scales[i] != 1.0:
                raise ValueError(f"{where}: {self.adapters[i].name!r} is the model's own ADAPTER layer: part of "
                                 f"the model, it always applies at scale 1 (serve the base model to go without)")
        return scales

    def _index(self, entry: dict, names: dict[str, int], where: str) -> int:
        if "name" in entry:
            name = entry["name"]
            if not isinstance(name, str):
                raise ValueError(f"{where}.name must be a string, not {type(name).__name__}")
            if name not in names:
                why = f" ({self.skipped[name]})" if name in self.skipped else ""
                raise ValueError(f"{where}: unknown LoRA adapter {name!r}{why}; loaded: "
                                 f"{', '.join(names) or 'none'}")
            if "id" in entry and entry["id"] != names[name]:
                raise ValueError(f"{where}: \"id\" {entry['id']!r} and \"name\" {name!r} name different "
                                 f"adapters (give one)")
            return names[name]
        i = entry.get("id")
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(self.adapters):
            raise ValueError(f"{where}: invalid adapter id {i!r}; ids are 0..{len(self.adapters) - 1}"
                             if self.adapters else f"{where}: no LoRA adapters are loaded for this model")
        return i
