"""The fixed grid meshes are cut on: cubes of the finest mag, doubled per level of detail.

Coordinates here are mag-1 voxel faces ("stored model" space of the multi-resolution format): voxel
``k`` of mag ``m`` covers ``[k * m, (k + 1) * m)``, so a surface between two voxels lies on their
common face and lines up with the voxels in every view.

A fragment at level of detail ``lod`` and grid position ``p`` is the mesh of a segment within the cube
``[p * size, (p + 1) * size)``, ``size = cube_edge * finest_mag * 2**lod``, made from the voxels of the
mag that level uses. Marching cubes runs on voxel centres, so a cube's mesh is made from the voxel
window ``[lo - 1, hi)`` of that mag: it owns the cells between those centres, the cells of
neighbouring cubes do not overlap it, and their surfaces meet on shared vertices. That window's
surfaces lie half a voxel below the cube, which the format's per-level ``vertex_offsets`` say.

A layer whose stored mags make fewer than ``MIN_LEVELS`` levels (one mag, or mags that stop early) gets more,
until one cube holds the whole layer: meshed from the coarsest stored mag's labels made coarser by mode when read
(:class:`~gateway.meshes.downsample.ModeDownsampled`), by the same factor on every axis. Each such level reads
as many stored voxels as the segment spans at that mag, so they are few: a large segment of such a layer then has
coarse levels that few fragments make.
"""

from dataclasses import dataclass
from functools import cached_property

from gateway_storage.geometry import Vec3, vec3

from ..sources.mag import MagSource
from .downsample import ModeDownsampled

CUBE_EDGE = 64  # voxels of the finest mag per edge of a level-0 cube
MAX_LOD = 10
MIN_LEVELS = 3  # levels of detail a layer larger than one cube has at least, coarser ones made by mode if need be


