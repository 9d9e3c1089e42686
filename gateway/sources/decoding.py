"""Decoding stored chunks with tensorstore from memory, so that tensorstore never opens a file itself.

A source reads the stored chunks a region needs through the :class:`~gateway_storage.Store` (which
checks containment and file versions), hands them to a :class:`MemoryDecoder`, and tensorstore
decodes them from an in-memory key-value store holding the array's metadata and exactly those
chunks. Tensorstore's own file and object kvstores would follow a symlink out of the data root and
skip the version check; through this path every byte has passed the store's checks.
"""

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from gateway_storage import Store
from gateway_storage.faults import Broken

_FETCHES = ThreadPoolExecutor(8, thread_name_prefix="chunk-fetch")  # chunk reads from object storage, in parallel
Item = TypeVar("Item")
Found = TypeVar("Found")


def fetch_all(store: Store, fetch: Callable[[Item], Found], items: list[Item]) -> list[Found]:
    """``fetch`` of every item, in order: one after the other from local files (a page-cache read each), several
    at a time from object storage (a request each)."""
    if store.is_local or len(items) <= 1:
        return [fetch(item) for item in items]
    return list(_FETCHES.map(fetch, items))


BLOSC_HEADER_BYTES = 16


def blosc_length(data: bytes) -> int | None:
    """The length a Blosc-1 frame says it has (``cbytes``, bytes 12-16 of its header); None if too short for one."""
    if len(data) < BLOSC_HEADER_BYTES:
        return None
    return int.from_bytes(data[12:16], "little")


class ChunkDecodeError(Broken, OSError):
    """Stored chunks that tensorstore cannot decode: the bytes are wrong (a storage fault, never absent data).

    Tensorstore only decodes here, from memory: store faults were raised by the store before it ran.
    """


class MemoryDecoder:
    """One array's decoder: a tensorstore ``driver`` over an in-memory store holding ``metadata`` files.

    Each thread opens its own store and array once (about 0.1 ms), so each read sees only its own
    chunks; the context keeps no chunk cache, so nothing of an earlier read is ever decoded again.
    """

    def __init__(self, spec: dict[str, Any], metadata: Mapping[str, bytes], where: str) -> None:
        self.spec = spec  # the tensorstore spec without its kvstore, e.g. {"driver": "n5"}
        self.metadata = dict(metadata)
        self.where = where  # named in decoding errors: the mag relative to the data root
        self._opened = threading.local()

    def decode(self, chunks: Mapping[str, bytes], window: tuple[slice, ...]) -> np.ndarray:
        """The ``window`` of the array (in tensorstore's index space), decoded from ``chunks`` by key.

        Keys not in ``chunks`` read as the fill value. The result is in Fortran order.
        """
        memory, array = self._decoder()
        try:
            for key, data in chunks.items():
                memory[key] = data
            voxels: np.ndarray = array[window].read(order="F").result()
            return voxels
        except ValueError as exc:
            raise ChunkDecodeError(f"{self.where}: {exc}") from None
        finally:
            for key in chunks:  # the store holds exactly the chunks of one read
                del memory[key]

    def check(self) -> None:
        """Open this thread's decoder now, so metadata tensorstore refuses makes the mag unusable at once."""
        self._decoder()

    def _decoder(self) -> tuple[Any, Any]:
        found: tuple[Any, Any] | None = getattr(self._opened, "pair", None)
        if found is None:
            import tensorstore as ts

            context = ts.Context()
            memory = ts.KvStore.open({"driver": "memory"}, context=context).result()
            for name, document in self.metadata.items():
                memory[name] = document
            spec = {**self.spec, "kvstore": {"driver": "memory"}}
            try:
                array = ts.open(spec, context=context, read=True).result()
            except ValueError as exc:
                raise ChunkDecodeError(f"{self.where}: tensorstore cannot open the metadata: {exc}") from None
            found = self._opened.pair = (memory, array)
        return found
