"""A WKW mag of a layer, in the terms the Zarr protocol needs: geometry, regions, stored blocks."""

import functools

import numpy as np

from gateway_storage import FileSource, Store, TruncatedFileError
from gateway_storage.cache import CacheCounts
from gateway_storage.geometry import Box, Vec3
from wkw_adapter import HeaderError, WkwFileCache, WkwHeader, WkwMag, morton_grid, read_mag_header

from .formats import SourceFormat
from .mag import MagSource, Region, StoredBlocks, StoredChunk, StoredEncoding
from .properties import BoundingBox, DataLayer

MARKER = "header.wkw"  # every WKW mag directory holds one

# The geometry real writers produce: webKnossos, webknossos-libs and the wkw library write 32-voxel blocks
# and 32 blocks per file edge by default, and let a writer choose other powers of two. Headers outside
# these bounds are refused, because their cost is out of proportion to what they serve: 1-voxel blocks
# make one chunk thousands of block reads, a 1024-voxel block decodes 1 GiB for any chunk it touches,
# and 1024 blocks per file edge give a jump table and a shard index of a billion entries.
BLOCK_EDGES = range(3, 7)  # log2: 8 to 64 voxels per block edge
BLOCKS_PER_FILE_EDGE = range(0, 6)  # log2: 1 to 32 blocks per file edge
MAX_BLOCK_BYTES = 4 << 20  # the decoded size of one block: 64^3 voxels of 16 bytes


def check_geometry(header: WkwHeader, where: str) -> None:
    """Refuse a header whose geometry no real writer produces (see BLOCK_EDGES), with the reason."""
    if header.block_len_log2 not in BLOCK_EDGES:
        raise HeaderError(
            f"{where}: blocks of {header.block_len} voxels per edge are not served "
            f"(from {1 << BLOCK_EDGES[0]} to {1 << BLOCK_EDGES[-1]}; webKnossos writes 32)"
        )
    if header.file_len_log2 not in BLOCKS_PER_FILE_EDGE:
        raise HeaderError(
            f"{where}: {header.file_len} blocks per file edge are not served "
            f"(from 1 to {1 << BLOCKS_PER_FILE_EDGE[-1]}; webKnossos writes 32)"
        )
    if header.block_bytes > MAX_BLOCK_BYTES:
        raise HeaderError(
            f"{where}: a block decodes to {header.block_bytes} bytes, more than the {MAX_BLOCK_BYTES} served"
        )


