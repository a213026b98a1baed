"""Pages promised to requests that have not taken them yet.

A request makes room for its pages on its own thread, then waits for a step of
the scheduler to allocate them. Between the two, other threads making room
must not count those pages as free, or two requests that each found room
would overdraw the pool together. So room is a promise: the pool's free pages
less those promised, held until the request has run (``Promise.release``,
which the scheduler calls when the request finishes, ran or failed).
"""
from __future__ import annotations

import threading


class Promise:
    """n pages held for one request; released once."""

    __slots__ = ("_budget", "n")

    def __init__(self, budget: "PageBudget", n: int):
        self._budget, self.n = budget, n

    def release(self) -> None:
        budget, self._budget = self._budget, None
        if budget is not None:
            budget._give_back(self.n)

    __call__ = release
    __del__ = release  # a promise its holder dropped holds nothing


class PageBudget:
    def __init__(self, pool):
        self._pool = pool
        self._promised = 0
        self._cv = threading.Condition(threading.Lock())

    @property
    def promised(self) -> int:
        return self._promised

    def promise(self, n: int) -> Promise | None:
        """Hold n pages if that many are free and not promised; None if not."""
        with self._cv:
            if self._pool.max_pages - self._pool.n_used - self._promised < n:
                return None
            self._promised += n
            return Promise(self, n)

    def wait_for_release(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) for a promise to be given back; False at once
        when none is held, so no page will come back by waiting."""
        with self._cv:
            if self._promised == 0:
                return False
            self._cv.wait(timeout)
            return True

    def _give_back(self, n: int) -> None:
        with self._cv:
            if n > self._promised:
                raise RuntimeError(f"{n} pages given back, but only {self._promised} were promised")
            self._promised -= n
            self._cv.notify_all()
