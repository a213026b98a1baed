"""Models pulled and removed on a client's word: Ollama's ``/api/pull`` and
``/api/delete`` (api/ollama_store.py).

A server writes one Ollama store, the one ``ctx pull ollama://`` writes by
default (our own), or the first ``--ollama-models`` it was given
(``LiveCatalog.writable``, serving/catalog.py), and it serves that store's
models before the other stores' of the same name. It pulls into that store
only, and deletes only from it: the other stores it reads (Ollama's own, say)
are Ollama's to change. A pull goes through ollama/registry_pull.py as
``ctx pull`` does (verified, resumable), then drops the blobs no manifest names
any more (a model pulled again with other layers), as Ollama does.

One model is pulled once at a time: a second request for it joins the pull
under way and is told its progress from then on (``Pulls``). A pull stops at
its next bytes once everyone who asked has left (a partial blob stays for the
next pull to resume); asked for again before it has stopped, it goes on.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..engine.disk import storage_error
from ..errors import CtxError, ModelNotFoundError, RequestError, UnavailableError
from ..ollama.registry_pull import pull_ollama
from ..ollama.store import manifests, parse_model_name

if TYPE_CHECKING:
    from .models import ServedModels

REPORT_EVERY_S = 0.25  # progress lines a blob, at most this often (and once at its end)
DONE = object()        # a pull's last event, after "success" or an error


class PullCancelled(UnavailableError):
    """Everyone who asked for a pull has gone, or the server is stopping (a 503: ask again)."""


def check_pull(served: "ServedModels", name: str) -> None:
    """Refuse a pull that cannot begin: a name that is not Ollama's, or no store to write."""
    writable(served)
    parse_model_name(name)


class Pulls:
    """The pulls this server runs, one a model. ``join(name, tell)`` starts the model's
    pull or joins the one under way; ``tell`` gets each event (a dict: Ollama's progress
    lines, or {"error": exception}), then DONE. ``Ticket.leave()`` when the client goes."""

    def __init__(self, served: "ServedModels"):
        self.served = served
        self._jobs: dict[tuple, _Job] = {}
        self._lock = threading.Lock()

    def join(self, name: str, tell: Callable[[object], None]) -> "Ticket":
        store = writable(self.served)
        key = (str(store), parse_model_name(name).key())
        with self._lock:
            job = self._jobs.get(key)
            if job is None or not job.add(tell):  # none, or one ending: a new pull, after it
                job = self._jobs[key] = _Job(self, name, key, before=job)
                job.add(tell)
                job.thread.start()
        return Ticket(job, tell)

    def stop_all(self) -> None:
        """The server is stopping: every client is told so now, and every pull stops at
        its next bytes (its partials stay), even one still waiting on a silent registry."""
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            job.abandon(PullCancelled("the server is stopping; the pull stopped (a later pull resumes it)"))

    def _ended(self, job: "_Job") -> None:
        with self._lock:
            if self._jobs.get(job.key) is job:
                del self._jobs[job.key]


class Ticket:
    """One client's place in a pull."""

    def __init__(self, job: "_Job", tell: Callable[[object], None]):
        self._job, self._tell = job, tell

    def leave(self) -> None:
        self._job.remove(self._tell)


class _Job:
    def __init__(self, pulls: Pulls, name: str, key: tuple, before: "_Job | None"):
        self.pulls, self.name, self.key, self.before = pulls, name, key, before
        self.cancelled = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"pull {name}", daemon=True)
        self._lock = threading.Lock()
        self._tells: list[Callable[[object], None]] = []
        self._last: dict | None = None  # told to a client that joins late
        self._ended = False

    def add(self, tell: Callable[[object], None]) -> bool:
        """Tell ``tell`` this pull's events from now on; False if it has ended."""
        with self._lock:
            if self._ended:
                return False
            self._tells.append(tell)
            self.cancelled.clear()
            last = self._last
        if last is not None:
            tell(last)
        return True

    def remove(self, tell: Callable[[object], None]) -> None:
        with self._lock:
            if tell in self._tells:
                self._tells.remove(tell)
            if not self._tells and not self._ended:
                self.cancelled.set()  # nobody waits for it: it stops at its next bytes

    def abandon(self, why: Exception) -> None:
        """End it for everyone now; the thread stops at its next bytes, telling nobody."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
            tells, self._tells = self._tells, []
        self.cancelled.set()
        _finish(tells, {"error": why})

    def _run(self) -> None:
        if self.before is not None:
            self.before.thread.join()  # its partial's lock is let go as it ends
        end: object = DONE
        while True:
            try:
                pull_model(self.pulls.served, self.name, self._emit, self.cancelled)
                break
            except PullCancelled:
                with self._lock:
                    if not self._tells:  # everyone left (or the server stopping told them already)
                        break
                    self.cancelled.clear()  # asked for again while it stopped: start over, resuming
            except Exception as err:  # noqa: BLE001 - told to every client as its last event
                end = {"error": err}
                break
        with self._lock:
            self._ended = True
            tells = list(self._tells)
        self.pulls._ended(self)
        _finish(tells, end)

    def _emit(self, event: dict) -> None:
        with self._lock:
            self._last = event  # a client joining now hears where it is (even "success", just said)
            tells = list(self._tells)
        for tell in tells:
            tell(event)


def _finish(tells: list[Callable[[object], None]], end: object) -> None:
    """Tell each client a pull's end: its error if it failed, then DONE."""
    for tell in tells:
        if end is not DONE:
            tell(end)
        tell(DONE)


