"""``zarr-gateway index-segments``, the meshes' side: a layer's finest mag cut into boxes of whole level-0 cubes,
each box indexed on its own (anywhere, in any order), and the parts assembled into the layer's index.

The one-process build (:func:`gateway.meshes.index.build_index`) and the block task of ``gateway/batch``
run the same :func:`~gateway.meshes.index.index_cubes` and :func:`~gateway.meshes.index.assemble_index`, so
both give the same bytes.
"""

from collections.abc import Iterator

from gateway_storage.faults import Unavailable
from gateway_storage.geometry import Vec3

from .errors import MeshTooLarge
from .geometry import MeshGrid
from .index import IndexPart, SegmentIndex, assemble_index, data_stamp, index_meta, index_part_bytes
from .layers import LayerMeshes
from .surfaces import read_window, window_of

BLOCK_CUBES = 2  # level-0 cubes per edge of a box (128^3 voxels): see box_memory_bytes for what one holds


class DataChangedWhileIndexing(Unavailable, RuntimeError):
    """The layer's files changed during the build: the index would describe no version of the data."""


def index_boxes(grid: MeshGrid, block_cubes: int = BLOCK_CUBES) -> Iterator[tuple[Vec3, Vec3, Vec3]]:
    """``(position, lo, hi)`` of each box of the finest mag's bounding box: ``block_cubes`` level-0 cubes per
    edge on the cube grid (fewer at the bounding box's faces), ``position`` the box's place in that grid."""
    xs, ys, zs = (list(_axis_boxes(grid, axis, block_cubes)) for axis in range(3))
    for z, (z_lo, z_hi) in zs:
        for y, (y_lo, y_hi) in ys:
            for x, (x_lo, x_hi) in xs:
                yield (x, y, z), (x_lo, y_lo, z_lo), (x_hi, y_hi, z_hi)


def _axis_boxes(grid: MeshGrid, axis: int, block_cubes: int) -> Iterator[tuple[int, tuple[int, int]]]:
    """The boxes' positions and ``[lo, hi)`` along one axis."""
    lo, hi = grid.finest.bbox.lo[axis], grid.finest.bbox.hi[axis]
    size = block_cubes * grid.levels[0].cube_voxels[axis]
    for position in range(lo // size, (hi - 1) // size + 1):
        yield position, (max(position * size, lo), min((position + 1) * size, hi))


def box_cubes(grid: MeshGrid, lo: Vec3, hi: Vec3) -> list[Vec3]:
    """The level-0 cubes box ``[lo, hi)`` owns (see ``MeshGrid.cube_ranges``)."""
    xs, ys, zs = grid.cube_ranges(lo, hi)
    return [(x, y, z) for z in zs for y in ys for x in xs]


def box_memory_bytes(grid: MeshGrid, block_cubes: int = BLOCK_CUBES) -> int:
    """The most memory indexing one box of :func:`index_boxes` holds: per axis the most cubes, voxels, and
    voxels with the cubes' one-voxel margins any box has (the first, an inner and the last are all kinds)."""
    cubes = inner = window = 1
    for axis in range(3):
        boxes = list(_axis_boxes(grid, axis, block_cubes))
        spans = [span for _, span in (boxes[0], boxes[-1], *boxes[1:2])]
        counts = [len(grid.cube_ranges(*_on_axis(grid, axis, span))[axis]) for span in spans]
        cubes *= max(counts)
        inner *= max(hi - lo for lo, hi in spans)
        window *= max(hi - lo + count for (lo, hi), count in zip(spans, counts))
    return index_part_bytes(grid, cubes, window, inner)


def _on_axis(grid: MeshGrid, axis: int, span: tuple[int, int]) -> tuple[Vec3, Vec3]:
    """The finest mag's bounding box, narrowed to ``span`` on ``axis``."""
    lo, hi = list(grid.finest.bbox.lo), list(grid.finest.bbox.hi)
    lo[axis], hi[axis] = span
    return (lo[0], lo[1], lo[2]), (hi[0], hi[1], hi[2])


def assemble_parts(meshes: LayerMeshes, stamp: str | None, parts: list[IndexPart]) -> SegmentIndex:
    """The layer's index from the parts of all its boxes, once its files are known to be still those of ``stamp``."""
    index = assemble_index(index_meta(meshes.grid, meshes.name, stamp), parts)
    if data_stamp(meshes.layer.mags) != stamp:
        raise DataChangedWhileIndexing(f"the files of layer {meshes.name!r} changed while it was indexed: run it again")
    return index


def check_indexable(grid: MeshGrid) -> None:
    """Raise :class:`MeshTooLarge` before any block runs when no cube of the layer can be read for meshes (its
    chunks decode too much): every block would fail alike. Found by reading the first cube's window, the one
    way any cube is read."""
    xs, ys, zs = grid.cube_ranges(grid.finest.bbox.lo, grid.finest.bbox.hi)
    try:
        read_window(grid.finest, *window_of(*grid.levels[0].box((xs[0], ys[0], zs[0]))))
    except MeshTooLarge:
        raise
    except Exception:  # a fault of the data there: the block that holds it fails, naming it and the reason
        return
