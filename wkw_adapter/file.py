"""One WKW data file: its header, its jump table, and where each block's bytes lie."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import cramjam
import lz4.block
import numpy as np

from gateway_storage import ByteLRU, FileIdentity, Store, TruncatedFileError

from .errors import BlockDecodeError, JumpTableError
from .header import HEADER_SIZE, BlockType, WkwHeader, parse_header

MAX_SPAN = 96 << 10  # bytes read at once for a run of consecutive blocks: measured, a longer read (in one buffer
# above the C allocator's mmap threshold, 128 KiB) costs more in fresh pages than the read calls it saves


@dataclass(frozen=True, slots=True)
class WkwFile:
    """The parts of a data file needed to find any block, for one version of the file."""

    path: str
    identity: FileIdentity
    header: WkwHeader
    jump_table: np.ndarray | None  # uint64 end offsets (compressed files only)
    ends: Sequence[int] | None = None  # the same table, indexable as Python ints without numpy's overhead

    @property
    def cache_bytes(self) -> int:
        return 256 + (self.jump_table.nbytes if self.jump_table is not None else 0)

    def block_range(self, index: int) -> tuple[int, int]:
        """``(offset, length)`` in the file of block ``index`` (Morton number)."""
        header = self.header
        if self.jump_table is None:
            return header.data_offset + index * header.block_bytes, header.block_bytes
        ends = self.ends if self.ends is not None else self.jump_table.tolist()
        start = header.data_offset if index == 0 else ends[index - 1]
        return start, ends[index] - start


@dataclass(slots=True)  # one per block read: plain construction is cheaper than frozen
class StoredBlock:
    """A block's bytes exactly as stored, with what is needed to decode them."""

    data: bytes
    header: WkwHeader

    @property
    def block_type(self) -> BlockType:
        return self.header.block_type


def _check_jump_table(path: str, header: WkwHeader, jumps: np.ndarray, size: int) -> None:
    if header.data_offset < HEADER_SIZE + header.jump_table_size:
        raise JumpTableError(f"{path}: data offset {header.data_offset} overlaps the jump table")
    if int(jumps[0]) < header.data_offset:
        raise JumpTableError(f"{path}: block 0 ends at {int(jumps[0])}, before the data offset {header.data_offset}")
    if jumps.size > 1 and bool(np.any(jumps[1:] < jumps[:-1])):
        raise JumpTableError(f"{path}: jump table is not increasing")
    if int(jumps[-1]) > size:
        raise JumpTableError(f"{path}: jump table points to {int(jumps[-1])}, past the end of the file ({size} bytes)")


def load_wkw_file(store: Store, path: str, identity: FileIdentity) -> WkwFile:
    """Read and validate the header and jump table of one version of a file."""
    # Read before the size is judged, so that a file still being written is reported as such by the
    # store (FileUnsettledError: retry later) rather than as a truncated file.
    head = store.read(path, 0, min(identity.size, HEADER_SIZE), identity, limit=HEADER_SIZE)
    if len(head) < HEADER_SIZE:
        raise TruncatedFileError(f"{path}: {identity.size} bytes is shorter than a header")
    header = parse_header(head)
    jumps = None
    if header.block_type.compressed:
        if identity.size < HEADER_SIZE + header.jump_table_size:
            raise TruncatedFileError(f"{path}: file ends inside its jump table")
        raw = store.read(path, HEADER_SIZE, header.jump_table_size, identity, limit=header.jump_table_size)
        jumps = np.frombuffer(raw, dtype="<u8")
        _check_jump_table(path, header, jumps, identity.size)
    elif header.data_offset < HEADER_SIZE:
        raise TruncatedFileError(f"{path}: data offset {header.data_offset} lies inside the header")
    ends = None if jumps is None else memoryview(np.ascontiguousarray(jumps, dtype="=u8").tobytes()).cast("Q")
    return WkwFile(path, identity, header, jumps, ends)


