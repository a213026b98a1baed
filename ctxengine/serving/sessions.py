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
* A client changes no ``responses/<id>``: the Responses API's stored
  responses, which never change (reading them, forking them is fine).
* A new context's name is not taken on any model loaded here (in a fleet: nor
  by the fleet's ref of that name), and its LoRA adapters are ones served
  with its model, at finite scales (a RequestError naming the ``lora`` entry
  at fault).
* A snapshot or restore needs the server's store ("this server has no
  snapshot store").
* A restore goes onto the served model with the snapshot's weights
  (WeightsNotServedError naming what is served), and never silently onto other
  weights (state/snapshots.py refuses those).

In a fleet (serving/fleet_host.py) a client's named context is the fleet's ref
of the same name: ``find`` restores it here when this host does not hold it,
replaces a copy another host has moved past, and ``restore`` reads the fleet's
ref rather than this host's possibly older one (FleetUnavailable, HTTP 503,
while it cannot). ``delete`` deletes that ref too, and a copy whose turn the
fleet refused (RefConflictError) is dropped, so the next request continues
from the fleet's.
"""
from __future__ import annotations

import itertools
import secrets
import threading
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Mapping

from ..engine.lora import adapter_ids, describe_identity
from ..errors import ContextError, InvalidNameError, RefConflictError, RequestError, StoreError
from ..state import Residency
from ..state.snapshots import take_snapshot
from ..store.manifest import new_labels
from ..store.names import HOST_LOCAL_PREFIX, is_host_local, validate_name

if TYPE_CHECKING:
    from ..state.context import Context
    from ..store import Store
    from .fleet_host import FleetHost
    from .models import LoadedEntry, ServedModels

RESPONSES_PREFIX = "responses/"  # the refs of the Responses API's stored responses (api/response_store.py)


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


def changeable_name(name: str, what: str = "context") -> str:
    """A client's name of a context or ref it changes (appends to, generates into, moves,
    deletes, makes): a valid name, never a stored response's. A response's ref, live on a
    host as a context in a fleet, would else change under the response that names it."""
    client_name(name, what)
    if name.startswith(RESPONSES_PREFIX):
        raise RequestError(f"{what} '{name}' is a stored response's (the Responses API's), which never changes: "
                           f"continue it with previous_response_id (a new response), or fork it under another name")
    return name


class Sessions:
    """The named contexts of one serving process (``runtime.sessions``)."""

    def __init__(self, models: "ServedModels", store: "Store | None", fleet: "FleetHost | None"):
        self.models = models
        self._store = store
        self.fleet = fleet
        self._restoring = threading.Lock()  # two requests for one missing context restore it once
        # Names being made into contexts now, on any model: a name is checked against every
        # model's table and claimed in one step, until its context is in its table, so two
        # makings of one name on two models (each table checks only itself) cannot both win.
        self._naming = threading.Lock()
        self._claimed: set[str] = set()
        self._unnamed = itertools.count(1)

    # -- names and the store ----------------------------------------------------------------
    def store(self) -> "Store":
        """The server's snapshot store; StoreError if it has none."""
        if self._store is None:
            raise StoreError("this server has no snapshot store")
        return self._store

    def new_name(self, name: str | None, *, client: bool = True, restoring: str | None = None) -> str:
        """A name for a new context, refused if taken on any model (or being made into a
        context now) or, in a fleet, by the fleet's ref of that name: a context made here
        under it would shadow the fleet's, and its every turn would meet a conflict
        (FleetUnavailable while the fleet cannot say). None or "": a name no model has (in
        a fleet, one no host has). ``restoring``: the ref a restore reads, which may be
        the name's own fleet ref. A check only: ``_claim`` holds the name while it is made."""
        name = self._local_name(name, client)
        self._fleet_allows(name, restoring)
        return name

    @contextmanager
    def _claim(self, name: str | None, *, client: bool = True, restoring: str | None = None) -> Iterator[str]:
        """``new_name``'s name, held against every other making of it until the block (which
        puts the context in its model's table) ends: each table checks only its own names."""
        with self._naming:
            name = self._local_name(name, client)
            self._claimed.add(name)
        try:
            self._fleet_allows(name, restoring)  # not under the lock: it may wait on the network
            yield name
        finally:
            with self._naming:
                self._claimed.discard(name)

    def _local_name(self, name: str | None, client: bool) -> str:
        """The name, valid and held by no model here nor being made ("": a fresh one)."""
        if not name:
            return self._unused_name()
        if client:
            changeable_name(name)
        if name in self._claimed or self._held_here(name):
            raise ContextError(f"a context named '{name}' already exists")
        return name

    def _fleet_allows(self, name: str, restoring: str | None) -> None:
        if name == restoring or self.fleet is None or is_host_local(name):
            return
        if self._on_fleet(name):
            raise ContextError(f"a context named '{name}' already exists")
        self.fleet.forget_deleted(name)  # a live copy elsewhere is of the deleted one, not this

    def _held_here(self, name: str) -> bool:
        try:
            self.models.find_local_context(name)
        except ContextError:
            return False
        return True

    def _on_fleet(self, name: str) -> bool:
        return self.fleet is not None and not is_host_local(name) and self.fleet.ref(name) is not None

    def _unused_name(self) -> str:
        """A name no model here has: ctx-1, ctx-2, ... (each table's own counter would give
        every model the same); in a fleet a random one, the counter being every host's own."""
        while True:
            name = f"ctx-{secrets.token_hex(6)}" if self.fleet is not None else f"ctx-{next(self._unnamed)}"
            if name not in self._claimed and not self._held_here(name) and not self._on_fleet(name):
                return name

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
        """A named context held for one request that changes it: no other request
        appends to or generates from it until the block ends (requests on it queue up)."""
        if client:
            changeable_name(name)
        with self.find(name, client=client).hold() as ctx:  # deleted meanwhile: ContextError
            yield ctx

    def delete(self, name: str, *, client: bool = True) -> None:
        """Delete a named context, after the request using it. In a fleet (a client's
        name) the context is the fleet's ref: that goes too, and this host's ref of the
        name, or the next request would restore it (FleetUnavailable: nothing deleted)."""
        if client:
            changeable_name(name)
        if self.fleet is None or is_host_local(name):
            ctx = self.models.find_local_context(name)
            with ctx.hold(resident=False):
                if ctx.residency is Residency.DELETED:  # meanwhile: its name may be another's now
                    raise ContextError(f"no context named '{name}'")
                ctx.delete()
            return
        try:
            ctx = self.models.find_local_context(name)
        except ContextError:
            ctx = None  # held elsewhere or nowhere: the fleet's ref is all there is here
        with ctx.hold(resident=False) if ctx is not None else nullcontext():  # a turn of ours publishes first
            held = ctx is not None and ctx.residency is not Residency.DELETED
            on_fleet = self.fleet.delete_ref(name)
            try:
                self.store().delete_ref(name)
            except StoreError as e:
                if not str(e).startswith("no ref"):
                    raise
            if held:
                ctx.delete()
        if not (held or on_fleet):
            raise ContextError(f"no context named '{name}'")

    # -- making contexts -------------------------------------------------------------------
    def create(self, name: str | None, model: str | None = None, *, labels: Mapping[str, str] | None = None,
               lora: object = None, fill: Callable[["Context"], object] | None = None,
               client: bool = True) -> "Context":
        """A new named context on ``model`` (None: the default), with ``labels``, and
        ``fill(ctx)`` run on it: a fill that fails leaves no half-made context.
        ``lora``: the adapters it runs with for its whole life, as a generation
        request's ``lora`` field (``[{"id" | "name", "scale"}]``, serving/lora.py;
        None: the scales requests run with by default); a bad one is a RequestError."""
        adapters = self.models.loras(model).for_request(lora)
        m = self.models.model(model)
        with self._claim(name, client=client) as name:
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
        with self._claim(name, client=client) as name:
            return ctx.fork(name)

    def restore(self, ref: str, name: str | None, *, client: bool = True) -> "Context":
        """A live context from a ref or snapshot id, on the served model with its
        weights; in a fleet, the fleet's ref (FleetUnavailable while unreadable)."""
        if client:
            client_name(ref, "ref")
        with self._claim(name, client=client, restoring=ref) as name:
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
            changeable_name(ref, "ref")
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
        it and move its ref, so any host continues it. A turn the fleet refuses
        (RefConflictError) leaves no copy here: a client's retry would else pile its turn
        again onto a copy no host continues; the next request restores the fleet's."""
        if self.fleet is None:
            return
        try:
            take_snapshot(ctx, self.store(), ref=ctx.name)
        except RefConflictError:
            self._drop(ctx)
            raise

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
        if sid is None and self.fleet.deleted(ctx.name):
            self._drop(ctx)  # deleted on another host: a turn here would publish it again
            raise ContextError(f"no context named '{ctx.name}' (it was deleted on the fleet)")
        if not self.fleet.holds(ctx.snapshot_id):
            try:
                self.fleet.catch_up(ctx.name, ctx.snapshot_id)
            except RefConflictError:
                self._drop(ctx)  # as a refused turn: its snapshot stays stored, the copy goes
                raise
            return ctx
        if sid is None:
            return ctx  # the fleet lost the ref (no tombstone): this host's copy is all there is
        store = self.store()
        with self._restoring:
            with ctx.hold(resident=False):  # not while a request of ours is using it
                if ctx.residency is Residency.DELETED:
                    return self.models.find_local_context(ctx.name)  # deleted meanwhile
                if ctx.snapshot_id == sid or ctx.tokens != store.get_manifest(ctx.snapshot_id).token_ids:
                    return ctx
                ctx.delete()
            return self._restore(store, sid, ctx.name)

    def _drop(self, ctx: "Context") -> None:
        """Forget this host's copy of a context whose publishing the fleet refused (the
        refused snapshot stays stored); after the request using it."""
        with ctx.hold(resident=False):
            if ctx.residency is not Residency.DELETED:  # else its name may be another's now
                ctx.delete()
