"""Where a context's KV is: its residency, an explicit state with asserted moves.

::

    LIVE ──begin_eviction──▶ EVICTING ──end_eviction──▶ EVICTED
      ▲                        │                          │
      └──────abort_eviction────┘◀─────────restored────────┘
    LIVE, EVICTED ──delete──▶ DELETED   (a delete during EVICTING waits for its end)

* **LIVE**: the context holds a page table (``seq``) in its model's pool, and
  the logits after its last computed token when it has them.
* **EVICTING**: its pages are being written to the snapshot store to free them
  (state/table.py). The pages are only read then; nothing else may touch them.
  The writer holds the context's lock, so a use of the context (which takes
  that lock) waits for the write to end and then reads the context back.
* **EVICTED**: its KV is a snapshot (``snapshot``); the next use restores it.
* **DELETED**: gone for good.

Every move checks where it comes from and raises otherwise, as nano-vllm's
blocks assert their reference counts: a wrong move is a bug in this package,
never the caller's, and is caught where it happens rather than as a corrupt
page much later. The moves are made under a small guard of their own (not the
context's lock), so a delete from another thread never sees a half-made move.

A LIVE page table is cut back (rewind, a prefix fork, a last token run again)
by ``truncated``: room for the page its copy-on-write takes is made first, as
for a forward pass, and a refused cut leaves everything as it was.
"""
from __future__ import annotations

import enum
import itertools
import threading
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..errors import ContextError

if TYPE_CHECKING:
    from .budget import Promise

# Numbers every context's KV, never reused in a process: its eviction ref is its own (state/table.py).
_serials = itertools.count(1)


class Residency(enum.Enum):
    LIVE = "live"
    EVICTING = "evicting"
    EVICTED = "evicted"
    DELETED = "deleted"


class InvalidTransition(RuntimeError):
    """A residency move from a state it may not start from: a bug, not bad input."""


class KVState:
    """One context's residency, page table and last logits."""

    def __init__(self, name: str, seq, logits: np.ndarray | None = None):
        self._name = name
        self.serial = next(_serials)  # names the ref that keeps its evicted snapshot (never another's)
        self.state = Residency.LIVE
        self.seq = seq          # the page table; None unless LIVE or EVICTING
        self.logits = logits    # after tokens[: seq.n_tokens]; None: recomputed on use
        self.snapshot: str | None = None  # EVICTED: the snapshot holding the KV
        self._guard = threading.Condition(threading.Lock())

    def __repr__(self) -> str:
        return f"KVState({self._name!r}, {self.state.name})"

    def _move(self, frm: tuple[Residency, ...], to: Residency) -> None:
        """Caller holds the guard."""
        if self.state not in frm:
            raise InvalidTransition(f"context '{self._name}': cannot go from {self.state.name} to {to.name}")
        self.state = to
        self._guard.notify_all()

    # -- while LIVE -------------------------------------------------------------
    def set_kv(self, seq, logits: np.ndarray | None) -> None:
        """A new page table (a truncated or recomputed one) and the logits after it."""
        self.require_live()
        self.seq, self.logits = seq, logits

    def computed(self, logits: np.ndarray) -> None:
        """The logits after the page table, just computed; dropped if the context was
        deleted meanwhile (a delete does not wait for a forward: the next use says so)."""
        with self._guard:
            if self.state is not Residency.DELETED:
                self.require_live()
                self.logits = logits

    def require_live(self) -> None:
        if self.state is Residency.DELETED:  # by another thread (a delete does not wait for a stream)
            raise ContextError(f"context '{self._name}' was deleted")
        if self.state is not Residency.LIVE:
            raise InvalidTransition(f"context '{self._name}': its KV changed while {self.state.name}")

    # -- eviction -----------------------------------------------------------------
    def begin_eviction(self):
        """LIVE → EVICTING; the page table to write (read-only until the eviction ends)."""
        with self._guard:
            self._move((Residency.LIVE,), Residency.EVICTING)
            return self.seq

    def end_eviction(self, snapshot_id: str) -> list[int]:
        """EVICTING → EVICTED: the KV is in ``snapshot_id``; the ids of the pages let go."""
        with self._guard:
            self._move((Residency.EVICTING,), Residency.EVICTED)
            pages = list(self.seq.pages)
            self.seq, self.logits, self.snapshot = None, None, snapshot_id
            return pages

    def abort_eviction(self) -> None:
        """EVICTING → LIVE: the write failed; the context keeps its pages."""
        with self._guard:
            self._move((Residency.EVICTING,), Residency.LIVE)

    def restored(self, seq) -> None:
        """EVICTED → LIVE around a page table read back from the snapshot (its logits
        are recomputed on first use, bit-identical)."""
        with self._guard:
            self._move((Residency.EVICTED,), Residency.LIVE)
            self.seq, self.logits, self.snapshot = seq, None, None

    def delete(self) -> tuple[list[int], str | None]:
        """LIVE or EVICTED → DELETED, after an eviction being written ends; the ids of the
        pages let go and the snapshot that held an evicted context's KV."""
        with self._guard:
            while self.state is Residency.EVICTING:
                self._guard.wait()
            self._move((Residency.LIVE, Residency.EVICTED), Residency.DELETED)
            pages = list(self.seq.pages) if self.seq is not None else []
            evicted, self.seq, self.logits, self.snapshot = self.snapshot, None, None, None
            return pages, evicted


def truncated(seq, n: int, reserve: "Callable[[int], Promise]", new_sequence: Callable[[], object]):
    """``seq`` cut to its first n tokens, the page its copy-on-write takes (a shared, partly
    kept last page) reserved first (a context table's ``reserve_pages``, which evicts idle
    contexts or refuses with a ContextError); the native truncate changes nothing when it
    throws, so a refused cut leaves ``seq`` as it was. Where a sliding-window model released
    KV the window at n needs, a new empty sequence instead (the caller prefills the tokens,
    which the deterministic kernels make bit-identical)."""
    if not seq.can_truncate(n):
        return new_sequence()
    need = seq.pages_to_truncate(n)
    promise = reserve(need) if need else None
    try:
        seq.truncate(n)
    finally:
        if promise is not None:
            promise.release()  # taken: the pool counts it now
    return seq
