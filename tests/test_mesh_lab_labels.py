"""A mesh for every segment a lab has: a glial sheet and a ragged automated segmentation
(scripts/benchmark/lab_labels.py, written by webknossos-libs), read through a real gateway with CloudVolume and
as Neuroglancer reads the formats.

Their boxes hold more voxel faces than one box may cost at its mag: each such box is meshed from its labels two
times coarser, so every segment gets a mesh (once refused with a 413), closed where the segment is within a box,
and within a coarser voxel of the truth. A segment past ``multires_voxels`` gets its coarse levels at once, a layer
with one mag gets levels of detail, and ``mesh-segments`` meshes the sheet to the end.
"""

import os
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import requests
from benchmark.lab_labels import (
    BALL_CENTRE,
    BALL_RADIUS,
    DATASET,
    NOISY_BALL,
    ORGANIZATION,
    RAGGED_LAYER,
    SHEET,
    SHEET_LAYER,
    SINGLE_LAYER,
    SINGLE_OFFSET,
    VOXEL_NM,
    LabLabels,
    write_lab_labels,
)
from support.cloudvolume_reads import open_volume
from support.mesh_sets import read_served
from support.servers import Server, assert_no_unexpected_errors

from gateway.meshes.budget import MAX_BOX_SURFACE, surface_faces

pytestmark = pytest.mark.slow  # a million-voxel sheet and twelve ragged cells meshed whole

REPO = Path(__file__).resolve().parent.parent
RESOLUTION = np.asarray(VOXEL_NM)
COARSER = 2  # a box past the bound is meshed from labels this many times coarser
LARGE = 4  # the largest ragged cell: 1.2 M voxels over 18 level-0 cubes
# multires_voxels of the small gateway: more than the noisy ball reads for all its levels (one fragment each, 2.8 M
# voxels, the coarsest level's reads two times finer), less than LARGE's levels (18 level-0 cubes) read
SMALL_VOXELS = 3_000_000


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> LabLabels:
    return write_lab_labels(tmp_path_factory.mktemp("lab"))


@pytest.fixture(scope="module")
def server(lab: LabLabels, server_factory: Callable[..., Server]) -> Server:
    return server_factory(lab.root)


def tree(server: Server, layer: str) -> str:
    return f"{server.url}/data/precomputed/{ORGANIZATION}/{DATASET}/{layer}"


def meshes_base(server: Server, layer: str, kind: str) -> str:
    return f"{server.url}/data/meshes/{ORGANIZATION}/{DATASET}/{layer}/{kind}/"


def truth_faces(labels: np.ndarray, segment: int) -> tuple[np.ndarray, np.ndarray]:
    """The segment's bounding box in nanometres, on the faces of its voxels."""
    where = np.argwhere(labels == segment)
    return where.min(axis=0) * RESOLUTION, (where.max(axis=0) + 1) * RESOLUTION


STRAYS = 4  # ragged cells have stray voxels a few voxels out, which labels made coarser by mode lose


def assert_within(
    vertices: np.ndarray, lo: np.ndarray, hi: np.ndarray, margin: np.ndarray, what: str, reach: float = 1.0
) -> None:
    """The mesh lies within the truth's box widened by ``margin``, and reaches each face of it within ``margin``
    (``reach`` times it, for labels with stray voxels)."""
    assert len(vertices) > 0, what
    low, high = vertices.min(axis=0), vertices.max(axis=0)
    assert np.all(low >= lo - margin - 1e-3) and np.all(high <= hi + margin + 1e-3), (what, low, high, lo, hi)
    short = reach * margin + 1e-3
    assert np.all(low <= lo + short) and np.all(high >= hi - short), (what, low, high, lo, hi)


def test_the_labels_are_past_the_bound_that_once_refused_them(lab: LabLabels) -> None:
    """The premise: the sheet and most ragged cells have boxes whose surface is past what one box may cost."""
    assert 800_000 < int((lab.sheet == SHEET).sum()) < 1_200_000
    past = []
    for labels, segment in [(lab.sheet, SHEET), *((lab.ragged, int(s)) for s in np.unique(lab.ragged))]:
        window = labels[63:128, 63:128, 0:64] if segment != SHEET else labels[63:128, 63:128, 63:128]
        past.append(surface_faces(window == segment) > MAX_BOX_SURFACE)
    assert past[0] and past[-1], "the sheet and the noisy ball are past the bound in their boxes"
    assert sum(past) >= 4, past