class WkwFileCache:
    """Opens data files through a byte-bounded cache of headers and jump tables.

    Each lookup asks the store for the file's current identity, so a file
    that was rewritten (new size, mtime or inode) is never read with a stale
    jump table.
    """

    def __init__(self, store: Store, max_bytes: int = 64 << 20) -> None:
        self.store = store
        self.lru: ByteLRU[WkwFile] = ByteLRU(max_bytes)

    def open(self, path: str, check: Callable[[WkwFile], None] | None = None) -> WkwFile | None:
        """The file at ``path``, or None if it does not exist; ``check`` vets a file when it is loaded."""
        identity = self.store.identity(path)
        return None if identity is None else self.version(path, identity, check)

    def version(self, path: str, identity: FileIdentity, check: Callable[[WkwFile], None] | None = None) -> WkwFile:
        """The version ``identity`` of the file at ``path`` (just looked up), from the cache or loaded now."""
        cached = self.lru.get(path)
        if cached is not None and cached.identity == identity:
            return cached
        wkw_file = load_wkw_file(self.store, path, identity)
        if check is not None:
            check(wkw_file)
        self.lru.put(path, wkw_file, wkw_file.cache_bytes)
        return wkw_file

    def stored_block(self, wkw_file: WkwFile, index: int) -> StoredBlock:
        """Block ``index`` exactly as stored.

        An empty block in a compressed file is corrupt (LZ4 never encodes a
        block in zero bytes), never a block of zeros.
        """
        offset, length = wkw_file.block_range(index)
        _check_block_length(wkw_file, index, length)
        limit = wkw_file.header.stored_block_limit
        return StoredBlock(
            self.store.read(wkw_file.path, offset, length, wkw_file.identity, limit=limit), wkw_file.header
        )

    def stored_blocks(self, wkw_file: WkwFile, indices: Sequence[int]) -> list[memoryview]:
        """Blocks ``indices`` (Morton numbers, ascending) exactly as stored, as views of few reads.

        Each run of consecutive blocks, up to :data:`MAX_SPAN` bytes, is one positioned read, checked once
        against the file's version (the store checks after each read): a block-aligned chunk of a
        power-of-two edge is one run.
        """
        if not indices:
            return []
        ranges = [wkw_file.block_range(index) for index in indices]
        for index, (_, length) in zip(indices, ranges):
            _check_block_length(wkw_file, index, length)
        blocks: list[memoryview] = []
        limit = max(MAX_SPAN, wkw_file.header.stored_block_limit)  # a run is one block, or blocks within MAX_SPAN
        run_start = 0
        for position in range(1, len(indices) + 1):
            if (
                position < len(indices)
                and indices[position] == indices[position - 1] + 1
                and sum(ranges[position]) - ranges[run_start][0] <= MAX_SPAN
            ):
                continue
            first, (last_offset, last_length) = ranges[run_start][0], ranges[position - 1]
            span = memoryview(
                self.store.read(wkw_file.path, first, last_offset + last_length - first, wkw_file.identity, limit=limit)
            )
            for offset, length in ranges[run_start:position]:
                blocks.append(span[offset - first : offset - first + length])
            run_start = position
        return blocks


def _check_block_length(wkw_file: WkwFile, index: int, length: int) -> None:
    """Refuse, before it is read, a block the jump table gives no bytes (LZ4 never encodes a block in none) or
    more than any block can be stored in (a crafted table could make one block the whole file)."""
    if length == 0:
        raise BlockDecodeError(f"{wkw_file.path}: block {index} has no bytes in the jump table")
    limit = wkw_file.header.stored_block_limit
    if length > limit:
        raise BlockDecodeError(
            f"{wkw_file.path}: block {index} is {length} bytes long in the jump table, larger than any "
            f"{wkw_file.header.block_bytes}-byte block can be stored in (at most {limit})"
        )


def decompress_block_into(data: bytes | memoryview, block_type: BlockType, out: memoryview) -> None:
    """Decode one stored block straight into ``out`` (exactly one block's bytes long), without a copy.

    cramjam's LZ4 block decoder writes into the caller's buffer; lz4's returns a new object to copy.
    """
    if not block_type.compressed:
        if len(data) != len(out):
            raise BlockDecodeError(f"a raw block of {len(data)} bytes, expected {len(out)}")
        out[:] = data
        return
    try:
        written = cramjam.lz4.decompress_block_into(data, out, output_len=len(out))
    except cramjam.DecompressionError as exc:
        raise BlockDecodeError(f"LZ4 block does not decode: {exc}") from exc
    if written != len(out):
        raise BlockDecodeError(f"LZ4 block decodes to {written} bytes, expected {len(out)}")


def decompress_block(stored: StoredBlock) -> bytes:
    """The block's raw voxel bytes (Fortran order, channels interleaved)."""
    expected = stored.header.block_bytes
    if not stored.block_type.compressed:
        return stored.data
    try:
        raw: bytes = lz4.block.decompress(stored.data, uncompressed_size=expected)
    except lz4.block.LZ4BlockError as exc:
        raise BlockDecodeError(f"LZ4 block does not decode: {exc}") from exc
    if len(raw) != expected:
        raise BlockDecodeError(f"LZ4 block decodes to {len(raw)} bytes, expected {expected}")
    return raw


def decode_block(stored: StoredBlock) -> np.ndarray:
    """The block as an array indexed ``[c, x, y, z]``."""
    header = stored.header
    side = header.block_len
    flat = np.frombuffer(decompress_block(stored), dtype=header.dtype)
    return flat.reshape((header.num_channels, side, side, side), order="F")


def compress_block(raw: bytes, block_type: BlockType) -> bytes:
    """Encode raw voxel bytes as stored for ``block_type``."""
    if block_type is BlockType.RAW:
        return raw
    mode = "high_compression" if block_type is BlockType.LZ4HC else "default"
    compressed: bytes = lz4.block.compress(raw, mode=mode, store_size=False)
    return compressed
