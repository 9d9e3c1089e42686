"""Producing the bytes of plain chunks and virtual shards from a WKW mag.

A chunk that is exactly one stored block lying wholly inside the bounding
box is passed through (LZ4 or raw bytes framed as Blosc, nothing decoded);
everything else is read as voxels, masked to the bounding box and encoded.
"""

from dataclasses import dataclass

import crc32c
import numpy as np

from wkw_adapter import (
    BlockDecodeError,
    ByteLRU,
    FileChangedError,
    StoredBlock,
    TruncatedFileError,
    WkwFile,
    morton_decode,
    morton_grid,
)

from ..sources.mag import MagSource
from ..sources.wkw_source import WkwMagSource
from ..sources.zarr_source import ZarrMagSource
from .blosc import LZ4_PREFIX_SIZE, MEMCPY_PREFIX_SIZE, lz4_bound, lz4_chunk_prefix, memcpy_chunk_prefix
from .codecs import Codec, encode
from .layout import ArrayLayout
from .native import encode_native
from .resource import OCTET_STREAM, Resource, bytes_resource, make_etag

Vec3 = tuple[int, int, int]
EMPTY = np.uint64(2**64 - 1)


class ChunkNotFound(LookupError):
    """A chunk or shard that is absent by design (outside the bounding box, past the grid, no file)."""


@dataclass(frozen=True, slots=True)
class ServedMag:
    """A mag source together with the layout it is served in; ``fingerprint`` changes with either."""

    source: MagSource
    layout: ArrayLayout
    fingerprint: str


def served_mag(source: MagSource, layout: ArrayLayout) -> ServedMag:
    fingerprint = make_etag(layout, source.kind, source.location_key, source.bbox_lo, source.bbox_hi)
    return ServedMag(source, layout, fingerprint)


def _check_grid(layout: ArrayLayout, index: tuple[int, ...]) -> None:
    for axis, (i, n) in enumerate(zip(index, layout.grid_shape)):
        if i >= n:
            raise ChunkNotFound(f"index {i} along axis {'cxyz'[axis]} is past the array's {n} chunks")


def _passthrough_body(stored: StoredBlock) -> bytes:
    """A stored block framed as Blosc. LZ4 is not decoded: only an impossible size is refused."""
    block_bytes = stored.header.block_bytes
    if not stored.block_type.compressed:
        return memcpy_chunk_prefix(block_bytes) + stored.data
    if len(stored.data) > lz4_bound(block_bytes):
        raise BlockDecodeError(
            f"stored LZ4 block of {len(stored.data)} bytes is larger than any {block_bytes}-byte block"
        )
    return lz4_chunk_prefix(len(stored.data), block_bytes) + stored.data


def _chunk_box(served: ServedMag, index: tuple[int, ...]) -> tuple[Vec3, Vec3]:
    _check_grid(served.layout, index)
    shape = served.layout.chunk_shape
    lo = (index[1] * shape[1], index[2] * shape[2], index[3] * shape[3])
    hi = (lo[0] + shape[1], lo[1] + shape[2], lo[2] + shape[3])
    if served.source.clip(lo, hi) is None:
        raise ChunkNotFound("the chunk lies wholly outside the layer's bounding box")
    return lo, hi


