"""Neuroglancer draws a mapped layer (issue 43) from the dataset page's link, in headless Chromium.

The sample's segmentation gets an agglomerate file that joins its cells into two agglomerates (odd ids and even
ids). The page's link for the mapped layer loads every source (the image, the labels, the agglomerates and their
meshes); then the same state, with only the raw labels and then only the agglomerates shown in one cross-section,
is drawn twice, and the pixels compare: the labels show many segment colours, the agglomerates two (and the
black of id 0), and every cell of the labels is drawn in one agglomerate colour, the two colours tiling it as
odd and even cells do. So the agglomerates are the labels' cells joined, as Neuroglancer draws them.
"""

import json
import re
import time
from collections.abc import Callable
from html import unescape
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import h5py
import numpy as np
import pytest
import requests
from support.browser import Browser
from support.servers import Server
from support.viewer import (
    PANEL_RECT_JS,
    access_lines,
    assert_chunks_answered,
    png_pixels,
    settled_screenshot,
    wait_until_drawn,
)

from gateway.sample import DATASET, ORGANIZATION

pytestmark = pytest.mark.browser  # drives headless Chromium

MAPPING = "cells_by_parity"
MAPPED = f"segmentation__{MAPPING}"
ODD, EVEN = 1001, 1002  # the two agglomerates
COMMON = 0.004  # a colour covering less of the panel than this is an edge's blend, not a segment's colour


@pytest.fixture(scope="module")
def mapped_root(sample_root: Path) -> Path:
    layer = sample_root / ORGANIZATION / DATASET / "segmentation"
    properties = json.loads((sample_root / ORGANIZATION / DATASET / "datasource-properties.json").read_text())
    largest = next(lay for lay in properties["dataLayers"] if lay["name"] == "segmentation")["largestSegmentId"]
    table = np.where(np.arange(largest + 1) % 2 == 1, ODD, EVEN).astype(np.uint64)
    table[0] = 0
    (layer / "agglomerates").mkdir(exist_ok=True)
    with h5py.File(layer / "agglomerates" / f"{MAPPING}.hdf5", "w") as f:
        f.create_dataset("segment_to_agglomerate", data=table)
    time.sleep(1.2)  # past the settle time of the file just written
    return sample_root


@pytest.fixture(scope="module")
def gateway(
    mapped_root: Path,
    server_factory: Callable[..., Server],
    neuroglancer_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Server:
    """An open gateway whose pages link to the local Neuroglancer."""
    settings = tmp_path_factory.mktemp("mapped-viewer") / "settings.json"
    settings.write_text(json.dumps({"neuroglancer_url": neuroglancer_url}))
    return server_factory(mapped_root, settings_file=settings)


def page_link(gateway: Server, layer: str) -> tuple[str, dict[str, Any]]:
    """The dataset page's Neuroglancer link that selects ``layer``, and its state."""
    html = requests.get(f"{gateway.url}/data/zarr3/{ORGANIZATION}/{DATASET}/", timeout=60).text
    for href in re.findall(r'class="open-neuroglancer" href\s*=\s*"([^"]*)"', html):
        link = unescape(href)
        state: dict[str, Any] = json.loads(unquote(link.partition("#!")[2]))
        if state["selectedLayer"]["layer"] == layer:
            return link, state
    raise AssertionError(f"the page has no Neuroglancer link for {layer}")


def cross_section(state: dict[str, Any], shown: str) -> dict[str, Any]:
    """The link's state drawn as one xy cross-section of the whole volume, only layer ``shown`` visible, every
    segment in its colour (none selected, opaque)."""
    layers = []
    for layer in state["layers"]:
        if layer["name"] == shown:
            layers.append({**{k: v for k, v in layer.items() if k != "segments"}, "selectedAlpha": 1})
        else:
            layers.append({**layer, "visible": False})
    return {
        **state,
        "layers": layers,
        "layout": "xy",
        "crossSectionScale": 0.45,
        "showAxisLines": False,
        "showScaleBar": False,
        "showDefaultAnnotations": False,
    }


def draw(browser: Browser, neuroglancer_url: str, state: dict[str, Any], screenshot: Path) -> np.ndarray[Any, Any]:
    """The panel's pixels once every source has loaded and every chunk is drawn."""
    with browser.page() as page:
        page.navigate(neuroglancer_url + "#!" + quote(json.dumps(state), safe=""))
        page.wait_for("typeof window.viewer === 'object'", timeout=60)
        final = wait_until_drawn(page)
        sources = [s for layer in final["layers"] for s in layer["sources"]]
        assert sources and all(s["state"] == "loaded" for s in sources), final
        settled_screenshot(page, screenshot)
        left, top, right, bottom = page.evaluate(PANEL_RECT_JS)
    return png_pixels(screenshot)[top:bottom, left:right]


def colours(panel: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], dict[int, float]]:
    """Each pixel's colour as one integer, and the share of the panel of each colour."""
    packed = (panel[..., 0].astype(np.int64) << 16) | (panel[..., 1].astype(np.int64) << 8) | panel[..., 2]
    values, counts = np.unique(packed, return_counts=True)
    return packed, {int(v): c / packed.size for v, c in zip(values, counts, strict=True)}


