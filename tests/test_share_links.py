"""Share links, ``/s/{capability}/...``: a signed, expiring, read-only grant of one dataset in the URL.

Two gateways with one key (replicas) serve the sample dataset with tokens on. Links are made by ``zarr-gateway
share`` and by a dataset page's form; below a link zarr-python, tensorstore and CloudVolume (volumes and
meshes) read exactly what the source holds, with no header; every other dataset, and links forged, tampered
with, expired or revoked, are refused with a status and a message that says which; the access log shows a
link's id, never its capability; and the compose proxy passes, refuses and caches them as the gateways decide.
"""

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import pytest
import requests
import wkw
from support import viewer
from support.clients import read_tensorstore, read_zarr_python
from support.cloudvolume_reads import assert_reads_exactly, open_volume
from support.processes import wait_until
from support.proxy import Proxy, address, start_proxy
from support.servers import Server

from gateway.http.share import ShareKey
from gateway.sample import DATASET, ORGANIZATION

KEY = b"k" * 16 + os.urandom(32)
TOKEN = "share-test-token"
OTHER_TOKEN = "share-test-other-org"
NAMES = f"{ORGANIZATION}/{DATASET}"
BORROWER = "borrowed_layer"


@dataclass(frozen=True)
class Setup:
    key_file: Path
    revoked_file: Path
    tokens_file: Path
    root: Path

    def env(self) -> dict[str, str]:
        """The settings ``serve`` gets, as ``share`` reads them from the environment."""
        return {
            **os.environ,
            "ZARR_GATEWAY_ROOT": str(self.root),
            "ZARR_GATEWAY_TOKENS_FILE": str(self.tokens_file),
            "ZARR_GATEWAY_SHARE_KEY_FILE": str(self.key_file),
            "ZARR_GATEWAY_SHARE_REVOKED_FILE": str(self.revoked_file),
        }


