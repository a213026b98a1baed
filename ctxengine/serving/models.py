"""The models one serving process serves: its catalog, the models loaded from
it, and the named contexts they hold (serving/runtime.py adds the store, the
fleet and the operations on named contexts, serving/sessions.py).

Models load on first use. Past the memory budget the least recently used
model that no request is using and that holds no named context is unloaded
(a context is state a client asked us to keep; the prefix cache is not),
when a model loads and again when a request's lease ends (a model in use
when another loaded past the budget goes once it is idle).
"""
from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from ..engine.catalog import CatalogEntry, ModelCatalog
from ..engine.lora import cached_file_id
from ..engine.registry import resolve_model
from ..engine.weights import cached_weight_id
from ..errors import (ContextError, ModelFileError, ModelNotFoundError, UnsupportedModelError,
                      WeightsNotServedError)
from ..store.names import is_host_local
from .fits import ServedFits, Warn
from .lora import LoraSpec, ServedLoras
from .prefix_cache import DEFAULT_MAX_ENTRIES, PrefixCache

if TYPE_CHECKING:
    from ..state.context import Context
    from ..state.model import Model
    from ..store import Store


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 << 30


@dataclass
class LoadedEntry:
    entry: CatalogEntry
    model: "Model"
    loaded_at: float
    last_used: float
    leases: int = 0
    expires_at: float | None = None    # keep_alive: unload when idle past this (None: keep)
    keep_for: float | None = None      # the keep_alive last asked for: each use moves expires_at on
    prefix_cache: PrefixCache | None = None  # recent requests' contexts (None: reuse is off)
    loras: ServedLoras | None = None  # the LoRA adapters served with it (serving/lora.py)

    @property
    def memory_bytes(self) -> int:
        """Weights (the mapped file and the copies laid out for decode) plus the KV pages
        allocated so far."""
        engine = self.model.engine
        return self.entry.size + engine.repacked_bytes + engine.pool.n_allocated * engine.pool.page_bytes


