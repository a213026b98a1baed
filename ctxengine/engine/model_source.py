"""Catalog entries, and the sources besides files that models come from.

A source (Ollama's store is the one there is) knows models by names of its
own. The registry and the catalog ask the sources they are given about a
name (``resolve_model(spec, sources=)``, ``ModelCatalog(sources=)``), so
they never import one: a source imports this module, never the other way
round, and whoever sits above both passes the list (state/model.py for
``ce.load``, serving/catalog.py for the served catalog). Listing a source's
every model is its own call (``ollama.store.add_ollama_models``), made by
whoever builds a catalog.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Sequence


@dataclass
class CatalogEntry:
    name: str                          # what clients put in "model"
    path: Path | None                  # the GGUF file; None when it cannot be served
    source: str                        # "packaged", "file", "models-dir", "ollama"
    aliases: tuple[str, ...] = ()
    error: str | None = None           # why it cannot be served (listed, never crashed on)
    # Layers an Ollama manifest may carry: default options, system prompt, template.
    params: dict = field(default_factory=dict)
    system: str | None = None
    template: str | None = None
    modified: float = 0.0              # mtime of the file (or manifest)
    # From an Ollama manifest (ollama/store.py): the manifest's sha256 (what
    # /api/tags lists as digest), the bytes it holds (every layer and the config),
    # its config blob (model_family, file_type, ...), the model layer's "from" and
    # the license layer.
    digest: str = ""
    manifest_size: int = 0
    config: dict = field(default_factory=dict)
    parent_model: str = ""
    license: str | None = None
    # Ollama ADAPTER layers (LoRA adapter GGUFs), applied to every request at scale 1.
    adapters: tuple[Path, ...] = ()

    @property
    def size(self) -> int:
        try:
            return self.path.stat().st_size if self.path is not None else 0
        except OSError:
            return 0

    @property
    def listed_size(self) -> int:
        """The size Ollama's /api/tags lists: an Ollama model's whole manifest (Manifest.Size:
        its system, template and params layers, adapters and config too), else the file's."""
        return self.manifest_size or self.size

    @property
    def servable(self) -> bool:
        return self.path is not None and self.error is None


class ModelSource(Protocol):
    def find(self, spec: str) -> CatalogEntry | None:
        """The entry for a name in this source's spelling (any case), or None if it has none."""

    def canonical_name(self, name: str) -> str | None:
        """The one full spelling of a name, as entries list it; None if it is not a name here."""


def find_in_sources(sources: Sequence[ModelSource], spec: str) -> CatalogEntry | None:
    """The first source's entry for a name, or None."""
    for source in sources:
        entry = source.find(spec)
        if entry is not None:
            return entry
    return None


def canonical_name(sources: Sequence[ModelSource], name: str) -> str | None:
    """The first source's full spelling of a name, or None."""
    for source in sources:
        full = source.canonical_name(name)
        if full is not None:
            return full
    return None
