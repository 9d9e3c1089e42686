"""Chunk keys of a precomputed scale: ``{x0}-{x1}_{y0}-{y1}_{z0}-{z1}``, end exclusive, on the scale's grid
(from its voxel offset, clipped at the volume's edge)."""

import re

from gateway_storage.geometry import Vec3

from ..sources.mag import ChunkNotFound
from ..zarr.keys import MalformedKey

_KEY = re.compile(r"([0-9]{1,10})-([0-9]{1,10})_([0-9]{1,10})-([0-9]{1,10})_([0-9]{1,10})-([0-9]{1,10})")


class KeyOffGrid(MalformedKey):
    """A well-formed key whose box is not a chunk of the scale's grid (a 400 that says which chunk it cuts)."""


def chunk_box(key: str, offset: Vec3, end: Vec3, chunk: Vec3) -> tuple[Vec3, Vec3]:
    """The voxel box ``[lo, hi)`` that ``key`` names, checked against the grid of a scale.

    Malformed or off the grid: :class:`MalformedKey` (400); wholly outside the volume: :class:`ChunkNotFound`.
    """
    match = _KEY.fullmatch(key)
    if match is None:
        raise MalformedKey(f"chunk key {key!r} is not of the form x0-x1_y0-y1_z0-z1 (decimal voxel coordinates)")
    numbers = [int(n) for n in match.groups()]
    lo = (numbers[0], numbers[2], numbers[4])
    hi = (numbers[1], numbers[3], numbers[5])
    for axis in range(3):
        name, start, stop = "xyz"[axis], lo[axis], hi[axis]
        if start < offset[axis] or start >= end[axis]:
            raise ChunkNotFound(
                f"chunk {key!r} starts outside the volume along {name}: it spans [{offset[axis]}, {end[axis]})"
            )
        step = chunk[axis]
        if (start - offset[axis]) % step or stop != min(start + step, end[axis]):
            grid_start = offset[axis] + (start - offset[axis]) // step * step
            raise KeyOffGrid(
                f"chunk {key!r} is off the scale's grid along {name}: chunks there start at "
                f"{offset[axis]} + k*{step} and end {step} later or at the volume's end {end[axis]} "
                f"(the chunk holding {start} is {grid_start}-{min(grid_start + step, end[axis])})"
            )
    return lo, hi
