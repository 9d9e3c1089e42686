"""A share link in the browser: Neuroglancer, opened from the dataset page below ``/s/{capability}/``, draws the
image and the segmentation from the gateway's own client with no token and no header, every request below the
link, and the access log names the link by its id.

The link is made the way a person with a grant makes one: the dataset page's form, posted in Chromium.
"""

import json
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest
import requests
from support import viewer
from support.browser import Browser
from support.servers import Server

from gateway.sample import DATASET, ORGANIZATION

TOKEN = "share-viewer-token"
NAMES = f"{ORGANIZATION}/{DATASET}"


@pytest.fixture(scope="module")
def gateway(
    sample_root: Path, server_factory: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory
) -> Server:
    secrets = tmp_path_factory.mktemp("share-viewer")
    (secrets / "tokens.json").write_text(json.dumps({"tokens": {TOKEN: [f"{ORGANIZATION}/*"]}}))
    (secrets / "share.key").write_text("a share key of the viewer test, longer than 32 bytes\n")
    return server_factory(sample_root, tokens_file=secrets / "tokens.json", share_key_file=secrets / "share.key")


def image(pixels: np.ndarray) -> float:
    """The share of grey pixels far from the slice view's mid-grey background: the EM image (light and dark)."""
    rgb = pixels.astype(int)
    grey = (rgb.max(axis=-1) - rgb.min(axis=-1)) <= 60
    return float((grey & (np.abs(rgb - 128).max(axis=-1) > 24)).mean())


def saturated(pixels: np.ndarray) -> float:
    """The share of strongly coloured pixels: segments (the EM image is grey)."""
    rgb = pixels.astype(int)
    return float(((rgb.max(axis=-1) - rgb.min(axis=-1)) > 60).mean())


@pytest.mark.browser
def test_neuroglancer_draws_the_dataset_from_a_link_made_on_its_page(
    browser: Browser, gateway: Server, tmp_path: Path
) -> None:
    scan = f"{gateway.url}/t/{TOKEN}/data/meshes/{NAMES}/segmentation/multires/segment_properties/info"
    assert requests.get(scan, timeout=120).status_code == 200  # the link's page then selects the largest segments
    with browser.page() as page:
        page.navigate(f"{gateway.url}/data/zarr3/{NAMES}/?token={TOKEN}")
        page.wait_for("document.readyState === 'complete'", timeout=60)
        page.evaluate(
            "document.querySelector('form.share-form input[name=expires]').value = '900',"
            " document.querySelector('form.share-form').submit(), true"
        )
        page.wait_for("document.querySelector('input.link') !== null", timeout=60)
        link = page.evaluate("document.querySelector('input.link').value")
        link_id = page.evaluate("document.querySelector('code.link-id').textContent")
    prefix = link.split("/data/", 1)[0]
    assert prefix.startswith(f"{gateway.url}/s/s1.{link_id}.") and TOKEN not in link, link
    with browser.page() as page:
        page.navigate(link)
        page.wait_for("document.readyState === 'complete'", timeout=60)
        layers = page.evaluate(
            "Object.fromEntries([...document.querySelectorAll('section.layer')].map("
            "s => [s.dataset.layer, s.querySelector('a.open-neuroglancer').href]))"
        )
    opened = layers["segmentation"]
    assert opened.startswith(f"{prefix}/neuroglancer/v/gateway/#!"), opened
    sources = viewer.state_sources(json.loads(unquote(opened.partition("#!")[2])))
    assert len(sources) == 3 and all(prefix in source for source in sources), sources  # image, labels, meshes
    time.sleep(0.5)  # the pages' own requests are logged before the viewer's are counted
    start = len(gateway.log())
    with browser.page() as page:
        loaded = viewer.open_and_draw(page, opened)
        assert len(loaded) == 3 and all(source["state"] == "loaded" for source in loaded), loaded
        page.evaluate("viewer.layout.restoreState('xy'), true")
        viewer.wait_until_drawn(page)
        shot = viewer.settled_screenshot(page, tmp_path / "share-link-xy.png")
        left, top, right, bottom = page.evaluate(viewer.PANEL_RECT_JS)
    panel = viewer.png_pixels(shot)[top:bottom, left:right]
    assert image(panel) > 0.04, "the EM image is drawn (about a tenth of the panel at the page link's zoom)"
    assert saturated(panel) > 0.01, "the selected segments are drawn in colour over it"
    access = viewer.access_lines(gateway, start)
    assert access and all(line.path.startswith(f"/s/{link_id}/") for line in access), access
    probes = [line for line in access if line.status == 404 and line.path.rpartition("/")[2] in viewer.METADATA_NAMES]
    assert not [line for line in access if line.status >= 400 and line not in probes], access
    assert any("/data/meshes/" in line.path and line.status in (200, 206) for line in access), access
    viewer.assert_chunks_answered(
        [viewer.AccessLine(line.method, line.path.removeprefix(f"/s/{link_id}"), line.status) for line in access]
    )
    log = gateway.log()
    assert prefix.rsplit("/s/", 1)[1] not in log, "the capability is never logged"