@dataclass(frozen=True, slots=True)
class Level:
    """One level of detail: the mag it is meshed from and the extent of its cubes."""

    lod: int
    source: MagSource
    cube_size: Vec3  # mag-1 voxels per cube edge
    stored_factor: Vec3 = (1, 1, 1)  # stored voxels per voxel of ``source`` (a mag made coarser when read)

    @property
    def mag(self) -> Vec3:
        return self.source.mag

    @property
    def cube_voxels(self) -> Vec3:
        """Voxels of this level's mag per cube edge."""
        return (
            self.cube_size[0] // self.mag[0],
            self.cube_size[1] // self.mag[1],
            self.cube_size[2] // self.mag[2],
        )

    @property
    def read_voxels(self) -> int:
        """Stored voxels one fragment's windows read: its cube and the margin below, ``stored_factor`` more each."""
        edge, factor = self.cube_voxels, self.stored_factor
        return (edge[0] + 1) * (edge[1] + 1) * (edge[2] + 1) * factor[0] * factor[1] * factor[2]

    @property
    def vertex_offset(self) -> tuple[float, float, float]:
        """Where the quantization box of a cube starts, relative to the cube: half a voxel below it."""
        return (-0.5 * self.mag[0], -0.5 * self.mag[1], -0.5 * self.mag[2])

    def box(self, position: Vec3) -> tuple[Vec3, Vec3]:
        """The cube at ``position`` in voxels of this level's mag."""
        edge = self.cube_voxels
        lo = (position[0] * edge[0], position[1] * edge[1], position[2] * edge[2])
        return lo, (lo[0] + edge[0], lo[1] + edge[1], lo[2] + edge[2])

    def parts(self, position: Vec3) -> list[tuple[Vec3, Vec3]]:
        """The boxes a fragment is meshed in: the cube itself at level 0, else its 2x2x2 octants (the format
        requires that no triangle of a coarser fragment cross the octant boundaries)."""
        lo, hi = self.box(position)
        if self.lod == 0:
            return [(lo, hi)]
        mid = vec3((a + b) // 2 for a, b in zip(lo, hi))
        boxes = []
        for z in range(2):
            for y in range(2):
                for x in range(2):
                    corner = (x, y, z)
                    part_lo = vec3(m if c else a for a, m, c in zip(lo, mid, corner))
                    part_hi = vec3(b if c else m for b, m, c in zip(hi, mid, corner))
                    boxes.append((part_lo, part_hi))
        return boxes


class MeshGrid:
    """The levels of detail of a segmentation layer, from its own mags (finest first)."""

    def __init__(self, mags: dict[Vec3, MagSource]) -> None:
        ordered = sorted(mags.values(), key=lambda s: (max(s.mag), s.mag))
        self.finest = ordered[0]
        base = tuple(CUBE_EDGE * m for m in self.finest.mag)
        levels: list[Level] = []
        lod = 0
        while True:
            factor = 1 << lod
            fits = [s for s in ordered if all(m <= f * factor for m, f in zip(s.mag, self.finest.mag))]
            source = max(fits, key=lambda s: (s.mag[0] * s.mag[1] * s.mag[2], s.mag))
            size = (base[0] * factor, base[1] * factor, base[2] * factor)
            if lod > 0 and any(s // m < 4 for s, m in zip(size, source.mag)):
                break  # octants of fewer than two voxels: no finer structure left to show
            levels.append(Level(lod, source, size))
            if source is ordered[-1] or lod >= MAX_LOD:
                break
            lod += 1
        self.levels = levels + self._coarser_than_stored(levels[-1], ordered[-1], MIN_LEVELS - len(levels))

    def _coarser_than_stored(self, last: Level, coarsest: MagSource, wanted: int) -> list[Level]:
        """Up to ``wanted`` levels past the coarsest stored mag, each from its labels made coarser by mode, while
        one cube does not hold the whole layer and the factor is the same on every axis."""
        top = self.finest.bbox.hi
        reach = (top[0] * self.finest.mag[0], top[1] * self.finest.mag[1], top[2] * self.finest.mag[2])
        levels: list[Level] = []
        while len(levels) < wanted and any(s < r for s, r in zip(last.cube_size, reach)) and last.lod < MAX_LOD:
            lod = last.lod + 1
            target = vec3(f << lod for f in self.finest.mag)
            factor = vec3(t // m for t, m in zip(target, coarsest.mag))
            if len(set(factor)) != 1 or any(t % m for t, m in zip(target, coarsest.mag)):
                break  # anisotropic mags: their coarser levels would need halvings of single axes
            last = Level(lod, ModeDownsampled(coarsest, factor), vec3(s * 2 for s in last.cube_size), factor)
            levels.append(last)
        return levels

    @property
    def chunk_shape(self) -> Vec3:
        return self.levels[0].cube_size

    @cached_property
    def voxels(self) -> int:
        """Voxels of the finest mag: what a scan without an index reads."""
        x, y, z = self.finest.bbox.size
        return x * y * z

    def cubes_of_finest(self) -> list[Vec3]:
        """Every level-0 cube that holds a voxel of the bounding box, or a voxel just below it: the upper
        neighbour of the last voxel owns the cells between it and the fill value outside."""
        ranges = self.cube_ranges(self.finest.bbox.lo, self.finest.bbox.hi)
        return [(x, y, z) for z in ranges[2] for y in ranges[1] for x in ranges[0]]

    def cube_ranges(self, lo: Vec3, hi: Vec3) -> tuple[range, range, range]:
        """The level-0 cubes, per axis, that a box ``[lo, hi)`` of the finest mag's bounding box owns: those
        holding its voxels, and past the bounding box's upper face the neighbour that owns the last cells."""
        top = self.finest.bbox.hi
        edge = self.levels[0].cube_voxels
        x, y, z = (range(a // e, (b - 1) // e + 1 + (b == t and b % e == 0)) for a, b, t, e in zip(lo, hi, top, edge))
        return x, y, z


def morton_key(position: Vec3) -> int:
    """The x, y, z Z-curve index of a grid position (x in the lowest bit), the order fragments are listed in."""
    key = 0
    for bit in range(21):
        for axis in range(3):
            key |= ((position[axis] >> bit) & 1) << (3 * bit + axis)
    return key