@pytest.mark.parametrize("layer", [SHEET_LAYER, RAGGED_LAYER])
def test_every_segment_gets_a_multiresolution_mesh_cloudvolume_reads(
    lab: LabLabels, server: Server, layer: str
) -> None:
    """CloudVolume reads each segment's finest level: within a voxel of two times coarser labels of the truth."""
    labels = lab.sheet if layer == SHEET_LAYER else lab.ragged
    segments = [int(s) for s in np.unique(labels) if s != 0]
    meshes = open_volume(tree(server, layer)).mesh.get(segments)
    for segment in segments:
        mesh = meshes[segment]
        assert len(mesh.faces) > 100, (layer, segment)
        lo, hi = truth_faces(labels, segment)
        reach = 1.0 if layer == SHEET_LAYER else STRAYS
        assert_within(np.asarray(mesh.vertices), lo, hi, COARSER * RESOLUTION, f"{layer} {segment}", reach)
    assert_no_unexpected_errors(server)


def test_every_legacy_fragment_of_the_sheet_is_made(lab: LabLabels, server: Server) -> None:
    base = meshes_base(server, SHEET_LAYER, "legacy")
    fragments = requests.get(f"{base}{SHEET}:0", timeout=60).json()["fragments"]
    assert len(fragments) >= 32, fragments
    vertices = []
    for name in fragments:
        answer = requests.get(base + name, timeout=120)
        assert answer.status_code == 200, (name, answer.text[:300])
        count = int.from_bytes(answer.content[:4], "little")
        vertices.append(np.frombuffer(answer.content, "<f4", 3 * count, 4).reshape(-1, 3))
    lo, hi = truth_faces(lab.sheet, SHEET)
    assert_within(np.concatenate(vertices), lo, hi, COARSER * RESOLUTION, "the sheet's legacy fragments")


def welded_edges(vertices: np.ndarray, faces: np.ndarray) -> dict[tuple[int, int], int]:
    """How many triangles share each edge once coincident vertices are one (degenerate triangles left out)."""
    _, ids = np.unique(np.round(vertices, 3), axis=0, return_inverse=True)
    triangles = ids.reshape(-1)[faces]
    kept = triangles[
        (triangles[:, 0] != triangles[:, 1])
        & (triangles[:, 1] != triangles[:, 2])
        & (triangles[:, 0] != triangles[:, 2])
    ]
    counts: dict[tuple[int, int], int] = {}
    for a, b, c in kept.tolist():
        for edge in ((a, b), (b, c), (c, a)):
            key = (min(edge), max(edge))
            counts[key] = counts.get(key, 0) + 1
    return counts


def test_a_box_meshed_coarser_is_closed_and_within_a_coarser_voxel(lab: LabLabels, server: Server) -> None:
    """The noisy ball lies in one cube whose surface is past the bound: its fragment, made from labels two times
    coarser, is closed after welding, and its bounds are those of the ball within one coarser voxel."""
    window = lab.ragged[63:128, 63:128, 0:64] == NOISY_BALL
    assert surface_faces(window) > MAX_BOX_SURFACE, "the ball's box is meshed at its mag"
    base = meshes_base(server, RAGGED_LAYER, "legacy")
    fragments = requests.get(f"{base}{NOISY_BALL}:0", timeout=60).json()["fragments"]
    assert fragments == [f"{NOISY_BALL}:0:1_1_0"], fragments
    body = requests.get(base + fragments[0], timeout=60).content
    count = int.from_bytes(body[:4], "little")
    vertices = np.frombuffer(body, "<f4", 3 * count, 4).reshape(-1, 3).astype(np.float64)
    faces = np.frombuffer(body, "<u4", offset=4 + 12 * count).reshape(-1, 3)
    edges = welded_edges(vertices, faces)
    open_edges = [edge for edge, shared in edges.items() if shared != 2]
    assert edges and not open_edges, f"{len(open_edges)} of {len(edges)} edges are not shared by two triangles"
    lo, hi = truth_faces(lab.ragged, NOISY_BALL)
    assert_within(vertices, lo, hi, COARSER * RESOLUTION, "the noisy ball")
    centre = (np.asarray(BALL_CENTRE) + 0.5) * RESOLUTION
    assert np.all(np.abs((lo + hi) / 2 - centre) <= BALL_RADIUS * RESOLUTION), "the truth is the ball"


def manifest_levels(manifest: bytes) -> tuple[np.ndarray, np.ndarray]:
    """A manifest's chunk shape and its levels' scales."""
    (lods,) = struct.unpack_from("<I", manifest, 24)
    return np.asarray(struct.unpack_from("<3f", manifest, 0)), np.frombuffer(manifest, "<f4", lods, 28)


