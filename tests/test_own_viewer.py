"""The Neuroglancer client the gateway serves itself at ``/neuroglancer/`` (the ``viewer`` extra).

Its routes are checked over HTTP (content types, caching, the event stream, hostile names); then, in headless
Chromium with a host name that is not ``localhost`` (``gateway.test``, mapped to 127.0.0.1) over plain http and
with tokens on, the dataset page's own link is followed: the image, the segmentation and its meshes load from
the gateway through ``/t/TOKEN/`` paths and are drawn (pixel checks), with no mixed content to block them.
"""

import http.client
import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import numpy as np
import pytest
import requests
from support import viewer
from support.browser import Browser, Page, chromium_path
from support.processes import wait_until
from support.proxy import address, start_proxy
from support.servers import Server

from gateway.http.pages import viewer as own_viewer
from gateway.sample import DATASET, ORGANIZATION

TOKEN = "own-viewer+token~1.x"  # characters that a path and a query encode differently
PROXY_TOKEN = "own-viewer-proxy-token"  # the compose proxy takes path and query tokens that need no encoding
HOST = "gateway.test"  # not localhost: an https page could not read it over http


@pytest.fixture(scope="module")
def gateway(
    sample_root: Path, server_factory: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory
) -> Server:
    """A gateway with tokens and no ``neuroglancer_url``: its pages link to its own viewer."""
    tokens = tmp_path_factory.mktemp("own-viewer") / "tokens.json"
    tokens.write_text(json.dumps({"tokens": {TOKEN: [f"{ORGANIZATION}/*"], PROXY_TOKEN: [f"{ORGANIZATION}/*"]}}))
    return server_factory(sample_root, tokens_file=tokens)


@pytest.fixture(scope="module")
def lan_browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    """Chromium that resolves ``gateway.test`` to the loopback address, as a LAN host name would be."""
    if chromium_path() is None:
        pytest.fail("these tests drive a real browser: install Debian's chromium")
    instance = Browser(
        tmp_path_factory.mktemp("chromium-lan") / "profile", [f"--host-resolver-rules=MAP {HOST} 127.0.0.1"]
    )
    yield instance
    instance.close()


def lan_url(server: Server) -> str:
    return server.url.replace("127.0.0.1", HOST)