def pull_model(served: "ServedModels", name: str, report: Callable[[dict], None],
               cancelled: threading.Event) -> None:
    """Pull ``name`` from its registry into the server's store, telling ``report``
    each step as Ollama's server does (``{"status": ...}``, with ``digest``,
    ``total`` and ``completed`` while a blob comes in), "success" last. A model
    this engine cannot run is pulled but refused with the reason."""
    store = writable(served)
    wanted = parse_model_name(name)
    before = {b for n, path in manifests(store) if n == wanted for b in _blobs(path) or ()}
    progress = _Progress(report, cancelled)
    pulled = pull_ollama(name, store=store, progress=lambda total: progress, stage=progress.stage)
    _prune(store, before)
    _refresh(served)
    if not pulled.entry.servable:
        raise CtxError(f"pulled {pulled.entry.name} into {store}, but it cannot be served here: "
                       f"{pulled.entry.error}")
    report({"status": "success"})


def delete_model(served: "ServedModels", name: str) -> str:
    """Remove a model from the server's store as ``ollama rm`` does (its manifests, in
    every spelling, then each blob no other manifest there names), unloading it if
    nothing uses it (a running request or a named context keeps its open file; new
    requests by its name are told it is not found); the name removed."""
    store = writable(served)
    _refresh(served)
    entry = served.catalog.lookup(name)
    if entry is None:
        raise ModelNotFoundError(f"model '{name}' not found")
    wanted = parse_model_name(entry.name) if entry.source == "ollama" else None
    found = [path for n, path in manifests(store) if wanted is not None and n == wanted]
    if not found:
        where = entry.path or "nowhere it can be served from"
        raise RequestError(f"model '{entry.name}' is not in {store}, the Ollama store this server writes "
                           f"(it serves it from {where}); it is not deleted")
    if any(e.entry.name == entry.name for e in served.loaded()):  # (unload refuses an unservable name)
        served.unload(entry.name)
    blobs = {b for path in found for b in _blobs(path) or ()}
    try:
        for path in found:
            path.unlink()
    except OSError as err:
        raise storage_error(err, path.parent) from None
    _prune(store, blobs)
    _refresh(served)
    return entry.name


def writable(served: "ServedModels") -> Path:
    """The Ollama store this server pulls into and deletes from."""
    store = getattr(served.catalog, "writable", None)
    if store is None:
        raise RequestError("this server serves no Ollama store it may write (it runs with --no-ollama): "
                           "pull with `ctx pull ollama://NAME` where it runs")
    return store


def _prune(store: Path, blobs: set[str]) -> None:
    """Remove those of ``blobs`` that no manifest in the store names (now). While one
    cannot be read (written by another tool, say), none is removed: it may need them."""
    named: set[str] = set()
    for _, path in manifests(store):
        layers = _blobs(path)
        if layers is None:
            return
        named |= layers
    for blob in blobs - named:
        try:
            (store / "blobs" / blob).unlink(missing_ok=True)
        except OSError as err:
            raise storage_error(err, store / "blobs") from None


def _refresh(served: "ServedModels") -> None:
    refresh = getattr(served.catalog, "refresh", None)  # a live catalog: the change is seen at once
    if refresh is not None:
        refresh()


def _blobs(manifest: Path) -> set[str] | None:
    """The blob file names (``sha256-<hex>``) a manifest names; None if it cannot be read."""
    try:
        data = json.loads(manifest.read_bytes())
        layers = [data.get("config") or {}, *data.get("layers", [])]
        return {str(layer["digest"]).replace(":", "-") for layer in layers if isinstance(layer, dict)
                and str(layer.get("digest", "")).startswith("sha256:")}
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        return None


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