def _cells(shape: Vec3, side: int) -> int:
    """The most cells of a grid of cubes of edge ``side`` that a grid-aligned box of ``shape`` touches."""
    cells = 1
    for edge in shape:
        aligned = edge % side == 0 or side % edge == 0
        cells *= -(-edge // side) + (0 if aligned else 1)
    return cells


# A box of at most this many bytes inside one file is read without a look first (64³ of uint64 labels).
READ_FIRST_BYTES = 2 << 20


class WkwMagSource(MagSource):
    """One mag of a WKW layer: regions, and stored blocks for pass-through and shards."""

    kind = "wkw"

    def __init__(
        self, mag: Vec3, directory: str, bbox: BoundingBox, files: WkwFileCache, through: Store | None = None
    ) -> None:
        opening = self._locate(files.store, directory, through)
        self.wkw = WkwMag(directory, files, self.storage, read_mag_header(opening, directory))
        header = self.wkw.header
        check_geometry(header, "header.wkw")  # data files must match it (WkwMag checks each one)
        super().__init__(mag, bbox, header.dtype, header.num_channels)
        self._encoding = StoredEncoding.LZ4_BLOCK if header.block_type.compressed else StoredEncoding.RAW_BLOCK

    @property
    def reads_are_cheap(self) -> bool:
        return self.wkw.files.store.is_local

    def decoded_bytes(self, shape: Vec3) -> int:
        return _cells(shape, self.wkw.header.block_len) * self.wkw.header.block_bytes

    def files_read(self, shape: Vec3) -> int:
        return _cells(shape, self.wkw.header.file_voxel_len)

    def holds_data(self, lo: Vec3, hi: Vec3) -> bool:
        """Whether any data file covers part of ``[lo, hi)``: a box without one reads as zeros (looked up through
        the anchored store: in a mag directory that is there)."""
        edge = self.wkw.header.file_voxel_len
        first = [v // edge for v in lo]
        last = [(v - 1) // edge for v in hi]
        return any(
            self.wkw.open_file((x, y, z)) is not None
            for x in range(first[0], last[0] + 1)
            for y in range(first[1], last[1] + 1)
            for z in range(first[2], last[2] + 1)
        )

    def read_inside(self, offset: Vec3, shape: Vec3) -> tuple[np.ndarray, list[FileSource] | None]:
        return self.wkw.read_region_with_sources(offset, shape)

    def read_held(self, lo: Vec3, hi: Vec3) -> Region | None:
        """A small box inside one data file is read at once: the read names that file, absent or not (a look
        first would cost a second stat of it). A box over several files, or larger than READ_FIRST_BYTES (the
        zeros of a file that is not there would be made before the read could tell), is looked at first."""
        wanted = Box(lo, hi)
        inner = self.bbox.clip(wanted)
        edge = self.wkw.header.file_voxel_len
        if (
            inner is None
            or inner.size[0] * inner.size[1] * inner.size[2] * self.wkw.header.bytes_per_voxel > READ_FIRST_BYTES
            or any(a // edge != (b - 1) // edge for a, b in zip(inner.lo, inner.hi, strict=True))
        ):
            return super().read_held(lo, hi)
        data, sources = self.wkw.read_region_with_sources(inner.lo, inner.size)
        if all(identity is None for _, identity in sources):
            return None  # its file is not there: it reads as zeros
        return self.placed(wanted, inner, data, sources)

    def files_inside(self, offset: Vec3, shape: Vec3) -> list[str]:
        edge = self.wkw.header.file_voxel_len
        xs, ys, zs = (range(o // edge, (o + n - 1) // edge + 1) for o, n in zip(offset, shape))
        return [self.wkw.file_path((x, y, z)) for x in xs for y in ys for z in zs]

    @property
    def stored_chunk_shape(self) -> tuple[int, int, int, int]:
        edge = self.wkw.header.block_len
        return (self.channels, edge, edge, edge)

    def stored_chunk(self, index: tuple[int, ...], lo: Vec3) -> StoredChunk | None:
        """The stored block with corner ``lo``; None where its file does not exist in the mag directory (the
        caller then finds it holds no data: it reads as zeros)."""
        side = self.wkw.header.block_len
        cube, block = self.wkw.locate_block((lo[0] // side, lo[1] // side, lo[2] // side))
        wkw_file = self.wkw.open_file(cube)
        if wkw_file is None:
            return None
        stored = self.wkw.files.stored_block(wkw_file, block)
        origin = self.relative(wkw_file.path)
        return StoredChunk(
            stored.data, self._encoding, stored.header.block_bytes, origin, wkw_file.identity, wkw_file.path
        )

    @property
    def file_cube_edge(self) -> int:
        return self.wkw.header.file_voxel_len

    def stored_blocks(self, cube: Vec3) -> StoredBlocks | None:
        wkw_file = self.wkw.open_file(cube)
        if wkw_file is None:
            return None
        header = wkw_file.header
        count = header.blocks_per_file
        if wkw_file.jump_table is None and wkw_file.identity.size < header.data_offset + count * header.block_bytes:
            raise TruncatedFileError(f"{wkw_file.path}: raw file is shorter than its {count} blocks")
        store, path, identity = self.wkw.files.store, wkw_file.path, wkw_file.identity

        def block_table() -> tuple[np.ndarray, np.ndarray]:
            if wkw_file.jump_table is None:
                offsets = header.data_offset + np.arange(count, dtype=np.int64) * header.block_bytes
                return offsets, np.full(count, header.block_bytes, dtype=np.int64)
            ends = wkw_file.jump_table.astype(np.int64)
            offsets = np.concatenate([[header.data_offset], ends[:-1]])
            return offsets, ends - offsets

        def read_span(offset: int, length: int) -> bytes:
            return store.read(path, offset, length, identity, limit=count * header.stored_block_limit)

        return StoredBlocks(
            self.relative(path),
            identity,
            header.block_len,
            header.file_len,
            header.block_bytes,
            self._encoding,
            block_table,
            _block_coords(header.file_len),
            read_span,
        )


class WkwFormat(SourceFormat):
    """``dataFormat: wkw``: mags with a ``header.wkw``; their files' headers and jump tables share one cache."""

    data_formats = ("wkw",)

    def __init__(self, store: Store, cache_bytes: int) -> None:
        super().__init__(store, cache_bytes)
        self.files = WkwFileCache(store, max_bytes=cache_bytes)

    def holds_mag(self, directory: str, through: Store | None = None) -> bool:
        return self._holds_file(directory, MARKER, through)

    def open_mag(
        self,
        mag: Vec3,
        directory: str,
        layer: DataLayer,
        axis_order: dict[str, int] | None,
        through: Store | None = None,
    ) -> MagSource:
        return WkwMagSource(mag, directory, layer.bounding_box, self.files, through)

    @property
    def caches(self) -> dict[str, CacheCounts]:
        return {"files": self.files.lru}


@functools.lru_cache(maxsize=8)
def _block_coords(blocks_per_edge: int) -> np.ndarray:
    """Cube-local (x, y, z) of each block in a file's Morton order."""
    grid = morton_grid(blocks_per_edge)  # [x, y, z] -> Morton index
    coords = np.empty((blocks_per_edge**3, 3), dtype=np.int64)
    coords[grid.ravel().astype(np.int64)] = np.stack(
        np.unravel_index(np.arange(blocks_per_edge**3), (blocks_per_edge,) * 3), axis=1
    )
    coords.flags.writeable = False
    return coords
