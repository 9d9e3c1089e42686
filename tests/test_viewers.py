"""Neuroglancer in a real headless Chromium, and the dataset page in the same browser.

One Chromium (WebGL through SwiftShader) and one Neuroglancer Python server (which serves the client
that ships in the ``neuroglancer`` package) are shared by the whole module. Each view is opened from a
Neuroglancer state in the URL; the test reads the viewer's own state over the DevTools protocol (every
data source loaded or, for bad input, failed), checks the gateway's access log (chunks answered
200/206, no 5xx), and compares screenshots of the same view from the v2, v3 and sharded v3 trees.

Set ``ZARR_GATEWAY_SCREENSHOT_DIR`` to keep a downscaled screenshot for the README
(``neuroglancer.png``).
"""

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urljoin

import fsspec
import numpy as np
import pytest
import requests
from PIL import Image
from support.browser import Browser
from support.datasets import ORG, TOKEN, WrittenDataset
from support.servers import Server
from support.viewer import (
    LOAD_TIMEOUT,
    METADATA_NAMES,
    PANEL_RECT_JS,
    AccessLine,
    access_lines,
    assert_chunks_answered,
    png_pixels,
    settled_screenshot,
    wait_until_drawn,
)

from gateway.sample import DATASET, ORGANIZATION, SIZE, TOP_LEFT, VOXEL_SIZE_NM

pytestmark = pytest.mark.browser  # every test drives headless Chromium

SCREENSHOT_DIR_VARIABLE = "ZARR_GATEWAY_SCREENSHOT_DIR"
# The whole volume fills the panel; at this zoom Neuroglancer draws mag 1.
VIEW = {
    "dimensions": {
        "x": [VOXEL_SIZE_NM[0] * 1e-9, "m"],
        "y": [VOXEL_SIZE_NM[1] * 1e-9, "m"],
        "z": [VOXEL_SIZE_NM[2] * 1e-9, "m"],
    },
    "position": [TOP_LEFT[0] + SIZE[0] / 2, TOP_LEFT[1] + SIZE[1] / 2, TOP_LEFT[2] + SIZE[2] / 2 + 0.5],
    "crossSectionScale": 0.45,
    "layout": "xy",
    "showAxisLines": False,
    "showScaleBar": False,
    "showDefaultAnnotations": False,
}


@dataclass
class View:
    name: str
    layers: list[dict[str, Any]]
    screenshot: Path
    panel: np.ndarray  # RGB pixels of the rendered data panel
    access: list[AccessLine]
    console: list[str]


@pytest.fixture(scope="module")
def plain(sample_root: Path, server_factory: Callable[..., Server]) -> Server:
    return server_factory(sample_root)


@pytest.fixture(scope="module")
def sharded(sample_root: Path, server_factory: Callable[..., Server]) -> Server:
    return server_factory(sample_root, v3_layout="sharded")


def open_view(
    browser: Browser,
    neuroglancer_url: str,
    servers: list[Server],
    name: str,
    layers: list[dict[str, Any]],
    out_dir: Path,
    complete: Callable[[np.ndarray], bool] | None = None,
) -> View:
    """Open Neuroglancer on a state with ``layers``, wait until drawn, screenshot it, collect the access log.

    ``complete`` says whether a panel shows everything it should. Neuroglancer picks the chunks to
    fetch while it draws; on a loaded machine it has reported ready with chunks never fetched, so an
    incomplete panel gets forced redraws (which fetch the rest) until the deadline. A view that never
    completes is returned as it is, for the assertions to report.
    """
    state = {**VIEW, "layers": layers}
    starts = [len(server.log()) for server in servers]
    started = time.monotonic()
    with browser.page() as page:
        page.navigate(neuroglancer_url + "#!" + quote(json.dumps(state), safe=""))
        page.wait_for("typeof window.viewer === 'object'", timeout=60)
        while True:
            final = wait_until_drawn(page)
            screenshot = settled_screenshot(page, out_dir / f"{name}.png")
            left, top, right, bottom = page.evaluate(PANEL_RECT_JS)
            panel = png_pixels(screenshot)[top:bottom, left:right]
            if complete is None or complete(panel) or time.monotonic() > started + LOAD_TIMEOUT:
                break
            print(f"{name}: incomplete after {time.monotonic() - started:.0f} s, drawing again")
            time.sleep(1)
        console = list(page.console)
    time.sleep(0.5)  # access lines are written once per event-loop turn
    access = [line for server, start in zip(servers, starts) for line in access_lines(server, start)]
    print(f"{name}: drawn in {time.monotonic() - started:.0f} s, screenshot {screenshot}")
    return View(name, final["layers"], screenshot, panel, access, console)


