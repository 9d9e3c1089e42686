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

from ..resources import OCTET_STREAM, Resource, bytes_resource, make_etag
from . import documents
from .chunks import ChunkNotFound, ServedMag, encoded_chunk, passthrough_chunk, plain_chunk
from .documents import Attributes
from .layout import array_zarr_json, zarray
from .shards import ShardPlans


class ArrayNode(ABC):
    """An array: the names of its dimensions, its attributes, its metadata in each Zarr version, its chunks."""

    dimension_names: tuple[str, ...]
    attributes: Attributes

    @property
    def rank(self) -> int:
        return len(self.dimension_names)

    @property
    @abstractmethod
    def fingerprint(self) -> str:
        """What its chunks are made as (layout and source, not the files' versions): the same for two arrays
        only if the same stored files make the same chunks of them. Every ETag of its chunks starts from it."""

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

    @property
    def working_bytes(self) -> int:
        """The most memory producing one chunk holds at once: what it counts against the worker's budget."""
        return 0


# A chunk whose production decodes at most this many bytes of local files is made on the event loop: a
# thread hand-off costs about as much as encoding a 32^3 chunk, and the worker's CPU is busy either way.
# It is the bytes decoded that count, not the bytes served: a small chunk of large blocks decodes them whole.
INLINE_ENCODE_BYTES = 512 << 10
# ... and looks at no more than this many files: a file costs a stat, a new version of one an open and a check of
# where it lies, so a chunk of many small files (WKW cubes of one block each: 512 files per 64^3 chunk) would hold
# the event loop for milliseconds, and every request waiting on it (a /healthz among them) with it.
INLINE_FILES = 16


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
        _, cx, cy, cz = served.layout.chunk_shape
        self._chunk_bytes = int(np.prod(served.layout.chunk_shape)) * served.layout.dtype.itemsize
        self._decoded_bytes = served.source.decoded_bytes((cx, cy, cz))
        few_files = served.source.files_read((cx, cy, cz)) <= INLINE_FILES
        self._encodes_inline = (
            self._local and plans is None and self._decoded_bytes <= INLINE_ENCODE_BYTES and few_files
        )
        # The pass-through decodes the stored chunk once, to check it (cached per file version after that).
        stored = served.source.stored_chunk_shape
        stored_bytes = None if stored is None else int(np.prod(stored)) * served.layout.dtype.itemsize
        self._passes_inline = self._local and stored_bytes is not None and stored_bytes <= INLINE_ENCODE_BYTES

    @property
    def fingerprint(self) -> str:
        return self.served.fingerprint

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
        return passthrough_chunk(self.served, full) if self._passes_inline else None

    def costly_chunk(self, index: tuple[int, ...]) -> Resource:
        full = self._source_index(index)
        if self.plans is not None:
            return self.plans.shard(self.served, full)
        # A chunk offered the pass-through on the event loop already is what is left: read and encoded.
        return encoded_chunk(self.served, full) if self._passes_inline else plain_chunk(self.served, full)

    @property
    def working_bytes(self) -> int:
        if self.plans is not None:
            return 0  # a shard's bytes are read piece by piece as it is sent
        # the decoded blocks, the masked chunk, and its encoded copy
        return self._decoded_bytes + 2 * self._chunk_bytes


# Values per chunk of a coordinate array: 512 KiB of float64, cheap to compute on the event loop.
COORDINATE_CHUNK = 1 << 16


class CoordinateArray(ArrayNode):
    """A 1-D float64 coordinate ``i * step`` (the xarray tree's coordinates), computed one chunk at a time.

    Its values are never held whole, so an extent as long as the bounding box costs nothing until a
    chunk of it is asked for.
    """

    def __init__(self, name: str, size: int, step: float, attributes: Attributes) -> None:
        self.dimension_names = (name,)
        self.attributes = attributes
        self.size = size
        self.step = float(step)
        self.chunk = max(1, min(size, COORDINATE_CHUNK))
        self._etag_parts = ("coordinate", name, size, self.step)
        self._fingerprint = make_etag(*self._etag_parts)

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    def zarr_json(self) -> documents.ArrayZarrJson:
        codecs = [documents.bytes_codec("little")]
        return documents.array_zarr_json(
            [self.size], "float64", [self.chunk], 0.0, codecs, self.dimension_names, self.attributes
        )

    def zarray(self) -> documents.ZArray:
        return documents.zarray([self.size], [self.chunk], "<f8", 0.0, "C")

    def cheap_chunk(self, index: tuple[int, ...]) -> Resource | None:
        chunks = -(-self.size // self.chunk)
        if len(index) != 1 or not 0 <= index[0] < max(chunks, 1):
            raise ChunkNotFound(f"a coordinate array of {self.size} values has {chunks} chunks; there is no {index}")
        start = index[0] * self.chunk
        body = (np.arange(start, start + self.chunk, dtype="<f8") * self.step).astype("<f8").tobytes()
        return bytes_resource(body, OCTET_STREAM, make_etag(*self._etag_parts, index[0]))

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
