"""A Neuroglancer precomputed mag of a layer (``dataFormat: neuroglancerPrecomputed``), decoded by tensorstore.

A precomputed volume is a directory with an ``info`` (data type, channels, and its ``scales``) and a
directory per scale, named by the scale's ``key``. A mag's path is ``<volume>/<key>``: the mag is the
scale of that key (as webknossos-libs opens it: the parent directory, with ``scale_metadata.key``).
The scale spans ``[voxel_offset, voxel_offset + size)`` in the mag's voxel coordinates; its chunk grid
starts at ``voxel_offset``. Chunks are stored one file each, ``<x0>-<x1>_<y0>-<y1>_<z0>-<z1>``, or in
shard files (``neuroglancer_uint64_sharded_v1``: a shard index, gzip-able minishard indexes, chunks).

Chunks (raw, jpeg, png, compressed_segmentation) are never passed through: a Zarr chunk cannot declare
those encodings, and edge chunks are cut short. The chunks a region needs are read through the
store (of a shard: its minishard index, then the chunk's bytes) and tensorstore decodes them from
memory as the chunks of an unsharded copy of the scale.
"""

import itertools
import json
import zlib
from typing import Any

import numpy as np

from gateway_storage import ByteLRU, FileIdentity, FileSource, Store
from gateway_storage.cache import CacheCounts
from gateway_storage.geometry import Vec3

from ..shard_formats.neuroglancer_sharded import (
    MINISHARD_ENTRY_BYTES,
    SHARD_INDEX_ENTRY_BYTES,
    Sharding,
    compressed_morton_code,
)
from .bounds import (
    MAX_CHUNKS_PER_SHARD,
    check_chunk_bytes,
    chunked_decoded_bytes,
    malformed_metadata,
    read_document,
    stored_limit,
)
from .decoding import ChunkDecodeError, MemoryDecoder, fetch_all
from .formats import SourceFormat
from .mag import MagSource, SourceError
from .metadata import PrecomputedInfo, PrecomputedSharding, parse_document
from .properties import BoundingBox, DataLayer

INFO = "info"  # every precomputed volume directory holds one
# A shard index holds 16 bytes per minishard, and a minishard index 24 bytes per chunk: bounded as a Zarr
# shard index is (``MAX_CHUNKS_PER_SHARD``).
_MAX_MINISHARD_BITS = (MAX_CHUNKS_PER_SHARD - 1).bit_length()
MAX_MINISHARD_INDEX_BYTES = MINISHARD_ENTRY_BYTES * MAX_CHUNKS_PER_SHARD


def sharding_of(spec: PrecomputedSharding) -> Sharding:
    """The sharding an ``info`` states, if its index is within the bounds (``MAX_CHUNKS_PER_SHARD``)."""
    if spec.minishard_bits > _MAX_MINISHARD_BITS:
        raise SourceError(
            f"{INFO}: sharding minishard_bits {spec.minishard_bits} is more than {_MAX_MINISHARD_BITS} "
            f"(a shard index of {SHARD_INDEX_ENTRY_BYTES << spec.minishard_bits} bytes)"
        )
    return Sharding(
        spec.preshift_bits,
        spec.hash,
        spec.minishard_bits,
        spec.shard_bits,
        spec.minishard_index_encoding == "gzip",
        spec.data_encoding == "gzip",
    )


def _gunzip(data: bytes, limit: int, what: str) -> bytes:
    """The gzip member in ``data``, decompressed to at most ``limit`` bytes: one that holds more cannot be what it
    claims to be (a chunk, a minishard index), and is refused before it costs more memory than that."""
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = decompressor.decompress(data, limit + 1)
    except zlib.error as exc:
        raise ChunkDecodeError(f"{what} is not valid gzip: {exc}") from None
    if len(out) > limit:
        raise ChunkDecodeError(f"{what} decompresses to more than the {limit} bytes it can hold")
    if not decompressor.eof:
        raise ChunkDecodeError(f"{what} is not valid gzip: the stream is cut short")
    return out


