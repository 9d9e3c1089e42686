"""Neuroglancer's own client draws the gateway's meshes, in headless Chromium (as tests/test_viewers.py runs it).

The sample's segmentation is opened with its mesh source (the multi-resolution one, then the legacy one)
in a 3-D view with an orthographic projection down the z axis, against a gateway that requires a token:
the token travels only in the sources' query strings, so a mesh request that dropped it would fail. With
a segment selected the panel shows a surface whose silhouette is the segment's voxels projected along z;
with none selected it shows nothing; no mesh request fails; from afar only coarse levels of detail are
fetched, close up the finest too.
"""

import json
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pytest
import requests
from scipy import ndimage
from support import viewer
from support.browser import Browser
from support.sample import VOLUME_HI, VOLUME_LO, sample_labels
from support.servers import Server

from gateway.sample import DATASET, ORGANIZATION, VOXEL_SIZE_NM

pytestmark = pytest.mark.browser  # every test drives headless Chromium

TOKEN = "viewer-mesh-token"
CENTRE = [float(v) for v in (VOLUME_LO + VOLUME_HI) / 2]
PANEL_VOXELS = 400  # projectionScale: the 3-D panel's height in voxels (of x and y, which are the same size)


@pytest.fixture(scope="module")
def server(
    sample_root: Path, tmp_path_factory: pytest.TempPathFactory, server_factory: Callable[..., Server]
) -> Server:
    tokens = tmp_path_factory.mktemp("viewer-mesh-auth") / "tokens.json"
    tokens.write_text(json.dumps({"tokens": {TOKEN: [f"{ORGANIZATION}/*"]}}))
    return server_factory(sample_root, tokens_file=tokens)


@pytest.fixture(scope="module")
def labels(sample_root: Path) -> np.ndarray:
    return sample_labels(sample_root)


def largest_interior_segment(labels: np.ndarray) -> int:
    ids, voxels = np.unique(labels[labels > 0], return_counts=True)
    for segment in ids[np.argsort(-voxels)]:
        where = np.argwhere(labels == segment)
        if np.all(where.min(axis=0) > VOLUME_LO) and np.all(where.max(axis=0) + 1 < VOLUME_HI):
            return int(segment)
    raise AssertionError("no interior segment")


def state(server: Server, kind: str, segments: list[int]) -> dict[str, Any]:
    """A 3-D view of the segmentation's meshes alone, looking down z; the token only in the query string.

    (Neuroglancer 2.41's zarr source cannot carry a query string: ``zarr3://URL?token=T`` is refused as
    "query parameters not supported" and ``URL?token=T|zarr3:`` asks for ``...?token=Tzarr.json``; a volume
    source takes the token in its path, ``/t/T/data/...``, see test_viewers.py. The mesh source alone draws
    the 3-D view.)
    """
    meshes = f"{server.url}/data/meshes/{ORGANIZATION}/{DATASET}/segmentation/{kind}/?token={TOKEN}"
    return viewer.mesh_view(meshes + "|neuroglancer-precomputed:", VOXEL_SIZE_NM, CENTRE, PANEL_VOXELS, segments)


def open_mesh_view(
    chromium: Browser, client_url: str, server: Server, name: str, view: dict[str, Any], out: Path
) -> tuple[Any, np.ndarray, list[viewer.AccessLine], list[str]]:
    start = len(server.log())
    with chromium.page() as page:
        page.navigate(client_url + "#!" + quote(json.dumps(view), safe=""))
        page.wait_for("typeof window.viewer === 'object'", timeout=60)
        layers = viewer.wait_until_drawn(page)["layers"]
        time.sleep(2)  # meshes arrive after the manifests: give the last fragments a moment, then settle
        viewer.wait_until_drawn(page)
        shot = viewer.settled_screenshot(page, out / f"{name}.png")
        left, top, right, bottom = page.evaluate(viewer.PANEL_RECT_JS)
        console = list(page.console)
    time.sleep(0.5)
    panel = viewer.png_pixels(shot)[top:bottom, left:right]
    print(f"{name}: screenshot {shot}")
    return layers, panel, viewer.access_lines(server, start), console


def drawn_pixels(panel: np.ndarray) -> np.ndarray:
    """Pixels brighter than the black background (the white segment, and the panel's small axis labels)."""
    drawn: np.ndarray = panel.astype(int).sum(axis=-1) > 60
    return drawn


def silhouette(panel: np.ndarray) -> np.ndarray:
    """The largest connected drawn region: the segment's surface, without the labels in the panel's corner."""
    regions, count = ndimage.label(drawn_pixels(panel))
    if count == 0:
        return np.zeros(panel.shape[:2], dtype=bool)
    sizes = np.bincount(regions.ravel())[1:]
    largest: np.ndarray = regions == 1 + int(np.argmax(sizes))
    return largest


