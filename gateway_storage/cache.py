"""A thread-safe LRU cache bounded by the bytes its values hold."""

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, Protocol, TypeVar

V = TypeVar("V")


class ByteLRU(Generic[V]):
    """Least-recently-used mapping whose total of declared sizes stays under ``max_bytes``.

    Values larger than the whole budget are not stored, so one huge entry
    cannot flush everything else.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[0]

    def put(self, key: Hashable, value: V, nbytes: int) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if nbytes > self.max_bytes:
                return
            self._entries[key] = (value, nbytes)
            self._bytes += nbytes
            self._evict_past(self.max_bytes)

    def shrink_to(self, nbytes: int) -> None:
        """Drop the least recently used entries until at most ``nbytes`` are held."""
        with self._lock:
            self._evict_past(nbytes)

    def _evict_past(self, nbytes: int) -> None:
        while self._bytes > nbytes and self._entries:
            _, (_, evicted) = self._entries.popitem(last=False)
            self._bytes -= evicted


class CacheCounts(Protocol):
    """What the metrics read of any cache, whatever it holds: its hits, misses and bytes held."""

    hits: int
    misses: int

    @property
    def size_bytes(self) -> int: ...