def image_complete(panel: np.ndarray) -> bool:
    """No chunk left black: the sample's EM image is nowhere 0, and a missing chunk blacks out ~2% of it."""
    return bool((data_region(panel).max(axis=-1) == 0).mean() < 0.005)


def layer_source(server: Server, tree: str, layer: str) -> str:
    protocol = "zarr2" if tree == "zarr" else "zarr3"
    return f"{protocol}://{server.url}/data/{tree}/{ORGANIZATION}/{DATASET}/{layer}/"


@pytest.fixture(scope="module")
def views(
    browser: Browser,
    neuroglancer_url: str,
    plain: Server,
    sharded: Server,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, View]:
    """Every view the tests look at, opened once each in the shared browser."""
    out_dir = tmp_path_factory.mktemp("screenshots")
    # A fixed contrast range: the pixels then depend on the voxels alone.
    image: dict[str, Any] = {"type": "image", "name": "color", "shaderControls": {"normalized": {"range": [0, 255]}}}
    segmentation: dict[str, Any] = {"type": "segmentation", "name": "segmentation"}
    cases: dict[str, tuple[Server, list[dict[str, Any]]]] = {
        "image-v2": (plain, [{**image, "source": layer_source(plain, "zarr", "color")}]),
        "image-v3": (plain, [{**image, "source": layer_source(plain, "zarr3", "color")}]),
        "image-v3-sharded": (sharded, [{**image, "source": layer_source(sharded, "zarr3", "color")}]),
        "segmentation-over-image": (
            plain,
            [
                {**image, "source": layer_source(plain, "zarr3", "color")},
                {**segmentation, "source": layer_source(plain, "zarr3", "segmentation")},
            ],
        ),
        "segmentation-v2": (
            plain,
            [{**segmentation, "source": layer_source(plain, "zarr", "segmentation"), "selectedAlpha": 1}],
        ),
        "missing": (
            plain,
            [
                {**image, "name": "no-layer", "source": layer_source(plain, "zarr3", "no_such_layer")},
                {**image, "name": "no-mag", "source": layer_source(plain, "zarr", "color") + "16/"},
            ],
        ),
    }
    opened = {}
    for name, (server, layers) in cases.items():
        complete = image_complete if name.startswith("image") else None
        opened[name] = open_view(browser, neuroglancer_url, [server], name, layers, out_dir, complete)
    keep = os.environ.get(SCREENSHOT_DIR_VARIABLE)
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        written = readme_image(opened["segmentation-over-image"].screenshot, Path(keep) / "neuroglancer.png")
        print(f"README screenshot written to {written}")
    return opened


