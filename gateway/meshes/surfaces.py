"""The surface of one segment within one box of one mag: marching cubes, then simplification (zmesh).

The same voxels the Zarr trees serve (``MagSource.read_box``) go in; a storage fault while reading
them propagates (a 5xx), so a fault is never answered as an empty mesh. A box whose surface is past what one
box may cost (:data:`~gateway.meshes.budget.MAX_BOX_SURFACE`: glia, ragged automated segmentations) is meshed
from its labels two times coarser by mode (:func:`coarser_surface`), so the answer is a coarser mesh, not none.
"""

from dataclasses import dataclass

import numpy as np

from gateway_storage.geometry import Vec3, vec3

from ..extras import MESHES
from ..sources.mag import MagSource
from .budget import MAX_BOX_SURFACE, MAX_TRIANGLES, MAX_VERTICES, MeshBudget, surface_faces
from .downsample import mode_downsample
from .errors import MeshTooLarge
from .geometry import Level

# Simplification: at most this far from the marching-cubes surface, in voxels of the mag meshed.
MAX_ERROR_VOXELS = 0.5
REDUCTION_FACTOR = 8  # aim at 1/8 of the triangles where the error bound allows
COARSER = 2  # a box past the surface bound is meshed from its labels this many times coarser per axis
# The most one read of a box may decode (``MagSource.decoded_bytes``: every stored chunk it touches, whole).
# Mesh work runs in a thread outside the chunks' memory budget, so each read is bounded here: a layer whose
# chunks are so large that one mesh box decodes more is refused (413) with the reason. Boxes are the level-0
# windows (65 voxels per edge) and the octants of coarser levels (33 voxels where the layer has every mag in
# between), so real layers decode a few MiB per read (Neuroglancer's 128^3 uint64 chunks: at most 432 MiB,
# counted as 3 chunks per edge); the voxels a request reads in all are bounded by ``MULTIRES_VOXELS``.
MAX_READ_DECODED_BYTES = 512 << 20


@dataclass(frozen=True, slots=True)
class Surface:
    """Triangles in face coordinates of the mag meshed: ``vertices`` (n, 3) float64, ``faces`` (m, 3) uint32."""

    vertices: np.ndarray
    faces: np.ndarray

    @property
    def empty(self) -> bool:
        return len(self.faces) == 0

    @staticmethod
    def concatenate(parts: list["Surface"]) -> "Surface":
        kept = [p for p in parts if not p.empty]
        if not kept:
            return EMPTY
        offsets = np.cumsum([0] + [len(p.vertices) for p in kept[:-1]])
        vertices = np.concatenate([p.vertices for p in kept])
        faces = np.concatenate([p.faces + np.uint32(o) for p, o in zip(kept, offsets)])
        return Surface(vertices, faces)


EMPTY = Surface(np.zeros((0, 3)), np.zeros((0, 3), dtype=np.uint32))


def _mesher() -> type:
    MESHES.require("meshes")
    import zmesh

    mesher: type = zmesh.Mesher
    return mesher


def window_of(lo: Vec3, hi: Vec3) -> tuple[Vec3, Vec3]:
    """The voxels a box's mesh is made from: one more below, so the box owns the cells up to its lower face."""
    return (lo[0] - 1, lo[1] - 1, lo[2] - 1), hi


# The most surface one request may make, as the marching cubes and the simplification hold it: vertices of
# three float64 and faces of three uint32, each kept twice (made, then simplified or merged).
SURFACE_BYTES = 2 * (MAX_VERTICES * 3 * 8 + MAX_TRIANGLES * 3 * 4)
# The most surface one box makes: at most MAX_BOX_SURFACE voxel faces (at its mag, or its labels coarser), each
# at most four triangles and four vertices of the marching cubes, kept twice as above (9 MiB).
BOX_SURFACE_BYTES = 2 * 4 * MAX_BOX_SURFACE * (3 * 8 + 3 * 4)


def request_bytes(levels: list[Level], boxes: int | None = None) -> int:
    """The most memory one mesh request that meshes ``levels`` of a layer holds at once (what it counts against
    the worker's memory budget): the largest window a level reads (every stored chunk it touches, whole,
    decoded; never past :data:`MAX_READ_DECODED_BYTES`, where the read is refused), its labels and a mask of
    them, and the surface of the ``boxes`` it meshes that hold data (:data:`BOX_SURFACE_BYTES` each), never more
    than the most a request may make (:data:`SURFACE_BYTES`, all of it where they are not known)."""
    most = 0
    for level in levels:
        edge = level.cube_voxels
        shape = (edge[0] + 1, edge[1] + 1, edge[2] + 1)
        decoded = min(level.source.decoded_bytes(shape), MAX_READ_DECODED_BYTES)
        most = max(most, decoded + 2 * level.read_voxels * level.source.dtype.itemsize)
    return most + (SURFACE_BYTES if boxes is None else min(SURFACE_BYTES, boxes * BOX_SURFACE_BYTES))


def holds_surface(source: MagSource, lo: Vec3, hi: Vec3) -> bool:
    """Whether box ``[lo, hi)`` may hold a segment's surface: False only where the source knows nothing is
    stored in its window and the fill value is no segment (a stat, or the shard index: no voxel is read)."""
    window_lo, window_hi = window_of(lo, hi)
    return source.fill_value != 0 or source.holds_data(vec3(max(0, v) for v in window_lo), window_hi)


