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
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway_storage import ByteLRU, FileIdentity, FileSource, Store
from gateway_storage.cache import CacheCounts
from gateway_storage.geometry import Vec3

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
MAX_MINISHARD_INDEX_BYTES = 24 * MAX_CHUNKS_PER_SHARD


class ShardError(OSError):
    """A shard whose index cannot be right: a storage fault, answered 5xx."""


def compressed_morton_code(position: tuple[int, ...], grid_shape: tuple[int, ...]) -> int:
    """A chunk's id in a sharded volume: the bits of its grid position interleaved (x first), each dimension
    contributing only as many bits as its grid needs."""
    bits = [max(0, (g - 1).bit_length()) for g in grid_shape]
    code, out_bit = 0, 0
    for bit in range(max(bits, default=0)):
        for d, p in enumerate(position):
            if bit < bits[d]:
                code |= ((p >> bit) & 1) << out_bit
                out_bit += 1
    return code


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF


def _fmix32(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def murmurhash3_x86_128_low64(key: int) -> int:
    """The low 64 bits of MurmurHash3_x86_128 (seed 0) of ``key`` as 8 little-endian bytes: the sharded
    format's ``murmurhash3_x86_128`` hash. Eight bytes are all tail: two 32-bit lanes, no full block."""
    c1, c2, c3 = 0x239B961B, 0xAB0E9789, 0x38B34AE5
    k1, k2 = key & 0xFFFFFFFF, (key >> 32) & 0xFFFFFFFF
    k2 = (_rotl32((k2 * c2) & 0xFFFFFFFF, 16) * c3) & 0xFFFFFFFF
    h2 = k2
    k1 = (_rotl32((k1 * c1) & 0xFFFFFFFF, 15) * c2) & 0xFFFFFFFF
    h1 = k1
    h1, h2, h3, h4 = h1 ^ 8, h2 ^ 8, 8, 8
    h1 = (h1 + h2 + h3 + h4) & 0xFFFFFFFF
    h2, h3, h4 = (h2 + h1) & 0xFFFFFFFF, (h3 + h1) & 0xFFFFFFFF, (h4 + h1) & 0xFFFFFFFF
    h1, h2, h3, h4 = _fmix32(h1), _fmix32(h2), _fmix32(h3), _fmix32(h4)
    h1 = (h1 + h2 + h3 + h4) & 0xFFFFFFFF
    h2 = (h2 + h1) & 0xFFFFFFFF
    return h1 | (h2 << 32)


@dataclass(frozen=True, slots=True)
class Sharding:
    """A scale's ``neuroglancer_uint64_sharded_v1`` sharding: which shard and minishard hold a chunk id."""

    preshift_bits: int
    hash: str
    minishard_bits: int
    shard_bits: int
    minishard_index_gzip: bool
    data_gzip: bool

    @classmethod
    def of(cls, spec: PrecomputedSharding) -> "Sharding":
        """The sharding an ``info`` states, if its index is within the bounds (``MAX_CHUNKS_PER_SHARD``)."""
        if spec.minishard_bits > _MAX_MINISHARD_BITS:
            raise SourceError(
                f"{INFO}: sharding minishard_bits {spec.minishard_bits} is more than {_MAX_MINISHARD_BITS} "
                f"(a shard index of {16 << spec.minishard_bits} bytes)"
            )
        return cls(
            spec.preshift_bits,
            spec.hash,
            spec.minishard_bits,
            spec.shard_bits,
            spec.minishard_index_encoding == "gzip",
            spec.data_encoding == "gzip",
        )

    def locate(self, chunk_id: int) -> tuple[int, int]:
        """(shard, minishard) of a chunk id."""
        shifted = chunk_id >> self.preshift_bits
        hashed = shifted if self.hash == "identity" else murmurhash3_x86_128_low64(shifted)
        minishard = hashed & ((1 << self.minishard_bits) - 1)
        shard = (hashed >> self.minishard_bits) & ((1 << self.shard_bits) - 1)
        return shard, minishard

    def shard_name(self, shard: int) -> str:
        return f"{shard:0{-(-self.shard_bits // 4)}x}.shard"

    @property
    def index_bytes(self) -> int:
        return 16 << self.minishard_bits


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
        self.sharding = None if scale.sharding is None else Sharding.of(scale.sharding)
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
    index_end = sharding.index_bytes
    if identity.size < index_end:
        raise ShardError(f"{where}: the shard is shorter than its index")
    entry = np.frombuffer(storage.read(path, 16 * minishard, 16, identity, limit=16), dtype="<u8")
    start, end = int(entry[0]), int(entry[1])
    table: dict[int, tuple[int, int]] = {}
    if end > start:
        if index_end + end > identity.size:
            raise ShardError(f"{where}: minishard {minishard} ends past the end of the shard")
        raw = storage.read(path, index_end + start, end - start, identity, limit=MAX_MINISHARD_INDEX_BYTES)
        if sharding.minishard_index_gzip:
            raw = _gunzip(raw, MAX_MINISHARD_INDEX_BYTES, f"{where}: minishard index {minishard}")
        if len(raw) % 24:
            raise ShardError(f"{where}: minishard index {minishard} has {len(raw)} bytes, not a multiple of 24")
        columns = np.frombuffer(raw, dtype="<u8").reshape(3, -1).astype(object)  # Python ints: no overflow
        ids = np.cumsum(columns[0])
        sizes = columns[2]
        starts = np.cumsum(columns[1] + np.concatenate([[0], sizes[:-1]]))
        for chunk_id, chunk_start, size in zip(ids, starts, sizes):
            offset = index_end + int(chunk_start)
            if offset + int(size) > identity.size:
                raise ShardError(f"{where}: minishard {minishard} points past the end of the shard")
            table[int(chunk_id)] = (offset, int(size))
    elif end < start:
        raise ShardError(f"{where}: minishard {minishard} ends before it starts")
    return table


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
