"""A WKW mag of a layer, in the terms the Zarr protocol needs: geometry, regions, stored blocks."""

import numpy as np

from wkw_adapter import StoredBlock, WkwFile, WkwFileCache, WkwMag
from wkw_adapter.mag import FileSource

from .mag import MagSource, Vec3
from .properties import BoundingBox


class WkwMagSource(MagSource):
    """One mag of a WKW layer: regions, and stored blocks for pass-through and shards."""

    kind = "wkw"

    def __init__(self, mag: Vec3, directory: str, bbox: BoundingBox, files: WkwFileCache) -> None:
        self.wkw = WkwMag(directory, files)
        self.location = directory
        self.root = getattr(files.store, "root", None) or ""
        header = self.wkw.header
        super().__init__(mag, bbox, header.dtype, header.num_channels)

    @property
    def block_len(self) -> int:
        return self.wkw.header.block_len

    @property
    def file_voxel_len(self) -> int:
        return self.wkw.header.file_voxel_len

    @property
    def reads_are_cheap(self) -> bool:
        return self.wkw.files.store.is_local

    def read_inside(self, offset: Vec3, shape: Vec3) -> tuple[np.ndarray, list[FileSource] | None]:
        return self.wkw.read_region_with_sources(offset, shape)

    def open_file(self, cube: Vec3) -> WkwFile | None:
        """The data file of one file cube (a v3 shard), or None if it does not exist."""
        return self.wkw.open_file(cube)

    def stored_block(self, wkw_file: WkwFile, index: int) -> StoredBlock:
        return self.wkw.files.stored_block(wkw_file, index)

    def block_in_file(self, x: int, y: int, z: int) -> tuple[WkwFile | None, int, str]:
        """The file holding block ``(x, y, z)``, the block's Morton index in it, and the file's path."""
        cube, index = self.wkw.locate_block((x, y, z))
        return self.open_file(cube), index, self.wkw.file_path(cube)
