"""The catalog a serving process serves: what ``-m``, ``--models-dir`` and the
packaged models give (engine/catalog.py), then every model in Ollama's stores
(ollama/store.py). ``ctx serve`` (HTTP and gRPC alike) and ``ctx models`` build
theirs here.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Iterable

from ..engine.catalog import ModelCatalog
from ..errors import ModelNotFoundError
from ..ollama.store import add_ollama_models, ollama_roots
from ..state.model import MODEL_SOURCES


def build_catalog(model_paths: Iterable[str | os.PathLike] = (), models_dir: str | os.PathLike | None = None, *,
                  packaged: bool = True, ollama: Iterable[str | os.PathLike] = ()) -> ModelCatalog:
    """Files, a folder and the packaged models, then each model in the Ollama stores ``ollama``;
    other names are asked of the model sources ``ce.load`` asks."""
    catalog = ModelCatalog.build(model_paths, models_dir, packaged=packaged, sources=MODEL_SOURCES)
    roots = list(ollama)
    if roots:
        add_ollama_models(catalog, roots)
    return catalog


def found_ollama_stores() -> list[Path]:
    """The usual Ollama stores that exist here (ollama.store.ollama_roots)."""
    return [r for r in ollama_roots() if r.is_dir()]


def catalog_from_args(args: argparse.Namespace) -> ModelCatalog:
    """``ctx serve``'s catalog: -m, --models-dir, then --ollama-models (default: the
    usual stores) unless --no-ollama."""
    roots: list[Path] = []
    if not getattr(args, "no_ollama", False):
        given = [Path(d).expanduser() for d in getattr(args, "ollama_models", [])]
        for d in given:
            if not d.is_dir():
                raise ModelNotFoundError(f"Ollama model store {d} does not exist")
        roots = given or found_ollama_stores()
    return build_catalog(args.model, args.models_dir, ollama=roots)
