"""Neuroglancer, in headless Chromium, draws a segment too large for on-demand meshing from the layer's stored mesh
set (as tests/test_mesh_viewer.py draws the sample's meshes made on demand).

The gateway is told to mesh every level on demand only of the smallest segment; the tube of
tests/support/mesh_sets.py gets its coarse levels at once (a manifest that starts at a coarse level), which
Neuroglancer draws, and every level once the set is written: Neuroglancer reads its manifest and fragments
(ranges) and draws a surface whose silhouette, looking down z, is the tube's voxels projected along z.
"""

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest
import requests
from scipy import ndimage
from support import mesh_sets, viewer
from support.browser import Browser
from support.mesh_sets import SMALL_VOXELS, TUBE, VOXEL_NM, make_mesh_set, write_cells
from support.servers import Server

pytestmark = pytest.mark.browser

BASE = f"/data/meshes/{mesh_sets.ORGANIZATION}/{mesh_sets.DATASET}/{mesh_sets.LAYER}/multires/"
PANEL_VOXELS = 260  # the 3-D panel's height in voxels: the whole volume (192 voxels) with a margin
CENTRE = [s / 2 for s in mesh_sets.SHAPE]


@dataclass
class Drawn:
    seen: list[int]  # the silhouette's box on screen: top, bottom, left, right
    expected: list[float]  # the tube's voxels' box on screen
    per_voxel: float
    overlap: float  # of the silhouette and the tube's projected voxels


def draw_the_tube(
    server: Server, browser: Browser, neuroglancer_url: str, shot_path: Path, labels: np.ndarray
) -> Drawn:
    """Neuroglancer draws the tube looking down z; every mesh request answered 200 or 206."""
    state = viewer.mesh_view(f"{server.url}{BASE}|neuroglancer-precomputed:", VOXEL_NM, CENTRE, PANEL_VOXELS, [TUBE])
    start = len(server.log())
    with browser.page() as page:
        page.navigate(neuroglancer_url + "#!" + quote(json.dumps(state), safe=""))
        page.wait_for("typeof window.viewer === 'object'", timeout=60)
        layers = viewer.wait_until_drawn(page)["layers"]
        time.sleep(2)  # the fragments arrive after the manifest: give the last a moment, then settle
        viewer.wait_until_drawn(page)
        shot = viewer.settled_screenshot(page, shot_path)
        left, top, right, bottom = page.evaluate(viewer.PANEL_RECT_JS)
    print(f"screenshot {shot}")
    assert all(source["state"] == "loaded" for layer in layers for source in layer["sources"]), layers
    access = [line for line in viewer.access_lines(server, start) if "/data/meshes/" in line.path]
    assert any(line.path.endswith(f"/{TUBE}.index") and line.status == 200 for line in access), access
    assert any(line.path.endswith(f"/{TUBE}") and line.status == 206 for line in access), access
    assert not [line for line in access if line.status not in (200, 206, 304)], access

    panel = viewer.png_pixels(shot)[top:bottom, left:right]
    regions, count = ndimage.label(panel.astype(int).sum(axis=-1) > 60)
    assert count > 0, "nothing was drawn"
    drawn = regions == 1 + int(np.argmax(np.bincount(regions.ravel())[1:]))
    height, width = drawn.shape
    per_voxel = height / PANEL_VOXELS
    ys, xs = np.nonzero((labels == TUBE).any(axis=2).T)  # rows y, columns x, as the screen shows them
    rows, cols = np.nonzero(drawn)
    expected = [
        height / 2 + (ys.min() - CENTRE[1]) * per_voxel,
        height / 2 + (ys.max() + 1 - CENTRE[1]) * per_voxel,
        width / 2 + (xs.min() - CENTRE[0]) * per_voxel,
        width / 2 + (xs.max() + 1 - CENTRE[0]) * per_voxel,
    ]
    seen = [int(rows.min()), int(rows.max()) + 1, int(cols.min()), int(cols.max()) + 1]
    print(f"silhouette box {seen}, the voxels' box on screen {np.round(expected, 1).tolist()}")
    # The silhouette is the tube's projection: compare on the screen's grid of voxels.
    projected = np.zeros_like(drawn)
    screen_y = ((np.arange(height) - height / 2) / per_voxel + CENTRE[1]).astype(int)
    screen_x = ((np.arange(width) - width / 2) / per_voxel + CENTRE[0]).astype(int)
    inside_y = (screen_y >= 0) & (screen_y < mesh_sets.SHAPE[1])
    inside_x = (screen_x >= 0) & (screen_x < mesh_sets.SHAPE[0])
    footprint = (labels == TUBE).any(axis=2).T
    projected[np.ix_(inside_y, inside_x)] = footprint[np.ix_(screen_y[inside_y], screen_x[inside_x])]
    overlap = np.count_nonzero(drawn & projected) / np.count_nonzero(drawn | projected)
    print(f"silhouette vs projected voxels IoU {overlap:.3f}")
    return Drawn(seen, expected, per_voxel, overlap)


def test_neuroglancer_draws_a_segment_too_large_for_on_demand_meshing(
    browser: Browser, neuroglancer_url: str, tmp_path: Path, server_factory: Callable[..., Server]
) -> None:
    """At once its coarse levels made on demand (a manifest that starts at a coarse level), then every level
    from the stored set."""
    root = tmp_path / "root"
    labels = write_cells(root)
    server = server_factory(root, multires_voxels=SMALL_VOXELS)
    coarse_manifest = requests.get(f"{server.url}{BASE}{TUBE}.index", timeout=120)
    assert coarse_manifest.status_code == 200, coarse_manifest.text
    coarse_lods = int.from_bytes(coarse_manifest.content[24:28], "little")
    first_scale = np.frombuffer(coarse_manifest.content, "<f4", 1, 28)[0]
    assert coarse_lods < 3 and first_scale > 1, (coarse_lods, first_scale)
    coarse = draw_the_tube(server, browser, neuroglancer_url, tmp_path / "coarse-tube.png", labels)
    # meshed from mag first_scale: within a few of its voxels of the tube's box
    assert np.allclose(coarse.seen, coarse.expected, atol=3 * first_scale * coarse.per_voxel), coarse
    assert coarse.overlap > 0.6
    make_mesh_set(root)
    whole = draw_the_tube(server, browser, neuroglancer_url, tmp_path / "stored-tube.png", labels)
    assert np.allclose(whole.seen, whole.expected, atol=3 * whole.per_voxel), whole
    assert whole.overlap > 0.8
