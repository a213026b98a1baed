"""The catalog a serving process serves: what ``-m``, ``--models-dir`` and the
packaged models give (engine/catalog.py), then every model in Ollama's stores
(ollama/store.py). ``ctx serve`` (HTTP and gRPC alike) and ``ctx models`` build
theirs here.

A server's catalog is live (``LiveCatalog``): a model pulled, copied into a
store or folder, or removed while it serves is listed, served or gone by the
next request, as Ollama's server sees ``ollama pull`` and ``ollama rm``.
"""
from __future__ import annotations

import argparse
import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

from .. import paths
from ..engine.catalog import ModelCatalog
from ..engine.hf_pull import INDEX
from ..engine.model_source import CatalogEntry
from ..engine.registry import MODELS
from ..errors import CtxError, ModelNotFoundError
from ..ollama.registry_pull import own_store
from ..ollama.store import add_ollama_models, ollama_roots
from ..sources import MODEL_SOURCES

RECHECK_S = 1.0        # how stale a served catalog may be for a name it knows (LiveCatalog)
MISS_RECHECK_S = 0.25  # and for one it does not (a stream of unknown names looks no more often)


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


def catalog_from_args(args: argparse.Namespace) -> "LiveCatalog":
    """``ctx serve``'s catalog: -m, --models-dir, then --ollama-models (default: the
    usual stores, those that exist at each look) unless --no-ollama."""
    given: list[Path] = []
    use_ollama = not getattr(args, "no_ollama", False)
    if use_ollama:
        given = [Path(d).expanduser() for d in getattr(args, "ollama_models", [])]
        for d in given:
            if not d.is_dir():
                raise ModelNotFoundError(f"Ollama model store {d} does not exist")

    writable = (given[0] if given else own_store()) if use_ollama else None

    def roots() -> list[Path]:
        found = (given or found_ollama_stores()) if use_ollama else []
        # The store it writes first: a model pulled through it is the one served by that name.
        return sorted(found, key=lambda root: not _same_dir(root, writable))

    def build() -> ModelCatalog:
        return build_catalog(args.model, args.models_dir, ollama=roots())

    def watched() -> tuple:
        return _watched(args.model, args.models_dir, roots())

    return LiveCatalog(build, watched, writable=writable)


class LiveCatalog(ModelCatalog):
    """A catalog built again whenever what it was built from has changed: the
    ``-m`` files, the models folder's GGUF files, the Ollama stores' manifests,
    the Hugging Face pulls' index, the packaged models' files. It looks (a stat
    of each of those files, no model file read) before every listing, on a name
    it does not know (at most every ``MISS_RECHECK_S``), and at most every
    ``RECHECK_S`` on names it knows and on the default model: a request right
    after ``ctx pull`` finds the model, and one a second after a model was
    pulled again gets the new one. The server's own pulls and deletes look at
    once (serving/pulls.py). An entry handed out never changes."""

    def __init__(self, build: Callable[[], ModelCatalog], watched: Callable[[], object], *,
                 writable: Path | None = None):
        super().__init__()
        self._build, self._watched = build, watched
        self.writable = writable  # the one a client's pull writes into (serving/pulls.py); None: no pulls
        self._seen: object = None
        self._checked = 0.0  # time.monotonic() of the last look
        self._rebuilding = threading.Lock()
        self.refresh()

    def refresh(self) -> bool:
        """Build the catalog again if what it reads has changed; whether it did."""
        self._checked = time.monotonic()
        if self._watched() == self._seen:
            return False
        with self._rebuilding:
            seen = self._watched()  # before the build: a change during it is seen next time
            if seen == self._seen:
                return False
            try:
                fresh = self._build()
            except CtxError as err:  # the models folder removed, say: what was listed stays listed
                logging.getLogger(__name__).warning("the model list was not rebuilt: %s", err)
                self._seen = seen  # until something changes again
                return False
            self.sources = fresh.sources
            self._entries, self._by_name = fresh._entries, fresh._by_name
            self._seen = seen
        return True

    def entries(self) -> list[CatalogEntry]:
        self.refresh()
        return super().entries()

    def lookup(self, name: str) -> CatalogEntry | None:
        if time.monotonic() - self._checked >= RECHECK_S:
            self.refresh()
        entry = super().lookup(name)
        if entry is None and time.monotonic() - self._checked >= MISS_RECHECK_S and self.refresh():
            entry = super().lookup(name)
        return entry

    @property
    def default(self) -> CatalogEntry | None:
        if time.monotonic() - self._checked >= RECHECK_S or super().default is None:
            self.refresh()
        return super().default


def _watched(model_paths: Iterable[str | os.PathLike], models_dir: str | os.PathLike | None,
             roots: Iterable[Path]) -> tuple:
    """(path, mtime, size) of every file a catalog is built from."""
    files = [Path(os.path.expanduser(p)) for p in model_paths]
    if models_dir is not None:
        folder = Path(os.path.expanduser(models_dir))
        files += _TREE.ggufs(folder) if folder.is_dir() else [folder]
    for root in roots:
        base = root / "manifests"
        files += [base, *sorted(base.glob("*/*/*/*"))]
    files += [paths.data_dir() / INDEX, *(known.target for known in MODELS)]
    return tuple(_stat(p) for p in files)


class _Tree:
    """The .gguf files under folders, each folder listed again only when its mtime changed
    (a file added, removed or renamed in it): a look at ``--models-dir`` stats its folders
    instead of listing them all (a tree as large as /usr took 0.5 s a look)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[int, list[str], list[str]]] = {}  # folder -> (mtime, .gguf files, folders)

    def ggufs(self, root: Path) -> list[Path]:
        found, todo, visited = [], [str(root)], set()
        with self._lock:
            while todo:
                folder = todo.pop()
                try:
                    st = os.stat(folder)
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) in visited:
                    continue  # a symlink loop, or a folder reached twice
                visited.add((st.st_dev, st.st_ino))
                listed = self._seen.get(folder)
                if listed is None or listed[0] != st.st_mtime_ns:
                    listed = self._seen[folder] = (st.st_mtime_ns, *_list(folder))
                found += listed[1]
                todo += listed[2]
        return sorted(Path(p) for p in found)


def _list(folder: str) -> tuple[list[str], list[str]]:
    files, folders = [], []
    try:
        with os.scandir(folder) as entries:
            for e in entries:
                if e.is_dir():
                    folders.append(e.path)
                elif e.name.endswith(".gguf"):
                    files.append(e.path)
    except OSError:
        pass
    return files, folders


_TREE = _Tree()


def _same_dir(a: Path, b: Path | None) -> bool:
    try:
        return b is not None and a.resolve() == b.resolve()
    except OSError:
        return False


def _stat(path: Path) -> tuple:
    try:
        st = path.stat()
    except OSError:
        return (str(path),)
    return (str(path), st.st_mtime_ns, st.st_size)
