"""A context's lock: reentrant, and carried along by a generate() stream that another
thread resumes.

``threading.RLock`` belongs to the thread that took it. A stream holds its context's
lock from its first piece to its end, and the threads that advance it need not be the
one that started it: an executor, Starlette's ``iterate_in_threadpool``, a consumer
handing the iterator to a worker. On RLock the resumed stream could not release it
(``cannot release un-acquired lock``), and the context stayed locked for good by a
thread that had long moved on. Here a holder resumed on another thread adopts the lock
(``adopt``), and it is released from wherever its holder ends.
"""
from __future__ import annotations

import threading
from typing import Callable, TypeVar

T = TypeVar("T")


class HandoffLock:
    """Reentrant: its owner may take it again; ``adopt`` moves its ownership to this thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None  # written only by the thread holding _lock
        self._depth = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = threading.get_ident()
        if self._owner == me:  # another thread never sees its own id here unless it holds the lock
            self._depth += 1
            return True
        if not self._lock.acquire(blocking, timeout):
            return False
        self._owner, self._depth = me, 1
        return True

    def release(self) -> None:
        """One level off; the last gives the lock up. From the owner, or from the thread
        that ends a holder resumed elsewhere (it adopted the lock first)."""
        if self._depth <= 0:
            raise RuntimeError("release of a context lock that is not held")
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
            self._lock.release()

    def adopt(self) -> None:
        """This thread now runs a holder suspended on another one (a stream resumed here):
        it owns the lock, every level of it. Only a holder may call it."""
        if self._depth <= 0:
            raise RuntimeError("adopt of a context lock that is not held")
        self._owner = threading.get_ident()

    def if_free(self, read: Callable[[], T]) -> T | None:
        """``read()`` under the lock if it can be had at once (it is free, or this thread's),
        else None: what a reader that must not wait (a listing, a metric) does."""
        if not self.acquire(blocking=False):
            return None
        try:
            return read()
        finally:
            self.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
