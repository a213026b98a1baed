"""What a serving process does as a member of a fleet (docs/fleet.md).

* **Heartbeats.** Every few seconds the host writes what it serves (models and
  their weight ids) and which named contexts it holds live, with a TTL, so
  ``GET /v1/fleet`` on any host lists the live ones and the fleet knows which
  hosts can restore a snapshot of given weights.
* **A named context is the fleet ref of the same name.** A request naming a
  context this host does not hold restores it from that ref (onto the model
  with the snapshot's weights, if this host serves them), and a context held
  here whose ref another host has moved on is replaced by the fleet's before
  it is used, so a conversation continues where it was last left, whichever
  host served its previous turn.
* **Each turn is published**: after a generation on a named context, it is
  snapshotted (locally, then only the pages the fleet lacks) and its ref moved
  by compare-and-set; a host that lost the race gets RefConflictError.
* **Never a silent fork.** A request naming a context needs the fleet's ref
  of that name; while the fleet cannot be read it is refused with
  FleetUnavailable (HTTP 503, Retry-After) rather than answered from a copy
  the fleet may have moved past. A turn whose publishing met an unreachable
  fleet stays local and is published before the context's next use, by the
  same compare-and-set: a fleet that moved on meanwhile makes that a
  RefConflictError (409), never a silent overwrite either way.
"""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from ..errors import ContextError, StoreError
from ..state import Residency
from ..state.snapshots import take_snapshot

if TYPE_CHECKING:
    from ..store import Store
    from ..state.context import Context
    from .runtime import Runtime

HEARTBEAT_S = 2.0         # how often a host says it is alive
HEARTBEAT_TTL_S = 10.0    # a host missing this long is left out of the fleet's lists


class FleetHost:
    def __init__(self, runtime: "Runtime", store: "Store"):
        self.runtime = runtime
        self.store = store
        self.fleet = store.fleet
        self.host_id = self.fleet.host_id
        self.url: str | None = None
        self._restoring = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # what this host serves changed: beat now
        self._thread: threading.Thread | None = None

    # -- membership ---------------------------------------------------------------------
    def start(self, url: str | None) -> None:
        """Begin heartbeats (``url``: where this host's HTTP face listens)."""
        self.url = url
        self.beat()
        self._thread = threading.Thread(target=self._beat_loop, name="ctx-fleet-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)

    def info(self) -> dict:
        """This host as the fleet lists it."""
        loaded = self.runtime.loaded()
        return {"url": self.url, "models": [e.entry.name for e in loaded],
                "weight_ids": sorted({e.model.weight_id for e in loaded}),
                "contexts": sorted(c.name for c in self.runtime.contexts())}

    def beat(self) -> None:
        # Every servable model's weights, loaded or not: this host can restore onto any.
        self.fleet.heartbeat(self.info(), self.runtime.weight_ids(), HEARTBEAT_TTL_S)

    def changed(self) -> None:
        """A model was loaded or unloaded: the fleet hears of it now, not at the next beat."""
        self._wake.set()

    def _beat_loop(self) -> None:
        while True:
            self._wake.wait(HEARTBEAT_S)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.beat()
            except StoreError:
                pass  # a fleet error is reported (once) by the cluster; keep beating

    # -- named contexts -----------------------------------------------------------------
    def restore(self, name: str) -> "Context | None":
        """The fleet's ref ``name`` restored as a live context here (None: no such ref)."""
        with self._restoring:  # two requests for one missing context restore it once
            try:
                return self.runtime.find_local_context(name)
            except ContextError:
                pass
            sid = self.fleet.get_ref(name, or_local=False)
            if sid is None:
                return None
            m = self.store.get_manifest(sid)
            if m.weight_id not in self.runtime.weight_ids():
                others = [h for h in self.fleet.hosts_serving(m.weight_id) if h != self.host_id]
                where = f"; hosts serving them: {', '.join(others)}" if others else ""
                raise ContextError(f"context '{name}' was made by weights {m.weight_id} ({m.model_name}), "
                                   f"which this host does not serve{where}")
            model = self.runtime.model_for_weight_id(m.weight_id)
            return model.restore(self.store, sid, name=name)

    def fresh(self, ctx: "Context") -> "Context":
        """``ctx``, or the fleet's newer state of it when another host moved its ref on
        and ``ctx`` holds nothing its last snapshot does not (else it is kept, and
        publishing it will meet the conflict). FleetUnavailable while the fleet
        cannot be read."""
        sid = self.fleet.get_ref(ctx.name, or_local=False)
        if ctx.snapshot_id is None or sid == ctx.snapshot_id:
            return ctx  # made here and never published, or the fleet's latest
        if not self.fleet.has_manifest(ctx.snapshot_id, or_local=False):
            self._catch_up(ctx)
            return ctx
        if sid is None:
            return ctx  # the ref was deleted on the fleet: this host's copy is all there is
        with self._restoring:
            with ctx.hold(resident=False):  # not while a request of ours is using it
                if ctx.residency is Residency.DELETED:
                    return self.runtime.find_local_context(ctx.name)  # deleted meanwhile
                if ctx.snapshot_id == sid or ctx.tokens != self.store.get_manifest(ctx.snapshot_id).token_ids:
                    return ctx
                ctx.delete()
            m = self.store.get_manifest(sid)
            return self.runtime.model_for_weight_id(m.weight_id).restore(self.store, sid, name=ctx.name)

    def _catch_up(self, ctx: "Context") -> None:
        """Publish the snapshot a turn left local while the fleet was unreachable, moving
        the ref from where this host last saw it (RefConflictError if it moved on)."""
        sid = ctx.snapshot_id
        self.fleet.publish(sid, self.store.get_local_manifest(sid), ctx.name, or_local=False)

    def require_ref(self, name: str) -> None:
        """FleetUnavailable unless the fleet's ref ``name`` can be read now (a restore by
        name would otherwise fall back to this host's possibly older ref)."""
        self.fleet.get_ref(name, or_local=False)

    def publish_turn(self, ctx: "Context") -> None:
        """Snapshot a named context after a turn and move its ref (caller holds its lock)."""
        take_snapshot(ctx, self.store, ref=ctx.name)

    def describe(self) -> dict:
        """``GET /v1/fleet``: this host, every live host, and what crossed from here."""
        return {"object": "fleet", "url": self.fleet.url, "online": self.fleet.online, "host": self.host_id,
                "hosts": self.fleet.hosts(), "stats": self.fleet.stats().as_dict(), "time": time.time()}
