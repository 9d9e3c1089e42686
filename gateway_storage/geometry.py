"""Voxel geometry shared by every layer: 3-vectors, half-open boxes, and mags with their names.

It sits in the kernel because the WKW format, the sources and the Zarr layer all need it and the format may
import nothing but the kernel. Boxes are half-open, ``[lo, hi)``, in the voxels of one mag.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

Vec3 = tuple[int, int, int]


def vec3(values: Iterable[int]) -> Vec3:
    """Three integers as a :data:`Vec3`; anything else is a ``ValueError``."""
    x, y, z = values
    return (x, y, z)


@dataclass(frozen=True, slots=True)
class Box:
    """The voxels ``[lo, hi)`` along x, y and z.

    The arithmetic is written out per axis: boxes are made for every block a read touches.
    """

    lo: Vec3
    hi: Vec3

    @classmethod
    def sized(cls, top_left: Vec3, size: Vec3) -> "Box":
        """The box of ``size`` voxels from ``top_left`` (a webKnossos bounding box's terms)."""
        return cls(top_left, (top_left[0] + size[0], top_left[1] + size[1], top_left[2] + size[2]))

    @property
    def size(self) -> Vec3:
        lo, hi = self.lo, self.hi
        return (hi[0] - lo[0], hi[1] - lo[1], hi[2] - lo[2])

    @property
    def is_empty(self) -> bool:
        lo, hi = self.lo, self.hi
        return hi[0] <= lo[0] or hi[1] <= lo[1] or hi[2] <= lo[2]

    def clip(self, other: "Box") -> "Box | None":
        """The part of ``other`` inside this box, or None if they do not overlap."""
        a, b, c, d = self.lo, other.lo, self.hi, other.hi
        lo = (max(a[0], b[0]), max(a[1], b[1]), max(a[2], b[2]))
        hi = (min(c[0], d[0]), min(c[1], d[1]), min(c[2], d[2]))
        if hi[0] <= lo[0] or hi[1] <= lo[1] or hi[2] <= lo[2]:
            return None
        return Box(lo, hi)

    def contains(self, other: "Box") -> bool:
        """Whether every voxel of ``other`` lies in this box."""
        return all(a >= b for a, b in zip(other.lo, self.lo)) and all(a <= b for a, b in zip(other.hi, self.hi))

    def at_mag(self, mag: Vec3) -> "Box":
        """The mag-``mag`` voxels this mag-1 box touches: ``[floor(lo / mag), ceil(hi / mag))``."""
        return Box(vec3(low // m for low, m in zip(self.lo, mag)), vec3(-(-h // m) for h, m in zip(self.hi, mag)))

    def shifted(self, offset: Vec3) -> "Box":
        """The same box in coordinates whose origin is ``offset``."""
        lo, hi, o = self.lo, self.hi, offset
        return Box((lo[0] - o[0], lo[1] - o[1], lo[2] - o[2]), (hi[0] - o[0], hi[1] - o[1], hi[2] - o[2]))

    def slices(self) -> tuple[slice, slice, slice]:
        """The box as slices of an ``(x, y, z)`` array whose origin is ``(0, 0, 0)``."""
        lo, hi = self.lo, self.hi
        return (slice(lo[0], hi[0]), slice(lo[1], hi[1]), slice(lo[2], hi[2]))


# --- mags: a power-of-two downsampling factor per axis ---------------------------------------------


def parse_mag(value: Any) -> Vec3:
    """A mag from ``2``, ``"2"``, ``"2-2-1"``, ``[2, 2, 1]``; every factor a positive power of two.

    ``value`` is anything a properties file holds, so anything else is a ``ValueError`` that says why.
    """
    if isinstance(value, str):
        parts = value.split("-")
        if len(parts) not in (1, 3) or not all(p.isdigit() for p in parts):
            raise ValueError(f"mag {value!r} is neither 'N' nor 'X-Y-Z'")
        value = [int(p) for p in parts * (3 // len(parts))]
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value] * 3
    if not isinstance(value, list | tuple) or len(value) != 3 or not all(_is_int(v) for v in value):
        raise ValueError(f"mag {value!r} must be an integer or three integers")
    if any(v < 1 or v & (v - 1) for v in value):
        raise ValueError(f"mag {value!r} must be positive powers of two")
    return (value[0], value[1], value[2])


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def mag_name(mag: Vec3) -> str:
    """A mag's name: ``"2"`` for an isotropic mag, ``"2-2-1"`` otherwise (webKnossos' own literals)."""
    return str(mag[0]) if mag[0] == mag[1] == mag[2] else long_mag_name(mag)


def long_mag_name(mag: Vec3) -> str:
    """The ``"X-Y-Z"`` form of a mag's name, which names an isotropic mag too (``"2-2-2"``)."""
    return "-".join(map(str, mag))


def mag_names(mag: Vec3) -> tuple[str, ...]:
    """Every name a mag answers to, its own first: ``("2", "2-2-2")``, or just ``("2-2-1",)``."""
    return tuple(dict.fromkeys((mag_name(mag), long_mag_name(mag))))


def canonical_mag_name(name: str) -> str:
    """The name of the mag ``name`` names (``"2-2-2"`` is ``"2"``); a name of no mag comes back unchanged."""
    try:
        mag = parse_mag(name)
    except ValueError:
        return name
    return mag_name(mag) if name in mag_names(mag) else name
