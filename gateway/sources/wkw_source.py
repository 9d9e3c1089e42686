"""A WKW mag of a layer, in the terms the Zarr protocol needs: geometry, regions, stored blocks."""

from dataclasses import dataclass

import numpy as np

from wkw_adapter import StoredBlock, WkwFile, WkwFileCache, WkwMag
from wkw_adapter.mag import FileSource

from .properties import BoundingBox

Vec3 = tuple[int, int, int]


def bbox_at_mag(bbox: BoundingBox, mag: Vec3) -> tuple[Vec3, Vec3]:
    """The mag-m voxels ``[floor(topLeft/m), ceil((topLeft+size)/m))`` the bounding box covers."""
    lo = tuple(t // m for t, m in zip(bbox.top_left, mag))
    hi = tuple(-(-e // m) for e, m in zip(bbox.end, mag))
    return lo, hi  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class Region:
    """An ``[c, x, y, z]`` array plus the identity of every file it was read from."""

    data: np.ndarray
    sources: list[FileSource]


class WkwMagSource:
    """One mag of a WKW layer. Voxels outside the bounding box are never returned."""

    def __init__(self, mag: Vec3, directory: str, bbox: BoundingBox, files: WkwFileCache) -> None:
        self.mag = mag
        self.wkw = WkwMag(directory, files)
        self.bbox_lo, self.bbox_hi = bbox_at_mag(bbox, mag)

    @property
    def dtype(self) -> np.dtype:
        return self.wkw.header.dtype

    @property
    def channels(self) -> int:
        return self.wkw.header.num_channels

    @property
    def shape(self) -> Vec3:
        """Served extent in this mag's voxels: every voxel of the bounding box, from the origin."""
        return self.bbox_hi

    @property
    def block_len(self) -> int:
        return self.wkw.header.block_len

    @property
    def file_voxel_len(self) -> int:
        return self.wkw.header.file_voxel_len

    def clip(self, lo: Vec3, hi: Vec3) -> tuple[Vec3, Vec3] | None:
        """The part of box ``[lo, hi)`` inside the bounding box, or None if there is none."""
        clo = tuple(max(a, b) for a, b in zip(lo, self.bbox_lo))
        chi = tuple(min(a, b) for a, b in zip(hi, self.bbox_hi))
        if any(h <= low for low, h in zip(clo, chi)):
            return None
        return clo, chi  # type: ignore[return-value]

    def contains(self, lo: Vec3, hi: Vec3) -> bool:
        return all(a >= b for a, b in zip(lo, self.bbox_lo)) and all(a <= b for a, b in zip(hi, self.bbox_hi))

    def read_box(self, lo: Vec3, hi: Vec3) -> Region:
        """Box ``[lo, hi)`` with voxels outside the bounding box set to the fill value 0."""
        shape = tuple(h - low for low, h in zip(lo, hi))
        out = np.zeros((self.channels, *shape), dtype=self.dtype, order="F")
        inner = self.clip(lo, hi)
        if inner is None:
            return Region(out, [])
        ilo, ihi = inner
        data, sources = self.wkw.read_region_with_sources(ilo, tuple(h - low for low, h in zip(ilo, ihi)))
        out[(slice(None), *(slice(a - o, b - o) for a, b, o in zip(ilo, ihi, lo)))] = data
        return Region(out, sources)

    def open_file(self, cube: Vec3) -> WkwFile | None:
        """The data file of one file cube (a v3 shard), or None if it does not exist."""
        return self.wkw.open_file(cube)

    def stored_block(self, wkw_file: WkwFile, index: int) -> StoredBlock:
        return self.wkw.files.stored_block(wkw_file, index)

    def block_in_file(self, x: int, y: int, z: int) -> tuple[WkwFile | None, int, str]:
        """The file holding block ``(x, y, z)``, the block's Morton index in it, and the file's path."""
        cube, index = self.wkw.locate_block((x, y, z))
        return self.open_file(cube), index, self.wkw.file_path(cube)

    @property
    def reads_are_cheap(self) -> bool:
        """Whether a stat and a small read may run on the event loop (local page cache, not a network)."""
        return self.wkw.files.store.is_local