@pytest.fixture(scope="module")
def setup(sample_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Setup:
    secrets = tmp_path_factory.mktemp("share-secrets")
    key_file = secrets / "share.key"
    key_file.write_bytes(base64.b64encode(KEY) + b"\n")
    # A second dataset whose one layer is the sample's own (a symlink into its directory): what it reads lies
    # in another dataset's directory, so a link to it alone reads nothing (authorization follows the files).
    borrower = sample_root / ORGANIZATION / BORROWER
    borrower.mkdir()
    properties = json.loads((sample_root / NAMES / "datasource-properties.json").read_text())
    properties["id"]["name"] = BORROWER
    properties["dataLayers"] = [layer for layer in properties["dataLayers"] if layer["name"] == "color"]
    (borrower / "datasource-properties.json").write_text(json.dumps(properties))
    (borrower / "color").symlink_to(Path("..") / DATASET / "color")
    tokens_file = secrets / "tokens.json"
    tokens_file.write_text(json.dumps({"tokens": {TOKEN: [f"{ORGANIZATION}/*"], OTHER_TOKEN: ["other_org/*"]}}))
    return Setup(key_file, secrets / "revoked.txt", tokens_file, sample_root)


@pytest.fixture(scope="module")
def pair(setup: Setup, server_factory: Callable[..., Server]) -> list[Server]:
    """Two replicas: the same key, each reading the revocation list (re-read within a fifth of a second)."""
    return [
        server_factory(
            setup.root,
            tokens_file=setup.tokens_file,
            share_key_file=setup.key_file,
            share_revoked_file=setup.revoked_file,
            tokens_reload_seconds=0.2,
            share_max_seconds=3600,
        )
        for _ in range(2)
    ]


def key() -> ShareKey:
    return ShareKey(base64.b64encode(KEY))


def made_link(server: Server, seconds: int = 600, **headers: str) -> dict[str, Any]:
    """A link made through a gateway's ``POST /share/`` with the token."""
    answer = requests.post(
        f"{server.url}/share/{NAMES}",
        data={"expires": str(seconds), "tree": "zarr3"},
        headers={"X-Auth-Token": TOKEN, **headers},
        timeout=30,
    )
    assert answer.status_code == 201, answer.text
    document: dict[str, Any] = answer.json()
    return document


def prefix_of(link: str) -> str:
    """``scheme://host/s/{capability}``: what every path of the dataset follows."""
    return link.split("/data/", 1)[0]


def capability_of(link: str) -> str:
    return prefix_of(link).rsplit("/s/", 1)[1]


def truth(setup: Setup, layer: str, lo: tuple[int, int, int], hi: tuple[int, int, int]) -> np.ndarray:
    """The voxels ``[lo, hi)`` at mag 1 as the format's own library reads them, ``[c, x, y, z]``."""
    with wkw.Dataset.open(str(setup.root / ORGANIZATION / DATASET / layer / "1")) as source:
        data: np.ndarray = source.read(lo, tuple(b - a for a, b in zip(lo, hi)))
    return data


LO, HI = (16, 8, 4), (120, 100, 40)  # inside the sample's box (16, 8, 4) + (320, 288, 96), across chunk edges


# --- clients read below a link, with no header ------------------------------------------------------------


@pytest.mark.slow  # whole boxes read by three clients through two gateways; the whole suite runs it
@pytest.mark.parametrize("tree", ["zarr", "zarr3"])
@pytest.mark.parametrize("layer", ["color", "segmentation"])
def test_zarr_python_and_tensorstore_read_exactly_through_a_link(
    pair: list[Server], setup: Setup, tree: str, layer: str
) -> None:
    prefix = prefix_of(made_link(pair[0])["link"])
    url = f"{prefix}/data/{tree}/{NAMES}/{layer}/1"
    region = (slice(None), *(slice(a, b) for a, b in zip(LO, HI)))
    want = truth(setup, layer, LO, HI)
    assert want.any(), "the box holds data"
    version = 3 if tree == "zarr3" else 2
    np.testing.assert_array_equal(read_zarr_python(url, version, region=region), want)
    np.testing.assert_array_equal(read_tensorstore(url, version, region=region), want)


@pytest.mark.slow  # xarray over two trees
def test_xarray_opens_a_mag_through_a_link_as_through_a_token(pair: list[Server]) -> None:
    import xarray as xr

    prefix = prefix_of(made_link(pair[0])["link"])
    through_link = xr.open_zarr(f"{prefix}/data/xarray/{NAMES}/2-2-1")
    through_token = xr.open_zarr(
        f"{pair[0].url}/data/xarray/{NAMES}/2-2-1", storage_options={"headers": {"X-Auth-Token": TOKEN}}
    )
    assert set(through_link.data_vars) == {"color", "segmentation"}
    box = {"x": slice(8, 90), "y": slice(4, 70), "z": slice(2, 40)}
    for name in ("color", "segmentation"):
        got = through_link[name].isel(box).values
        assert got.any(), name
        np.testing.assert_array_equal(got, through_token[name].isel(box).values, err_msg=name)


@pytest.mark.slow  # CloudVolume reads a box and meshes a segment
def test_cloudvolume_reads_the_precomputed_tree_and_meshes_through_a_link(pair: list[Server], setup: Setup) -> None:
    prefix = prefix_of(made_link(pair[0])["link"])
    whole = np.zeros((1, *HI), dtype=np.uint8)
    whole[(slice(None), *(slice(a, b) for a, b in zip(LO, HI)))] = truth(setup, "color", LO, HI)
    assert_reads_exactly(f"{prefix}/data/precomputed/{NAMES}/color", 0, whole, LO, HI, "color through a link")
    segmentation = f"/data/precomputed/{NAMES}/segmentation"
    ids = requests.get(f"{prefix}/data/meshes/{NAMES}/segmentation/multires/segment_properties/info", timeout=120)
    assert ids.status_code == 200, ids.text
    segment = int(ids.json()["inline"]["ids"][0])
    through_link = open_volume(prefix + segmentation).mesh.get([segment])[segment]
    through_token = open_volume(f"{pair[0].url}/t/{TOKEN}{segmentation}").mesh.get([segment])[segment]
    assert len(through_link.vertices) > 0 and len(through_link.faces) > 0
    np.testing.assert_array_equal(through_link.vertices, through_token.vertices)
    np.testing.assert_array_equal(through_link.faces, through_token.faces)


def test_the_pages_below_a_link_link_below_it_and_offer_no_form(pair: list[Server]) -> None:
    link = made_link(pair[0])["link"]
    prefix = prefix_of(link)
    capability = capability_of(link)
    page = requests.get(link, timeout=120)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html"), page.text[:300]
    text = page.text
    assert 'class="share-form"' not in text, "a link makes no links"
    assert "X-Auth-Token" not in text, "the snippets need no token below a link"
    for href in [part.split('"', 1)[0] for part in text.split('href="')[1:]]:
        assert href.startswith(f"/s/{capability}/data/"), href  # the listing's links stay below the link
    viewer_links = [part.split('"', 1)[0] for part in text.split('class="open-neuroglancer" href = "')[1:]]
    assert viewer_links and all(v.startswith(f"/s/{capability}/neuroglancer/") for v in viewer_links), viewer_links
    sources = viewer.state_sources(json.loads(unquote(viewer_links[0].partition("#!")[2])))
    assert len(sources) == 3, sources  # image, segmentation, its meshes
    assert all(source.startswith((f"zarr3://{prefix}/data/", f"{prefix}/data/")) for source in sources), sources
    for path in (f"/data/zarr3/{NAMES}/color/", f"/data/zarr/{NAMES}/color/1/", f"/data/xarray/{ORGANIZATION}/"):
        listing = requests.get(prefix + path, timeout=120)
        hrefs = [part.split('"', 1)[0] for part in listing.text.split('href="')[1:]]
        assert listing.status_code == 200 and hrefs, (path, listing.text[:300])
        assert all(href.startswith(f"/s/{capability}{path}") for href in hrefs), (path, hrefs)
        followed = requests.get(prefix.split("/s/", 1)[0] + hrefs[-1], timeout=120)
        assert followed.status_code == 200, (hrefs[-1], followed.text[:300])
    preview = requests.get(f"{prefix}/preview/{NAMES}/color.png", timeout=120)
    assert preview.status_code == 200 and preview.content.startswith(b"\x89PNG")


def test_a_links_bare_prefix_opens_its_dataset_page(pair: list[Server]) -> None:
    """``/s/{capability}/``, a link cut back to its prefix (and every page's way back to the start below a link),
    is the shared dataset's page, not a 404; a link that does not hold is refused there as everywhere."""
    link = made_link(pair[1])["link"]
    capability = capability_of(link)
    bare = requests.get(f"{pair[0].url}/s/{capability}/", allow_redirects=False, timeout=30)
    assert bare.status_code == 302, bare.text
    assert bare.headers["location"] == f"/s/{capability}/data/zarr3/{NAMES}/"
    assert bare.headers["cache-control"] == "no-store"
    page = requests.get(f"{pair[0].url}/s/{capability}/", headers={"Accept": "text/html"}, timeout=120)
    assert page.status_code == 200 and page.url == link.replace(pair[1].url, pair[0].url), page.url
    assert 'class="share-form"' not in page.text and DATASET in page.text
    start_links = [part.split('"', 1)[0] for part in page.text.split('class="up" href = "')[1:]]
    assert f"/s/{capability}/" in start_links, start_links  # the breadcrumb back to the start stays below the link
    _, expired = key().issue(ORGANIZATION, DATASET, 60, now=time.time() - 3600)
    refused = requests.get(f"{pair[0].url}/s/{expired}/", allow_redirects=False, timeout=30)
    assert refused.status_code == 401 and "has expired" in refused.json()["error"], refused.text
    assert requests.get(f"{pair[0].url}/s/{capability}", allow_redirects=False, timeout=30).status_code == 404


def test_the_401_page_names_a_share_link_as_a_way_in(pair: list[Server], proxy: Proxy) -> None:
    """A browser without a credential learns every way in this gateway takes: a token in each form and a share
    link; no sign-in, which it does not offer. The proxy's page is the gateway's."""
    path = f"/data/zarr3/{NAMES}/color/"
    for base in (pair[0].url, proxy.url):
        page = requests.get(base + path, headers={"Accept": "text/html"}, timeout=30)
        assert page.status_code == 401 and page.headers["content-type"].startswith("text/html"), page.text[:300]
        text = unquote(page.text).replace("&#47;", "/")
        ways = text.split('<ul class="sign-in">', 1)[1].split("</ul>", 1)[0]
        assert f"{path}?token=YOUR_TOKEN" in ways and f"/t/YOUR_TOKEN{path}" in ways and "X-Auth-Token" in ways
        assert "share link" in ways and "<code>/s/</code>" in ways, ways
        assert "/login" not in text, ways
    expired = requests.get(
        f"{pair[0].url}/s/{key().issue(ORGANIZATION, DATASET, 60, now=time.time() - 3600)[1]}{path}",
        headers={"Accept": "text/html"},
        timeout=30,
    )
    assert expired.status_code == 401 and "has expired" in expired.text and "share link" in expired.text


def test_error_pages_below_a_link_lead_back_below_it_unless_the_link_is_refused(pair: list[Server]) -> None:
    """A browser's 404 or 403 below a link leads to the link's start (its dataset's page); a 401 for the link
    itself (expired, forged) leads to the gateway's start page, never back to the link it refused."""
    capability = capability_of(made_link(pair[0])["link"])
    html = {"Accept": "text/html"}

    def start_links(path: str, status: int) -> list[str]:
        answer = requests.get(pair[0].url + path, headers=html, timeout=30)
        assert answer.status_code == status and answer.headers["content-type"].startswith("text/html"), answer.text
        return [part.split('"', 1)[0] for part in answer.text.split('class="start" href = "')[1:]]

    below = f"/s/{capability}"
    assert start_links(f"{below}/data/zarr3/{NAMES}/no_such_layer/", 404) == [f"{below}/"]
    assert start_links(f"{below}/data/zarr3/other_org/theirs/", 403) == [f"{below}/"]
    _, expired = key().issue(ORGANIZATION, DATASET, 60, now=time.time() - 3600)
    assert start_links(f"/s/{expired}/data/zarr3/{NAMES}/", 401) == ["/"]
    assert start_links(f"/s/{_tampered(capability, 5, 'A' * 43)}/data/zarr3/{NAMES}/", 401) == ["/"]
    assert requests.get(pair[0].url + f"{below}/", headers=html, timeout=120).status_code == 200


# --- refused -----------------------------------------------------------------------------------------------


def _tampered(capability: str, part: int, value: str) -> str:
    parts = capability.split(".")
    parts[part] = value
    return ".".join(parts)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _other_dataset_part() -> str:
    return (
        base64.urlsafe_b64encode(json.dumps(["other_org", "theirs"], separators=(",", ":")).encode())
        .rstrip(b"=")
        .decode()
    )


def test_forged_tampered_expired_and_malformed_links_are_401_saying_which(pair: list[Server]) -> None:
    good = capability_of(made_link(pair[0])["link"])
    chunk = f"/data/zarr3/{NAMES}/color/1/c/0/0/0/0"
    _, forged = ShareKey(b"another key of more than thirty-two bytes").issue(ORGANIZATION, DATASET, 600)
    _, expired = key().issue(ORGANIZATION, DATASET, 60, now=time.time() - 3600)
    cases = {
        "forged": (forged, "forged"),
        "tampered dataset": (_tampered(good, 4, _other_dataset_part()), "tampered"),
        "tampered expiry": (_tampered(good, 3, str(int(time.time()) + 10**6)), "tampered"),
        "tampered signature": (_tampered(good, 5, "A" * 43), "tampered"),
        "expired": (expired, "expired"),
        "malformed": ("s1.not-a-link", "malformed"),
        "non-canonical base64": (_tampered(good, 4, good.split(".")[4] + "="), "malformed"),
        "escaped surrogate": (_tampered(good, 4, _b64(b'["\\ud800","x"]')), "malformed"),
        "not JSON": (_tampered(good, 4, _b64(b"\xff\xfe")), "malformed"),
        "a number for a name": (_tampered(good, 4, _b64(b'["lab",1]')), "malformed"),
    }
    for name, (capability, word) in cases.items():
        answer = requests.get(f"{pair[1].url}/s/{capability}{chunk}", timeout=30)
        assert answer.status_code == 401, (name, answer.text)
        assert word in answer.json()["error"], (name, answer.text)
    assert requests.get(f"{pair[1].url}/s/{good}{chunk}", timeout=30).status_code == 200


def test_a_link_read_before_is_refused_once_it_expires(pair: list[Server]) -> None:
    """Each worker remembers a checked signature, never a verdict on expiry: the link stops at its time."""
    chunk = f"{prefix_of(made_link(pair[0], seconds=2)['link'])}/data/zarr3/{NAMES}/color/1/c/0/0/0/0"
    assert requests.get(chunk, timeout=30).status_code == 200

    def expired() -> bool:
        answer = requests.get(chunk, timeout=30)
        return answer.status_code == 401 and "has expired" in answer.json()["error"]

    assert wait_until(expired, 30), "the link still reads after its expiry"


def test_a_link_reads_nothing_outside_its_dataset(pair: list[Server]) -> None:
    prefix = prefix_of(made_link(pair[0])["link"])
    for path in (
        "/data/zarr3/other_org/theirs/zarr.json",
        f"/data/zarr/{ORGANIZATION}/no_such_dataset/",
        f"/data/meshes/{ORGANIZATION}/another/segmentation/multires/info",
        f"/preview/{ORGANIZATION}/another/color.png",
    ):
        answer = requests.get(prefix + path, timeout=30)
        assert answer.status_code == 403, (path, answer.text)
        assert f"for {NAMES} only" in answer.json()["error"], answer.text


def test_listings_below_a_link_show_its_dataset_alone(pair: list[Server]) -> None:
    prefix = prefix_of(made_link(pair[0])["link"])
    for path in (f"/data/zarr3/{ORGANIZATION}/", "/data/zarr3/", f"/data/precomputed/{ORGANIZATION}/"):
        below_link = requests.get(prefix + path, timeout=120)
        with_token = requests.get(pair[0].url + path, headers={"X-Auth-Token": TOKEN}, timeout=120)
        assert below_link.status_code == 200 and with_token.status_code == 200, (path, below_link.text[:300])
        assert BORROWER in with_token.text, "the token sees both datasets"
        assert DATASET in below_link.text and BORROWER not in below_link.text, path


def test_a_link_to_a_dataset_whose_files_lie_in_another_reads_nothing(pair: list[Server]) -> None:
    _, capability = key().issue(ORGANIZATION, BORROWER, 600)
    answer = requests.get(
        f"{pair[0].url}/s/{capability}/data/zarr3/{ORGANIZATION}/{BORROWER}/color/zarr.json", timeout=30
    )
    assert answer.status_code == 403, answer.text
    assert "or to every dataset whose files it reads" in answer.json()["error"]
    with_token = requests.get(
        f"{pair[0].url}/data/zarr3/{ORGANIZATION}/{BORROWER}/color/zarr.json",
        headers={"X-Auth-Token": TOKEN},
        timeout=30,
    )
    assert with_token.status_code == 200, "a grant of both datasets reads it"


def test_a_link_with_another_credential_is_400(pair: list[Server]) -> None:
    prefix = prefix_of(made_link(pair[0])["link"])
    chunk = f"/data/zarr3/{NAMES}/color/1/c/0/0/0/0"
    with_header = requests.get(prefix + chunk, headers={"X-Auth-Token": TOKEN}, timeout=30)
    with_query = requests.get(prefix + chunk, params={"token": TOKEN}, timeout=30)
    for answer in (with_header, with_query):
        assert answer.status_code == 400, answer.text
        assert "share link and a token" in answer.json()["error"]
    capability = capability_of(prefix)
    for nested in (f"/t/{TOKEN}/s/{capability}{chunk}", f"/s/{capability}/t/{TOKEN}{chunk}"):
        assert requests.get(pair[0].url + nested, timeout=30).status_code == 404, nested


def test_a_revoked_link_is_401_at_every_replica(pair: list[Server], setup: Setup) -> None:
    made = made_link(pair[0])
    chunk = f"{prefix_of(made['link'])}/data/zarr3/{NAMES}/color/1/c/0/0/0/0"
    other_replica = chunk.replace(pair[0].url, pair[1].url)
    assert requests.get(other_replica, timeout=30).status_code == 200, "replicas accept each other's links"
    setup.revoked_file.write_text("# revoked by hand, the last line without its end\nAAAAAAAAAAAAAAAA")
    for revoked in (made["id"], "-uYW-sKLQZD2oirJ"):  # as the link's page writes the command; an id of '-' too
        revoke = subprocess.run(
            [sys.executable, "-m", "gateway", "share", f"--revoke={revoked}"],
            env=setup.env(),
            capture_output=True,
            text=True,
        )
        assert revoke.returncode == 0, revoke.stderr
    assert setup.revoked_file.read_text().splitlines()[1:] == ["AAAAAAAAAAAAAAAA", made["id"], "-uYW-sKLQZD2oirJ"]
    for url in (chunk, other_replica):

        def refused(url: str = url) -> bool:
            return requests.get(url, timeout=30).status_code == 401

        assert wait_until(refused, 30), f"{url} answers"
        answer = requests.get(url, timeout=30)
        assert f"share link {made['id']} has been revoked" in answer.json()["error"]


def test_the_access_log_shows_a_links_id_never_its_capability(pair: list[Server]) -> None:
    made = made_link(pair[0])
    capability = capability_of(made["link"])
    signature = capability.rsplit(".", 1)[1]
    for path in (
        f"/s/{capability}/data/zarr3/{NAMES}/zarr.json",
        f"/s/{capability}/data/zarr3/other_org/theirs/",
        f"/s/{capability}/nothing/here",
        f"/s/{_tampered(capability, 5, 'B' * 43)}/data/zarr3/{NAMES}/",
        f"//s/{capability}/data/zarr3/{NAMES}/",
        f"/x/../s/{capability}/data/",
    ):
        requests.get(pair[0].url + path, timeout=30)
    last = f"/s/{made['id']}/data/zarr3/other_org/theirs/"
    assert wait_until(lambda: last in [line["path"] for line in pair[0].access_lines()], 10), "logged"
    log = pair[0].log()
    assert capability not in log and signature not in log and "B" * 43 not in log, log[-3000:]
    assert f"/s/{made['id']}/data/zarr3/{NAMES}/zarr.json" in [line["path"] for line in pair[0].access_lines()]


# --- making links ------------------------------------------------------------------------------------------


def test_the_share_command_prints_a_link_that_reads(pair: list[Server], setup: Setup) -> None:
    made = subprocess.run(
        [sys.executable, "-m", "gateway", "share", NAMES, "--expires", "600", "--base-url", pair[1].url],
        env=setup.env(),
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    link = made.stdout.strip()
    assert link.startswith(f"{pair[1].url}/s/s1.") and link.endswith(f"/data/zarr3/{NAMES}/"), link
    assert "id " in made.stderr and "expires" in made.stderr
    assert requests.get(link, timeout=120).status_code == 200
    assert requests.get(f"{prefix_of(link)}/data/zarr/{NAMES}/color/1/.zarray", timeout=30).status_code == 200


@pytest.mark.parametrize(
    ("arguments", "without", "words"),
    [
        ([NAMES, "--expires", "600"], "ZARR_GATEWAY_SHARE_KEY_FILE", "share_key_file"),
        (["--revoke", "abc"], "", "not a share link id"),
        (["--revoke", "A" * 16], "ZARR_GATEWAY_SHARE_REVOKED_FILE", "share_revoked_file"),
        (["no-slash", "--expires", "600"], "", "not ORGANIZATION/DATASET"),
        ([NAMES, "--expires", "0"], "", "at least 1"),
        ([NAMES], "", "--expires"),
        ([NAMES, "--expires", "600", "--tree", "n5"], "", "unknown tree"),
    ],
)
def test_the_share_command_refuses_with_one_line(setup: Setup, arguments: list[str], without: str, words: str) -> None:
    env = setup.env()
    env.pop(without, None)
    run = subprocess.run(
        [sys.executable, "-m", "gateway", "share", *arguments], env=env, capture_output=True, text=True
    )
    assert run.returncode == 1 and words in run.stderr and "Traceback" not in run.stderr, run.stderr


@pytest.mark.parametrize(
    "dataset", [f"{ORGANIZATION}/no_such_dataset", f"no_such_org/{DATASET}", f"{ORGANIZATION}/color", f"../{DATASET}"]
)
def test_the_share_command_refuses_a_dataset_that_does_not_exist(setup: Setup, dataset: str) -> None:
    """A link to nothing would answer 404 to whoever it was sent to: exit status 2 (the argument names nothing),
    one line that names the dataset, and nothing on standard output."""
    run = subprocess.run(
        [sys.executable, "-m", "gateway", "share", dataset, "--expires", "600"],
        env=setup.env(),
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2, (run.returncode, run.stderr)
    assert run.stderr.strip() == f"zarr-gateway: there is no dataset {dataset!r} under the data root {setup.root}"
    assert run.stdout == ""


def test_making_a_link_needs_a_grant_of_the_dataset(pair: list[Server]) -> None:
    url = f"{pair[0].url}/share/{NAMES}"
    refusals = {
        "no token": (requests.post(url, data={"expires": "60"}, timeout=30), 401, "token is required"),
        "another org's": (
            requests.post(url, data={"expires": "60"}, headers={"X-Auth-Token": OTHER_TOKEN}, timeout=30),
            403,
            "does not grant",
        ),
        "too long": (
            requests.post(url, data={"expires": "3601"}, headers={"X-Auth-Token": TOKEN}, timeout=30),
            400,
            "from 1 to 3600",
        ),
        "not a number": (
            requests.post(url, data={"expires": "1e3"}, headers={"X-Auth-Token": TOKEN}, timeout=30),
            400,
            "whole seconds",
        ),
        "missing dataset": (
            requests.post(f"{pair[0].url}/share/{ORGANIZATION}/nope", headers={"X-Auth-Token": TOKEN}, timeout=30),
            404,
            "no dataset",
        ),
        "a GET": (requests.get(url, headers={"X-Auth-Token": TOKEN}, timeout=30), 405, "POST"),
        "too large a form": (
            requests.post(url, data={"expires": "60", "x": "y" * 5000}, headers={"X-Auth-Token": TOKEN}, timeout=30),
            413,
            "at most",
        ),
    }
    for name, (answer, status, words) in refusals.items():
        assert answer.status_code == status and words in answer.json()["error"], (name, answer.text)
    link = made_link(pair[0])
    by_link = requests.post(f"{prefix_of(link['link'])}/share/{NAMES}", data={"expires": "60"}, timeout=30)
    assert by_link.status_code == 403 and "cannot make share links" in by_link.json()["error"]
    assert link["expires"] - time.time() == pytest.approx(600, abs=120)


def test_the_dataset_page_form_makes_a_link_for_a_browser(pair: list[Server]) -> None:
    page = requests.get(f"{pair[0].url}/t/{TOKEN}/data/zarr/{NAMES}/", timeout=120).text
    action = f"/t/{TOKEN}/share/{NAMES}"
    assert f'<form class="share-form" method="post" action="{action}">' in page
    assert 'name="tree" value="zarr"' in page and 'max="3600"' in page
    answer = requests.post(
        pair[0].url + action, data={"expires": "120", "tree": "zarr"}, headers={"Accept": "text/html"}, timeout=30
    )
    assert answer.status_code == 201 and answer.headers["content-type"].startswith("text/html"), answer.text
    assert answer.headers["cache-control"] == "no-store"
    link = answer.text.split('class="link" readonly size="80" value="', 1)[1].split('"', 1)[0]
    assert link.startswith(f"{pair[0].url}/s/s1.") and link.endswith(f"/data/zarr/{NAMES}/"), link
    assert requests.get(link, timeout=120).status_code == 200


def test_a_gateway_without_a_key_takes_no_links(setup: Setup, server_factory: Callable[..., Server]) -> None:
    keyless = server_factory(setup.root, tokens_file=setup.tokens_file)
    capability = key().issue(ORGANIZATION, DATASET, 600)[1]
    answer = requests.get(f"{keyless.url}/s/{capability}/data/zarr3/{NAMES}/zarr.json", timeout=30)
    assert answer.status_code == 401 and "accepts no share links" in answer.json()["error"]
    made = requests.post(f"{keyless.url}/share/{NAMES}", headers={"X-Auth-Token": TOKEN}, timeout=30)
    assert made.status_code == 404 and "share_key_file" in made.json()["error"]
    page = requests.get(f"{keyless.url}/data/zarr/{NAMES}/", params={"token": TOKEN}, timeout=120)
    assert page.status_code == 200 and "share-form" not in page.text


def test_a_short_key_or_an_unreadable_revocation_list_stops_start_up(setup: Setup, tmp_path: Path) -> None:
    short = tmp_path / "short.key"
    short.write_text("too short\n")
    unreadable = tmp_path / "revoked-is-a-directory"
    unreadable.mkdir()
    for name, path, words in (
        ("ZARR_GATEWAY_SHARE_KEY_FILE", short, "at least 32"),
        ("ZARR_GATEWAY_SHARE_REVOKED_FILE", unreadable, "revocation list"),
    ):
        env = {**setup.env(), name: str(path), "ZARR_GATEWAY_PORT": "0"}
        command = [sys.executable, "-m", "gateway", "serve"]
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        assert run.returncode != 0 and words in run.stderr and "Traceback" not in run.stderr, run.stderr


# --- through the compose proxy ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def proxy(pair: list[Server], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    started = start_proxy(tmp_path_factory.mktemp("share-nginx"), [address(server) for server in pair])
    yield started
    started.stop()


@pytest.mark.nginx
def test_the_proxy_passes_refuses_and_caches_links_as_the_gateways_decide(
    proxy: Proxy, pair: list[Server], setup: Setup
) -> None:
    made = made_link(pair[0])
    capability = capability_of(made["link"])
    chunk = f"/data/zarr3/{NAMES}/color/1/c/0/0/0/0"
    direct = requests.get(pair[0].url + chunk, headers={"X-Auth-Token": TOKEN}, timeout=30)
    auth_before = sum(line["path"] == "/auth" for server in pair for line in server.access_lines())
    for _ in range(3):
        through = requests.get(f"{proxy.url}/s/{capability}{chunk}", timeout=30)
        assert (through.status_code, through.content) == (200, direct.content), proxy.logs()[-3000:]
    auth_after = sum(line["path"] == "/auth" for server in pair for line in server.access_lines())
    assert auth_after - auth_before == 1, "one check for the link and the dataset, then the proxy's cache"
    other = requests.get(f"{proxy.url}/s/{capability}/data/zarr3/other_org/theirs/zarr.json", timeout=30)
    assert other.status_code == 403
    _, expired = key().issue(ORGANIZATION, DATASET, 60, now=time.time() - 3600)
    assert requests.get(f"{proxy.url}/s/{expired}{chunk}", timeout=30).status_code == 401
    two = requests.get(f"{proxy.url}/s/{capability}{chunk}", headers={"X-Auth-Token": TOKEN}, timeout=30)
    assert two.status_code == 400, two.text
    bare = requests.get(f"{proxy.url}/s/{capability}/", timeout=120)  # the link's start: its dataset's page
    assert bare.status_code == 200 and bare.url == f"{proxy.url}/s/{capability}/data/zarr3/{NAMES}/", bare.url
    viewer = requests.get(f"{proxy.url}/s/{capability}/neuroglancer/v/gateway/", timeout=30)
    assert viewer.status_code in (200, 404), viewer.text[:200]  # checked, and passed on (404 without the extra)
    form = requests.post(
        f"{proxy.url}/t/{TOKEN}/share/{NAMES}",
        data={"expires": "60"},
        headers={"Accept": "application/json"},
        timeout=30,
    )
    assert form.status_code == 201, form.text
    assert form.json()["link"].startswith(f"{proxy.url}/s/s1.")
    assert requests.post(f"{proxy.url}/data/zarr3/", data={"x": "1"}, timeout=30).status_code == 405
    logged = f"/s/{made['id']}{chunk}"
    assert wait_until(lambda: logged in [line["path"] for line in proxy.access_log()], 10), proxy.logs()[-3000:]
    logs = proxy.logs()
    assert capability not in logs and expired not in logs, logs[-3000:]


# --- a browser's walk: every link from the start page, in each credential form ----------------------------------


def _credential_forms(server: Server) -> dict[str, tuple[list[str], dict[str, str], Callable[[str], bool]]]:
    """Per form: where a browser starts (the start page; below a link, which leads to the dataset's page, also the
    precomputed tree the README gives CloudVolume, which no page of one tree links to), the header a script would
    send (a browser sends none), and what every address reached must hold to keep the form (a viewer's own
    address carries a token in its path)."""
    capability = capability_of(made_link(server)["link"])
    in_query, in_path, below_link = f"token={TOKEN}", f"/t/{TOKEN}/", f"/s/{capability}/"
    return {
        "query": (["/?" + in_query], {}, lambda address: in_query in address or address.startswith(in_path)),
        "path": ([in_path], {}, lambda address: address.startswith(in_path)),
        "share link": (
            [below_link, f"{below_link}data/precomputed/"],
            {},
            lambda address: address.startswith(below_link),
        ),
        "header": (["/"], {"X-Auth-Token": TOKEN}, lambda address: TOKEN not in address and "/s/" not in address),
    }


@pytest.mark.slow  # a crawl of every page, listing and document, in four forms
@pytest.mark.parametrize("form", ["query", "path", "share link", "header"])
def test_every_link_a_browser_reaches_from_the_start_page_opens(pair: list[Server], form: str) -> None:
    """From the start page, every page, listing (the precomputed tree's layers, scales and mesh directories too),
    metadata file, preview and viewer address a click reaches answers, in the start page's credential form."""
    from support.crawl import walk

    starts, headers, keeps = _credential_forms(pair[0])[form]
    with requests.Session() as session:
        seen = walk(session, pair[0].url, starts, headers=headers)
    assert not seen.failures(), seen.failures()
    lost = [address for address in seen.statuses if not keeps(address)]
    assert not lost, lost
    reached = {address.partition("?")[0].split("/data/", 1)[-1] for address in seen.statuses}
    deep = {
        f"precomputed/{NAMES}/segmentation/mesh/",
        f"precomputed/{NAMES}/segmentation/1/",
        f"precomputed/{NAMES}/color/info",
        f"zarr3/{NAMES}/color/1/zarr.json",
    }
    if form != "share link":  # a link's start is its dataset's page in one tree
        deep |= {f"zarr/{NAMES}/segmentation/2-2-1/.zarray", f"xarray/{NAMES}/2-2-1/"}
    assert deep <= reached, sorted(reached)


def test_a_new_link_s_id_never_starts_as_an_option_would() -> None:
    """One random id in 64 started with '-', which ``share --revoke ID`` (as the page wrote it) took for an option."""
    ids = [key().issue(ORGANIZATION, DATASET, 60)[0].id for _ in range(3000)]
    assert len(set(ids)) == len(ids)
    assert not [made for made in ids if made.startswith("-")]
    assert {made[0] for made in ids} > {"_", "A", "z", "0"}  # otherwise drawn as before
