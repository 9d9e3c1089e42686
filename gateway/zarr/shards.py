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

from ..resources import OCTET_STREAM, Resource, make_etag
from ..shard_formats.sharding_indexed import ShardLayout
from ..sources.mag import ChunkNotFound, MagSource, StoredBlocks
from .blosc import MEMCPY_PREFIX_SIZE, memcpy_chunk_prefix
from .chunks import ServedMag, check_grid
from .codecs import Codec
from .framing import Framing, framing_for


@dataclass(frozen=True, slots=True)
class ShardPlan:
    """Where each present inner chunk of a shard lies, in the virtual shard and in the stored file.

    An inner chunk wholly inside the bounding box is its stored block, framed (``seg_stored``); one that
    straddles it is read, masked and sent uncompressed.
    """

    blocks: StoredBlocks
    framing: Framing
    cube: Vec3
    seg_start: np.ndarray  # virtual offset of each present inner chunk, in file order
    seg_end: np.ndarray
    seg_block: np.ndarray  # its block number in the file
    seg_stored: np.ndarray
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

    def segments(self, start: int, end: int) -> range:
        """The present inner chunks that bytes ``[start, end)`` of the shard overlap."""
        if start >= self.data_size:
            return range(0)
        first = int(np.searchsorted(self.seg_end, start, side="right"))
        last = int(np.searchsorted(self.seg_start, min(end, self.data_size), side="left"))
        return range(first, last)

    def decoded_bytes(self, start: int, end: int) -> int:
        """The voxel bytes that producing ``[start, end)`` decodes: every inner chunk it overlaps is
        checked (stored) or read (masked) whole."""
        return len(self.segments(start, end)) * self.blocks.block_bytes + (end - start)


def plan_shard(source: MagSource, blocks: StoredBlocks, cube: Vec3) -> ShardPlan:
    """Lay out the shard of ``cube`` from the block table alone (no block is read)."""
    side, n, block_bytes = blocks.block_edge, blocks.blocks_per_edge, blocks.block_bytes
    framing = framing_for(blocks.encoding)
    lo = (np.array(cube) * n + blocks.block_coords) * side
    hi = lo + side
    bbox_lo, bbox_hi = np.array(source.bbox.lo), np.array(source.bbox.hi)
    inside = np.all(lo >= bbox_lo, axis=1) & np.all(hi <= bbox_hi, axis=1)
    present = ~(np.any(hi <= bbox_lo, axis=1) | np.any(lo >= bbox_hi, axis=1))
    offsets, lengths = blocks.block_table()
    if np.any(present & (lengths == 0)):
        raise BlockDecodeError(f"{blocks.origin}: a block has no bytes in the jump table")
    most = framing.max_stored_length(block_bytes)
    if most is not None and np.any(present & inside & (lengths > most)):
        raise BlockDecodeError(f"{blocks.origin}: a stored block is larger than any block can be stored in")
    sizes = np.where(inside, framing.prefix_size + lengths, MEMCPY_PREFIX_SIZE + block_bytes).astype(np.int64)
    sizes[~present] = 0
    ends = np.cumsum(sizes)
    starts = ends - sizes
    # The shard's inner-chunk grid is (x, y, z): the channel axis has one chunk.
    index = ShardLayout((n, n, n)).encode(blocks.block_coords, starts, sizes, present)
    return ShardPlan(
        blocks,
        framing,
        cube,
        starts[present],
        ends[present],
        np.flatnonzero(present),
        inside[present],
        offsets[present],
        lengths[present],
        index,
    )


def _masked_block(source: MagSource, plan: ShardPlan, block: int) -> bytes:
    blocks = plan.blocks
    n, side = blocks.blocks_per_edge, blocks.block_edge
    lo = vec3(int((c * n + b) * side) for c, b in zip(plan.cube, blocks.block_coords[block]))
    region = source.read_box(lo, vec3(v + side for v in lo))
    if any(identity != blocks.identity for _, identity in region.sources or []):
        raise FileChangedError(f"{blocks.origin} changed while a shard was being read")
    return memcpy_chunk_prefix(blocks.block_bytes) + region.data.tobytes(order="F")


def _stored_runs(plan: ShardPlan, segments: range) -> list[tuple[int, int]]:
    """``(offset, length)`` in the file of each run of adjacent stored blocks among ``segments``.

    Only the stored bytes of the covered inner chunks are read: a gap between two of them in the file
    (blocks outside the bounding box, or masked ones) is never read.
    """
    runs: list[tuple[int, int]] = []
    for i in segments:
        if not plan.seg_stored[i]:
            continue
        offset, length = int(plan.seg_file_offset[i]), int(plan.seg_file_length[i])
        if runs and runs[-1][0] + runs[-1][1] == offset:
            runs[-1] = (runs[-1][0], runs[-1][1] + length)
        else:
            runs.append((offset, length))
    return runs


def read_shard(source: MagSource, plan: ShardPlan, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of the virtual shard, reading from the file only the blocks they cover.

    Every stored block covered, even in part, is checked to decode to exactly its size first.
    """
    pieces: list[bytes] = []
    data_size = plan.data_size
    blocks = plan.blocks
    segments = plan.segments(start, end)
    # Views of the runs read: each block is copied once, into its framed segment.
    runs = [(offset, memoryview(blocks.read_span(offset, length))) for offset, length in _stored_runs(plan, segments)]
    run = 0
    for i in segments:
        if plan.seg_stored[i]:
            offset, length = int(plan.seg_file_offset[i]), int(plan.seg_file_length[i])
            while runs[run][0] + len(runs[run][1]) <= offset:
                run += 1
            run_offset, span = runs[run]
            data = span[offset - run_offset : offset - run_offset + length]
            key = (blocks.origin, blocks.identity.version, "block", int(plan.seg_block[i]))
            segment = plan.framing.frame(data, blocks.block_bytes, key)
        else:
            segment = _masked_block(source, plan, int(plan.seg_block[i]))
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
            decoded_bytes=plan.decoded_bytes,
        )


def shard_inner_codec(codec: Codec) -> Codec:
    """Sharded inner chunks are stored blocks framed as Blosc, whatever the plain codec is."""
    return codec if codec.is_blosc else Codec.BLOSC_LZ4