class PrecomputedMagSource(MagSource):
    """One scale of a precomputed volume as a mag, on a local disk or in object storage."""

    kind = "precomputed"

    def __init__(
        self,
        mag: Vec3,
        storage: Store,
        directory: str,
        bbox: BoundingBox,
        minishards: ByteLRU[dict[int, tuple[int, int]]],
        through: Store | None = None,
    ) -> None:
        self._locate(storage, directory)
        self.minishards = minishards
        volume, _, self.key = directory.rstrip("/").rpartition("/")
        opening = through or storage  # the info lies above the mag directory
        found = read_document(opening, opening.join(volume, INFO), INFO)
        if found is None:
            raise SourceError(f"no precomputed volume ({INFO}) above {self.location_key}")
        with malformed_metadata(INFO):
            self._parse(mag, bbox, found[0])

    def _parse(self, mag: Vec3, bbox: BoundingBox, info: dict[str, Any]) -> None:
        parsed: PrecomputedInfo = parse_document(PrecomputedInfo, info, INFO)
        scale = parsed.scale(self.key, INFO)
        channels = parsed.num_channels
        self.size = scale.size
        self.voxel_offset = scale.voxel_offset
        self.chunk_size = scale.chunk_sizes[0]
        dtype = np.dtype(parsed.data_type)
        self._chunk_bytes = check_chunk_bytes((channels, *self.chunk_size), dtype.itemsize, f"{INFO}: a chunk")
        self._stored_limit = stored_limit(self._chunk_bytes)
        self.grid_shape = tuple(-(-s // c) for s, c in zip(self.size, self.chunk_size))
        self.sharding = None if scale.sharding is None else sharding_of(scale.sharding)
        super().__init__(mag, bbox, dtype, channels)
        unsharded = {k: v for k, v in scale.model_dump(by_alias=True).items() if k != "sharding"}
        unsharded["chunk_sizes"] = [list(self.chunk_size)]
        metadata = {**{k: v for k, v in info.items() if k != "scales"}, "scales": [unsharded]}
        spec = {"driver": "neuroglancer_precomputed", "scale_index": 0}
        self._decoder = MemoryDecoder(spec, {INFO: json.dumps(metadata).encode()}, self.location_key)
        self._decoder.check()

    def decoded_bytes(self, shape: Vec3) -> int:
        """Every chunk a grid-aligned box touches is decoded whole; the chunk grid starts at ``voxel_offset``."""
        chunk = (self.channels, *self.chunk_size)
        return chunked_decoded_bytes(chunk, self.dtype.itemsize, self.channels, shape, self.voxel_offset)

    @property
    def reads_are_cheap(self) -> bool:
        return self.storage.is_local

    def _chunk_name(self, position: tuple[int, ...]) -> str:
        """The unsharded file name of the chunk at grid ``position``: its voxel ranges."""
        starts = [o + p * c for o, p, c in zip(self.voxel_offset, position, self.chunk_size)]
        ends = [min(s + c, o + n) for s, c, o, n in zip(starts, self.chunk_size, self.voxel_offset, self.size)]
        return "_".join(f"{s}-{e}" for s, e in zip(starts, ends))

    def read_inside(self, offset: Vec3, shape: Vec3) -> tuple[np.ndarray, list[FileSource] | None]:
        """Voxels of a box: the chunks it covers read through the store, decoded by tensorstore from memory."""
        out = np.full((self.channels, *shape), self.fill_value, dtype=self.dtype, order="F")
        lo = [max(a, o) for a, o in zip(offset, self.voxel_offset)]
        hi = [min(a + s, o + n) for a, s, o, n in zip(offset, shape, self.voxel_offset, self.size)]
        if any(h <= low for low, h in zip(lo, hi)):
            return out, None
        ranges = (
            range((a - o) // c, -(-(b - o) // c)) for a, b, o, c in zip(lo, hi, self.voxel_offset, self.chunk_size)
        )
        positions = list(itertools.product(*ranges))
        found = self._sharded_chunks(positions) if self.sharding is not None else self._chunk_files(positions)
        chunks = {f"{self.key}/{self._chunk_name(p)}": data for p, data in found.items()}
        window = (*(slice(a, b) for a, b in zip(lo, hi)), slice(None))
        data = np.moveaxis(self._decoder.decode(chunks, window), 3, 0)  # (x, y, z, channel) to (c, x, y, z)
        out[(slice(None), *(slice(a - o, b - o) for a, b, o in zip(lo, hi, offset)))] = data
        return out, None

    def files_inside(self, offset: Vec3, shape: Vec3) -> list[str]:
        """The chunk files (or shards) :meth:`read_inside` reads."""
        lo = [max(a, o) for a, o in zip(offset, self.voxel_offset)]
        hi = [min(a + s, o + n) for a, s, o, n in zip(offset, shape, self.voxel_offset, self.size)]
        if any(h <= low for low, h in zip(lo, hi)):
            return []
        ranges = [
            range((a - o) // c, -(-(b - o) // c)) for a, b, o, c in zip(lo, hi, self.voxel_offset, self.chunk_size)
        ]
        sharding = self.sharding
        if sharding is None:
            names = (self._chunk_name(position) for position in itertools.product(*ranges))
        else:
            shards = (
                sharding.locate(compressed_morton_code(p, self.grid_shape))[0] for p in itertools.product(*ranges)
            )
            names = (sharding.shard_name(shard) for shard in shards)
        return [self.storage.join(self.location, name) for name in dict.fromkeys(names)]

    def _chunk_files(self, positions: list[tuple[int, ...]]) -> dict[tuple[int, ...], bytes]:
        def fetch(position: tuple[int, ...]) -> tuple[bytes, FileIdentity] | None:
            path = self.storage.join(self.location, self._chunk_name(position))
            return self.storage.read_whole(path, limit=self._stored_limit, settled=True)

        found = fetch_all(self.storage, fetch, positions)
        return {position: chunk[0] for position, chunk in zip(positions, found) if chunk is not None}

    # --- sharded scales --------------------------------------------------------------------------

    def _sharded_chunks(self, positions: list[tuple[int, ...]]) -> dict[tuple[int, ...], bytes]:
        sharding = self.sharding
        assert sharding is not None
        where = {}  # position: (chunk id, shard path, minishard)
        for position in positions:
            chunk_id = compressed_morton_code(position, self.grid_shape)
            shard, minishard = sharding.locate(chunk_id)
            where[position] = (chunk_id, self.storage.join(self.location, sharding.shard_name(shard)), minishard)
        # each shard looked up once for the whole read
        identities = {path: self.storage.identity(path) for path in dict.fromkeys(p for _, p, _ in where.values())}

        def fetch(position: tuple[int, ...]) -> bytes | None:
            chunk_id, path, minishard = where[position]
            identity = identities[path]
            if identity is None:
                return None  # no shard (in a scale directory that is there): its chunks read as the fill value
            located = self._minishard_index(path, identity, minishard).get(chunk_id)
            if located is None:
                return None
            start, nbytes = located
            origin = f"{self.relative(path)}@{start}"
            data = self.storage.read(path, start, nbytes, identity, limit=self._stored_limit)
            return _gunzip(data, self._stored_limit, origin) if sharding.data_gzip else data

        found = fetch_all(self.storage, fetch, positions)
        return {position: chunk for position, chunk in zip(positions, found) if chunk is not None}

    def _minishard_index(self, path: str, identity: FileIdentity, minishard: int) -> dict[int, tuple[int, int]]:
        """Chunk id to (offset in the shard file, size) of one minishard, read once per shard version."""
        key = (path, identity, minishard)
        cached = self.minishards.get(key)
        if cached is not None:
            return cached
        assert self.sharding is not None
        table = read_minishard_index(self.storage, path, identity, self.sharding, minishard, self.relative(path))
        self.minishards.put(key, table, 64 + 48 * len(table))
        return table


def read_minishard_index(
    storage: Store, path: str, identity: FileIdentity, sharding: Sharding, minishard: int, where: str
) -> dict[int, tuple[int, int]]:
    """Chunk id to (offset in the shard file, size) of one minishard of the shard file ``path`` (that version),
    every offset checked against the file and the index bounded (``MAX_MINISHARD_INDEX_BYTES``, stored and
    inflated): precomputed scales and stored mesh sets read their shards through this."""
    at = sharding.entry_offset(minishard, identity.size, where)
    entry = storage.read(path, at, SHARD_INDEX_ENTRY_BYTES, identity, limit=SHARD_INDEX_ENTRY_BYTES)
    span = sharding.minishard_span(entry, minishard, identity.size, where)
    if span is None:
        return {}
    raw = storage.read(path, *span, identity, limit=MAX_MINISHARD_INDEX_BYTES)
    if sharding.minishard_index_gzip:
        raw = _gunzip(raw, MAX_MINISHARD_INDEX_BYTES, f"{where}: minishard index {minishard}")
    return sharding.decode_minishard_index(raw, minishard, identity.size, where)


class PrecomputedFormat(SourceFormat):
    """``dataFormat: neuroglancerPrecomputed``: a mag is a scale directory whose parent holds the ``info``;
    the minishard indexes of sharded scales share one cache."""

    data_formats = ("neuroglancerPrecomputed",)

    def __init__(self, store: Store, cache_bytes: int) -> None:
        super().__init__(store, cache_bytes)
        self.minishards: ByteLRU[dict[int, tuple[int, int]]] = ByteLRU(cache_bytes)

    def holds_mag(self, directory: str, through: Store | None = None) -> bool:
        return self._holds_file(directory.rstrip("/").rpartition("/")[0], INFO, through)  # the volume's info

    def open_mag(
        self,
        mag: Vec3,
        directory: str,
        layer: DataLayer,
        axis_order: dict[str, int] | None,
        through: Store | None = None,
    ) -> MagSource:
        return PrecomputedMagSource(mag, self.store, directory, layer.bounding_box, self.minishards, through)

    @property
    def caches(self) -> dict[str, CacheCounts]:
        return {"minishard_indexes": self.minishards}
