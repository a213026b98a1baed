"""What a serving process does as a member of a fleet (docs/fleet.md).

* **Heartbeats.** Every few seconds the host writes what it serves (models,
  their weight ids and the ids of the LoRA adapters it runs with each) and
  which named contexts it holds live, with a TTL, so ``GET /v1/fleet`` on any
  host lists the live ones and the fleet knows which hosts can restore a
  snapshot of given weights made with given adapters.
* **A named context is the fleet ref of the same name.** A request naming a
  context this host does not hold restores it from that ref (onto the model
  with the snapshot's weights and LoRA adapters, if this host serves them; else
  refused, naming the hosts that do), and a context held
  here whose ref another host has moved on is replaced by the fleet's before
  it is used, so a conversation continues where it was last left, whichever
  host served its previous turn. (serving/sessions.py does both, asking the
  refs here.)
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
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..errors import StoreError

if TYPE_CHECKING:
    from ..store import Store
    from .models import ServedModels

HEARTBEAT_S = 2.0         # how often a host says it is alive
HEARTBEAT_TTL_S = 10.0    # a host missing this long is left out of the fleet's lists


class FleetHost:
    def __init__(self, models: "ServedModels", store: "Store"):
        self.models = models
        self.store = store
        self.fleet = store.fleet
        self.host_id = self.fleet.host_id
        self.url: str | None = None
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

    def info(self, served: dict[str, list[str]] | None = None) -> dict:
        """This host as the fleet lists it (``served``: models.served_adapters(), if known)."""
        loaded = self.models.loaded()
        served = self.models.served_adapters() if served is None else served
        return {"url": self.url, "models": [e.entry.name for e in loaded],
                "weight_ids": sorted({e.model.weight_id for e in loaded}),
                "lora": {wid: ids for wid, ids in served.items() if ids},
                "contexts": sorted(c.name for c in self.models.contexts())}

    def beat(self) -> None:
        # Every servable model's weights and adapters, loaded or not: this host can
        # restore onto any what they made. One scan of the catalog for both.
        served = self.models.served_adapters()
        self.fleet.heartbeat(self.info(served), served, HEARTBEAT_TTL_S)

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

    # -- refs -----------------------------------------------------------------------------
    def ref(self, name: str) -> str | None:
        """The snapshot id the fleet's ref ``name`` points at (None: no such ref);
        FleetUnavailable while the fleet cannot be read, never this host's older ref."""
        return self.fleet.get_ref(name, or_local=False)

    def delete_ref(self, name: str) -> bool:
        """Delete the fleet's ref ``name`` and its log (False: there was none);
        FleetUnavailable while the fleet cannot be written, and nothing deleted."""
        return self.fleet.delete_ref(name, or_local=False)

    def deleted(self, name: str) -> bool:
        """Whether the fleet's ref ``name`` was deleted and no context made under it since."""
        return self.fleet.deleted(name, or_local=False)

    def forget_deleted(self, name: str) -> None:
        """A context is being made under ``name``: a deleted ref's tombstone no longer applies."""
        self.fleet.forget_deleted(name, or_local=False)

    def holds(self, snapshot_id: str) -> bool:
        """Whether the fleet (not only this host) holds a snapshot."""
        return self.fleet.has_manifest(snapshot_id, or_local=False)

    def catch_up(self, name: str, snapshot_id: str) -> None:
        """Publish the snapshot a turn left local while the fleet was unreachable, moving
        ref ``name`` from where this host last saw it (RefConflictError if it moved on)."""
        self.fleet.publish(snapshot_id, self.store.get_local_manifest(snapshot_id), name, or_local=False)

    def hosts_serving(self, weight_id: str, adapters: Iterable[str] = ()) -> list[str]:
        """The other live hosts that serve these weights with (at least) these LoRA adapters."""
        return [h for h in self.fleet.hosts_serving(weight_id, adapters) if h != self.host_id]

    def describe(self) -> dict:
        """``GET /v1/fleet``: this host, every live host, and what crossed from here."""
        return {"object": "fleet", "url": self.fleet.url, "online": self.fleet.online, "host": self.host_id,
                "hosts": self.fleet.hosts(), "stats": self.fleet.stats().as_dict(), "time": time.time()}
