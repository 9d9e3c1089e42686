"""The nodes of a served tree: groups, and arrays that know how to produce their chunks.

An array's chunks come from a mag source (passed through, encoded, or as virtual
shards) or, for the xarray tree's coordinates, from a small array held in memory.
The HTTP layer asks every array the same two questions, whatever it is: a chunk
that is cheap to produce (may run on the event loop), else one that is not.
Cheap means cheaper than handing the work to a thread: memory, and small work on
local files; anything on object storage goes to a thread.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from . import documents
from .chunks import ChunkNotFound, ServedMag, encoded_chunk, passthrough_chunk, plain_chunk
from .documents import Attributes
from .layout import array_zarr_json, zarray
from .resource import OCTET_STREAM, Resource, bytes_resource, make_etag
from .shards import ShardPlans


class ArrayNode(ABC):
    """An array: the names of its dimensions, its attributes, its metadata in each Zarr version, its chunks."""

    dimension_names: tuple[str, ...]
    attributes: Attributes

    @property
    def rank(self) -> int:
        return len(self.dimension_names)

    @abstractmethod
    def zarr_json(self) -> documents.ArrayZarrJson:
        """The array's ``zarr.json`` (Zarr v3)."""

    @abstractmethod
    def zarray(self) -> documents.ZArray:
        """The array's ``.zarray`` (Zarr v2)."""

    def v2_attributes(self) -> dict[str, object]:
        """The array's ``.zattrs`` (Zarr v2), with its dimension names."""
        return documents.v2_array_attributes(self.attributes, self.dimension_names)

    @abstractmethod
    def cheap_chunk(self, index: tuple[int, ...]) -> Resource | None:
        """The chunk if producing it costs less than a hand-off to a thread; else None.

        That is: in memory, or a little work on local files (a few positioned reads, a small encode).
        """

    @abstractmethod
    def costly_chunk(self, index: tuple[int, ...]) -> Resource:
        """The chunk, produced with any I/O and computation it needs: run it off the event loop."""


# A chunk of at most this many raw bytes from local files is read and encoded on the event loop: a
# thread hand-off costs about as much as encoding a 32^3 chunk, and the worker's CPU is busy either way.
INLINE_ENCODE_BYTES = 512 << 10


class SourceArray(ArrayNode):
    """A mag of a layer as one array; ``plans`` is set when it is served as virtual shards."""

    def __init__(
        self,
        served: ServedMag,
        dimension_names: tuple[str, ...],
        attributes: Attributes | None = None,
        plans: ShardPlans | None = None,
    ) -> None:
        self.served = served
        self.layout = served.layout
        self.dimension_names = dimension_names
        self.attributes = attributes or {}
        self.plans = plans
        # Without a channel dimension, keys have one index fewer than the source's (c, x, y, z) grid.
        self._channel_dropped = len(dimension_names) == len(served.layout.shape) - 1
        self._local = served.source.reads_are_cheap
        chunk_bytes = int(np.prod(served.layout.chunk_shape)) * served.layout.dtype.itemsize
        self._encodes_inline = self._local and plans is None and chunk_bytes <= INLINE_ENCODE_BYTES

    def zarr_json(self) -> documents.ArrayZarrJson:
        return array_zarr_json(self.layout, self.dimension_names, self.attributes)

    def zarray(self) -> documents.ZArray:
        return zarray(self.layout)

    def _source_index(self, index: tuple[int, ...]) -> tuple[int, ...]:
        return (0, *index) if self._channel_dropped else index

    def cheap_chunk(self, index: tuple[int, ...]) -> Resource | None:
        if not self._local:
            return None
        full = self._source_index(index)
        if self.plans is not None:
            return self.plans.shard(self.served, full)  # a stat and a cached plan; its bytes are read later
        if self._encodes_inline:
            return plain_chunk(self.served, full)
        return passthrough_chunk(self.served, full)

    def costly_chunk(self, index: tuple[int, ...]) -> Resource:
        full = self._source_index(index)
        if self.plans is not None:
            return self.plans.shard(self.served, full)
        # A local source was offered the pass-through already; what is left is read and encoded.
        return encoded_chunk(self.served, full) if self._local else plain_chunk(self.served, full)


class MemoryArray(ArrayNode):
    """A small 1-D float64 array held in memory as one uncompressed chunk (the xarray tree's coordinates)."""

    def __init__(self, name: str, values: np.ndarray, attributes: Attributes) -> None:
        self.dimension_names = (name,)
        self.attributes = attributes
        self.size = int(values.size)
        self._body = values.astype("<f8").tobytes()
        self._etag = make_etag("memory", name, self._body)

    def zarr_json(self) -> documents.ArrayZarrJson:
        chunk = [max(self.size, 1)]
        codecs = [documents.bytes_codec("little")]
        return documents.array_zarr_json(
            [self.size], "float64", chunk, 0.0, codecs, self.dimension_names, self.attributes
        )

    def zarray(self) -> documents.ZArray:
        return documents.zarray([self.size], [max(self.size, 1)], "<f8", 0.0, "C")

    def cheap_chunk(self, index: tuple[int, ...]) -> Resource | None:
        if index != (0,):
            raise ChunkNotFound(f"a coordinate array has one chunk, (0,); there is no {index}")
        return bytes_resource(self._body, OCTET_STREAM, self._etag)

    def costly_chunk(self, index: tuple[int, ...]) -> Resource:
        found = self.cheap_chunk(index)
        assert found is not None
        return found


@dataclass(frozen=True, slots=True)
class GroupNode:
    """A group of a tree (a layer, or an xarray mag) and the arrays in it."""

    name: str
    attributes: Attributes
    arrays: dict[str, ArrayNode] = field(default_factory=dict)
