"""A small synthetic webKnossos dataset to try the gateway on without downloading anything.

The picture imitates electron-microscopy tissue: a few dozen packed, irregular cells with dark
membranes, darker nuclei, mitochondria with cristae, clusters of vesicles, and a little extracellular
space. A ``segmentation`` layer labels the cells (``0`` is extracellular), so both a color and a
segmentation layer, each with three mags, can be served and compared against webknossos-libs.
Everything is computed with numpy from a fixed seed, so every run writes the same bytes.
"""

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gateway_storage.geometry import Box, Vec3, mag_name
from wkw_adapter import BlockType, WkwHeader, write_mag

from .extras import SAMPLE

ORGANIZATION = "sample_org"
DATASET = "sample_dataset"
VOXEL_SIZE_NM = (11.24, 11.24, 28.0)
TOP_LEFT = (16, 8, 4)
SIZE = (320, 288, 96)
MAGS: tuple[tuple[int, int, int], ...] = ((1, 1, 1), (2, 2, 1), (4, 4, 2))
RANDOM_SEED = 20240611
BLOCK_LEN = 32
FILE_LEN = 32

_SLAB_DEPTH = 16  # z planes generated at a time; bounds memory to a few slab-sized float arrays
_MEMBRANE_WIDTH_NM = 16.0  # 1/e half-width of a membrane's dark profile (~2.5 px across at 11 nm/px)
_INFLUENCE_NM = 320.0  # a seed further than radius + this from a voxel can't matter there (see _label_slab)
_WARP_NM = (150.0, 45.0)  # amplitudes of the coarse and fine coordinate warps that make cells irregular


