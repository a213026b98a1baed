"""The models one server can serve, by the names clients use.

A catalog is built from what the user pointed at (``-m PATH`` files, a
``--models-dir``) plus the packaged default; other model sources (Ollama's
store) add their entries to it, and the catalog asks the sources it is given
about names it does not know (engine/model_source.py). Each entry either has
a GGUF file to load or a reason it cannot be served; the catalog never loads
a model itself (that is the runtime's job, on first use).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Sequence

from ..errors import CtxError, ModelNotFoundError
from .gguf_split import is_later_part
from .hf_files import is_hf_spec
from .model_source import CatalogEntry, ModelSource, canonical_name, find_in_sources
from .registry import DEFAULT, MODELS, is_known_name, resolve_model
from .servable import unservable_reason


class ModelCatalog:
    def __init__(self, entries: Iterable[CatalogEntry] = (), *, sources: Sequence[ModelSource] = ()):
        self.sources = tuple(sources)  # asked, in order, about names no entry has
        self._entries: list[CatalogEntry] = []
        self._by_name: dict[str, CatalogEntry] = {}
        for e in entries:
            self.add(e)

    @classmethod
    def build(cls, model_paths: Iterable[str | os.PathLike] = (), models_dir: str | os.PathLike | None = None,
              *, packaged: bool = True, sources: Sequence[ModelSource] = ()) -> "ModelCatalog":
        """Files, a folder and the packaged models (serving/catalog.py adds Ollama's stores)."""
        cat = cls(sources=sources)
        for spec in model_paths:
            cat.add_spec(spec)
        if models_dir is not None:
            cat.add_dir(models_dir)
        if packaged:
            cat.add_packaged()
            cat.add_pulled()
        return cat

    # -- building -------------------------------------------------------------------
    def add(self, entry: CatalogEntry) -> CatalogEntry:
        """Add an entry unless another entry has its name (the first one wins).
        A name beats an alias: an earlier entry's alias that spells this name
        (the packaged smollm2's "smollm2:135m", say) now finds this entry."""
        key = entry.name.lower()
        taken = self._by_name.get(key)
        if taken is not None and taken.name.lower() == key:
            return taken
        self._entries.append(entry)
        self._by_name[key] = entry
        for n in entry.aliases:
            self._by_name.setdefault(n.lower(), entry)
        return entry

    def add_spec(self, spec: str | os.PathLike) -> CatalogEntry:
        """A ``-m`` argument: a GGUF path, a known name (smollm2, gemma3), or a
        model a source knows, such as Ollama's store (with its layers, or the
        reason it cannot be served)."""
        path = Path(os.path.expanduser(spec))
        if path.is_file():
            return self.add(_file_entry(path, "file"))
        found = None if is_known_name(str(spec)) else find_in_sources(self.sources, str(spec))
        if found is not None:
            return self.add(found)
        try:
            resolved = resolve_model(str(spec), sources=self.sources)
        except ModelNotFoundError as err:
            return self.add(CatalogEntry(str(spec), None, "file", error=str(err)))
        return self.add(_file_entry(resolved, "file", name=str(spec)))

    def add_dir(self, folder: str | os.PathLike) -> None:
        folder = Path(os.path.expanduser(folder))
        if not folder.is_dir():
            raise ModelNotFoundError(f"models directory {folder} does not exist")
        for path in sorted(folder.rglob("*.gguf")):
            if path.is_file() and not is_later_part(path):  # a split model is listed by its first part
                self.add(_file_entry(path, "models-dir"))

    def add_packaged(self) -> None:
        for known in MODELS:
            path = known.find()
            if path is None and known.installed():
                path = known.target  # built there on first use (registry.resolve_model)
            if path is None and known is not DEFAULT:
                continue  # not installed: not worth listing
            error = None if path is not None else f"not installed: {known.how_to_get}"
            self.add(CatalogEntry(known.name, path, "packaged", aliases=known.aliases, error=error,
                                  modified=_mtime(path)))

    def add_pulled(self) -> None:
        """Models ``ctx pull hf://...`` fetched, by the names they were pulled as."""
        from .hf_pull import pulled_paths  # imports huggingface_hub: only when something was pulled

        for name, aliases, path, error in pulled_paths():
            entry = _file_entry(path, "hf", name=name) if path is not None else CatalogEntry(name, None, "hf")
            entry.aliases = tuple(aliases)
            entry.error = entry.error or error
            self.add(entry)

    # -- reading --------------------------------------------------------------------
    def entries(self) -> list[CatalogEntry]:
        return list(self._entries)

    def get(self, name: str) -> CatalogEntry:
        entry = self.lookup(name)
        if entry is None:
            known = ", ".join(e.name for e in self._entries) or "none"
            raise ModelNotFoundError(f"model '{name}' not found (served here: {known})")
        return entry

    def lookup(self, name: str) -> CatalogEntry | None:
        """By name or alias, case-insensitively; then any other spelling a source
        gives the same name (Ollama's ``https://registry.ollama.ai/library/smollm2:latest``)."""
        key = name.strip().lower()
        entry = self._by_name.get(key)
        if entry is None and key:
            canonical = canonical_name(self.sources, key)
            entry = self._by_name.get(canonical.lower()) if canonical is not None else None
        if entry is None and is_hf_spec(key):
            entry = self._from_hf_cache(name.strip())
        return entry

    def _from_hf_cache(self, name: str) -> CatalogEntry | None:
        """A Hugging Face name the cache holds though no ``ctx pull`` listed it (another
        tool's download, another quant of a pulled repo), found as ``ctx run -m`` finds it."""
        from .hf_files import parse_hf_spec
        from .hf_pull import cached_model  # imports huggingface_hub: only for such names

        try:
            spec = parse_hf_spec(name)
            path = cached_model(name)
        except CtxError:
            return None
        return self.add(_file_entry(path, "hf", name=spec.name)) if path is not None else None

    @property
    def default(self) -> CatalogEntry | None:
        """The model a request without a model name gets: the first servable entry."""
        return next((e for e in self._entries if e.servable), None)


def _mtime(path: Path | None) -> float:
    try:
        return path.stat().st_mtime if path is not None else 0.0
    except OSError:
        return 0.0


def _file_entry(path: Path, source: str, *, name: str | None = None) -> CatalogEntry:
    """A GGUF file; one the engine cannot run is listed with the reason, not served."""
    stem = path.name[:-5] if path.name.endswith(".gguf") else path.name
    error = unservable_reason(path)
    return CatalogEntry(name or stem, path if error is None else None, source,
                        aliases=(path.name,) if name is None else (stem,), error=error, modified=_mtime(path))
