"""A browser signs in with OpenID Connect and reads with its login cookie alone: headless Chromium fills in the
real provider's login form (oidc-provider, run with node), lands on the dataset page it started from, follows
the page's link into the gateway's own Neuroglancer, which draws the image, the segmentation and its meshes
with no token in any URL; after /logout the same browser reads nothing."""

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote, unquote

import pytest
import requests
from support import viewer
from support.browser import Browser
from support.oidc import Provider, provider_at, signin_settings
from support.servers import Server

from gateway.sample import DATASET, ORGANIZATION

TOKEN = "oidc-browser-scan-token"  # only to have the segment list scanned before the browser comes


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provider]:
    made = provider_at(tmp_path_factory.mktemp("oidc-browser"))
    yield made
    made.stop()


@pytest.fixture(scope="module")
def signin(
    provider: Provider,
    sample_root: Path,
    server_factory: Callable[..., Server],
    tmp_path_factory: pytest.TempPathFactory,
) -> Server:
    """A gateway whose pages link to its own viewer, granting the sample to the lab-a group."""
    directory = tmp_path_factory.mktemp("oidc-browser-gateway")
    policy = {"tokens": {TOKEN: [f"{ORGANIZATION}/*"]}, "claims": {"groups": {"lab-a": [f"{ORGANIZATION}/*"]}}}
    server = server_factory(sample_root, **signin_settings(provider, directory, policy))
    provider.redirect_uris = [server.url + "/callback"]
    provider.start()
    return server


FETCH_STATUS_JS = "fetch({path!r}).then(r => r.status)"


@pytest.mark.browser
def test_a_browser_signs_in_and_the_viewer_draws_with_the_cookie_alone(
    browser: Browser, signin: Server, tmp_path: Path
) -> None:
    scan = f"{signin.url}/t/{TOKEN}/data/meshes/{ORGANIZATION}/{DATASET}/segmentation/multires/segment_properties/info"
    assert requests.get(scan, timeout=120).status_code == 200  # the page's link then selects the largest segments
    page_path = f"/data/zarr/{ORGANIZATION}/{DATASET}/"
    time.sleep(0.5)
    start = len(signin.log())
    with browser.page() as page:
        began = time.monotonic()
        page.navigate(f"{signin.url}/login?next={quote(page_path)}")
        page.wait_for("document.querySelector('input[name=login]') !== null", timeout=60)
        assert page.evaluate("location.origin") != signin.url, "the login form is the provider's own"
        page.evaluate(
            "document.querySelector('input[name=login]').value = 'ada',"
            " document.querySelector('input[name=password]').value = 'any',"
            " document.querySelector('form').submit(), true"
        )
        page.wait_for(f"location.href === {signin.url + page_path!r} && document.readyState === 'complete'", 60)
        signed_in_after = time.monotonic() - began
        links = page.evaluate(
            "Object.fromEntries([...document.querySelectorAll('section.layer')].map("
            "s => [s.dataset.layer, s.querySelector('a.open-neuroglancer').href]))"
        )
        link = links["segmentation"]
        assert link.startswith(f"{signin.url}/neuroglancer/v/gateway/#!"), link
        sources = viewer.state_sources(json.loads(unquote(link.partition("#!")[2])))
        assert len(sources) == 3 and all("/t/" not in s and "token" not in s for s in sources), sources
        assert page.evaluate("document.cookie") == "", "the login cookie is HttpOnly: no script reads it"
        page.navigate(link)
        page.wait_for("typeof window.viewer === 'object'", timeout=60)
        final = viewer.wait_until_drawn(page)
        drawn_after = time.monotonic() - began
        time.sleep(2)  # meshes arrive after their manifests
        viewer.wait_until_drawn(page)
        viewer.settled_screenshot(page, tmp_path / "signed-in-viewer.png")
        loaded = [s for layer in final["layers"] for s in layer["sources"]]
        assert len(loaded) == 3 and all(s["state"] == "loaded" for s in loaded), final
        chunk = f"/data/zarr/{ORGANIZATION}/{DATASET}/color/1/.zarray"
        assert page.evaluate(FETCH_STATUS_JS.format(path=chunk)) == 200
        page.navigate(f"{signin.url}/logout")
        page.wait_for("document.readyState === 'complete'", 30)
        assert page.evaluate(FETCH_STATUS_JS.format(path=chunk)) == 401, "signed out: the cookie is gone"
    print(f"from /login to the first drawn viewer panel: {drawn_after:.1f} s ({signed_in_after:.1f} s to sign in)")
    time.sleep(0.5)
    access = [line for line in viewer.access_lines(signin, start) if not line.path.startswith("/t/")]
    assert all("/t/" not in line.path for line in access)
    data = [line for line in access if line.path.startswith("/data/")]
    assert any("/data/meshes/" in line.path and line.status in (200, 206) for line in data), access
    refused = [line for line in data if line.status in (400, 401, 403) or line.status >= 500]
    assert refused == [viewer.AccessLine("GET", chunk, 401)], refused  # only the read after /logout
    probes = [line for line in data if line.status == 404 and line.path.rpartition("/")[2] in viewer.METADATA_NAMES]
    viewer.assert_chunks_answered([line for line in data if line not in probes and line.status != 401])
