"""How faithful a segment's mesh is to the voxels it was made from (``scripts/bench-meshes --igneous``).

Positions are nanometres in Neuroglancer's convention: voxel ``v`` of a layer of ``resolution`` covers
``[v, v + 1) * resolution``, so a mesh that lines up with the voxels has its vertices on the faces between a
segment's voxels and the others. Three figures:

- the distance of each vertex to the nearest such face (exact: point to rectangle);
- the enclosed volume against the segment's voxels (the divergence theorem over the welded triangles);
- the open edges after welding (vertices at one position merged): edges of one triangle only, where a closed
  surface has none.
"""

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.spatial import cKDTree

Array = np.ndarray[Any, Any]
WELD_NM = 1e-3  # positions closer than this are one vertex (float32 nanometres of one face agree far closer)
NEAREST_FACES = 8  # candidate faces per vertex in the first pass; the exact bound settles the rest


@dataclass(frozen=True)
class Fidelity:
    vertices: int  # after welding
    triangles: int
    max_distance_nm: float
    mean_distance_nm: float
    volume_ratio: float  # the mesh's enclosed volume over the voxels'
    open_edges: int


def weld(vertices: Array, faces: Array, tolerance: float = WELD_NM) -> tuple[Array, Array]:
    """One vertex per position (rounded to ``tolerance``), triangles re-indexed, and those that collapse dropped."""
    keys = np.round(np.asarray(vertices, dtype=np.float64) / tolerance).astype(np.int64)
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    merged = np.asarray(inverse).reshape(-1)[np.asarray(faces, dtype=np.int64)]
    kept = (merged[:, 0] != merged[:, 1]) & (merged[:, 1] != merged[:, 2]) & (merged[:, 0] != merged[:, 2])
    return np.asarray(vertices, dtype=np.float64)[first], merged[kept]


def open_edges(faces: Array) -> int:
    """Edges that belong to exactly one triangle."""
    edges = np.concatenate([faces[:, [0, 1]], faces[:, [1, 2]], faces[:, [2, 0]]])
    _, counts = np.unique(np.sort(edges, axis=1), axis=0, return_counts=True)
    return int((counts == 1).sum())


def enclosed_volume(vertices: Array, faces: Array) -> float:
    """The volume a closed, consistently oriented surface encloses (its absolute value: either orientation)."""
    a, b, c = (vertices[faces[:, i]] for i in range(3))
    return float(abs(np.einsum("ij,ij->i", a, np.cross(b, c)).sum()) / 6.0)


def voxel_faces(mask: Array, resolution: Array, offset: Array) -> tuple[Array, Array]:
    """The faces between ``mask``'s voxels and the others (the volume's edge included), as the low and high
    corners of rectangles in nanometres; ``mask`` starts at voxel ``offset`` of the layer."""
    padded = np.pad(mask, 1)
    lows = []
    highs = []
    for axis in range(3):
        change = np.diff(padded.astype(np.int8), axis=axis)
        # change[i] compares padded[i] and padded[i + 1]: the face at padded index i + 1, voxel i of the mask
        inner = change[tuple(slice(None) if a == axis else slice(1, -1) for a in range(3))]
        corner = np.argwhere(inner != 0).astype(np.float64)
        high = corner.copy()
        for other in range(3):
            if other != axis:
                high[:, other] += 1
        lows.append(corner)
        highs.append(high)
    low, high = np.concatenate(lows), np.concatenate(highs)
    return (low + offset) * resolution, (high + offset) * resolution


def face_distances(vertices: Array, mask: Array, resolution: Array, offset: Array) -> Array:
    """Each vertex's exact distance to the nearest face of :func:`voxel_faces` in nanometres."""
    low, high = voxel_faces(mask, resolution, offset)
    centres = (low + high) / 2
    reach = float(np.max(np.linalg.norm(high - low, axis=1)) / 2)  # a face lies within this of its centre
    tree = cKDTree(centres)
    count = min(NEAREST_FACES, len(centres))
    centre_distance, nearest = tree.query(vertices, k=count)
    centre_distance = centre_distance.reshape(len(vertices), count)
    nearest = nearest.reshape(len(vertices), count)
    clamped = np.clip(vertices[:, None, :], low[nearest], high[nearest])
    best: Array = np.linalg.norm(vertices[:, None, :] - clamped, axis=2).min(axis=1)
    # a face not among the candidates is at least (its centre's distance - reach) away: look further only
    # where that could beat the best candidate
    for i in np.flatnonzero(centre_distance[:, -1] - reach < best):
        around = tree.query_ball_point(vertices[i], best[i] + reach)
        points = np.clip(vertices[i], low[around], high[around])
        best[i] = np.linalg.norm(points - vertices[i], axis=1).min()
    return best


def fidelity(vertices: Array, faces: Array, mask: Array, resolution: Array, offset: Array) -> Fidelity:
    """The figures of a segment's mesh (``vertices`` in nanometres) against ``mask``, its voxels from
    ``offset``; the voxels' volume is their count times a voxel's."""
    welded, triangles = weld(vertices, faces)
    distances = face_distances(welded, mask, resolution, offset)
    truth = float(mask.sum()) * float(np.prod(resolution))
    return Fidelity(
        vertices=len(welded),
        triangles=len(triangles),
        max_distance_nm=float(distances.max()),
        mean_distance_nm=float(distances.mean()),
        volume_ratio=enclosed_volume(welded, triangles) / truth,
        open_edges=open_edges(triangles),
    )
