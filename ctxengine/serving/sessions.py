"""Everything done to a named context, for both faces: create, find, hold for
a request, fork, snapshot, restore onto the weights that made a snapshot, and
publish a turn. ``api/contexts.py`` (HTTP), ``rpc/contexts.py`` (gRPC) and
the Responses API's stored turns (``api/response_store.py``) translate their
wire formats to these calls and back; a found context's own methods
(``append``, ``rewind``, ``generate``, ``delete``: state/context.py) do the rest.

The checks are here, once:

* A client's context and ref names are valid names (store/names.py) and never
  host-local: a name starting with ``_`` is the server's own
  (``store.names.is_host_local``). The server's own callers pass
  ``client=False``.
* A new context's name is not taken on any model loaded here, and its LoRA
  adapters are ones served with its model, at finite scales (a RequestError
  naming the ``lora`` entry at fault).
* A snapshot or restore needs the server's store ("this server has no
  snapshot store").
* A restore goes onto the served model with the snapshot's weights
  (WeightsNotServedError naming what is served), and never silently onto other
  weights (state/snapshots.py refuses those).

In a fleet (serving/fleet_host.py) a client's named context is the fleet's ref
of the same name: ``find`` restores it here when this host does not hold it,
replaces a copy another host has moved past, and ``restore`` reads the fleet's
ref rather than this host's possibly older one (FleetUnavailable, HTTP 503,
while it cannot).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Mapping

from ..engine.lora import adapter_ids, describe_identity
from ..errors import ContextError, InvalidNameError, StoreError
from ..state import Residency
from ..state.snapshots import take_snapshot
from ..store.manifest import new_labels
from ..store.names import HOST_LOCAL_PREFIX, is_host_local, validate_name

if TYPE_CHECKING:
    from ..state.context import Context
    from ..store import Store
    from .fleet_host import FleetHost
    from .models import LoadedEntry, ServedModels


@dataclass(frozen=True)
class Snapshot:
    """What a snapshot of a named context wrote."""
    snapshot_id: str
    ref: str | None
    n_pages: int      # pages the manifest names
    pages_sent: int   # pages the store lacked, and was given
    bytes_sent: int   # raw bytes of those pages


def client_name(name: str, what: str = "context") -> str:
    """A context or ref name a client may use: valid, and not one of the server's own."""
    validate_name(name, what)
    if is_host_local(name):
        raise InvalidNameError(f"{what} names starting with '{HOST_LOCAL_PREFIX}' are reserved for the server: "
                               f"{name!r}")
    return name


