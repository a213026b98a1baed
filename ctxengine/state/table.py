"""The named contexts of one model."""
from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING, Sequence

from ..errors import ContextError
from ..store.names import validate_name
from .context import Context

if TYPE_CHECKING:
    from ..engine.model import LoadedModel


class ContextTable:
    def __init__(self, model: "LoadedModel"):
        self.model = model
        self._contexts: dict[str, Context] = {}
        self._lock = threading.Lock()
        self._counter = itertools.count(1)
        self._clock = itertools.count()
        self._last_use: dict[str, int] = {}

    def names(self) -> list[str]:
        with self._lock:
            return list(self._contexts)

    def get(self, name: str) -> Context:
        with self._lock:
            try:
                return self._contexts[name]
            except KeyError:
                raise ContextError(f"no context named '{name}'") from None

    def __contains__(self, name: str) -> bool:
        with self._lock:
            return name in self._contexts

    def open(self, name: str | None = None) -> Context:
        """The context with this name, created empty if it does not exist."""
        with self._lock:
            if name is not None and name in self._contexts:
                return self._contexts[name]
        return self.adopt(name, self.model.new_sequence(), ())

    def adopt(self, name: str | None, seq, tokens: Sequence[int], **state) -> Context:
        """Register a new context around an existing page table."""
        with self._lock:
            if name is None:
                name = self._fresh_name()
            validate_name(name, what="context")
            if name in self._contexts:
                raise ContextError(f"a context named '{name}' already exists")
            ctx = Context(self, name, seq, tokens, **state)
            self._contexts[name] = ctx
            self._last_use[name] = next(self._clock)
            return ctx

    def remove(self, name: str) -> None:
        with self._lock:
            ctx = self._contexts.pop(name, None)
            self._last_use.pop(name, None)
        if ctx is None:
            raise ContextError(f"no context named '{name}'")
        ctx._release()

    def touch(self, ctx: Context) -> None:
        with self._lock:
            if ctx.name in self._contexts:
                self._last_use[ctx.name] = next(self._clock)

    def _fresh_name(self) -> str:
        while True:
            name = f"ctx-{next(self._counter)}"
            if name not in self._contexts:
                return name