def make_sample(root: Path, progress: bool = True) -> Path:
    """Write the sample dataset under ``root/sample_org/sample_dataset/`` and return that directory.

    Existing files of an earlier run are overwritten with identical content. Needs the ``sample`` extra.
    """
    SAMPLE.require("zarr-gateway make-sample")
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    dataset_dir = Path(root) / ORGANIZATION / DATASET
    dataset_dir.mkdir(parents=True, exist_ok=True)
    lo, hi = _aligned_region(TOP_LEFT, SIZE)
    with Progress(
        TextColumn("{task.description:<34}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        disable=not progress,
    ) as bar:
        depth = hi[2] - lo[2]
        task = bar.add_task("generating tissue", total=math.ceil(depth / _SLAB_DEPTH))
        color, labels = _render(lo, hi, advance=lambda: bar.advance(task))
        largest_segment_id = int(labels.max())
        task = bar.add_task("writing mags", total=2 * len(MAGS))
        for name, data, dtype, downsample in (
            ("color", color, np.dtype(np.uint8), _mean_downsample),
            ("segmentation", labels, np.dtype(np.uint32), _mode_downsample),
        ):
            header = WkwHeader.create(dtype, 1, BlockType.LZ4HC, block_len=BLOCK_LEN, file_len=FILE_LEN)
            for mag in MAGS:
                bar.update(task, description=f"writing {name}/{mag_name(mag)}")
                start, stop = _mag_extent(mag)
                scaled = downsample(data, mag)
                origin = [lo_i // m for lo_i, m in zip(lo, mag)]
                crop = tuple(slice(a - o, b - o) for a, b, o in zip(start, stop, origin))
                block = np.asarray(scaled[crop], dtype=dtype)
                write_mag(str(dataset_dir / name / mag_name(mag)), header, block[None], start)
                bar.advance(task)
    properties = _properties(largest_segment_id)
    (dataset_dir / "datasource-properties.json").write_text(json.dumps(properties, indent=4) + "\n")
    return dataset_dir


def _mag_extent(mag: Vec3) -> tuple[Vec3, Vec3]:
    """The mag-``mag`` voxels ``[start, stop)`` that cover the bounding box."""
    box = Box.sized(TOP_LEFT, SIZE).at_mag(mag)
    return box.lo, box.hi


def _aligned_region(top_left: Vec3, size: Vec3) -> tuple[Vec3, Vec3]:
    """The bounding box grown to whole voxels of the coarsest mag, so every mag downsamples exactly."""
    coarsest = [math.lcm(*(m[i] for m in MAGS)) for i in range(3)]
    lo = [t // c * c for t, c in zip(top_left, coarsest)]
    hi = [-(-(t + s) // c) * c for t, s, c in zip(top_left, size, coarsest)]
    return (lo[0], lo[1], lo[2]), (hi[0], hi[1], hi[2])


def _properties(largest_segment_id: int) -> dict[str, Any]:
    """``datasource-properties.json`` as webknossos-libs writes it for WKW layers."""
    box = {"topLeft": list(TOP_LEFT), "width": SIZE[0], "height": SIZE[1], "depth": SIZE[2]}

    def layer(name: str, category: str, element_class: str) -> dict[str, Any]:
        mags = [
            {
                "mag": list(mag),
                "path": f"./{name}/{mag_name(mag)}",
                "cubeLength": BLOCK_LEN * FILE_LEN,
                "axisOrder": {"c": 0, "x": 1, "y": 2, "z": 3},
            }
            for mag in MAGS
        ]
        return {"name": name, "category": category, "boundingBox": dict(box), "dataFormat": "wkw", "mags": mags}

    color = {**layer("color", "color", "uint8"), "numChannels": 1, "elementClass": "uint8"}
    segmentation = {
        **layer("segmentation", "segmentation", "uint32"),
        "largestSegmentId": largest_segment_id,
        "numChannels": 1,
        "elementClass": "uint32",
    }
    return {
        "id": {"name": DATASET, "team": ""},
        "scale": {"factor": list(VOXEL_SIZE_NM), "unit": "nanometer"},
        "dataLayers": [color, segmentation],
        "version": 1,
    }


# --- downsampling -------------------------------------------------------------------------------


def _windows(data: np.ndarray, factor: Vec3) -> np.ndarray:
    """``[x, y, z]`` data as ``[x', y', z', k]``: each mag-``factor`` voxel's ``k`` mag-1 voxels."""
    (fx, fy, fz), (nx, ny, nz) = factor, data.shape
    split = data.reshape(nx // fx, fx, ny // fy, fy, nz // fz, fz)
    return split.transpose(0, 2, 4, 1, 3, 5).reshape(nx // fx, ny // fy, nz // fz, fx * fy * fz)


def _mean_downsample(data: np.ndarray, factor: Vec3) -> np.ndarray:
    """Intensity at a coarser mag: the rounded mean of each window, as a microscope would bin."""
    k = factor[0] * factor[1] * factor[2]
    total = _windows(data, factor).sum(axis=-1, dtype=np.uint32)
    mean: np.ndarray = ((total + k // 2) // k).astype(data.dtype)
    return mean


def _mode_downsample(data: np.ndarray, factor: Vec3) -> np.ndarray:
    """Labels at a coarser mag: the most frequent label of each window (averaging labels is meaningless).

    Ties go to the label met first in the window (ordered by x, then y, then z).
    """
    windows = _windows(data, factor)
    k = windows.shape[-1]
    if k == 1:
        return windows[..., 0]
    counts = np.empty(windows.shape, dtype=np.int16)
    for j in range(k):
        counts[..., j] = (windows == windows[..., j : j + 1]).sum(axis=-1)
    best = counts.argmax(axis=-1)
    return np.take_along_axis(windows, best[..., None], axis=-1)[..., 0]


# --- the picture --------------------------------------------------------------------------------


def smooth_lattice_grid(lattice: np.ndarray, coords: list[np.ndarray]) -> np.ndarray:
    """A 3-D lattice of values sampled at a grid of fractional lattice coordinates (one array per axis).

    Smoothstep interpolation along each axis in turn: smooth, cheap noise for pictures and benchmarks.
    """
    out = lattice
    for axis, t in enumerate(coords):
        i0 = np.clip(np.floor(t).astype(np.intp), 0, out.shape[axis] - 2)
        w = np.clip(t - i0, 0.0, 1.0)
        w = (w * w * (3.0 - 2.0 * w)).astype(np.float32)
        shape = [1, 1, 1]
        shape[axis] = -1
        a0 = np.take(out, i0, axis=axis)
        a1 = np.take(out, i0 + 1, axis=axis)
        out = a0 + (a1 - a0) * w.reshape(shape)
    return out


class _ValueNoise:
    """Smooth random field: random values on a coarse lattice, smoothstep-interpolated.

    Evaluated on outer-product grids one axis at a time, so any sub-box costs about one pass over it.
    """

    def __init__(self, rng: np.random.Generator, lo_nm: np.ndarray, hi_nm: np.ndarray, spacing_nm: float):
        self.origin = lo_nm - spacing_nm
        self.spacing = spacing_nm
        shape = np.ceil((hi_nm - self.origin) / spacing_nm).astype(int) + 3
        self.values = rng.uniform(-1.0, 1.0, size=tuple(shape)).astype(np.float32)

    def grid(self, x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
        coords = [(np.asarray(c, dtype=np.float64) - o) / self.spacing for c, o in zip((x, y, z), self.origin)]
        return smooth_lattice_grid(self.values, coords)

    def at(self, points: np.ndarray) -> np.ndarray:
        """The field at scattered ``[n, 3]`` points (nm)."""
        t = (points - self.origin) / self.spacing
        i0 = np.clip(np.floor(t).astype(np.intp), 0, np.array(self.values.shape) - 2)
        w = np.clip(t - i0, 0.0, 1.0)
        w = w * w * (3.0 - 2.0 * w)
        total = np.zeros(len(points))
        for corner in np.ndindex(2, 2, 2):
            c = np.array(corner)
            weight = np.prod(np.where(c, w, 1.0 - w), axis=1)
            total += weight * self.values[tuple((i0 + c).T)]
        return total


@dataclass
class _Tissue:
    """Where every cell and organelle is, in nanometres of mag-1 space."""

    seeds: np.ndarray  # [n, 3] cell centres
    radii: np.ndarray  # [n] nominal radii; cells compete by distance minus radius
    shade: np.ndarray  # [n] per-cell cytoplasm brightness offset
    nuclei: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, float]]  # (cell, centre, semi-axes, nucleolus, radius)
    mitochondria: list[tuple[int, np.ndarray, np.ndarray, float, float]]  # (cell, centre, axis, half-length, radius)
    vesicles: list[tuple[int, np.ndarray, float]]  # (cell, centre, radius)
    warp: list[tuple[_ValueNoise, _ValueNoise, _ValueNoise, float]]
    light: _ValueNoise  # slow illumination change across the field
    grain: _ValueNoise  # fine cytoplasmic texture
    chromatin: _ValueNoise  # clumps inside nuclei


def _plan_tissue(rng: np.random.Generator, lo_nm: np.ndarray, hi_nm: np.ndarray) -> _Tissue:
    """Place cells (Poisson-disk seeds, some just outside the box so cells are cut) and their organelles."""
    margin = 500.0
    box_lo, box_hi = lo_nm - margin, hi_nm + margin
    spacing = 860.0
    centres = np.empty((0, 3))
    for _ in range(4000):  # dart throwing: keep candidates at least `spacing` from every earlier seed
        candidate = rng.uniform(box_lo, box_hi)
        if np.all(np.linalg.norm(centres - candidate, axis=1) >= spacing):
            centres = np.vstack([centres, candidate])
    n = len(centres)
    radii = rng.uniform(0.84, 0.98, size=n) * spacing
    shade = rng.normal(0.0, 9.0, size=n)

    neighbour = np.linalg.norm(centres[:, None] - centres[None], axis=-1)
    np.fill_diagonal(neighbour, np.inf)
    nearest = neighbour.min(axis=1)
    warp = []
    for spacing_nm, amplitude in zip((650.0, 230.0), _WARP_NM):
        fields = [_ValueNoise(rng, box_lo - radii.max(), box_hi + radii.max(), spacing_nm) for _ in range(3)]
        warp.append((fields[0], fields[1], fields[2], amplitude))
    tissue = _Tissue(
        seeds=centres,
        radii=radii,
        shade=shade,
        nuclei=[],
        mitochondria=[],
        vesicles=[],
        warp=warp,
        light=_ValueNoise(rng, lo_nm, hi_nm, 1400.0),
        grain=_ValueNoise(rng, lo_nm, hi_nm, 40.0),
        chromatin=_ValueNoise(rng, lo_nm, hi_nm, 70.0),
    )

    def owner(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The cell each point belongs to, and how far (nm) it lies inside that cell's boundaries."""
        warped = points.copy()
        for fx, fy, fz, amp in tissue.warp:
            warped += amp * np.stack([f.at(points) for f in (fx, fy, fz)], axis=-1)
        e = np.linalg.norm(warped[:, None] - centres[None], axis=-1) - radii
        order = np.sort(e, axis=1)
        return e.argmin(axis=1), np.minimum((order[:, 1] - order[:, 0]) / 2, -order[:, 0])

    def unit(v: np.ndarray) -> np.ndarray:
        unit_vectors: np.ndarray = v / np.linalg.norm(v, axis=-1, keepdims=True)
        return unit_vectors

    visible = np.all((centres + radii[:, None] > lo_nm) & (centres - radii[:, None] < hi_nm), axis=1)
    for cell in np.flatnonzero(visible):
        seed, radius = centres[cell], radii[cell]
        nucleus_centre, nucleus_axes = seed, np.zeros(3)
        # A nucleus near the centre, kept clear of the membrane (cells end up smaller than their radius).
        centre = seed + rng.normal(0.0, 0.06 * radius, size=3)
        room = float(owner(centre[None])[1][0]) - 60.0
        shape = min(0.36 * radius, 0.36 * nearest[cell], room / 1.15) * rng.uniform(0.85, 1.15, size=3)
        if rng.random() < 0.8 and shape.min() > 120.0:
            nucleus_axes, nucleus_centre = shape, centre
            nucleolus = nucleus_centre + unit(rng.normal(size=3)) * nucleus_axes.min() * rng.uniform(0.0, 0.4)
            nucleolus_radius = nucleus_axes.min() * rng.uniform(0.2, 0.3)
            tissue.nuclei.append((int(cell), nucleus_centre, nucleus_axes, nucleolus, nucleolus_radius))
        # Mitochondria lie in the cytoplasm around the nucleus, roughly tangential; try 24 at once, keep up to 3
        # whose spine stays clear of the membrane, the nucleus and each other.
        tries = 24
        radial = unit(rng.normal(size=(tries, 3)))
        middles = seed + radial * radius * rng.uniform(0.3, 0.6, size=(tries, 1))
        axis = unit(np.cross(radial, rng.normal(size=(tries, 3))))
        half, thick = rng.uniform(150.0, 320.0, size=tries), rng.uniform(70.0, 100.0, size=tries)
        steps = np.linspace(-1.0, 1.0, 5)[:, None, None]
        spine = middles + steps * axis * (half - thick)[:, None]  # [5, tries, 3]
        who, depth = owner(spine.reshape(-1, 3))
        clear = (who == cell).reshape(5, tries) & (depth.reshape(5, tries) > thick + 30.0)
        reach = nucleus_axes + (thick + 30.0)[:, None]
        clear &= np.linalg.norm((spine - nucleus_centre) / reach, axis=-1) > 1.0
        placed: list[int] = []
        wanted = int(rng.integers(1, 4))
        for i in np.flatnonzero(clear.all(axis=0)):
            if len(placed) == wanted:
                break
            if all(np.linalg.norm(middles[i] - middles[j]) > half[i] + half[j] for j in placed):
                placed.append(int(i))
                tissue.mitochondria.append((int(cell), middles[i], axis[i], float(half[i]), float(thick[i])))
        # Some cells get a cluster of vesicles (as in a synaptic bouton) near their surface.
        if rng.random() < 0.3:
            hubs = seed + unit(rng.normal(size=(tries, 3))) * radius * 0.7
            who, depth = owner(hubs)
            good = np.flatnonzero((who == cell) & (depth > 120.0))
            if good.size == 0:
                continue
            points = hubs[good[0]] + rng.normal(0.0, 70.0, size=(int(rng.integers(25, 45)), 3))
            who, depth = owner(points)
            for point in points[(who == cell) & (depth > 40.0)]:
                tissue.vesicles.append((int(cell), point, float(rng.uniform(17.0, 24.0))))
    return tissue


def _render(lo: Vec3, hi: Vec3, advance: Callable[[], None] = lambda: None) -> tuple[np.ndarray, np.ndarray]:
    """Color (uint8) and cell labels (uint32, 1..N, 0 outside cells) over mag-1 voxels ``[lo, hi)``."""
    rng = np.random.default_rng(RANDOM_SEED)
    scale = np.array(VOXEL_SIZE_NM)
    lo_nm, hi_nm = np.array(lo) * scale, np.array(hi) * scale
    tissue = _plan_tissue(rng, lo_nm, hi_nm)
    shape = tuple(h - low for low, h in zip(lo, hi))
    color = np.empty(shape, dtype=np.uint8)
    owner = np.empty(shape, dtype=np.int16)
    coords = [(np.arange(low, h) + 0.5) * s for low, h, s in zip(lo, hi, scale)]
    for z0 in range(0, shape[2], _SLAB_DEPTH):
        z1 = min(z0 + _SLAB_DEPTH, shape[2])
        slab = (coords[0], coords[1], coords[2][z0:z1])
        color[:, :, z0:z1], owner[:, :, z0:z1] = _render_slab(tissue, slab, rng)
        advance()
    # Number the cells that show up 1..N (in seed order); cells whose seeds lie outside may not.
    present = np.flatnonzero(np.bincount(owner.ravel() + 1, minlength=len(tissue.seeds) + 1)[1:])
    lut = np.zeros(len(tissue.seeds) + 1, dtype=np.uint32)
    lut[present + 1] = np.arange(1, present.size + 1, dtype=np.uint32)
    return color, lut[owner + 1]


def _render_slab(
    tissue: _Tissue, grid: tuple[np.ndarray, np.ndarray, np.ndarray], rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Color and owning cell (``-1`` for extracellular) of the voxels centred at ``grid`` (nm per axis)."""
    gx, gy, gz = grid
    shape = (gx.size, gy.size, gz.size)
    # Warped coordinates: moving every voxel by a smooth displacement bends the cell boundaries.
    warped = [np.broadcast_to(c.reshape([-1 if i == a else 1 for i in range(3)]), shape) for a, c in enumerate(grid)]
    warped = [w.astype(np.float32) for w in warped]
    for fx, fy, fz, amp in tissue.warp:
        for axis, field in enumerate((fx, fy, fz)):
            warped[axis] += amp * field.grid(gx, gy, gz)
    best1, best2, cell = _label_slab(tissue, grid, warped)
    inside = best1 < 0
    # Distance (nm) to the nearest membrane: inside a cell the boundary with a neighbour or the cell's
    # own surface, outside all cells the nearest cell surface.
    gap = np.where(inside, np.minimum((best2 - best1) * 0.5, -best1), best1)
    membrane = np.exp(-np.square(gap / _MEMBRANE_WIDTH_NM))
    owner = np.where(inside, cell, -1).astype(np.int16)

    grain = tissue.grain.grid(gx, gy, gz)
    value = np.where(inside, 176.0 + tissue.shade[np.maximum(cell, 0)], 222.0).astype(np.float32)
    value += 12.0 * grain
    _paint_organelles(tissue, grid, owner, value)
    value += 14.0 * tissue.light.grid(gx, gy, gz)
    value -= membrane * (value - 48.0)
    value += rng.normal(0.0, 7.0, size=shape).astype(np.float32)
    return np.clip(np.rint(value), 0, 255).astype(np.uint8), owner


def _label_slab(
    tissue: _Tissue, grid: tuple[np.ndarray, np.ndarray, np.ndarray], warped: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nearest and second-nearest ``distance - radius`` over the cells, and the nearest cell.

    A cell is only evaluated in the sub-box where its value can be below ``_INFLUENCE_NM``; elsewhere
    the value is too large to change a label, and a second-nearest that large only says "no membrane
    here". This keeps the cost near a few passes per cell over its own neighbourhood, not the slab.
    """
    shape = warped[0].shape
    best1 = np.full(shape, np.inf, dtype=np.float32)
    best2 = np.full(shape, np.inf, dtype=np.float32)
    cell = np.full(shape, -1, dtype=np.int32)
    slack = _INFLUENCE_NM + sum(_WARP_NM)
    for index, (seed, radius) in enumerate(zip(tissue.seeds, tissue.radii)):
        reach = radius + slack
        box = []
        for coords, s in zip(grid, seed):
            start, stop = np.searchsorted(coords, [s - reach, s + reach])
            box.append(slice(int(start), int(stop)))
        if any(b.start >= b.stop for b in box):
            continue
        sel = tuple(box)
        d2 = np.square(warped[0][sel] - np.float32(seed[0]))
        d2 += np.square(warped[1][sel] - np.float32(seed[1]))
        d2 += np.square(warped[2][sel] - np.float32(seed[2]))
        e = np.sqrt(d2, out=d2)
        e -= np.float32(radius)
        b1, b2, c = best1[sel], best2[sel], cell[sel]
        nearer = e < b1
        np.copyto(b2, np.where(nearer, b1, np.minimum(b2, e)))
        np.copyto(b1, e, where=nearer)
        c[nearer] = index
    return best1, best2, cell


def _fill_with_rim(
    target: np.ndarray, inner: np.ndarray, fill: np.ndarray, ring: np.ndarray, rim: np.ndarray, rim_value: float
) -> None:
    """Paint an organelle into ``target`` (a view): its interior, then a rim darkened towards ``rim_value``."""
    target[inner] = fill[inner]
    target[ring] -= (rim[ring] * (target[ring] - rim_value)).astype(np.float32)


def _paint_organelles(
    tissue: _Tissue, grid: tuple[np.ndarray, np.ndarray, np.ndarray], owner: np.ndarray, value: np.ndarray
) -> None:
    """Draw nuclei, mitochondria and vesicles into ``value``, each clipped to its own cell."""

    def sub_box(centre: np.ndarray, reach: float) -> tuple[slice, ...] | None:
        box = []
        for coords, c in zip(grid, centre):
            start, stop = np.searchsorted(coords, [c - reach, c + reach])
            if start >= stop:
                return None
            box.append(slice(int(start), int(stop)))
        return tuple(box)

    def offsets(sel: tuple[slice, ...], centre: np.ndarray) -> list[np.ndarray]:
        return [
            (coords[s] - c).reshape([-1 if i == a else 1 for i in range(3)])
            for a, (coords, s, c) in enumerate(zip(grid, sel, centre))
        ]

    for cell, centre, axes, nucleolus, nucleolus_radius in tissue.nuclei:
        sel = sub_box(centre, float(axes.max()) + 40.0)
        if sel is None:
            continue
        dx, dy, dz = offsets(sel, centre)
        q = np.sqrt(np.square(dx / axes[0]) + np.square(dy / axes[1]) + np.square(dz / axes[2]))
        depth = (1.0 - q) * axes.mean()  # ~nm inside the nuclear envelope
        mine = owner[sel] == cell
        # Nucleoplasm: darker than cytoplasm, with chromatin clumps and heterochromatin under the envelope.
        chrom = tissue.chromatin.grid(*(c[s] for c, s in zip(grid, sel)))
        clumps = np.clip((chrom - 0.15) * 2.5, 0.0, 1.0)
        nucleus = 150.0 + 8.0 * chrom - 38.0 * clumps - 34.0 * np.exp(-np.maximum(depth, 0.0) / 45.0)
        ox, oy, oz = offsets(sel, nucleolus)
        dense = np.sqrt(np.square(ox) + np.square(oy) + np.square(oz)) < nucleolus_radius
        nucleus = np.where(dense, 92.0 + 10.0 * chrom, nucleus)
        envelope = np.exp(-np.square(depth / 13.0))
        _fill_with_rim(value[sel], mine & (depth > 0), nucleus, mine & (envelope > 0.05), envelope, 70.0)

    for cell, centre, axis, half, thick in tissue.mitochondria:
        sel = sub_box(centre, half + thick + 40.0)
        if sel is None:
            continue
        dx, dy, dz = offsets(sel, centre)
        along = dx * axis[0] + dy * axis[1] + dz * axis[2]
        across = np.sqrt(np.maximum(np.square(dx) + np.square(dy) + np.square(dz) - np.square(along), 0.0))
        core = np.maximum(np.abs(along) - half + thick, 0.0)  # capsule: a cylinder with round ends
        depth = thick - np.sqrt(np.square(core) + np.square(across))
        mine = owner[sel] == cell
        cristae = 0.5 + 0.5 * np.cos(along * (2 * np.pi / 55.0))
        matrix = 96.0 + 34.0 * cristae
        rim = np.exp(-np.square(depth / 12.0))
        _fill_with_rim(value[sel], mine & (depth > 0), matrix, mine & (rim > 0.05), rim, 55.0)

    for cell, centre, radius in tissue.vesicles:
        sel = sub_box(centre, radius + 30.0)
        if sel is None:
            continue
        dx, dy, dz = offsets(sel, centre)
        depth = radius - np.sqrt(np.square(dx) + np.square(dy) + np.square(dz))
        shell = np.exp(-np.square(depth / 9.0)) * (owner[sel] == cell)
        target = value[sel]
        target -= (shell * (target - 70.0)).astype(np.float32)
