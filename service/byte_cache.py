"""A least-recently-used cache bounded by the bytes of what it holds, not by a count of entries.

A count is the wrong bound for the run pages' caches: one stored page summary of a small run is
kilobytes, one of the 3-arm reference workload megabytes, so "keep 8" both wastes memory on
small runs and, with many large ones viewed in turn, misses on nearly every view (each miss
parses the stored summary again). Each entry is charged the bytes its caller estimates for it;
the least recently used entries leave once the total passes the budget.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class ByteBoundedCache(Generic[V]):
    """``key -> value`` with at most ``max_bytes`` charged in all (thread-safe).

    An entry charged more than the whole budget is not kept (it would evict everything else
    and then itself)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._charged = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        """The value under ``key`` (now the most recently used), or None."""
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return None
            self._entries.move_to_end(key)
            return found[0]

    def put(self, key: Hashable, value: V, nbytes: int) -> None:
        """Keep ``value`` under ``key``, charged ``nbytes``; evicts the least recently used
        entries until the total fits the budget."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._charged -= old[1]
            if nbytes > self.max_bytes:
                return
            self._entries[key] = (value, nbytes)
            self._charged += nbytes
            while self._charged > self.max_bytes:
                _, (_, freed) = self._entries.popitem(last=False)
                self._charged -= freed

    @property
    def charged_bytes(self) -> int:
        """Bytes charged by the entries held now."""
        with self._lock:
            return self._charged

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._charged = 0