class Sessions:
    """The named contexts of one serving process (``runtime.sessions``)."""

    def __init__(self, models: "ServedModels", store: "Store | None", fleet: "FleetHost | None"):
        self.models = models
        self._store = store
        self.fleet = fleet
        self._restoring = threading.Lock()  # two requests for one missing context restore it once

    # -- names and the store ----------------------------------------------------------------
    def store(self) -> "Store":
        """The server's snapshot store; StoreError if it has none."""
        if self._store is None:
            raise StoreError("this server has no snapshot store")
        return self._store

    def new_name(self, name: str | None, *, client: bool = True) -> str | None:
        """A name for a new context, refused if taken on any model (None or "": the
        table chooses one)."""
        if not name:
            return None
        if client:
            client_name(name)
        try:
            self.models.find_local_context(name)  # (in a fleet, find would restore it)
        except ContextError:
            return name
        raise ContextError(f"a context named '{name}' already exists")

    def loaded_entry(self, ctx: "Context") -> "LoadedEntry":
        """The loaded model a context belongs to; ContextError if it was unloaded."""
        loaded = self.models.loaded_entry_of(ctx)
        if loaded is None:
            raise ContextError(f"no context named '{ctx.name}': its model is no longer loaded")
        return loaded

    # -- finding and holding ---------------------------------------------------------------
    def find(self, name: str, *, client: bool = True) -> "Context":
        """A named context held here; in a fleet (a client's name), also one restored
        from the fleet's ref of that name, and never one older than that ref."""
        if client:
            client_name(name)
        if self.fleet is None or is_host_local(name):
            return self.models.find_local_context(name)
        try:
            ctx = self.models.find_local_context(name)
        except ContextError:
            found = self._restore_from_fleet(name)
            if found is None:
                raise
            return found
        return self._fresh(ctx)

    @contextmanager
    def hold(self, name: str, *, client: bool = True) -> Iterator["Context"]:
        """A named context held for one request: no other request appends to or
        generates from it until the block ends (requests on it queue up)."""
        with self.find(name, client=client).hold() as ctx:  # deleted meanwhile: ContextError
            yield ctx

    # -- making contexts -------------------------------------------------------------------
    def create(self, name: str | None, model: str | None = None, *, labels: Mapping[str, str] | None = None,
               lora: object = None, fill: Callable[["Context"], object] | None = None,
               client: bool = True) -> "Context":
        """A new named context on ``model`` (None: the default), with ``labels``, and
        ``fill(ctx)`` run on it: a fill that fails leaves no half-made context.
        ``lora``: the adapters it runs with for its whole life, as a generation
        request's ``lora`` field (``[{"id" | "name", "scale"}]``, serving/lora.py;
        None: the scales requests run with by default); a bad one is a RequestError."""
        name = self.new_name(name, client=client)
        adapters = self.models.loras(model).for_request(lora)
        m = self.models.model(model)
        ctx = m.contexts.adopt(name, m.engine.new_sequence(), (), lora=adapters)
        try:
            ctx.labels.update(new_labels(labels))  # a bad one (a lone surrogate) fails every snapshot
            if fill is not None:
                fill(ctx)
        except BaseException:
            ctx.delete()
            raise
        return ctx

    def fork(self, ctx: "Context", name: str | None, *, client: bool = True) -> "Context":
        """A copy-on-write branch of ``ctx`` (O(pages)) under a new name."""
        return ctx.fork(self.new_name(name, client=client))

    def restore(self, ref: str, name: str | None, *, client: bool = True) -> "Context":
        """A live context from a ref or snapshot id, on the served model with its
        weights; in a fleet, the fleet's ref (FleetUnavailable while unreadable)."""
        if client:
            client_name(ref, "ref")
        name = self.new_name(name, client=client)
        store = self.store()
        if client and self.fleet is not None:
            self.fleet.ref(ref)  # refused while the fleet cannot say where it points
        sid = store.resolve(ref)
        return self._restore(store, sid, name)

    # -- snapshots and turns ---------------------------------------------------------------
    def snapshot(self, ctx: "Context", ref: str | None, labels: Mapping[str, str] | None = None, *,
                 client: bool = True) -> Snapshot:
        """Write ``ctx`` into the store (only the pages it lacks), as ``ref`` (None: no ref)."""
        if client and ref is not None:
            client_name(ref, "ref")
        r = take_snapshot(ctx, self.store(), ref=ref, labels=labels or None)
        return Snapshot(r.snapshot_id, ref, r.n_pages, r.pages_sent, r.bytes_sent)

    def published(self, snapshot: Snapshot) -> bool | None:
        """In a fleet: whether it holds the snapshot (and the ref at it) now,
        acknowledged by a replica; False: kept here only, published before the
        context's next use. None: there is no fleet."""
        store = self.store()
        return store.fleet.holds(snapshot.snapshot_id, snapshot.ref) if store.fleet is not None else None

    def turn_done(self, ctx: "Context") -> None:
        """After a generation on a named context (caller holds it): in a fleet, snapshot
        it and move its ref, so any host continues it."""
        if self.fleet is not None:
            take_snapshot(ctx, self.store(), ref=ctx.name)

    # -- the fleet's refs ------------------------------------------------------------------
    def _restore_from_fleet(self, name: str) -> "Context | None":
        """The fleet's ref ``name`` restored as a live context here (None: no such ref)."""
        with self._restoring:
            try:
                return self.models.find_local_context(name)
            except ContextError:
                pass
            sid = self.fleet.ref(name)
            if sid is None:
                return None
            m = self.store().get_manifest(sid)
            adapters = adapter_ids(m.arch.get("lora"))
            if not self.models.serves(m.weight_id, adapters):
                others = self.fleet.hosts_serving(m.weight_id, adapters)
                where = f"; hosts serving them: {', '.join(others)}" if others else ""
                made = f" with LoRA {describe_identity(m.arch['lora'])}" if adapters else ""
                raise ContextError(f"context '{name}' was made by weights {m.weight_id} ({m.model_name}){made}, "
                                   f"which this host does not serve{where}")
            return self._restore(self.store(), sid, name)

    def _restore(self, store: "Store", sid: str, name: str | None) -> "Context":
        """Snapshot ``sid`` restored onto the served model with its weights and adapters
        (WeightsNotServedError naming what is missing; restore takes the recorded set)."""
        m = store.get_manifest(sid)
        model = self.models.model_for_weight_id(m.weight_id, adapter_ids(m.arch.get("lora")))
        return model.restore(store, sid, name=name)

    def _fresh(self, ctx: "Context") -> "Context":
        """``ctx``, or the fleet's newer state of it when another host moved its ref on
        and ``ctx`` holds nothing its last snapshot does not (else it is kept, and
        publishing it will meet the conflict)."""
        sid = self.fleet.ref(ctx.name)
        if ctx.snapshot_id is None or sid == ctx.snapshot_id:
            return ctx  # made here and never published, or the fleet's latest
        if not self.fleet.holds(ctx.snapshot_id):
            self.fleet.catch_up(ctx.name, ctx.snapshot_id)
            return ctx
        if sid is None:
            return ctx  # the ref was deleted on the fleet: this host's copy is all there is
        store = self.store()
        with self._restoring:
            with ctx.hold(resident=False):  # not while a request of ours is using it
                if ctx.residency is Residency.DELETED:
                    return self.models.find_local_context(ctx.name)  # deleted meanwhile
                if ctx.snapshot_id == sid or ctx.tokens != store.get_manifest(ctx.snapshot_id).token_ids:
                    return ctx
                ctx.delete()
            return self._restore(store, sid, ctx.name)
