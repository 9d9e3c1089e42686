"""A WKW mag of a layer, in the terms the Zarr protocol needs: geometry, regions, stored blocks."""

import functools

import numpy as np

from gateway_storage import FileSource, OutsideRootError, Store, TruncatedFileError
from gateway_storage.cache import CacheCounts
from gateway_storage.geometry import Vec3
from wkw_adapter import WkwFileCache, WkwMag, morton_grid

from .formats import SourceFormat
from .mag import MagSource, StoredBlocks, StoredChunk, StoredEncoding
from .properties import BoundingBox, DataLayer

MARKER = "header.wkw"  # every WKW mag directory holds one


class WkwMagSource(MagSource):
    """One mag of a WKW layer: regions, and stored blocks for pass-through and shards."""

    kind = "wkw"

    def __init__(self, mag: Vec3, directory: str, bbox: BoundingBox, files: WkwFileCache) -> None:
        self.wkw = WkwMag(directory, files)
        self.location = directory
        self.root = files.store.root_of(directory)  # the root it lies under: replicas agree on relative paths
        header = self.wkw.header
        super().__init__(mag, bbox, header.dtype, header.num_channels)
        self._encoding = StoredEncoding.LZ4_BLOCK if header.block_type.compressed else StoredEncoding.RAW_BLOCK

    @property
    def reads_are_cheap(self) -> bool:
        return self.wkw.files.store.is_local

    def read_inside(self, offset: Vec3, shape: Vec3) -> tuple[np.ndarray, list[FileSource] | None]:
        return self.wkw.read_region_with_sources(offset, shape)

    @property
    def stored_chunk_shape(self) -> tuple[int, int, int, int]:
        edge = self.wkw.header.block_len
        return (self.channels, edge, edge, edge)

    def stored_chunk(self, index: tuple[int, ...], lo: Vec3) -> StoredChunk | None:
        """The stored block with corner ``lo``; None where its file does not exist (it reads as zeros)."""
        side = self.wkw.header.block_len
        cube, block = self.wkw.locate_block((lo[0] // side, lo[1] // side, lo[2] // side))
        wkw_file = self.wkw.open_file(cube)
        if wkw_file is None:
            return None
        stored = self.wkw.files.stored_block(wkw_file, block)
        origin = self.relative(wkw_file.path)
        return StoredChunk(stored.data, self._encoding, stored.header.block_bytes, origin, wkw_file.identity)

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
            return store.read(path, offset, length, identity)

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

    def holds_mag(self, directory: str) -> bool:
        try:
            return self.store.identity(self.store.join(directory, MARKER)) is not None
        except OutsideRootError:
            return False  # the marker is a symlink out of the root: the mag is not served

    def open_mag(self, mag: Vec3, directory: str, layer: DataLayer, axis_order: dict[str, int] | None) -> MagSource:
        return WkwMagSource(mag, directory, layer.bounding_box, self.files)

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