def _stored_wkw_block(served: ServedMag, source: WkwMagSource, index: tuple[int, ...], lo: Vec3) -> Resource | None:
    if not (served.layout.codec.is_blosc and served.layout.chunk_shape[1] == source.block_len):
        return None
    side = source.block_len
    wkw_file, block_index, path = source.block_in_file(lo[0] // side, lo[1] // side, lo[2] // side)
    if wkw_file is None:
        return None
    stored = source.stored_block(wkw_file, block_index)
    identity = wkw_file.identity
    etag = make_etag(served.fingerprint, index, source.relative(path), identity.size, identity.version)
    return bytes_resource(_passthrough_body(stored), OCTET_STREAM, etag, wkw_file.identity.mtime)


def _stored_zarr_chunk(served: ServedMag, source: ZarrMagSource, index: tuple[int, ...]) -> Resource | None:
    if served.layout.native is None:
        return None
    found = source.native_chunk(index)
    if found is None:
        raise ChunkNotFound("the source holds no such chunk: it reads as the fill value")
    body, (path, identity) = found
    etag = make_etag(served.fingerprint, index, source.relative(path), identity)
    return bytes_resource(body, OCTET_STREAM, etag, identity.mtime if identity else None)


def passthrough_chunk(served: ServedMag, index: tuple[int, ...]) -> Resource | None:
    """The chunk exactly as stored, if it is one stored block or chunk inside the bounding box; else None.

    For local files this costs a stat and one positioned read, so the HTTP
    layer may call it on the event loop.
    """
    source = served.source
    lo, hi = _chunk_box(served, index)
    if not source.contains(lo, hi):
        return None
    if isinstance(source, WkwMagSource):
        return _stored_wkw_block(served, source, index, lo)
    if isinstance(source, ZarrMagSource):
        return _stored_zarr_chunk(served, source, index)
    return None


def encode_chunk(layout: ArrayLayout, data: np.ndarray) -> bytes:
    return encode_native(layout.native, data) if layout.native is not None else encode(layout.codec, data)


def plain_chunk(served: ServedMag, index: tuple[int, ...]) -> Resource:
    """One chunk of the plain layout (both trees): exactly the voxels of that chunk at this mag."""
    return passthrough_chunk(served, index) or encoded_chunk(served, index)


def encoded_chunk(served: ServedMag, index: tuple[int, ...]) -> Resource:
    """A chunk read as voxels, masked to the bounding box and encoded as the layout declares."""
    lo, hi = _chunk_box(served, index)
    region = served.source.read_box(lo, hi)
    body = encode_chunk(served.layout, region.data)
    if region.sources is None:
        return bytes_resource(body, OCTET_STREAM, make_etag(served.fingerprint, index, body))
    mtimes = [identity.mtime for _, identity in region.sources if identity is not None]
    etag = make_etag(served.fingerprint, index, [(served.source.relative(p), i) for p, i in region.sources])
    return bytes_resource(body, OCTET_STREAM, etag, max(mtimes, default=None))


# --- virtual shards: one WKW file served as one sharding_indexed shard ---------------------------

_STORED_LZ4, _STORED_RAW, _MASKED = 0, 1, 2


@dataclass(frozen=True, slots=True)
class ShardPlan:
    """Where each inner chunk of a shard lies, in the virtual shard and in the WKW file.

    Segments are in the file's Morton order, so neighbouring inner chunks are
    neighbouring file bytes and a range is served from one positioned read.
    """

    wkw_file: WkwFile
    cube: Vec3
    seg_start: np.ndarray  # virtual offset of each present inner chunk
    seg_end: np.ndarray
    seg_block: np.ndarray  # Morton index of its block in the file
    seg_kind: np.ndarray
    seg_file_offset: np.ndarray
    seg_file_length: np.ndarray
    index: bytes  # the shard index with its crc32c, at the end of the shard

    @property
    def data_size(self) -> int:
        return int(self.seg_end[-1]) if self.seg_end.size else 0

    @property
    def size(self) -> int:
        return self.data_size + len(self.index)

    @property
    def cache_bytes(self) -> int:
        return 6 * 8 * self.seg_start.size + len(self.index) + 512


def _block_ranges(wkw_file: WkwFile) -> tuple[np.ndarray, np.ndarray]:
    header = wkw_file.header
    count = header.blocks_per_file
    if wkw_file.jump_table is None:
        if wkw_file.identity.size < header.data_offset + count * header.block_bytes:
            raise TruncatedFileError(f"{wkw_file.path}: raw file is shorter than its {count} blocks")
        offsets = header.data_offset + np.arange(count, dtype=np.int64) * header.block_bytes
        return offsets, np.full(count, header.block_bytes, dtype=np.int64)
    ends = wkw_file.jump_table.astype(np.int64)
    starts = np.concatenate([[header.data_offset], ends[:-1]])
    return starts, ends - starts


def plan_shard(source: WkwMagSource, wkw_file: WkwFile, cube: Vec3) -> ShardPlan:
    """Lay out the shard of ``cube`` from the file's jump table alone (no block is read)."""
    header = wkw_file.header
    side, n, block_bytes = header.block_len, header.file_len, header.block_bytes
    grid = morton_grid(n)  # [x, y, z] -> Morton index
    c_order_of_morton = np.empty(n**3, dtype=np.int64)
    c_order_of_morton[grid.ravel().astype(np.int64)] = np.arange(n**3)
    local = np.stack(np.unravel_index(c_order_of_morton, (n, n, n)), axis=1)
    lo = (np.array(cube) * n + local) * side
    hi = lo + side
    inside = np.all(lo >= source.bbox_lo, axis=1) & np.all(hi <= source.bbox_hi, axis=1)
    outside = np.any(hi <= source.bbox_lo, axis=1) | np.any(lo >= source.bbox_hi, axis=1)
    offsets, lengths = _block_ranges(wkw_file)
    if np.any(~outside & (lengths == 0)):
        raise BlockDecodeError(f"{wkw_file.path}: a block has no bytes in the jump table")
    present = ~outside
    kind = np.where(inside, _STORED_LZ4 if header.block_type.compressed else _STORED_RAW, _MASKED)
    if header.block_type.compressed and np.any(present & inside & (lengths > lz4_bound(block_bytes))):
        raise BlockDecodeError(f"{wkw_file.path}: a stored LZ4 block is larger than any block can compress to")
    sizes = np.where(kind == _STORED_LZ4, LZ4_PREFIX_SIZE + lengths, MEMCPY_PREFIX_SIZE + block_bytes).astype(np.int64)
    sizes[~present] = 0
    ends = np.cumsum(sizes)
    starts = ends - sizes
    table = np.full((n**3, 2), EMPTY, dtype="<u8")
    table[c_order_of_morton[present], 0] = starts[present]
    table[c_order_of_morton[present], 1] = sizes[present]
    raw_index = table.tobytes()
    index = raw_index + crc32c.crc32c(raw_index).to_bytes(4, "little")
    return ShardPlan(
        wkw_file,
        cube,
        starts[present],
        ends[present],
        np.flatnonzero(present),
        kind[present],
        offsets[present],
        lengths[present],
        index,
    )


def _masked_block(source: WkwMagSource, plan: ShardPlan, block: int) -> bytes:
    n, side = plan.wkw_file.header.file_len, plan.wkw_file.header.block_len
    lo = tuple((c * n + b) * side for c, b in zip(plan.cube, morton_decode(block)))
    region = source.read_box(lo, tuple(v + side for v in lo))  # type: ignore[arg-type]
    if any(identity != plan.wkw_file.identity for _, identity in region.sources):
        raise FileChangedError(f"{plan.wkw_file.path} changed while a shard was being read")
    return memcpy_chunk_prefix(plan.wkw_file.header.block_bytes) + region.data.tobytes(order="F")


def read_shard(source: WkwMagSource, plan: ShardPlan, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of the virtual shard, reading from the file only the blocks they cover."""
    pieces: list[bytes] = []
    data_size = plan.data_size
    if start < data_size:
        first = int(np.searchsorted(plan.seg_end, start, side="right"))
        last = int(np.searchsorted(plan.seg_start, min(end, data_size), side="left"))
        stored = [i for i in range(first, last) if plan.seg_kind[i] != _MASKED]
        span = b""
        span_start = 0
        if stored:
            span_start = int(plan.seg_file_offset[stored[0]])
            span_end = int(plan.seg_file_offset[stored[-1]] + plan.seg_file_length[stored[-1]])
            span = source.wkw.files.store.read(
                plan.wkw_file.path, span_start, span_end - span_start, plan.wkw_file.identity
            )
        block_bytes = plan.wkw_file.header.block_bytes
        for i in range(first, last):
            kind = plan.seg_kind[i]
            if kind == _MASKED:
                segment = _masked_block(source, plan, int(plan.seg_block[i]))
            else:
                offset = int(plan.seg_file_offset[i]) - span_start
                length = int(plan.seg_file_length[i])
                prefix = lz4_chunk_prefix(length, block_bytes) if kind == _STORED_LZ4 else memcpy_chunk_prefix(length)
                segment = prefix + span[offset : offset + length]
            seg_start = int(plan.seg_start[i])
            pieces.append(segment[max(start - seg_start, 0) : end - seg_start])
    if end > data_size:
        pieces.append(plan.index[max(start - data_size, 0) : end - data_size])
    return b"".join(pieces)


class ShardPlans:
    """Shard layouts, cached per file version (they depend only on the jump table and the layout)."""

    def __init__(self, max_bytes: int) -> None:
        self.lru: ByteLRU[ShardPlan] = ByteLRU(max_bytes)

    def shard(self, served: ServedMag, index: tuple[int, ...]) -> Resource:
        _check_grid(served.layout, index)
        source = served.source
        assert isinstance(source, WkwMagSource), "only WKW mags are served sharded"
        edge = source.file_voxel_len
        cube = (index[1], index[2], index[3])
        lo = (cube[0] * edge, cube[1] * edge, cube[2] * edge)
        if source.clip(lo, (lo[0] + edge, lo[1] + edge, lo[2] + edge)) is None:
            raise ChunkNotFound("the shard lies wholly outside the layer's bounding box")
        wkw_file = source.open_file(cube)
        if wkw_file is None:
            raise ChunkNotFound("no WKW file holds this shard")
        key = (served.fingerprint, wkw_file.path, wkw_file.identity)
        plan = self.lru.get(key)
        if plan is None:
            plan = plan_shard(source, wkw_file, cube)
            self.lru.put(key, plan, plan.cache_bytes)
        etag = make_etag(served.fingerprint, index, source.relative(wkw_file.path), wkw_file.identity)

        def read(start: int, end: int) -> bytes:
            return read_shard(source, plan, start, end)

        return Resource(plan.size, etag, OCTET_STREAM, reader=read, last_modified=wkw_file.identity.mtime)


def shard_inner_codec(codec: Codec) -> Codec:
    """Sharded inner chunks are stored blocks framed as Blosc, whatever the plain codec is."""
    return codec if codec.is_blosc else Codec.BLOSC_LZ4
