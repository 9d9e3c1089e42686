"""Virtual shards: one stored file cube (a WKW file) served as one ``sharding_indexed`` shard.

The shard is laid out from the file's block table alone: inner chunks follow the
file's own block order, so neighbouring inner chunks are neighbouring file bytes
and a byte range of the shard is served from one positioned read.
"""

from dataclasses import dataclass

import numpy as np

from gateway_storage import ByteLRU, FileChangedError
from gateway_storage.geometry import Box, Vec3, vec3
from wkw_adapter import BlockDecodeError

from ..sources.mag import ChunkNotFound, MagSource, StoredBlocks, StoredEncoding
from ..sources.shard_index import encode_shard_index
from .blosc import LZ4_PREFIX_SIZE, MEMCPY_PREFIX_SIZE, lz4_bound, lz4_chunk_prefix, memcpy_chunk_prefix
from .chunks import ServedMag, check_grid
from .codecs import Codec
from .resource import OCTET_STREAM, Resource, make_etag

_STORED_LZ4, _STORED_RAW, _MASKED = 0, 1, 2


@dataclass(frozen=True, slots=True)
class ShardPlan:
    """Where each present inner chunk of a shard lies, in the virtual shard and in the stored file."""

    blocks: StoredBlocks
    cube: Vec3
    seg_start: np.ndarray  # virtual offset of each present inner chunk, in file order
    seg_end: np.ndarray
    seg_block: np.ndarray  # its block number in the file
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


def plan_shard(source: MagSource, blocks: StoredBlocks, cube: Vec3) -> ShardPlan:
    """Lay out the shard of ``cube`` from the block table alone (no block is read)."""
    side, n, block_bytes = blocks.block_edge, blocks.blocks_per_edge, blocks.block_bytes
    compressed = blocks.encoding is StoredEncoding.LZ4_BLOCK
    lo = (np.array(cube) * n + blocks.block_coords) * side
    hi = lo + side
    bbox_lo, bbox_hi = np.array(source.bbox.lo), np.array(source.bbox.hi)
    inside = np.all(lo >= bbox_lo, axis=1) & np.all(hi <= bbox_hi, axis=1)
    present = ~(np.any(hi <= bbox_lo, axis=1) | np.any(lo >= bbox_hi, axis=1))
    offsets, lengths = blocks.block_table()
    if np.any(present & (lengths == 0)):
        raise BlockDecodeError(f"{blocks.origin}: a block has no bytes in the jump table")
    if compressed and np.any(present & inside & (lengths > lz4_bound(block_bytes))):
        raise BlockDecodeError(f"{blocks.origin}: a stored LZ4 block is larger than any block can compress to")
    kind = np.where(inside, _STORED_LZ4 if compressed else _STORED_RAW, _MASKED)
    sizes = np.where(kind == _STORED_LZ4, LZ4_PREFIX_SIZE + lengths, MEMCPY_PREFIX_SIZE + block_bytes).astype(np.int64)
    sizes[~present] = 0
    ends = np.cumsum(sizes)
    starts = ends - sizes
    # The index is in C order of the shard's inner-chunk grid over (x, y, z): the channel axis has one chunk.
    position = np.ravel_multi_index(tuple(blocks.block_coords.T), (n, n, n))
    index_offsets = np.zeros(n**3, dtype=np.uint64)
    index_sizes = np.zeros(n**3, dtype=np.uint64)
    index_present = np.zeros(n**3, dtype=bool)
    index_offsets[position] = starts
    index_sizes[position] = sizes
    index_present[position] = present
    return ShardPlan(
        blocks,
        cube,
        starts[present],
        ends[present],
        np.flatnonzero(present),
        kind[present],
        offsets[present],
        lengths[present],
        encode_shard_index(index_offsets, index_sizes, index_present),
    )


def _masked_block(source: MagSource, plan: ShardPlan, block: int) -> bytes:
    blocks = plan.blocks
    n, side = blocks.blocks_per_edge, blocks.block_edge
    lo = vec3(int((c * n + b) * side) for c, b in zip(plan.cube, blocks.block_coords[block]))
    region = source.read_box(lo, vec3(v + side for v in lo))
    if any(identity != blocks.identity for _, identity in region.sources or []):
        raise FileChangedError(f"{blocks.origin} changed while a shard was being read")
    return memcpy_chunk_prefix(blocks.block_bytes) + region.data.tobytes(order="F")


def read_shard(source: MagSource, plan: ShardPlan, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of the virtual shard, reading from the file only the blocks they cover."""
    pieces: list[bytes] = []
    data_size = plan.data_size
    blocks = plan.blocks
    if start < data_size:
        first = int(np.searchsorted(plan.seg_end, start, side="right"))
        last = int(np.searchsorted(plan.seg_start, min(end, data_size), side="left"))
        stored = [i for i in range(first, last) if plan.seg_kind[i] != _MASKED]
        span = b""
        span_start = 0
        if stored:
            span_start = int(plan.seg_file_offset[stored[0]])
            span_end = int(plan.seg_file_offset[stored[-1]] + plan.seg_file_length[stored[-1]])
            span = blocks.read_span(span_start, span_end - span_start)
        for i in range(first, last):
            kind = plan.seg_kind[i]
            if kind == _MASKED:
                segment = _masked_block(source, plan, int(plan.seg_block[i]))
            else:
                offset = int(plan.seg_file_offset[i]) - span_start
                length = int(plan.seg_file_length[i])
                prefix = (
                    lz4_chunk_prefix(length, blocks.block_bytes) if kind == _STORED_LZ4 else memcpy_chunk_prefix(length)
                )
                segment = prefix + span[offset : offset + length]
            seg_start = int(plan.seg_start[i])
            pieces.append(segment[max(start - seg_start, 0) : end - seg_start])
    if end > data_size:
        pieces.append(plan.index[max(start - data_size, 0) : end - data_size])
    return b"".join(pieces)


class ShardPlans:
    """Shard layouts, cached per file version (they depend only on the block table and the layout)."""

    def __init__(self, max_bytes: int) -> None:
        self.lru: ByteLRU[ShardPlan] = ByteLRU(max_bytes)

    def shard(self, served: ServedMag, index: tuple[int, ...]) -> Resource:
        check_grid(served.layout, index)
        source = served.source
        edge = source.file_cube_edge
        assert edge is not None, "the sharded layout is only offered for sources with file cubes"
        cube = (index[1], index[2], index[3])
        lo = (cube[0] * edge, cube[1] * edge, cube[2] * edge)
        if source.bbox.clip(Box.sized(lo, (edge, edge, edge))) is None:
            raise ChunkNotFound("the shard lies wholly outside the layer's bounding box")
        blocks = source.stored_blocks(cube)
        if blocks is None:
            raise ChunkNotFound("no stored file holds this shard")
        key = (served.fingerprint, blocks.origin, blocks.identity)
        plan = self.lru.get(key)
        if plan is None:
            plan = plan_shard(source, blocks, cube)
            self.lru.put(key, plan, plan.cache_bytes)
        etag = make_etag(served.fingerprint, index, blocks.origin, blocks.identity.size, blocks.identity.version)
        found = plan

        def read(start: int, end: int) -> bytes:
            return read_shard(source, found, start, end)

        return Resource(
            plan.size,
            etag,
            OCTET_STREAM,
            reader=read,
            last_modified=blocks.identity.mtime,
            local_reads=source.reads_are_cheap,
        )


def shard_inner_codec(codec: Codec) -> Codec:
    """Sharded inner chunks are stored blocks framed as Blosc, whatever the plain codec is."""
    return codec if codec.is_blosc else Codec.BLOSC_LZ4
