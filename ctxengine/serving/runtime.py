"""What one serving process holds: the models it serves (serving/models.py),
the snapshot store they share, its place in a fleet when the store has one
(serving/fleet_host.py), and the operations on named contexts
(``runtime.sessions``, serving/sessions.py).

The HTTP and gRPC faces (``ctxengine.api``, ``ctxengine.rpc``) both take a
Runtime and nothing else, so a context created over one is visible to the
other, and every forward pass of every client goes through each model's one
scheduler.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from ..store.names import default_host_id
from .fleet_host import FleetHost
from .models import LoadedEntry, ServedModels
from .sessions import Sessions

if TYPE_CHECKING:
    from ..state.context import Context
    from ..store import Store

__all__ = ["LoadedEntry", "Runtime"]


class Runtime(ServedModels):
    def __init__(self, catalog, *, store: "Store | None" = None, template_kwargs: dict | None = None, **options):
        """``options``: ServedModels' (threads, kv, memory_budget, prefix_cache_entries,
        lora, draft, speculative, repack_budget). ``template_kwargs``: chat template variables every chat
        request gets unless it sets them itself (``ctx serve --chat-template-kwargs``)."""
        super().__init__(catalog, store=store, **options)
        self.template_kwargs = dict(template_kwargs or {})
        # A member of a fleet when the store has one; else None.
        self.fleet = FleetHost(self, store) if store is not None and store.fleet is not None else None
        self.host_id = self.fleet.host_id if self.fleet is not None else default_host_id()
        if self.fleet is not None:
            self.changed = self.fleet.changed  # a model loaded or unloaded: beat now
        self.sessions = Sessions(self, store, self.fleet)

    # The runtime's older names for three session calls (find and create: the server's own).
    def find_context(self, name: str) -> "Context":
        """A named context held here or (in a fleet) restored from the fleet's ref."""
        return self.sessions.find(name, client=False)

    def hold_context(self, name: str, *, client: bool) -> AbstractContextManager["Context"]:
        """``sessions.hold``: a named context held for one request; ``client``: the name
        came from a client (a generation's ``context`` field), so it is checked as one."""
        return self.sessions.hold(name, client=client)

    def create_context(self, name: str | None, model: str | None = None) -> "Context":
        """A new, empty named context (names are unique across models)."""
        return self.sessions.create(name, model, client=False)

    def turn_done(self, ctx: "Context") -> None:
        """``sessions.turn_done``: in a fleet, publish a named context after a turn."""
        self.sessions.turn_done(ctx)

    def close(self) -> None:
        if self.fleet is not None:
            self.fleet.stop()
        super().close()
