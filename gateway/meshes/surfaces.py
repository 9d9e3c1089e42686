"""The surface of one segment within one box of one mag: marching cubes, then simplification (zmesh).

The same voxels the Zarr trees serve (``MagSource.read_box``) go in; a storage fault while reading
them propagates (a 5xx), so a fault is never answered as an empty mesh.
"""

from dataclasses import dataclass

import numpy as np

from gateway_storage.geometry import Vec3

from ..extras import MESHES
from ..sources.mag import MagSource
from .budget import MeshBudget
from .errors import MeshTooLarge

# Simplification: at most this far from the marching-cubes surface, in voxels of the mag meshed.
MAX_ERROR_VOXELS = 0.5
REDUCTION_FACTOR = 8  # aim at 1/8 of the triangles where the error bound allows
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
    budget.check_surface(mask, where)
    surface = mask_surface(mask, (lo[0] - 0.5, lo[1] - 0.5, lo[2] - 0.5))
    budget.count(len(surface.faces), len(surface.vertices))
    return surface


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