class ServedModels:
    """Models by catalog name, loaded on first use; ``changed`` is called when one
    is loaded or unloaded (a fleet host beats then)."""

    def __init__(self, catalog: ModelCatalog, *, store: "Store | None" = None, threads: int | None = None,
                 kv: str = "f16", memory_budget: int | None = None,
                 prefix_cache_entries: int | None = None, lora: Sequence[LoraSpec] = (),
                 draft: str | None = None, speculative: bool = True, warn: Warn | None = None,
                 repack_budget: int | None = None):
        """``warn``: where a line saying what a model goes without (a draft, an adapter) goes
        (default: this module's logger). ``repack_budget``: Engine's, per model (None: its default)."""
        self.catalog = catalog
        self.lora = tuple(lora)  # adapters loaded into each model they fit
        self.draft = draft              # a draft model for every model loaded with its vocabulary
        self.fits = ServedFits(draft, self.lora, warn)  # which those are, and the warnings for the others
        self.speculative = speculative  # False: generations draft only when a request asks
        self.store = store  # where idle contexts are evicted to when pages run out, and snapshots kept
        self.threads = threads
        self.kv = kv
        self.repack_budget = repack_budget
        self.memory_budget = memory_budget if memory_budget is not None else _physical_memory() // 2
        # Per model; 0 turns prefix reuse off, None is the prefix cache's default.
        self.prefix_cache_entries = DEFAULT_MAX_ENTRIES if prefix_cache_entries is None else prefix_cache_entries
        self.started_at = time.time()
        self._loaded: dict[str, LoadedEntry] = {}  # by catalog entry name
        self._lock = threading.RLock()
        self._loading: dict[str, threading.Lock] = {}
        # POST /lora-adapters' scales by model, kept across unloads: (adapter ids, scales).
        self._lora_scales: dict[str, tuple[list[str], list[float]]] = {}
        self.changed: Callable[[], None] = lambda: None

    def check_at_start(self) -> None:
        """Warn of each model the draft or an adapter cannot serve with (``warn``); CtxError
        if the draft fits none (serving/fits.py)."""
        self.fits.check_at_start(self.catalog.entries())

    # -- models -------------------------------------------------------------------------
    def resolve(self, name: str | None) -> CatalogEntry:
        """The catalog entry for a model name (None or "": the default model)."""
        if not name:
            entry = self.catalog.default
            if entry is None:
                raise ModelNotFoundError("no model can be served here (see `ctx models list`)")
            return entry
        entry = self.catalog.get(name)
        if not entry.servable:
            raise UnsupportedModelError(f"model '{entry.name}' cannot be served: {entry.error}")
        return entry

    def model(self, name: str | None = None) -> "Model":
        """The loaded model for a name, loading it (and unloading others) if needed."""
        entry = self.resolve(name)
        with self._lock:
            loaded = self._current(entry)
            if loaded is not None:
                loaded.last_used = time.time()
                return loaded.model
            gate = self._loading.setdefault(entry.name, threading.Lock())
        with gate:  # one load per model at a time; other models load in parallel
            with self._lock:
                loaded = self._current(entry)
                if loaded is not None:
                    return loaded.model
            model = self._load(entry)
            now = time.time()
            cache = PrefixCache(model, max_entries=self.prefix_cache_entries) if self.prefix_cache_entries else None
            try:
                loras = ServedLoras(model, self.lora, entry.adapters)
            except BaseException:
                model.close()  # an Ollama model without its own adapter is not the model asked for
                raise
            self.fits.loras_skipped(entry, loras.skipped)
            ids, scales = self._lora_scales.get(entry.name, (None, None))
            if ids == [a.id for a in loras.adapters]:
                loras.scales = list(scales)  # the defaults a client set before it was unloaded
            with self._lock:
                self._loaded[entry.name] = LoadedEntry(entry, model, now, now, prefix_cache=cache, loras=loras)
                self._unload_over_budget(keep=entry.name)
            self.changed()
            return model

    @contextmanager
    def lease(self, name: str | None = None) -> Iterator["Model"]:
        """A model that is not unloaded while the block runs (one request's use)."""
        entry = self.resolve(name)
        while True:
            model = self.model(entry.name)
            with self._lock:
                loaded = self._loaded.get(entry.name)
                if loaded is not None and loaded.model is model:
                    loaded.leases += 1
                    break
        try:
            yield model
        finally:
            with self._lock:
                loaded.leases -= 1
                loaded.last_used = time.time()
                if loaded.keep_for is not None:  # an idle timer, as Ollama's: each request restarts it
                    loaded.expires_at = max(loaded.expires_at or 0.0, loaded.last_used + loaded.keep_for)
                if loaded.expires_at is not None and loaded.expires_at <= loaded.last_used:
                    self._maybe_unload(loaded)
                # Models that loaded while this one was in use may have gone past the budget
                # with it: the least recently used idle ones go now, as on a load.
                self._unload_over_budget(keep=entry.name)

    def keep_alive(self, name: str | None, seconds: float | None) -> None:
        """Ollama's keep_alive: unload after this many idle seconds (0: right after
        the current requests; None or negative: keep until the budget needs room)."""
        entry = self.resolve(name)
        with self._lock:
            loaded = self._loaded.get(entry.name)
            if loaded is None:
                return
            loaded.keep_for = None if seconds is None or seconds < 0 else seconds
            loaded.expires_at = None if loaded.keep_for is None else time.time() + loaded.keep_for
            if loaded.leases == 0 and loaded.expires_at is not None and loaded.expires_at <= time.time():
                self._maybe_unload(loaded)

    def loras(self, name: str | None) -> ServedLoras:
        """The LoRA adapters served with a model (loading it if needed)."""
        entry = self.resolve(name)
        while True:
            self.model(entry.name)
            with self._lock:
                loaded = self._loaded.get(entry.name)
                if loaded is not None:
                    return loaded.loras

    def set_lora_scales(self, name: str | None, entries: object) -> ServedLoras:
        """POST /lora-adapters: a model's default adapter scales, kept while the server
        runs (an unload and a reload of the model keep them); ValueError if refused."""
        loras = self.loras(name)
        loras.set_scales(entries)
        self._lora_scales[self.resolve(name).name] = ([a.id for a in loras.adapters], list(loras.scales))
        return loras

    def prefix_cache(self, name: str | None) -> PrefixCache | None:
        """The prefix cache of a loaded model (None when it is not loaded or reuse is off)."""
        entry = self.resolve(name)
        with self._lock:
            loaded = self._loaded.get(entry.name)
            return None if loaded is None else loaded.prefix_cache

    def loaded(self) -> list[LoadedEntry]:
        with self._lock:
            self._expire()
            return sorted(self._loaded.values(), key=lambda e: -e.last_used)

    def unload(self, name: str) -> bool:
        """Unload a model now if nothing uses it; whether it is gone."""
        entry = self.resolve(name)
        with self._lock:
            loaded = self._loaded.get(entry.name)
            return loaded is None or self._maybe_unload(loaded)

    def weight_ids(self) -> dict[str, str]:
        """weight_id -> model name, for every servable model (hashes each file once, then cached)."""
        out: dict[str, str] = {}
        for entry, wid in self._servable():
            out.setdefault(wid, entry.name)
        return out

    def served_adapters(self) -> dict[str, list[str]]:
        """weight_id -> the ids (BLAKE3) of the LoRA adapters this host runs with those
        weights, for every servable model: a loaded model's loaded adapters; one not
        loaded, the files it would load (``--lora`` and its own ADAPTER layers). The
        weights fix the shapes an adapter must have, so an adapter that made a
        snapshot with these weights anywhere loads here too when its file is here."""
        out: dict[str, set[str]] = {}
        for entry, wid in self._servable():
            out.setdefault(wid, set()).update(self._adapter_ids(entry))
        return {wid: sorted(ids) for wid, ids in out.items()}

    def serves(self, weight_id: str, adapters: Sequence[str] = ()) -> bool:
        """Whether some servable model has these weights and runs with these adapters."""
        return self._serving(weight_id, adapters) is not None

    def served_name(self, weight_id: str, adapters: Sequence[str] = ()) -> str:
        """The name of the served model with these weights and (at least) these LoRA
        adapters; WeightsNotServedError if none."""
        entry = self._serving(weight_id, adapters)
        if entry is not None:
            return entry.name
        served = self.weight_ids()
        if weight_id not in served:
            have = ", ".join(f"{name} ({wid[:16]})" for wid, name in served.items()) or "none"
            raise WeightsNotServedError(f"no model with weight_id {weight_id} is served here (it serves: {have})")
        have = ", ".join(a[:12] for a in self.served_adapters().get(weight_id, ())) or "none"
        raise WeightsNotServedError(f"the model with weight_id {weight_id} is served here without LoRA adapter(s) "
                                    f"{', '.join(a[:12] for a in adapters)} (its adapters: {have})")

    def model_for_weight_id(self, weight_id: str, adapters: Sequence[str] = ()) -> "Model":
        """Load the model with these weights and adapters (to restore a snapshot they made)."""
        return self.model(self.served_name(weight_id, adapters))

    # -- contexts, across models --------------------------------------------------------
    def contexts(self) -> list["Context"]:
        """Every client's named context of every loaded model (not the host-local ones)."""
        with self._lock:
            models = [e.model for e in self._loaded.values()]
        return [m.contexts.get(n) for m in models for n in m.contexts.names() if not is_host_local(n)]

    def loaded_entry_of(self, ctx: "Context") -> LoadedEntry | None:
        """The loaded model a context belongs to (None: it was unloaded since)."""
        return next((e for e in self.loaded() if e.model.engine is ctx.engine), None)

    def find_local_context(self, name: str) -> "Context":
        """A named context held here (never asks a fleet: serving/sessions.py does)."""
        with self._lock:
            models = [e.model for e in self._loaded.values()]
        for m in models:
            if name in m.contexts:
                return m.contexts.get(name)
        raise ContextError(f"no context named '{name}'")

    def close(self) -> None:
        with self._lock:
            for loaded in list(self._loaded.values()):
                loaded.model.close()
            self._loaded.clear()

    # -- internals ------------------------------------------------------------------------
    def _servable(self) -> Iterator[tuple[CatalogEntry, str]]:
        """(entry, weight_id) of every servable model whose weights can be read."""
        for entry in self.catalog.entries():
            if not entry.servable:
                continue
            try:
                yield entry, cached_weight_id(entry.path)
            except (OSError, ModelFileError):
                continue

    def _serving(self, weight_id: str, adapters: Sequence[str]) -> CatalogEntry | None:
        """The servable model with these weights that runs with (at least) these adapters
        and whose own ADAPTER layers (always applied: an Ollama fine-tune) are among
        them, one whose adapters are exactly these first; None if there is none. So KV
        made without a fine-tune's adapter never comes back under the fine-tune's name."""
        wanted = set(adapters)
        fits = [(e, ids) for e, w in self._servable() if w == weight_id
                and wanted <= (ids := self._adapter_ids(e)) and self._own_adapter_ids(e) <= wanted]
        return next((e for e, ids in fits if ids == wanted), fits[0][0] if fits else None)

    def _own_adapter_ids(self, entry: CatalogEntry) -> set[str]:
        return _file_ids(entry.adapters)

    def _adapter_ids(self, entry: CatalogEntry) -> set[str]:
        """The adapters a model runs with: those loaded, or (not loaded) the files it would load."""
        with self._lock:
            loaded = self._loaded.get(entry.name)
        if loaded is not None and loaded.loras is not None:
            return {a.id for a in loaded.loras.adapters}
        return _file_ids((*entry.adapters, *(spec.path for spec in self.lora)))

    def _load(self, entry: CatalogEntry) -> "Model":
        from ..engine.engine import Engine
        from ..state.model import Model, attach_draft

        path = entry.path
        if entry.source == "packaged" and not path.is_file():  # an installed package not built yet
            path = resolve_model(entry.name)
        drafted = self.fits.drafts_for(entry, path)  # before the engine, which a refusal would leave open
        engine = Engine(path, threads=self.threads, kv=self.kv, repack_budget=self.repack_budget)
        engine.speculative = self.speculative
        if drafted:
            attach_draft(engine, self.draft)
        model = Model(engine)
        model.contexts.store = self.store  # idle contexts are evicted there when pages run out
        return model

    def _current(self, entry: CatalogEntry) -> LoadedEntry | None:
        """The loaded model for a catalog entry. A name whose model changed since it
        was loaded (pulled again, its file replaced) is unloaded so that the new one
        loads, unless a request or a named context holds it: then it serves on."""
        loaded = self._loaded.get(entry.name)
        if loaded is not None and not _same_model(loaded.entry, entry) and self._maybe_unload(loaded):
            return None
        return loaded

    def _expire(self) -> None:
        now = time.time()
        for loaded in list(self._loaded.values()):
            if loaded.expires_at is not None and loaded.expires_at <= now:
                self._maybe_unload(loaded)

    def _unload_over_budget(self, keep: str) -> None:
        self._expire()
        for loaded in sorted(self._loaded.values(), key=lambda e: e.last_used):
            if sum(e.memory_bytes for e in self._loaded.values()) <= self.memory_budget:
                return
            if loaded.entry.name != keep:
                self._maybe_unload(loaded)

    def _maybe_unload(self, loaded: LoadedEntry) -> bool:
        """Unload if no request uses it and it holds no client's named context."""
        if loaded.leases > 0 or any(not is_host_local(n) for n in loaded.model.contexts.names()):
            return False
        self._loaded.pop(loaded.entry.name, None)
        loaded.model.close()
        self.changed()
        return True


def _same_model(loaded: CatalogEntry, listed: CatalogEntry) -> bool:
    """Whether a catalog entry still names the model loaded from an older one (a packaged
    model listed before its file was built, modified 0, is the file built since)."""
    return ((loaded.path, loaded.digest, loaded.adapters) == (listed.path, listed.digest, listed.adapters)
            and loaded.modified in (0.0, listed.modified))


def _file_ids(paths) -> set[str]:
    """The adapter ids (BLAKE3) of the files that can be read (loading says why the others cannot)."""
    ids = set()
    for path in paths:
        try:
            ids.add(cached_file_id(path))
        except OSError:
            continue
    return ids
