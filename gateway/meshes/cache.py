"""The meshes' one cache: byte-bounded, single-flight, under keys that say what each entry is.

Every key names the layer (:class:`LayerKey`) and the stamp of the data it was made from, so an entry of
an older version of the data is never found again (it ages out of the LRU).
"""

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

from gateway_storage import ByteLRU
from gateway_storage.geometry import Vec3

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LayerKey:
    organization: str
    dataset: str
    version: str
    layer: str


@dataclass(frozen=True, slots=True)
class SegmentsKey:
    """A layer's segment index (read from its file, or scanned)."""

    layer: LayerKey
    stamp: str


@dataclass(frozen=True, slots=True)
class PropertiesKey:
    """The ``segment_properties/info`` of a layer, by what settles it: the data's stamp, the version of the
    layer's index file (with the stamp, it says whether that file or a scan lists the segments) and the version
    of its labels file. Not by the index itself, which may be too large for the cache: the document is found
    without it."""

    layer: LayerKey
    stamp: str
    index_version: str | None
    labels_version: str | None


@dataclass(frozen=True, slots=True)
class LargestKey:
    """A few of a layer's largest segments for its dataset page, by the data's stamp and the version of its index
    file: found once per version, and a failure to find them remembered (as none) until either changes."""

    layer: LayerKey
    stamp: str
    index_version: str | None
    count: int


@dataclass(frozen=True, slots=True)
class MultiresKey:
    """A segment's multi-resolution manifest and data file, made together."""

    layer: LayerKey
    stamp: str
    segment: int


@dataclass(frozen=True, slots=True)
class LegacyKey:
    """One legacy fragment: a segment's surface in one level-0 cube."""

    layer: LayerKey
    stamp: str
    segment: int
    cube: Vec3


@dataclass(frozen=True, slots=True)
class StoredKey:
    """A segment's place in a stored mesh set, by the version of the set's stamp."""

    layer: LayerKey
    stamp_version: str
    segment: int


MeshKey = SegmentsKey | PropertiesKey | LargestKey | MultiresKey | LegacyKey | StoredKey


class MeshCache(ByteLRU[Any]):
    """A byte-bounded LRU whose :meth:`made` computes a missing entry once, however many requests want it."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes)
        self._pending: dict[Hashable, threading.Lock] = {}
        self._pending_lock = threading.Lock()

    def made(self, key: MeshKey, compute: Callable[[], T], size: Callable[[T], int]) -> T:
        """``compute()`` cached under ``key``; concurrent requests for the same key wait for the first."""
        with self._pending_lock:
            lock = self._pending.setdefault(key, threading.Lock())
        try:
            with lock:
                cached: T | None = self.get(key)
                if cached is not None:
                    return cached
                value = compute()
                self.put(key, value, size(value))
                return value
        finally:
            with self._pending_lock:
                self._pending.pop(key, None)
