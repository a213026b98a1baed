"""Models pulled and removed on a client's word: Ollama's ``/api/pull`` and
``/api/delete`` (api/ollama_store.py).

A server writes one Ollama store, the one ``ctx pull ollama://`` writes by
default (our own), or the first ``--ollama-models`` it was given
(``LiveCatalog.writable``, serving/catalog.py). It pulls into that store only,
and deletes only from it: the other stores it reads (Ollama's own, say) are
Ollama's to change. A pull goes through ollama/registry_pull.py as
``ctx pull`` does (verified, resumable); the catalog is live, so the model is
served by the next request. A client that leaves mid-pull stops it at the
next bytes, and the partial blob stays for the next pull to resume.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..errors import CtxError, ModelNotFoundError, RequestError
from ..ollama.registry_pull import pull_ollama
from ..ollama.store import manifests, parse_model_name

if TYPE_CHECKING:
    from .models import ServedModels

REPORT_EVERY_S = 0.25  # progress lines a blob, at most this often (and once at its end)


class PullCancelled(Exception):
    """The client that asked for a pull has gone."""


def check_pull(served: "ServedModels", name: str) -> None:
    """Refuse a pull that cannot begin: a name that is not Ollama's, or no store to write."""
    _writable(served)
    parse_model_name(name)


def pull_model(served: "ServedModels", name: str, report: Callable[[dict], None],
               cancelled: threading.Event) -> None:
    """Pull ``name`` from its registry into the server's store, telling ``report``
    each step as Ollama's server does (``{"status": ...}``, with ``digest``,
    ``total`` and ``completed`` while a blob comes in), "success" last. A model
    this engine cannot run is pulled but refused with the reason."""
    store = _writable(served)
    progress = _Progress(report, cancelled)
    pulled = pull_ollama(name, store=store, progress=lambda total: progress, stage=progress.stage)
    if not pulled.entry.servable:
        raise CtxError(f"pulled {pulled.entry.name} into {store}, but it cannot be served here: "
                       f"{pulled.entry.error}")
    report({"status": "success"})


def delete_model(served: "ServedModels", name: str) -> str:
    """Remove a model from the server's store as ``ollama rm`` does (its manifest,
    then each blob no other manifest there names), unloading it if nothing uses
    it; the name removed."""
    store = _writable(served)
    entry = served.catalog.lookup(name)
    if entry is None:
        raise ModelNotFoundError(f"model '{name}' not found")
    wanted = parse_model_name(entry.name) if entry.source == "ollama" else None
    found = [path for n, path in manifests(store) if wanted is not None and n == wanted]
    if not found:
        where = entry.path or "nowhere it can be served from"
        raise RequestError(f"model '{entry.name}' is not in {store}, the Ollama store this server writes "
                           f"(it serves it from {where}); it is not deleted")
    loaded = next((e for e in served.loaded() if e.entry.name == entry.name), None)
    if loaded is not None:
        served.unload(entry.name)  # a model a request or a named context holds serves on from its open file
    blobs = _blobs(found[0])
    found[0].unlink()
    kept = {b for _, path in manifests(store) for b in _blobs(path)}
    for blob in blobs - kept:
        (store / "blobs" / blob).unlink(missing_ok=True)
    return entry.name


def _writable(served: "ServedModels") -> Path:
    store = getattr(served.catalog, "writable", None)
    if store is None:
        raise RequestError("this server serves no Ollama store it may write (it runs with --no-ollama): "
                           "pull with `ctx pull ollama://NAME` where it runs")
    return store


def _blobs(manifest: Path) -> set[str]:
    """The blob file names (``sha256-<hex>``) a manifest names."""
    import json

    try:
        data = json.loads(manifest.read_bytes())
        layers = [data.get("config") or {}, *data.get("layers", [])]
        return {str(layer["digest"]).replace(":", "-") for layer in layers if isinstance(layer, dict)
                and str(layer.get("digest", "")).startswith("sha256:")}
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        return set()


class _Progress:
    """registry_pull's progress and stage hooks, as Ollama's progress lines."""

    def __init__(self, report: Callable[[dict], None], cancelled: threading.Event):
        self.report, self.cancelled = report, cancelled
        self.blob: dict | None = None
        self.last = 0.0

    def __enter__(self) -> "_Progress":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def stage(self, status: str, digest: str | None, size: int | None) -> None:
        self._check()
        if digest is None:
            self.blob = None
            self.report({"status": status})
            return
        self.blob = {"status": status, "digest": digest, "total": size, "completed": 0}
        self.last = 0.0
        self.update(0)

    def update(self, n: int) -> None:
        self._check()
        blob = self.blob
        if blob is None:
            return
        blob["completed"] += n
        now = time.monotonic()
        if now - self.last >= REPORT_EVERY_S or blob["completed"] >= (blob["total"] or 0):
            self.last = now
            self.report(dict(blob))

    def _check(self) -> None:
        if self.cancelled.is_set():
            raise PullCancelled("the client left; the pull stopped (a later pull resumes it)")
