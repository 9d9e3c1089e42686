"""The benchmark's mesh fidelity figures (``scripts/benchmark/mesh_fidelity.py``) on meshes whose answers are
known: a box of voxels meshed exactly, then moved, opened, split into fragments and shrunk."""

from typing import Any

import numpy as np
import pytest
from benchmark.mesh_fidelity import enclosed_volume, face_distances, fidelity, open_edges, weld

Array = np.ndarray[Any, Any]
RESOLUTION = np.array([8.0, 8.0, 40.0])
OFFSET = np.array([10.0, 20.0, 3.0])  # the mask's first voxel in the layer
BOX = (3, 4, 2)  # voxels of the segment, from (1, 1, 1) of the mask


def box_mesh(low: Array, high: Array) -> tuple[Array, Array]:
    """The 12 outward triangles of an axis-aligned box (corners in nanometres), 8 shared vertices."""
    corners = np.array([[(high if (i >> a) & 1 else low)[a] for a in range(3)] for i in range(8)], dtype=np.float64)
    quads = [(0, 2, 3, 1), (4, 5, 7, 6), (0, 1, 5, 4), (2, 6, 7, 3), (0, 4, 6, 2), (1, 3, 7, 5)]
    faces = [t for a, b, c, d in quads for t in ((a, b, c), (a, c, d))]
    return corners, np.array(faces, dtype=np.int64)


@pytest.fixture(scope="module")
def truth() -> tuple[Array, Array, Array]:
    """The mask (the box with a voxel's margin) and the box's exact corners in nanometres."""
    mask = np.zeros(tuple(n + 2 for n in BOX), dtype=bool)
    mask[1:-1, 1:-1, 1:-1] = True
    low = (OFFSET + 1) * RESOLUTION
    high = (OFFSET + 1 + np.array(BOX)) * RESOLUTION
    return mask, low, high


def test_an_exact_mesh_is_on_the_faces_closed_and_of_the_voxels_volume(truth: tuple[Array, Array, Array]) -> None:
    mask, low, high = truth
    vertices, faces = box_mesh(low, high)
    found = fidelity(vertices, faces, mask, RESOLUTION, OFFSET)
    assert (found.vertices, found.triangles, found.open_edges) == (8, 12, 0)
    assert found.max_distance_nm == pytest.approx(0, abs=1e-9)
    assert found.volume_ratio == pytest.approx(1.0)


def test_a_mesh_half_a_voxel_off_is_that_far_from_the_faces(truth: tuple[Array, Array, Array]) -> None:
    mask, low, high = truth
    vertices, faces = box_mesh(low, high)
    shifted = vertices + np.array([0.0, 0.0, RESOLUTION[2] / 2])  # voxel centres taken for corners, along z
    found = fidelity(shifted, faces, mask, RESOLUTION, OFFSET)
    # the corners moved 20 nm along z: off the top and bottom faces, and past the side faces' ends
    assert found.max_distance_nm == pytest.approx(20.0)
    assert found.volume_ratio == pytest.approx(1.0)  # moved, not resized
    inside = np.array([(low + high) / 2])  # the centre: 12 nm from the nearest faces (x: 3 voxels of 8 nm, halved)
    assert face_distances(inside, mask, RESOLUTION, OFFSET)[0] == pytest.approx(12.0)


def test_a_missing_triangle_leaves_three_open_edges_and_fragments_weld_shut(
    truth: tuple[Array, Array, Array],
) -> None:
    _, low, high = truth
    vertices, faces = box_mesh(low, high)
    assert open_edges(faces[1:]) == 3
    # each triangle a fragment of its own, vertices repeated (as chunked meshes are before welding)
    loose = vertices[faces.reshape(-1)] + np.float64(1e-5)
    separate = np.arange(len(loose)).reshape(-1, 3)
    assert open_edges(separate) == 36
    welded, rejoined = weld(loose, separate)
    assert len(welded) == 8 and open_edges(rejoined) == 0
    assert enclosed_volume(welded, rejoined) == pytest.approx(float(np.prod(high - low)))


def test_a_shrunk_mesh_has_less_volume_and_distance_to_spare(truth: tuple[Array, Array, Array]) -> None:
    mask, low, high = truth
    centre = (low + high) / 2
    vertices, faces = box_mesh(centre + (low - centre) * 0.5, centre + (high - centre) * 0.5)
    found = fidelity(vertices, faces, mask, RESOLUTION, OFFSET)
    assert found.volume_ratio == pytest.approx(0.125)
    # a corner moved half way to the centre: (6, 8, 20) nm inside along x, y, z; its nearest face is x's
    assert found.max_distance_nm == pytest.approx(6.0)