def raw_get(server: Server, path: str) -> tuple[int, bytes]:
    """A GET of ``path`` exactly as written (no client normalizes dot segments or escapes)."""
    parts = urlsplit(server.url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


# --- the routes ------------------------------------------------------------------------------------------------


def test_the_client_is_served_with_its_types_and_caching(gateway: Server) -> None:
    page = requests.get(gateway.url + own_viewer.PAGE, timeout=30)
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.headers["cache-control"] == "no-cache"
    assert '<script>if (!location.hash) { history.replaceState(null, "", "#!%7B%7D"); }</script>' in page.text
    scripts = [name for name in page.text.split('"') if name.endswith((".js", ".css"))]
    assert any(name.startswith("main.") for name in scripts), page.text
    for name in scripts:
        answer = requests.get(gateway.url + own_viewer.PAGE + name, timeout=30)
        assert answer.status_code == 200, name
        expected = "text/javascript" if name.endswith(".js") else "text/css"
        assert answer.headers["content-type"].startswith(expected), name
        assert answer.headers["cache-control"] == "public, max-age=31536000, immutable", name
        again = requests.get(gateway.url + own_viewer.PAGE + name, headers={"If-None-Match": answer.headers["etag"]})
        assert again.status_code == 304, name
    client = own_viewer.NeuroglancerClient.installed()
    assert client is not None, "the viewer extra is installed here"
    wasm = sorted(name for name in client.files if name.endswith(".wasm"))
    assert wasm, sorted(client.files)
    answer = requests.get(gateway.url + own_viewer.PAGE + wasm[0], timeout=30)
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/wasm"


def test_the_bare_address_redirects_and_the_fragment_comes_along(gateway: Server) -> None:
    for path, location in (("/neuroglancer/", "v/gateway/"), ("/neuroglancer", "neuroglancer/v/gateway/")):
        answer = requests.get(gateway.url + path, allow_redirects=False, timeout=30)
        assert answer.status_code == 302 and answer.headers["location"] == location, path
    followed = requests.get(gateway.url + "/t/" + quote(TOKEN, safe="") + "/neuroglancer/", timeout=30)
    assert followed.status_code == 200 and followed.url.endswith("/neuroglancer/v/gateway/")


def test_the_event_stream_stays_open_and_says_nothing(gateway: Server) -> None:
    with requests.get(gateway.url + own_viewer.EVENTS + "?c=client&gc=", stream=True, timeout=30) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "text/event-stream"
        assert answer.headers["cache-control"] == "no-cache" and answer.headers["x-accel-buffering"] == "no"
        first = next(answer.iter_lines())
        assert first.startswith(b":"), first  # a comment: no state, no event for the client to apply


def _open_streams(server: Server, count: int) -> list[socket.socket]:
    """``count`` event streams held open on raw connections, each once its first comment has arrived."""
    parts = urlsplit(server.url)
    opened = []
    for _ in range(count):
        connection = socket.create_connection((parts.hostname or "", parts.port or 80), timeout=30)
        connection.sendall(f"GET {own_viewer.EVENTS}?c=x&gc= HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        received = b""
        while b"\n\n" not in received.partition(b"\r\n\r\n")[2]:
            received += connection.recv(4096)
        assert received.startswith(b"HTTP/1.1 200 "), received[:300]
        opened.append(connection)
    return opened


def test_tokenless_event_streams_are_bounded_in_number_per_worker(gateway: Server) -> None:
    """The issue held 1,500 tokenless streams open for 600 s each; past the bound a stream is a 503 the client
    retries, and one that closes makes room again."""
    streams = _open_streams(gateway, own_viewer.MAX_EVENT_STREAMS)
    try:
        refused = requests.get(gateway.url + own_viewer.EVENTS + "?c=y&gc=", stream=True, timeout=30)
        assert refused.status_code == 503, refused.headers  # (a stream, read whole, would never end)
        assert refused.json()["status"] == 503, refused.text
        assert refused.headers["Retry-After"] == str(own_viewer.STREAMS_RETRY_SECONDS)
        assert "event streams" in refused.json()["error"]
        assert requests.get(gateway.url + "/healthz", timeout=30).status_code == 200
        streams.pop().close()
        assert wait_until(lambda: _stream_status(gateway) == 200, timeout=10), "a closed stream makes room"
    finally:
        for connection in streams:
            connection.close()


def _stream_status(server: Server) -> int:
    with requests.get(server.url + own_viewer.EVENTS + "?c=z&gc=", stream=True, timeout=30) as answer:
        return answer.status_code


@pytest.mark.parametrize(
    "path",
    [
        "/neuroglancer/v/gateway/../../../../etc/passwd",
        "/neuroglancer/v/gateway/%2e%2e/%2e%2e/static/__init__.py",
        "/neuroglancer/v/gateway/..%2f__init__.py",
        "/neuroglancer/v/gateway/index.html",  # the page is served at its directory only
        "/neuroglancer/v/gateway/sub/main.js",
        "/neuroglancer/v/other-token/",
        "/neuroglancer/v/gateway/%00",
        "/neuroglancer/state/gateway",
        "/neuroglancer/credentials/gateway",
        "/neuroglancer/nothing",
    ],
)
def test_hostile_and_unknown_names_are_404(gateway: Server, path: str) -> None:
    status, body = raw_get(gateway, path)
    assert status in (400, 404), (path, status)
    assert b"root:" not in body and b"import" not in body


def test_posting_state_is_refused_the_viewer_holds_none(gateway: Server) -> None:
    answer = requests.post(gateway.url + "/neuroglancer/state/gateway", data=b"{}", timeout=30)
    assert answer.status_code == 405


# --- in the browser ------------------------------------------------------------------------------------------


def drawn(panel: np.ndarray) -> float:
    """The share of the panel's pixels brighter than the black background."""
    return float((panel.astype(int).sum(axis=-1) > 60).mean())


def colourful(panel: np.ndarray) -> float:
    """The share of saturated pixels: segment colours (the EM image is grey)."""
    rgb = panel.astype(int)
    return float(((rgb.max(axis=-1) - rgb.min(axis=-1)) > 60).mean())


def panel_pixels(page: Page, path: Path) -> np.ndarray:
    viewer.wait_until_drawn(page)
    shot = viewer.settled_screenshot(page, path)
    left, top, right, bottom = page.evaluate(viewer.PANEL_RECT_JS)
    print(f"screenshot {shot}")
    return viewer.png_pixels(shot)[top:bottom, left:right]


@pytest.mark.browser
def test_the_dataset_page_link_opens_the_gateways_own_viewer(
    lan_browser: Browser, gateway: Server, tmp_path: Path
) -> None:
    follow_the_page_link(lan_browser, gateway, lan_url(gateway), TOKEN, tmp_path)


@pytest.mark.browser
@pytest.mark.nginx
def test_the_viewer_works_through_the_compose_proxy(lan_browser: Browser, gateway: Server, tmp_path: Path) -> None:
    """The same path through deploy/nginx.conf: the client passes unchecked, every data request is checked,
    and the page's links name the port the browser reached the proxy at."""
    proxy = start_proxy(tmp_path / "nginx", [address(gateway)])
    try:
        bare = requests.get(proxy.url + "/data/zarr/", timeout=30)
        assert bare.status_code == 401, "data without a token is refused at the proxy"
        client = requests.get(proxy.url + own_viewer.PAGE, timeout=30)
        assert client.status_code == 200 and "main." in client.text, "the viewer's code passes without a token"
        follow_the_page_link(lan_browser, gateway, proxy.url.replace("127.0.0.1", HOST), PROXY_TOKEN, tmp_path)
    finally:
        proxy.stop()


def follow_the_page_link(lan_browser: Browser, gateway: Server, base: str, token: str, tmp_path: Path) -> None:
    """From the dataset page at ``base`` (the gateway or a proxy in front of it), over plain http on a LAN
    host name with a token: the page's viewer link opens the gateway's own Neuroglancer, which draws the
    image, the segmentation and its meshes."""
    encoded = quote(token, safe="")
    scan = (
        f"{gateway.url}/t/{encoded}/data/meshes/{ORGANIZATION}/{DATASET}/segmentation/multires/segment_properties/info"
    )
    assert requests.get(scan, timeout=120).status_code == 200  # the page's link then selects the largest segments
    with lan_browser.page() as page:
        page.navigate(f"{base}/data/zarr/{ORGANIZATION}/{DATASET}/?token={encoded}")
        page.wait_for("document.readyState === 'complete'", timeout=60)
        assert page.evaluate("document.querySelector('p.viewer-note') === null"), "no warning: the viewer can read"
        links = page.evaluate(
            "Object.fromEntries([...document.querySelectorAll('section.layer')].map("
            "s => [s.dataset.layer, s.querySelector('a.open-neuroglancer').href]))"
        )
    link = links["segmentation"]
    assert link.startswith(f"{base}/t/{encoded}/neuroglancer/v/gateway/#!"), link
    state = json.loads(unquote(link.partition("#!")[2]))
    sources = viewer.state_sources(state)
    assert all(source.startswith((f"zarr2://{base}/t/{encoded}/", f"{base}/t/{encoded}/")) for source in sources)
    assert len(sources) == 3, sources  # image, labels, meshes
    time.sleep(0.5)
    start = len(gateway.log())
    with lan_browser.page() as page:
        page.navigate(link)
        page.wait_for("typeof window.viewer === 'object'", timeout=60)
        final = viewer.wait_until_drawn(page)
        time.sleep(2)  # meshes arrive after their manifests
        viewer.wait_until_drawn(page)
        viewer.settled_screenshot(page, tmp_path / "own-viewer-4panel.png")
        loaded = [s for layer in final["layers"] for s in layer["sources"]]
        assert len(loaded) == 3 and all(s["state"] == "loaded" for s in loaded), final
        status = page.evaluate("document.body.innerText")
        assert "Python server" not in status, status  # the event stream opened: no "disconnected" message
        assert page.evaluate("location.hash.startsWith('#!')")  # the state stays in the address

        page.evaluate("viewer.layout.restoreState('xy'), true")
        slice_view = panel_pixels(page, tmp_path / "own-viewer-xy.png")
        assert drawn(slice_view) > 0.5, "the EM image fills the slice"
        assert colourful(slice_view) > 0.01, "the selected segments are drawn in colour over it"

        page.evaluate(
            "viewer.showPerspectiveSliceViews.value = false, viewer.showAxisLines.value = false,"
            " viewer.showDefaultAnnotations.value = false, viewer.showScaleBar.value = false,"
            " viewer.layout.restoreState('3d'), true"
        )
        time.sleep(1)
        meshes = panel_pixels(page, tmp_path / "own-viewer-3d.png")
        page.evaluate("viewer.layerManager.getLayerByName('segmentation').setVisible(false), true")
        time.sleep(1)
        without = panel_pixels(page, tmp_path / "own-viewer-3d-hidden.png")
    assert drawn(meshes) > 0.01, "the selected segments' meshes are drawn in 3-D"
    assert drawn(without) < drawn(meshes) / 10, "what the 3-D panel showed was the segmentation's meshes"
    time.sleep(0.5)
    # Behind a proxy the gateway also answers its token checks (/auth), a 401 for the browser's favicon among them.
    access = [line for line in viewer.access_lines(gateway, start) if line.path != "/auth"]
    probes = [line for line in access if line.status == 404 and line.path.rpartition("/")[2] in viewer.METADATA_NAMES]
    assert not [line for line in access if line.status >= 400 and line not in probes], access  # a probe may miss
    assert any("/neuroglancer/v/gateway/main." in line.path for line in access), "the client came from the gateway"
    assert any("/data/meshes/" in line.path and line.status in (200, 206) for line in access), access
    viewer.assert_chunks_answered(
        [viewer.AccessLine(line.method, line.path.removeprefix("/t/***"), line.status) for line in access]
    )


@pytest.mark.browser
def test_the_bare_address_opens_an_empty_viewer_whose_state_is_in_the_address(
    lan_browser: Browser, gateway: Server
) -> None:
    with lan_browser.page() as page:
        page.navigate(f"{lan_url(gateway)}/neuroglancer/")
        page.wait_for("typeof window.viewer === 'object'", timeout=60)
        assert page.evaluate("location.pathname") == own_viewer.PAGE
        page.evaluate("viewer.layout.restoreState('xy'), true")  # a change the address must record
        address = page.wait_for("location.hash.includes('xy') ? location.hash : null", timeout=30)
        time.sleep(2)
        text = page.evaluate("document.body.innerText")
        console = list(page.console)
    assert address.startswith("#!"), address
    assert "Python server" not in text, text  # the event stream opened and stays open
    assert not [line for line in console if "Failed to send state update" in line], console  # nothing was posted