def test_neuroglancer_draws_the_mapped_layer_from_the_page_link(
    browser: Browser, gateway: Server, neuroglancer_url: str, tmp_path: Path
) -> None:
    link, state = page_link(gateway, MAPPED)
    assert link.startswith(neuroglancer_url), link
    names = [layer["name"] for layer in state["layers"]]
    assert MAPPED in names and "segmentation" in names, names
    start = len(gateway.log())
    with browser.page() as page:  # the link as the page gives it: every source loads
        page.navigate(link)
        page.wait_for("typeof window.viewer === 'object'", timeout=60)
        final = wait_until_drawn(page)
        settled_screenshot(page, tmp_path / "page-link.png")
    mapped_sources = next(layer for layer in final["layers"] if layer["name"] == MAPPED)["sources"]
    assert len(mapped_sources) == 2 and all(s["state"] == "loaded" for s in mapped_sources), final  # voxels, meshes
    time.sleep(0.5)  # access lines are written once per event-loop turn
    access = access_lines(gateway, start)
    assert_chunks_answered([line for line in access if f"/{MAPPED}/" in line.path])

    raw = draw(browser, neuroglancer_url, cross_section(state, "segmentation"), tmp_path / "raw.png")
    mapped = draw(browser, neuroglancer_url, cross_section(state, MAPPED), tmp_path / "mapped.png")
    assert raw.shape == mapped.shape
    raw_colour, raw_shares = colours(raw)
    mapped_colour, mapped_shares = colours(mapped)
    raw_common = {c for c, share in raw_shares.items() if share >= COMMON}
    mapped_common = {c for c, share in mapped_shares.items() if share >= COMMON}
    print(f"raw: {len(raw_common)} common colours, mapped: {len(mapped_common)}")
    assert len(raw_common) > 10, f"the labels show {len(raw_common)} segment colours"
    # Outside the volume and where id 0 is, both show the panel's own colour; no segment colour is in both
    # (black: the viewer's own bars, not a segment's).
    shared = (raw_common & mapped_common) - {0}
    assert len(shared) == 1, f"colours common in both views: {sorted(shared)}"
    agglomerate_colours = mapped_common - shared - {0}
    assert len(agglomerate_colours) == 2, f"the agglomerates show {sorted(agglomerate_colours)}, not two colours"
    for colour in agglomerate_colours:
        assert mapped_shares[colour] > 0.05, (colour, mapped_shares[colour])
    # Every cell of the labels (a common colour of the raw view, not the background) is one agglomerate colour.
    joined: dict[int, set[int]] = {}
    for cell in raw_common - shared - {0}:
        under = mapped_colour[raw_colour == cell]
        values, counts = np.unique(under, return_counts=True)
        assert counts.max() >= 0.98 * under.size, (cell, dict(zip(values.tolist(), counts.tolist(), strict=True)))
        majority = int(values[counts.argmax()])
        assert majority in agglomerate_colours, (cell, majority)
        joined.setdefault(majority, set()).add(cell)
    assert len(joined) == 2 and all(len(cells) > 2 for cells in joined.values()), joined