def read_window(source: MagSource, lo: Vec3, hi: Vec3) -> np.ndarray:
    """The ``(x, y, z)`` voxels of box ``[lo, hi)`` of the first channel, once the read is known to decode at most
    ``MAX_READ_DECODED_BYTES``: every read of voxels for meshes and segment indexes goes through here."""
    shape = (hi[0] - lo[0], hi[1] - lo[1], hi[2] - lo[2])
    decoded = source.decoded_bytes(shape)
    if decoded > MAX_READ_DECODED_BYTES:
        raise MeshTooLarge(
            f"a box of {shape} voxels of mag {'-'.join(map(str, source.mag))} decodes {decoded} bytes of stored "
            f"chunks, more than the {MAX_READ_DECODED_BYTES} a mesh read may: the layer's chunks are too large to mesh"
        )
    window: np.ndarray = source.read_box(lo, hi).data[0]
    return window


def segment_surface(source: MagSource, segment: int, lo: Vec3, hi: Vec3, budget: MeshBudget) -> Surface:
    """The surface of ``segment`` in box ``[lo, hi)`` of ``source`` (voxels of its mag), in face coordinates,
    made within ``budget`` (checked before the read, before the marching cubes and after it).

    Vertex ``v`` of the marching cubes over the window ``[lo - 1, hi)`` lies at window index ``v`` with
    voxel centres on integers, so its face coordinate is ``lo - 0.5 + v``.
    """
    budget.check_time()
    voxels = read_window(source, *window_of(lo, hi))  # read first: a storage fault is never "no mesh"
    return window_surface(voxels, segment, lo, f"the box {lo}..{hi} of mag {'-'.join(map(str, source.mag))}", budget)


def window_surface(voxels: np.ndarray, segment: int, lo: Vec3, where: str, budget: MeshBudget) -> Surface:
    """The surface of ``segment`` in the window ``voxels`` read for the box from ``lo`` (:func:`window_of`): what
    a request meshes from its own read, and a mesh set's block from one read for all its segments."""
    if segment > np.iinfo(voxels.dtype).max:
        return EMPTY  # an id the layer's type cannot hold (say 300 in a uint8 layer)
    mask = voxels == voxels.dtype.type(segment)
    if not mask.any():
        return EMPTY
    faces = surface_faces(mask)
    if faces <= MAX_BOX_SURFACE:
        surface = mask_surface(mask, (lo[0] - 0.5, lo[1] - 0.5, lo[2] - 0.5))
    else:
        surface = coarser_surface(voxels, segment, lo, where, faces, budget)
    budget.count(len(surface.faces), len(surface.vertices))
    return surface


def coarser_surface(voxels: np.ndarray, segment: int, lo: Vec3, where: str, faces: int, budget: MeshBudget) -> Surface:
    """The surface of a box too costly at its mag, from its labels :data:`COARSER` times coarser by mode (on the
    grid of that factor from the origin, so that every box of a level is made coarser alike), scaled back to the
    box's voxels and kept within its cells. Past the bound even there, the work stops with the reason.

    The window ``[lo - 1, hi)`` is widened to whole coarse voxels by repeating its faces: the coarse window is
    ``[lo // 2 - 1, ceil(hi / 2))``, whose surfaces lie on coarse voxel faces, that is on faces of the box's mag.
    """
    hi = (lo[0] + voxels.shape[0] - 1, lo[1] + voxels.shape[1] - 1, lo[2] + voxels.shape[2] - 1)
    coarse_lo = tuple(a // COARSER for a in lo)
    coarse_hi = tuple(-(-b // COARSER) for b in hi)
    widths = [(a - 1 - COARSER * (c - 1), COARSER * d - b) for a, b, c, d in zip(lo, hi, coarse_lo, coarse_hi)]
    labels = mode_downsample(np.pad(voxels, widths, mode="edge"), (COARSER, COARSER, COARSER))
    mask = labels == labels.dtype.type(segment)
    if not mask.any():
        return EMPTY  # out-voted everywhere by other labels: nothing of it is left at this coarseness
    coarse_faces = surface_faces(mask)
    if coarse_faces > MAX_BOX_SURFACE:
        raise budget.refuse_surface(where, faces, coarse_faces)
    surface = mask_surface(mask, (coarse_lo[0] - 0.5, coarse_lo[1] - 0.5, coarse_lo[2] - 0.5))
    if surface.empty:
        return EMPTY
    cells_lo = np.asarray(lo, dtype=np.float64) - 0.5
    cells_hi = np.asarray(hi, dtype=np.float64) - 0.5
    return Surface(np.clip(surface.vertices * COARSER, cells_lo, cells_hi), surface.faces)


def mask_surface(mask: np.ndarray, origin: tuple[float, float, float]) -> Surface:
    """The simplified surface of a boolean ``(x, y, z)`` mask whose voxel ``(0, 0, 0)`` is centred at ``origin``."""
    mesher = _mesher()((1, 1, 1))
    mesher.mesh(np.asfortranarray(mask.astype(np.uint8)))
    mesh = mesher.get(1, normals=False, reduction_factor=REDUCTION_FACTOR, max_error=MAX_ERROR_VOXELS)
    mesher.clear()
    faces = np.asarray(mesh.faces, dtype=np.uint32).reshape(-1, 3)
    if len(faces) == 0:
        return EMPTY
    vertices = np.asarray(mesh.vertices, dtype=np.float64).reshape(-1, 3) + np.asarray(origin)
    return Surface(vertices, faces)