def readme_image(screenshot: Path, path: Path) -> Path:
    """The screenshot at half size in 256 colours: small enough to commit (docs/images/neuroglancer.png)."""
    with Image.open(screenshot) as shot:
        half = shot.convert("RGB").resize((shot.width // 2, shot.height // 2), Image.Resampling.LANCZOS)
    half.quantize(colors=256).save(path, optimize=True)
    return path


def assert_loaded_from_gateway(view: View) -> None:
    for layer in view.layers:
        for source in layer["sources"]:
            assert source["state"] == "loaded", (view.name, layer["name"], source, view.console[-10:])
    assert_chunks_answered(view.access)
    # Probes for the other names of a node (e.g. .zarray at a group) may be 404; nothing else may fail.
    failures = [line for line in view.access if line.status >= 400 and line.path.split("/")[-1] not in METADATA_NAMES]
    assert not failures, failures
    assert not [line for line in view.access if line.status >= 500]


def data_region(panel: np.ndarray) -> np.ndarray:
    """The middle of the panel, which the volume covers at the view's zoom."""
    height, width = panel.shape[:2]
    return panel[height // 4 : 3 * height // 4, width // 4 : 3 * width // 4]


@pytest.mark.parametrize(
    "name", ["image-v2", "image-v3", "image-v3-sharded", "segmentation-over-image", "segmentation-v2"]
)
def test_view_loads_from_the_gateway(views: dict[str, View], name: str) -> None:
    assert_loaded_from_gateway(views[name])


def test_sharded_view_reads_shards_by_range(views: dict[str, View]) -> None:
    chunks = [line for line in views["image-v3-sharded"].access if line.is_chunk]
    assert any(line.status == 206 for line in chunks), chunks


def test_v2_v3_and_sharded_trees_draw_the_same_pixels(views: dict[str, View]) -> None:
    reference = views["image-v3"].panel
    region = data_region(reference)
    assert region.std() > 10, "the view is flat: no data was drawn"
    assert len(np.unique(region.reshape(-1, 3), axis=0)) > 50
    for name in ("image-v2", "image-v3-sharded"):
        panel = views[name].panel
        assert panel.shape == reference.shape
        differing = np.count_nonzero((panel != reference).any(axis=-1))
        assert differing == 0, f"{name} differs from image-v3 in {differing} pixels: {views[name].screenshot}"


def segment_boundaries(panel: np.ndarray) -> np.ndarray:
    """Pixels whose colour differs from the pixel to the right or below (where one segment meets another)."""
    edges = np.zeros(panel.shape[:2], dtype=bool)
    edges[:, :-1] |= (panel[:, 1:] != panel[:, :-1]).any(axis=-1)
    edges[:-1, :] |= (panel[1:, :] != panel[:-1, :]).any(axis=-1)
    return edges


def test_segmentation_lines_up_with_the_membranes(views: dict[str, View]) -> None:
    """Cell boundaries of the segmentation (v2 tree) fall on the dark membranes of the image (v3 tree)."""
    gray = data_region(views["image-v3"].panel).mean(axis=-1)
    labels = data_region(views["segmentation-v2"].panel)
    assert len(np.unique(labels.reshape(-1, 3), axis=0)) > 10, "the segmentation shows fewer than 10 colours"
    margin, shift = 6, 4  # compare the boundaries with the image at their place and 4 pixels off it
    height, width = gray.shape
    edges = segment_boundaries(labels)[margin:-margin, margin:-margin]
    assert edges.mean() > 0.005
    on_edges = gray[margin:-margin, margin:-margin][edges].mean()
    shifted = gray[margin + shift : height - margin + shift, margin + shift : width - margin + shift][edges].mean()
    print(f"mean gray {gray.mean():.1f}, on segment boundaries {on_edges:.1f}, {shift} px off them {shifted:.1f}")
    assert on_edges < 0.75 * gray.mean()
    assert on_edges < 0.9 * shifted


def test_segmentation_over_image_differs_from_the_image_alone(views: dict[str, View]) -> None:
    overlay, image = views["segmentation-over-image"].panel, views["image-v3"].panel
    assert (data_region(overlay) != data_region(image)).any(axis=-1).mean() > 0.5


def test_missing_layer_and_mag_show_as_failed_sources_not_server_errors(views: dict[str, View]) -> None:
    view = views["missing"]
    states = {layer["name"]: layer["sources"] for layer in view.layers}
    for name in ("no-layer", "no-mag"):
        (source,) = states[name]
        assert source["state"] == "error" and source["error"], (name, source)
    paths = {line.path: line.status for line in view.access}
    assert paths, "the viewer asked the gateway nothing"
    assert all(status == 404 for status in paths.values()), paths
    assert any("/no_such_layer/" in path for path in paths)
    assert any("/color/16/" in path for path in paths)


class _Links(HTMLParser):
    """Every ``<a href>`` of a page, and which of them sit inside ``<ul class="children">``."""

    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.listing: list[str] = []
        self._open_lists: list[bool] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "ul":
            self._open_lists.append("children" in (attributes.get("class") or "").split())
        elif tag == "a" and attributes.get("href") is not None:
            href = attributes["href"] or ""
            self.hrefs.append(href)
            if any(self._open_lists):
                self.listing.append(href)

    def handle_endtag(self, tag: str) -> None:
        if tag == "ul" and self._open_lists:
            self._open_lists.pop()


# Where each client's snippet must point: the finest mag of the first layer (either Zarr tree), the
# dataset in the zarr tree for webknossos, the dataset in the xarray tree for xarray.
SNIPPET_URLS = {
    "zarr-python": r"{base}/data/zarr3?/{org}/{ds}/color/1\b",
    "tensorstore": r"{base}/data/zarr3?/{org}/{ds}/color/1\b",
    "webknossos": r"{base}/data/zarr/{org}/{ds}\b",
    "xarray": r"{base}/data/xarray/{org}/{ds}/",
}
PAGE_JS = """(() => ({
  previews: [...document.querySelectorAll("img.preview")].map(i => ({
    src: i.src, complete: i.complete, width: i.naturalWidth, alt: i.alt,
    layer: i.closest("section.layer") && i.closest("section.layer").dataset.layer})),
  sections: [...document.querySelectorAll("section.layer")].map(s => ({
    layer: s.dataset.layer, id: s.id,
    heading: s.querySelector("h2") && s.querySelector("h2").textContent.trim(),
    facts: Object.fromEntries([...s.querySelectorAll("dl.facts dt")].map(
      dt => [dt.textContent.trim(), dt.nextElementSibling ? dt.nextElementSibling.textContent.trim() : null])),
    neuroglancer: [...s.querySelectorAll("a.open-neuroglancer")].map(a => a.href)})),
  snippets: Object.fromEntries([...document.querySelectorAll("section.snippets pre.snippet")].map(
    p => [p.dataset.client, p.textContent])),
}))()"""


@pytest.fixture(scope="module")
def page_settings(neuroglancer_url: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A settings file whose pages link to the local Neuroglancer, so the links can be followed here."""
    settings = tmp_path_factory.mktemp("page-settings") / "settings.json"
    settings.write_text(json.dumps({"neuroglancer_url": neuroglancer_url}))
    return settings


@pytest.fixture(scope="module")
def page_gateway(sample_root: Path, server_factory: Callable[..., Server], page_settings: Path) -> Server:
    """An open gateway whose pages link to the local Neuroglancer."""
    return server_factory(sample_root, settings_file=page_settings)


def read_page(browser: Browser, url: str, screenshot: Path) -> dict[str, Any]:
    with browser.page() as page:
        page.navigate(url)
        page.wait_for("[...document.images].every(i => i.complete)", timeout=60)
        page.screenshot(screenshot)
        print(f"dataset page {url}: screenshot {screenshot}")
        found: dict[str, Any] = page.evaluate(PAGE_JS)
        return found


def neuroglancer_state(link: str, neuroglancer_url: str) -> dict[str, Any]:
    base, _, fragment = link.partition("#!")
    assert base == neuroglancer_url, link
    document: dict[str, Any] = json.loads(unquote(fragment))
    return document


def test_dataset_page_in_the_browser(
    browser: Browser, page_gateway: Server, neuroglancer_url: str, tmp_path: Path
) -> None:
    dataset_url = f"{page_gateway.url}/data/zarr3/{ORGANIZATION}/{DATASET}"
    page_url = dataset_url + "/"
    content = read_page(browser, page_url, tmp_path / "dataset-page.png")

    previews = content["previews"]
    assert sorted(p["layer"] for p in previews) == ["color", "segmentation"], previews
    for preview in previews:
        assert preview["complete"] and preview["width"] > 0, f"preview did not load: {preview}"
        assert preview["src"] == f"{page_gateway.url}/preview/{ORGANIZATION}/{DATASET}/{preview['layer']}.png"
        assert preview["alt"] == f"preview of {preview['layer']}"

    sections = {section["layer"]: section for section in content["sections"]}
    assert set(sections) == {"color", "segmentation"}
    for layer, category, dtype in (("color", "color", "uint8"), ("segmentation", "segmentation", "uint32")):
        section = sections[layer]
        assert section["id"] == f"layer-{layer}" and section["heading"] == layer
        facts = section["facts"]
        assert set(facts) >= {"Category", "Data type", "Channels", "Bounding box", "Voxel size", "Mags"}, facts
        assert facts["Category"] == category
        assert facts["Data type"] == dtype
        assert facts["Channels"] == "1"
        numbers = [int(n) for n in re.findall(r"\d+", facts["Bounding box"])]
        assert set(TOP_LEFT) | set(SIZE) <= set(numbers), facts["Bounding box"]
        voxel_size = facts["Voxel size"]
        assert "11.24" in voxel_size and "28" in voxel_size and ("nm" in voxel_size or "nanomet" in voxel_size)
        assert facts["Mags"] == "1, 2-2-1, 4-4-2"
        (link,) = section["neuroglancer"]
        state = neuroglancer_state(link, neuroglancer_url)
        assert state["selectedLayer"] == {"layer": layer}  # every link opens every layer, its own selected
        layer_states = {s["name"]: s for s in state["layers"]}
        assert list(layer_states) == ["color", "segmentation"]  # the image under the segmentation
        sources = layer_states[layer]["source"]
        volume = sources if category == "color" else sources[0]
        assert volume == f"zarr3://{dataset_url}/{layer}/"
        if category == "segmentation":
            meshes = f"{page_gateway.url}/data/meshes/{ORGANIZATION}/{DATASET}/{layer}/multires/"
            assert sources[1] == f"{meshes}|neuroglancer-precomputed:"
        assert layer_states[layer]["type"] == ("image" if category == "color" else "segmentation")

    snippets = content["snippets"]
    assert set(snippets) >= set(SNIPPET_URLS), snippets
    for client, pattern in SNIPPET_URLS.items():
        url = re.escape(page_gateway.url)
        assert re.search(pattern.format(base=url, org=ORGANIZATION, ds=DATASET), snippets[client]), snippets[client]
    assert "open_datatree" in snippets["xarray"]
    assert not any("<token>" in text for text in snippets.values()), "an open gateway needs no token"
    for client in SNIPPET_URLS:  # copyable code: each snippet runs as it is
        run = subprocess.run([sys.executable, "-c", snippets[client]], capture_output=True, text=True, cwd=tmp_path)
        assert run.returncode == 0, f"the {client} snippet failed:\n{snippets[client]}\n{run.stderr[-3000:]}"

    # The page is still a directory listing: its child links are exactly the listing, for fsspec too.
    html = requests.get(page_url, timeout=30).text
    parser = _Links()
    parser.feed(html)
    expected = {f"{page_url}{name}" for name in ("datasource-properties.json", "zarr.json", "color/", "segmentation/")}
    assert {urljoin(page_url, href) for href in parser.listing} == expected
    below = {urljoin(page_url, h) for h in parser.hrefs if urljoin(page_url, h).startswith(page_url)}
    assert below == expected, f"links below the page that are not children: {below - expected}"
    listed = fsspec.filesystem("http").ls(page_url, detail=False)
    assert {url.rstrip("/") for url in listed} == {url.rstrip("/") for url in expected}


def _neuroglancer_links(html: str, neuroglancer_url: str) -> dict[str, str]:
    """A dataset page's Neuroglancer links by the layer each selects: one for the image, one for the labels."""
    links = {
        neuroglancer_state(href, neuroglancer_url)["selectedLayer"]["layer"]: href
        for href in _hrefs(html)
        if href.startswith(neuroglancer_url)
    }
    assert set(links) == {"color", "segmentation"}, links
    return links


def test_dataset_page_link_opens_in_neuroglancer(
    browser: Browser, page_gateway: Server, neuroglancer_url: str, tmp_path: Path
) -> None:
    """The page's "Open in Neuroglancer" link, followed in the browser, loads every layer from the gateway,
    the segmentation's mesh source included."""
    html = requests.get(f"{page_gateway.url}/data/zarr/{ORGANIZATION}/{DATASET}/", timeout=30).text
    links = _neuroglancer_links(html, neuroglancer_url)
    assert neuroglancer_state(links["color"], neuroglancer_url)["layers"][0]["source"].startswith("zarr2://")
    start = len(page_gateway.log())
    with browser.page() as page:
        page.navigate(links["color"])
        page.wait_for("typeof window.viewer === 'object'", timeout=60)
        final = wait_until_drawn(page)
        settled_screenshot(page, tmp_path / "from-page-link.png")
    sources = [s for layer in final["layers"] for s in layer["sources"]]
    assert len(sources) == 3 and all(s["state"] == "loaded" for s in sources), final  # image, labels, meshes
    time.sleep(0.5)
    assert_chunks_answered(access_lines(page_gateway, start))


VIEWER_TOKEN = "viewer+token~1.x"  # characters that a path and a query encode differently


@pytest.fixture(scope="module")
def token_page_gateway(
    sample_root: Path,
    server_factory: Callable[..., Server],
    page_settings: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Server:
    """A gateway with tokens whose pages link to the local Neuroglancer."""
    tokens = tmp_path_factory.mktemp("token-page") / "tokens.json"
    tokens.write_text(json.dumps({"tokens": {VIEWER_TOKEN: [f"{ORGANIZATION}/*"]}}))
    return server_factory(sample_root, settings_file=page_settings, tokens_file=tokens)


@pytest.mark.parametrize("tree, scheme", [("zarr", "zarr2"), ("zarr3", "zarr3")])
def test_dataset_page_link_with_a_token_opens_in_neuroglancer(
    browser: Browser, token_page_gateway: Server, neuroglancer_url: str, tmp_path: Path, tree: str, scheme: str
) -> None:
    """With tokens on, the link of a page opened with ``?token=`` loads every source (image, labels, meshes) in
    Neuroglancer's own client: every request carries the token (no 401), chunks and mesh files are answered
    200/206, and no log line shows the token."""
    gateway = token_page_gateway
    encoded = quote(VIEWER_TOKEN, safe="")
    meshes = f"{gateway.url}/t/{encoded}/data/meshes/{ORGANIZATION}/{DATASET}/segmentation/multires/"
    # the segment list scans the layer once; from then on the page's link selects its largest segments
    assert requests.get(meshes + "segment_properties/info", timeout=120).status_code == 200
    html = requests.get(f"{gateway.url}/data/{tree}/{ORGANIZATION}/{DATASET}/?token={encoded}", timeout=30).text
    links = _neuroglancer_links(html, neuroglancer_url)
    state = neuroglancer_state(links["segmentation"], neuroglancer_url)
    sources = [
        s
        for layer in state["layers"]
        for s in (layer["source"] if isinstance(layer["source"], list) else [layer["source"]])
    ]
    assert sorted(sources) == sorted(
        [
            f"{scheme}://{gateway.url}/t/{encoded}/data/{tree}/{ORGANIZATION}/{DATASET}/color/",
            f"{scheme}://{gateway.url}/t/{encoded}/data/{tree}/{ORGANIZATION}/{DATASET}/segmentation/",
            f"{meshes}|neuroglancer-precomputed:",
        ]
    )
    segments = next(layer for layer in state["layers"] if layer["name"] == "segmentation").get("segments", [])
    assert segments, state
    time.sleep(0.5)  # the page's own access line is written once per event-loop turn: before ``start``
    start = len(gateway.log())
    with browser.page() as page:
        page.navigate(links["segmentation"])
        page.wait_for("typeof window.viewer === 'object'", timeout=60)
        final = wait_until_drawn(page)
        time.sleep(2)  # meshes arrive after their manifests
        wait_until_drawn(page)
        settled_screenshot(page, tmp_path / f"from-page-link-token-{tree}.png")
        console = list(page.console)
    loaded = [s for layer in final["layers"] for s in layer["sources"]]
    assert len(loaded) == 3 and all(s["state"] == "loaded" for s in loaded), final
    time.sleep(0.5)
    access = access_lines(gateway, start)
    assert access and all(line.path.startswith("/t/***/") for line in access), access  # the token went everywhere
    assert not [line for line in access if line.status in (400, 401, 403) or line.status >= 500], access
    assert_chunks_answered([AccessLine(line.method, line.path.removeprefix("/t/***"), line.status) for line in access])
    mesh_files = [line for line in access if "/data/meshes/" in line.path and not line.path.endswith("/info")]
    assert mesh_files, f"no mesh file was asked for; access log: {access}"
    assert all(line.status in (200, 206, 304) for line in mesh_files), mesh_files
    assert not [line for line in console if "status of 401" in line or "status of 403" in line], console
    log = gateway.log()
    assert VIEWER_TOKEN not in log and encoded not in log, "the token reached the gateway's log"


def _hrefs(html: str) -> list[str]:
    parser = _Links()
    parser.feed(html)
    return parser.hrefs


def test_dataset_page_with_a_token(
    browser: Browser, gateway: Server, test_data: WrittenDataset, tmp_path: Path
) -> None:
    """With auth on, previews carry the page's token (an <img> sends no header); snippets show a placeholder."""
    dataset_url = f"{gateway.url}/data/zarr3/{ORG}/{test_data.dataset}"
    content = read_page(browser, f"{dataset_url}/?token={TOKEN}", tmp_path / "dataset-page-token.png")
    assert content["previews"], "no preview images"
    for preview in content["previews"]:
        assert preview["src"].endswith(f".png?token={TOKEN}"), preview
        assert preview["complete"] and preview["width"] > 0, f"preview did not load: {preview}"
    for section in content["sections"]:
        (link,) = section["neuroglancer"]
        state = json.loads(unquote(link.partition("#!")[2]))
        assert state["selectedLayer"] == {"layer": section["layer"]}
        for layer_state in state["layers"]:
            name = layer_state["name"]
            sources = layer_state["source"] if isinstance(layer_state["source"], list) else [layer_state["source"]]
            # the token in the path: Neuroglancer's zarr sources keep no query on the files below a source
            assert sources[0] == f"zarr3://{gateway.url}/t/{TOKEN}/data/zarr3/{ORG}/{test_data.dataset}/{name}/"
            meshes = f"{gateway.url}/t/{TOKEN}/data/meshes/{ORG}/{test_data.dataset}/{name}/multires/"
            assert sources[1:] == (
                [f"{meshes}|neuroglancer-precomputed:"] if layer_state["type"] == "segmentation" else []
            )
    assert content["snippets"], "no snippets"
    for client, text in content["snippets"].items():
        assert TOKEN not in text, f"the {client} snippet shows the real token"
    assert all("<token>" in content["snippets"][c] for c in ("zarr-python", "tensorstore", "webknossos")), content[
        "snippets"
    ]
