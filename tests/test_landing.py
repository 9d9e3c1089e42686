"""The landing page at ``/`` and at each tree's root: the datasets a token may read, grouped by organization, each
with a thumbnail, its layers and links to its page and to the viewer; still exactly the listing for fsspec.

Pages come from real gateways on loopback ports (the session's data root with tokens, and the sample, open);
they are parsed with html.parser, listed with fsspec's HTTP filesystem, and the sample's landing page is opened
in headless Chromium, its thumbnails loaded, and a screenshot kept.
"""

import json
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote, unquote

import fsspec
import pytest
import requests
from support.browser import Browser
from support.datasets import LAYERS, ORG, OTHER_TOKEN, TOKEN, WrittenDataset
from support.servers import Server
from support.viewer import state_sources

from gateway.http.pages import viewer
from gateway.sample import DATASET, ORGANIZATION

TREES = ("zarr", "zarr3", "xarray")
ROOT_TREES = (*TREES, "precomputed", "precomputed_raw")  # what the start page lists: the precomputed trees too


class Landing(HTMLParser):
    """What a landing page holds: its child links, and per organization the cards of its datasets."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.children: list[str] = []
        self.organizations: dict[str, dict[str, dict[str, object]]] = {}
        self.notes: list[str] = []
        self._in_children = False
        self._organization: str | None = None
        self._card: dict[str, object] | None = None
        self._note = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {name: value or "" for name, value in attrs}
        classes = found.get("class", "").split()
        if tag == "ul" and "children" in classes:
            self._in_children = True
        elif tag == "a" and self._in_children:
            self.children.append(found["href"])
        elif tag == "section" and "organization" in classes:
            self._organization = found["data-organization"]
            self.organizations[self._organization] = {}
        elif tag == "li" and "dataset" in classes and self._organization is not None:
            self._card = {"layers": [], "links": {}, "thumbnail": None, "unusable": "unusable" in classes}
            self.organizations[self._organization][found["data-dataset"]] = self._card
        elif self._card is not None and tag == "img":
            self._card["thumbnail"] = found["src"]
        elif self._card is not None and tag == "a":
            links = self._card["links"]
            assert isinstance(links, dict)
            links[found["class"]] = found["href"]
        elif self._card is not None and tag == "li":
            layers = self._card["layers"]
            assert isinstance(layers, list)
            layers.append(found["class"].removeprefix("layer-"))
        elif tag == "p" and "token-note" in classes:
            self._note = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "ul" and self._in_children:
            self._in_children = False
        elif tag == "p":
            self._note = False

    def handle_data(self, data: str) -> None:
        if self._note:
            self.notes.append(data)


def landing(server: Server, path: str, headers: dict[str, str] | None = None) -> Landing:
    answer = requests.get(server.url + path, headers=headers or {}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "text/html; charset=utf-8"
    page = Landing()
    page.feed(answer.text)
    return page


def fsspec_children(server: Server, path: str, headers: dict[str, str] | None = None) -> set[str]:
    filesystem = fsspec.filesystem("http", headers=headers or {}, skip_instance_cache=True)
    url = server.url + path
    return {entry.removeprefix(url).rstrip("/") for entry in filesystem.ls(url, detail=False)}


@pytest.fixture(scope="module")
def open_sample(sample_root: Path, server_factory: Callable[..., Server]) -> Server:
    return server_factory(sample_root)


# --- still the listing for clients ----------------------------------------------------------------------------


def test_fsspec_lists_exactly_the_trees_at_the_root(gateway: Server, open_sample: Server) -> None:
    trees = {f"data/{tree}" for tree in ROOT_TREES}
    assert fsspec_children(open_sample, "/") == trees
    for headers in ({}, {"X-Auth-Token": TOKEN}):
        assert fsspec_children(gateway, "/", headers) == trees


@pytest.mark.parametrize("tree", TREES)
def test_fsspec_lists_exactly_the_organizations_at_a_tree_root(
    gateway: Server, open_sample: Server, test_data: WrittenDataset, tree: str
) -> None:
    assert fsspec_children(gateway, f"/data/{tree}/", {"X-Auth-Token": TOKEN}) == {ORG}
    assert fsspec_children(gateway, f"/data/{tree}/", {"X-Auth-Token": OTHER_TOKEN}) == {"other_org"}
    assert fsspec_children(open_sample, f"/data/{tree}/") == {ORGANIZATION}
    # the cards below link to datasets, previews and the viewer; none of those is a child
    page = landing(gateway, f"/data/{tree}/", {"X-Auth-Token": TOKEN})
    assert page.children == [f"/data/{tree}/{ORG}/"]
    assert set(page.organizations[ORG]) == {"wk_dataset", "broken_dataset"}


# --- what it shows -------------------------------------------------------------------------------------------


def test_the_root_shows_the_datasets_the_token_may_read(gateway: Server) -> None:
    encoded = quote(TOKEN, safe="")
    page = landing(gateway, f"/?token={encoded}")
    assert page.children == [f"/data/{tree}/?token={encoded}" for tree in ROOT_TREES]  # the page's credential form
    assert list(page.organizations) == [ORG]  # not other_org
    cards = page.organizations[ORG]
    assert cards["broken_dataset"]["unusable"] and not cards["broken_dataset"]["links"]
    card = cards["wk_dataset"]
    assert card["thumbnail"] == f"/preview/{ORG}/wk_dataset/color_u8.png?token={encoded}"  # the first image layer
    assert card["layers"] == [category for *_, category in LAYERS], card
    links = card["links"]
    assert isinstance(links, dict)
    assert links["dataset-page"] == f"/data/zarr/{ORG}/wk_dataset/?token={encoded}"
    viewer_link = str(links["open-neuroglancer"])
    assert viewer_link.startswith(f"/t/{encoded}{viewer.PAGE}#!"), viewer_link
    state = json.loads(unquote(viewer_link.partition("#!")[2]))
    sources = state_sources(state)
    assert sources and all(f"/t/{encoded}/data/" in source for source in sources), sources
    assert any("This page was opened with a token" in note for note in page.notes)

    other = landing(gateway, "/", {"X-Auth-Token": OTHER_TOKEN})
    assert list(other.organizations) == ["other_org"] and set(other.organizations["other_org"]) == {"theirs"}
    assert "token=" not in json.dumps(other.organizations)  # a header token goes into no link


def test_the_root_without_a_token_shows_the_trees_and_says_how_to_see_more(gateway: Server) -> None:
    page = landing(gateway, "/")
    assert page.children == [f"/data/{tree}/" for tree in ROOT_TREES]
    assert page.organizations == {}
    assert any("token" in note for note in page.notes), page.notes
    assert requests.get(gateway.url + "/", headers={"X-Auth-Token": "not-a-token"}, timeout=30).status_code == 401
    assert requests.get(gateway.url + "/data/zarr/", timeout=30).status_code == 401  # as before


def test_a_tree_root_links_the_pages_of_its_own_tree(gateway: Server) -> None:
    page = landing(gateway, "/data/zarr3/", {"X-Auth-Token": TOKEN})
    links = page.organizations[ORG]["wk_dataset"]["links"]
    assert isinstance(links, dict)
    assert links["dataset-page"] == f"/data/zarr3/{ORG}/wk_dataset/"
    state = json.loads(unquote(str(links["open-neuroglancer"]).partition("#!")[2]))
    assert state["layers"][0]["source"].startswith("zarr3://"), state


@pytest.mark.browser
def test_the_landing_page_in_the_browser(browser: Browser, open_sample: Server, tmp_path: Path) -> None:
    with browser.page() as page:
        page.navigate(open_sample.url + "/")
        page.wait_for("[...document.images].length > 0 && [...document.images].every(i => i.complete)", timeout=60)
        shot = page.screenshot(tmp_path / "landing.png")
        print(f"landing page: screenshot {shot}")
        thumbnails = page.evaluate(
            "[...document.querySelectorAll('img.thumbnail')].map(i => [i.naturalWidth, i.getAttribute('src')])"
        )
        cards = page.evaluate("[...document.querySelectorAll('li.dataset')].map(li => li.dataset.dataset)")
        viewer_links = page.evaluate(
            "[...document.querySelectorAll('li.dataset a.open-neuroglancer')].map(a => a.href)"
        )
    assert cards == [DATASET]
    assert thumbnails == [[thumbnails[0][0], f"/preview/{ORGANIZATION}/{DATASET}/color.png"]] and thumbnails[0][0] > 0
    assert viewer_links and viewer_links[0].startswith(open_sample.url + viewer.PAGE + "#!")