def test_a_layer_with_one_mag_has_levels_of_detail(lab: LabLabels, server: Server) -> None:
    """The unaligned single-mag layer: its levels past mag 1 are meshed from labels made coarser by mode, each
    within its own voxels of the truth, and CloudVolume reads its finest level."""
    base = meshes_base(server, SINGLE_LAYER, "multires")
    served = read_served(lambda url, **headers: requests.get(url, headers=headers, timeout=120), base, LARGE)
    _, scales = manifest_levels(served.manifest)
    assert scales.tolist() == [1.0, 2.0, 4.0], scales
    labels = np.zeros_like(lab.ragged)
    top = SINGLE_OFFSET
    labels[top[0] :, top[1] :, top[2] :] = lab.ragged[top[0] :, top[1] :, top[2] :]
    lo, hi = truth_faces(labels, LARGE)
    for lod in range(3):
        vertices = np.concatenate([f.vertices for f in served.fragments if f.lod == lod])
        # level lod is meshed from mag 2**lod, and a box of it past the bound two times coarser
        assert_within(vertices, lo, hi, COARSER * 2**lod * RESOLUTION, f"level {lod}", STRAYS)
    mesh = open_volume(tree(server, SINGLE_LAYER)).mesh.get([LARGE])[LARGE]
    assert_within(np.asarray(mesh.vertices), lo, hi, COARSER * RESOLUTION, "CloudVolume's read", STRAYS)
    assert_no_unexpected_errors(server)


def test_a_segment_past_multires_voxels_gets_its_coarse_levels_at_once(
    lab: LabLabels, server: Server, server_factory: Callable[..., Server]
) -> None:
    """With ``multires_voxels`` small, the largest cell is answered at once with the coarse levels whose reads fit
    (once a 413 naming mesh-segments): a valid manifest whose chunk shape is its first level's cube, read by
    CloudVolume; a small segment still gets every level."""
    small = server_factory(lab.root, multires_voxels=SMALL_VOXELS)
    get = lambda url, **headers: requests.get(url, headers=headers, timeout=120)  # noqa: E731
    full = read_served(get, meshes_base(server, RAGGED_LAYER, "multires"), LARGE)
    coarse = read_served(get, meshes_base(small, RAGGED_LAYER, "multires"), LARGE)
    full_shape, full_scales = manifest_levels(full.manifest)
    coarse_shape, coarse_scales = manifest_levels(coarse.manifest)
    assert 0 < len(coarse_scales) < len(full_scales) and coarse_scales[0] > 1, (coarse_scales, full_scales)
    first = int(np.log2(coarse_scales[0]))
    made = range(first, first + len(coarse_scales))
    assert coarse_scales.tolist() == full_scales[made.start : made.stop].tolist(), "a run of the levels, finest out"
    assert coarse_shape.tolist() == (full_shape * coarse_scales[0]).tolist()
    same = [(f.lod - first, f.position, f.data) for f in full.fragments if f.lod in made]
    assert [(f.lod, f.position, f.data) for f in coarse.fragments] == same, "the levels are those of the whole mesh"
    lo, hi = truth_faces(lab.ragged, LARGE)
    mesh = open_volume(tree(small, RAGGED_LAYER)).mesh.get([LARGE])[LARGE]
    assert_within(np.asarray(mesh.vertices), lo, hi, COARSER * 2**first * RESOLUTION, "the coarse levels", STRAYS)
    _, ball_scales = manifest_levels(
        read_served(get, meshes_base(small, RAGGED_LAYER, "multires"), NOISY_BALL).manifest
    )
    assert ball_scales.tolist() == full_scales.tolist()
    assert_no_unexpected_errors(small)


def test_mesh_segments_meshes_the_sheet_to_the_end(lab: LabLabels, server: Server) -> None:
    """The run that once ended "1 of 22 blocks failed, nothing was finished": every block made, nothing left out,
    and the gateway serves the stored set (byte for byte the fragments it makes on demand)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ZARR_GATEWAY_")}
    arguments = [sys.executable, "-m", "gateway", "mesh-segments", str(lab.root), f"{ORGANIZATION}/{DATASET}"]
    run = subprocess.run(
        [*arguments, SHEET_LAYER, "--strict"], cwd=REPO, env=environment, capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr and "left out" not in run.stdout, run.stdout
    assert (lab.root / ORGANIZATION / DATASET / f"{SHEET_LAYER}.meshes" / "stamp.json").is_file()
    get = lambda url, **headers: requests.get(url, headers=headers, timeout=120)  # noqa: E731
    stored = read_served(get, meshes_base(server, SHEET_LAYER, "multires"), SHEET)
    assert stored.fragments
    lo, hi = truth_faces(lab.sheet, SHEET)
    vertices = np.concatenate([f.vertices for f in stored.fragments if f.lod == 0])
    assert_within(vertices, lo, hi, COARSER * RESOLUTION, "the stored sheet")
    assert_no_unexpected_errors(server)