def normalized(mask: np.ndarray, size: int = 96) -> np.ndarray:
    """``mask`` cut to its bounding box and resampled to ``size`` x ``size`` (nearest), rows first."""
    rows, cols = np.nonzero(mask)
    cut = mask[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
    r = (np.arange(size) * cut.shape[0] / size).astype(int)
    c = (np.arange(size) * cut.shape[1] / size).astype(int)
    return cut[np.ix_(r, c)]


@pytest.mark.parametrize("kind", ["multires", "legacy"])
def test_neuroglancer_draws_the_segment_s_surface(
    browser: Browser,
    neuroglancer_url: str,
    server: Server,
    labels: np.ndarray,
    kind: str,
    tmp_path: Path,
) -> None:
    segment = largest_interior_segment(labels)
    layers, panel, access, _ = open_mesh_view(
        browser, neuroglancer_url, server, f"{kind}-selected", state(server, kind, [segment]), tmp_path
    )
    for layer in layers:
        for source in layer["sources"]:
            assert source["state"] == "loaded", f"{source['url']}: {source['error']}"
    mesh_lines = [line for line in access if "/data/meshes/" in line.path]
    assert mesh_lines, "Neuroglancer asked for no mesh"
    failed = [line for line in mesh_lines if line.status not in (200, 206, 304)]
    assert not failed, failed
    if kind == "multires":
        assert any(line.path.endswith(f"/{segment}.index") for line in mesh_lines)
        assert any(line.path.endswith(f"/{segment}") and line.status == 206 for line in mesh_lines)
    else:
        assert any(line.path.endswith(f"/{segment}:0") for line in mesh_lines)
        assert any(f"/{segment}:0:" in line.path for line in mesh_lines)

    drawn = silhouette(panel)
    assert drawn.mean() > 0.01, "no surface was drawn"
    # The screen's x is the volume's x, its rows the volume's y, at the voxel size's aspect ratio.
    projected = (labels == segment).any(axis=2).T  # rows y, columns x
    rows, cols = np.nonzero(drawn)
    ys, xs = np.nonzero(projected)
    screen_aspect = (rows.max() - rows.min() + 1) / (cols.max() - cols.min() + 1)
    voxel_aspect = (ys.max() - ys.min() + 1) * VOXEL_SIZE_NM[1] / ((xs.max() - xs.min() + 1) * VOXEL_SIZE_NM[0])
    assert abs(screen_aspect / voxel_aspect - 1) < 0.1, (screen_aspect, voxel_aspect)
    # And it lies where the voxels are: the panel's centre is the view's position, PANEL_VOXELS its height.
    height, width = drawn.shape
    pixels_per_voxel = height / PANEL_VOXELS
    expected = [
        height / 2 + (ys.min() - CENTRE[1]) * pixels_per_voxel,
        height / 2 + (ys.max() + 1 - CENTRE[1]) * pixels_per_voxel,
        width / 2 + (xs.min() - CENTRE[0]) * pixels_per_voxel,
        width / 2 + (xs.max() + 1 - CENTRE[0]) * pixels_per_voxel,
    ]
    seen = [rows.min(), rows.max() + 1, cols.min(), cols.max() + 1]
    print(f"{kind}: silhouette box {seen}, the voxels' box on screen {np.round(expected, 1).tolist()}")
    assert np.allclose(seen, expected, atol=2 * pixels_per_voxel), (seen, expected)
    a, b = normalized(drawn), normalized(projected)
    overlap = np.count_nonzero(a & b) / np.count_nonzero(a | b)
    print(f"{kind}: silhouette vs projected voxels IoU {overlap:.3f}")
    assert overlap > 0.85


def test_an_empty_selection_draws_nothing(
    browser: Browser,
    neuroglancer_url: str,
    server: Server,
    tmp_path: Path,
) -> None:
    layers, panel, access, console = open_mesh_view(
        browser, neuroglancer_url, server, "none-selected", state(server, "multires", []), tmp_path
    )
    assert all(s["state"] == "loaded" for layer in layers for s in layer["sources"]), console[-10:]
    assert drawn_pixels(panel).mean() < 0.001 and silhouette(panel).sum() < 200  # at most the axis labels
    assert not [line for line in access if line.status >= 400]


def fragment_sizes_by_level(server: Server, segment: int) -> dict[int, set[int]]:
    """The byte size of each fragment per level of detail, from the manifest (layout: meshes.md)."""
    url = f"{server.url}/data/meshes/{ORGANIZATION}/{DATASET}/segmentation/multires/{segment}.index"
    raw = requests.get(url, params={"token": TOKEN}, timeout=120).content
    (levels,) = struct.unpack_from("<I", raw, 24)
    counts = struct.unpack_from(f"<{levels}I", raw, 28 + 16 * levels)  # after scales (4 B) and offsets (12 B)
    offset = 28 + 20 * levels
    sizes = {}
    for level, count in enumerate(counts):
        offset += 12 * count  # the fragment positions
        sizes[level] = set(struct.unpack_from(f"<{count}I", raw, offset)) - {0}
        offset += 4 * count
    return sizes


def test_a_segment_draws_coarse_from_afar_and_fine_up_close(
    browser: Browser,
    neuroglancer_url: str,
    server: Server,
    labels: np.ndarray,
    tmp_path: Path,
) -> None:
    """Levels of detail come from the mags: from afar Neuroglancer fetches only coarse fragments, close up
    the finest ones too (fragments are told apart by their byte sizes, which the access log records)."""
    segment = largest_interior_segment(labels)
    sizes = fragment_sizes_by_level(server, segment)
    coarse = sizes[1] | sizes[2]
    finest_only = sizes[0] - coarse
    assert len(finest_only) >= len(sizes[0]) // 2
    fetched = {}
    for scale in (10 * PANEL_VOXELS, PANEL_VOXELS):
        view = {**state(server, "multires", [segment]), "projectionScale": scale}
        start = len(server.access_lines())
        open_mesh_view(browser, neuroglancer_url, server, f"lod-at-{scale}", view, tmp_path)
        fetched[scale] = {line["bytes"] for line in server.access_lines()[start:] if line["status"] == 206}
    afar, close = fetched[10 * PANEL_VOXELS], fetched[PANEL_VOXELS]
    assert afar and afar <= coarse, (afar, sizes)
    assert finest_only <= close, (close, sizes)
