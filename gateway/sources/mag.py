"""What every mag source shares: the bounding box at its mag, clipping, and masked reads."""

from dataclasses import dataclass

import numpy as np

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
    """An ``[c, x, y, z]`` array and where it came from.

    ``sources`` lists the identity of every file read (an exact validator);
    None means the reader cannot say, and the caller derives the ETag from
    the bytes themselves.
    """

    data: np.ndarray
    sources: list[FileSource] | None


class MagSource:
    """One mag of a layer. Voxels outside the bounding box are never returned."""

    kind = "abstract"
    location: str  # where the data lives
    root: str  # the data root ``location`` lies in

    def __init__(self, mag: Vec3, bbox: BoundingBox, dtype: np.dtype, channels: int, fill_value: float = 0) -> None:
        self.mag = mag
        self.bbox_lo, self.bbox_hi = bbox_at_mag(bbox, mag)
        self.dtype = dtype
        self.channels = channels
        self.fill_value = fill_value

    @property
    def location_key(self) -> str:
        """``location`` relative to the data root: the same on every replica, wherever it mounts the root."""
        return self.relative(self.location)

    def relative(self, path: str) -> str:
        """A path below the data root, without the root itself."""
        return path.removeprefix(self.root).lstrip("/")

    @property
    def shape(self) -> Vec3:
        """Served extent in this mag's voxels: every voxel of the bounding box, from the origin."""
        return self.bbox_hi

    @property
    def reads_are_cheap(self) -> bool:
        """Whether a stat and a small read may run on the event loop (local page cache, not a network)."""
        return False

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
        """Box ``[lo, hi)`` with voxels outside the bounding box set to the fill value."""
        shape = tuple(h - low for low, h in zip(lo, hi))
        inner = self.clip(lo, hi)
        if inner is not None and inner == (lo, hi):
            return Region(*self.read_inside(lo, shape))  # type: ignore[arg-type]
        out = np.full((self.channels, *shape), self.fill_value, dtype=self.dtype, order="F")
        if inner is None:
            return Region(out, [])
        ilo, ihi = inner
        data, sources = self.read_inside(ilo, tuple(h - low for low, h in zip(ilo, ihi)))  # type: ignore[arg-type]
        out[(slice(None), *(slice(a - o, b - o) for a, b, o in zip(ilo, ihi, lo)))] = data
        return Region(out, sources)

    def read_inside(self, offset: Vec3, shape: Vec3) -> tuple[np.ndarray, list[FileSource] | None]:
        """Voxels of a box that lies inside the bounding box, as ``[c, x, y, z]``."""
        raise NotImplementedError
