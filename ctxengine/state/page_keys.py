"""Page keys remembered by page id, so that snapshotting a context that grew
hashes only its new pages (state/snapshots.py); the table gives back the pages
only this cache still holds when its pool runs short (state/table.py)."""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..engine.engine import Engine


class PageKeyCache:
    """The key of each full page of a pool, by page id.

    A cached key stays right only while the page's bytes do not change and its
    id is not reused, so the cache holds a reference to every page it knows (a
    one-page page table each): a page with two holders is never written in
    place (truncate and append copy it first) and never freed. Pages that only
    the cache still holds are dropped by ``forget_unused`` (the table calls it
    for a deleted context's pages) and ``prune`` (when the pool runs short).
    """

    def __init__(self, engine: "Engine"):
        self._engine = engine
        self._page_tokens = engine.pool.page_tokens
        self._entries: dict[int, tuple[str, object]] = {}  # page id -> (key, pinning page table)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, page_id: int) -> str | None:
        with self._lock:
            entry = self._entries.get(page_id)
        return None if entry is None else entry[0]

    def remember(self, pairs) -> None:
        """Record (page id, key) of pages that are full and held by the caller."""
        with self._lock:
            for pid, key in pairs:
                if pid not in self._entries:
                    pin = self._engine.new_sequence()
                    pin.append_page(pid, self._page_tokens)  # takes a reference
                    self._entries[pid] = (key, pin)

    def forget_unused(self, page_ids) -> int:
        """Drop those of ``page_ids`` that nobody but the cache holds; return how many."""
        pool = self._engine.pool
        dropped = 0
        with self._lock:
            for pid in page_ids:
                if pid in self._entries and pool.refcount(pid) == 1:
                    del self._entries[pid]  # its page table releases the page
                    dropped += 1
        return dropped

    def prune(self) -> int:
        """Drop every page nobody but the cache holds; return how many were freed."""
        with self._lock:
            candidates = list(self._entries)
        return self.forget_unused(candidates)
