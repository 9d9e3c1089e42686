"""Each level of every tree answers exactly the names that belong there and 404 for the rest.

Every level of the zarr, zarr3 and xarray trees of the test dataset (tree root, organization,
dataset, every group, every array) is asked for every metadata name of both Zarr versions: where a
name belongs it is a 200 with the right document, everywhere else a JSON 404 (never 400, never 200),
because clients probe for the other version's names and only a 404 means "missing". The HTML listing
of each level, read through fsspec's HTTP filesystem, links exactly those names and the children.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import fsspec
import pytest
import requests
import zarr
from support.datasets import LAYERS, MAGS, ORG, TOKEN, bbox_at_mag, mag_name
from support.datasets import WrittenDataset as Data
from support.servers import Server
from support.tree_names import BELONGS, LEVELS, METADATA, PROPERTIES

DATASET = "wk_dataset"
HEADERS = {"X-Auth-Token": TOKEN}
LAYER_NAMES = [layer[0] for layer in LAYERS]
CHANNELS = {layer[0]: layer[2] for layer in LAYERS}
DTYPES = {layer[0]: layer[1] for layer in LAYERS}
MULTI_CHANNEL = [name for name, channels in CHANNELS.items() if channels > 1]


@dataclass(frozen=True)
class Node:
    """One level of a tree: its URL path below ``/data/``, its level, and what is expected of it."""

    tree: str
    level: str
    parts: tuple[str, ...]
    children: frozenset[str]
    layer: str | None = None  # layer trees: the layer of a group or array; xarray: the variable's layer
    mag: tuple[int, int, int] | None = None

    @property
    def path(self) -> str:
        return "/".join(("data", self.tree, *self.parts)) + "/"

    def __str__(self) -> str:
        return self.path


def grid(mag: tuple[int, int, int]) -> tuple[int, int, int]:
    """The served extent of every layer at ``mag``: all layers share the bounding box in the test data."""
    return bbox_at_mag(mag)[1]


def walk(tree: str) -> Iterator[Node]:
    """Every node of ``tree`` over the test dataset, derived from what support.datasets wrote."""
    mags = [mag_name(m) for m in MAGS]
    yield Node(tree, "tree", (), frozenset({ORG}))  # the token grants only its own organization
    yield Node(tree, "organization", (ORG,), frozenset({DATASET}))  # broken_dataset is listed without a link
    if tree == "xarray":
        yield Node(tree, "dataset", (ORG, DATASET), frozenset(mags))
        variables = {*LAYER_NAMES, "x", "y", "z", *(f"c_{name}" for name in MULTI_CHANNEL)}
        for mag in MAGS:
            yield Node(tree, "group", (ORG, DATASET, mag_name(mag)), frozenset(variables), mag=mag)
            for variable in sorted(variables):
                layer = variable if variable in LAYER_NAMES else None
                yield Node(tree, "array", (ORG, DATASET, mag_name(mag), variable), frozenset(), layer, mag)
        return
    yield Node(tree, "dataset", (ORG, DATASET), frozenset(LAYER_NAMES))
    for layer in LAYER_NAMES:
        yield Node(tree, "group", (ORG, DATASET, layer), frozenset(mags), layer)
        for mag in MAGS:
            yield Node(tree, "array", (ORG, DATASET, layer, mag_name(mag)), frozenset(), layer, mag)


# --- what each document must say -----------------------------------------------------------------


def check_v2(node: Node, name: str, document: dict[str, Any]) -> None:
    if name == ".zgroup":
        assert document == {"zarr_format": 2}
    elif name == ".zarray":
        assert node.layer is not None and node.mag is not None
        assert document["zarr_format"] == 2
        assert document["shape"] == [CHANNELS[node.layer], *grid(node.mag)]
        assert document["chunks"] == [CHANNELS[node.layer], 32, 32, 32]
        assert document["order"] == "F"
    elif name == ".zattrs" and node.level == "dataset":
        assert document == {}
    elif name == ".zattrs" and node.level == "group":
        (multiscale,) = document["multiscales"]
        assert multiscale["version"] == "0.4" and multiscale["name"] == node.layer
        assert [d["path"] for d in multiscale["datasets"]] == [mag_name(m) for m in MAGS]
        assert "_ARRAY_DIMENSIONS" not in document
    elif name == ".zattrs":
        assert document["_ARRAY_DIMENSIONS"] == ["c", "x", "y", "z"]
    elif name == ".zmetadata":
        assert document["zarr_consolidated_format"] == 1
        metadata = document["metadata"]
        prefixes = [f"{layer}/" for layer in LAYER_NAMES] if node.level == "dataset" else [""]
        expected = {f"{p}{mag_name(m)}/{f}" for p in prefixes for m in MAGS for f in (".zarray", ".zattrs")}
        expected |= {f"{p}{f}" for p in {"", *prefixes} for f in (".zgroup", ".zattrs")}  # "": the dataset group
        assert set(metadata) == expected
        for prefix in prefixes:
            for mag in MAGS:
                assert metadata[f"{prefix}{mag_name(mag)}/.zattrs"]["_ARRAY_DIMENSIONS"] == ["c", "x", "y", "z"]
                assert metadata[f"{prefix}{mag_name(mag)}/.zarray"]["zarr_format"] == 2
            assert metadata[f"{prefix}.zattrs"]["multiscales"][0]["version"] == "0.4"
    else:
        raise AssertionError(f"no check for {name}")


def check_properties(node: Node, document: dict[str, Any]) -> None:
    assert [layer["name"] for layer in document["dataLayers"]] == LAYER_NAMES
    data_format = "zarr" if node.tree == "zarr" else "zarr3"
    for layer in document["dataLayers"]:
        assert layer["dataFormat"] == data_format
        assert [entry["path"] for entry in layer["mags"]] == [f"./{layer['name']}/{mag_name(m)}" for m in MAGS]


def check_v3(node: Node, document: dict[str, Any]) -> None:
    assert document["zarr_format"] == 3
    if node.level in ("dataset", "group"):
        assert document["node_type"] == "group"
        # every v3 group consolidates what lies below it, so that clients that cannot list find it all
        consolidated = document["consolidated_metadata"]
        assert consolidated["kind"] == "inline" and consolidated["must_understand"] is False
        members = consolidated["metadata"]
        if node.tree != "xarray" and node.level == "group":
            assert document["attributes"]["ome"]["version"] == "0.5"
        if node.level == "dataset":
            assert set(members) == set(node.children) | {
                f"{child}/{sub}" for child in node.children for sub in _subs(node, child)
            }
        else:
            assert set(members) == set(node.children)
        return
    assert document["node_type"] == "array"
    if node.tree != "xarray":
        assert node.layer is not None and node.mag is not None
        assert document["dimension_names"] == ["c", "x", "y", "z"]
        assert document["shape"] == [CHANNELS[node.layer], *grid(node.mag)]
        return
    variable = node.parts[-1]
    assert node.mag is not None
    if node.layer is None:  # a coordinate
        assert document["dimension_names"] == [variable]
        assert document["data_type"] == "float64"
        length = {"x": 0, "y": 1, "z": 2}
        expected = grid(node.mag)[length[variable]] if variable in length else CHANNELS[variable[2:]]
        assert document["shape"] == [expected]
    elif CHANNELS[node.layer] > 1:
        assert document["dimension_names"] == [f"c_{node.layer}", "x", "y", "z"]
        assert document["shape"] == [CHANNELS[node.layer], *grid(node.mag)]
    else:
        assert document["dimension_names"] == ["x", "y", "z"]
        assert document["shape"] == list(grid(node.mag))
    if node.layer is not None:
        assert document["data_type"] == DTYPES[node.layer]
        assert document["attributes"]["long_name"] == node.layer


def _subs(node: Node, child: str) -> set[str]:
    """The members of a child group, as the dataset's consolidated metadata names them."""
    if node.tree != "xarray":
        return {mag_name(m) for m in MAGS}
    return {*LAYER_NAMES, "x", "y", "z", *(f"c_{name}" for name in MULTI_CHANNEL)}


def check_document(node: Node, name: str, document: dict[str, Any]) -> None:
    if name == PROPERTIES:
        check_properties(node, document)
    elif node.tree == "zarr":
        check_v2(node, name, document)
    else:
        check_v3(node, document)


# --- the tests ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    with requests.Session() as http:
        http.headers.update(HEADERS)
        yield http


@pytest.mark.parametrize("tree", list(BELONGS))
def test_every_level_answers_its_names_and_404_for_the_rest(
    gateway: Server, test_data: Data, session: requests.Session, tree: str
) -> None:
    nodes = list(walk(tree))
    assert {node.level for node in nodes} == set(LEVELS)
    answered = 0
    for node in nodes:
        belongs = BELONGS[tree][node.level]
        for name in METADATA:
            response = session.get(f"{gateway.url}/{node.path}{name}")
            where = f"{node}{name}"
            head = session.head(f"{gateway.url}/{node.path}{name}")  # what fsspec's info() and exists() ask
            assert head.status_code == response.status_code, where
            assert head.headers["content-length"] == str(len(response.content)), where
            if name in belongs:
                assert response.status_code == 200, f"{where}: {response.status_code} {response.text}"
                assert response.headers["content-type"].startswith("application/json"), where
                check_document(node, name, response.json())
                answered += 1
            else:
                assert response.status_code == 404, f"{where}: {response.status_code} {response.text}"
                assert response.headers["content-type"].startswith("application/json"), where
                body = response.json()
                assert body["status"] == 404 and name in body["error"], f"{where}: {body}"
    assert answered == sum(len(BELONGS[tree][node.level]) for node in nodes)


@pytest.mark.parametrize("tree", list(BELONGS))
def test_listings_link_exactly_the_names_and_children(gateway: Server, tree: str) -> None:
    """fsspec's HTTP filesystem (what zarr-python lists with) sees the table's names and the children."""
    fs = fsspec.filesystem("http", headers=HEADERS, skip_instance_cache=True)
    for node in walk(tree):
        url = f"{gateway.url}/{node.path}"
        listed = {entry.removeprefix(url).rstrip("/") for entry in fs.ls(url, detail=False)}
        expected = BELONGS[tree][node.level] | node.children
        assert listed == expected, f"{node}: listed {sorted(listed)}, expected {sorted(expected)}"
        for entry in fs.ls(url, detail=True):  # directories end in "/", files are files
            assert entry["type"] == ("directory" if entry["name"].endswith("/") else "file"), entry


@pytest.mark.filterwarnings("ignore:Object at datasource-properties.json is not recognized")
@pytest.mark.parametrize("consolidated", [True, False], ids=["consolidated", "listed"])
@pytest.mark.parametrize("tree", ["zarr", "zarr3", "xarray"])
def test_zarr_python_walks_the_same_tree(gateway: Server, tree: str, consolidated: bool) -> None:
    """zarr-python finds the same groups and arrays from the consolidated metadata and from the listings."""
    url = f"{gateway.url}/data/{tree}/{ORG}/{DATASET}"
    zarr_format: Literal[2, 3] = 2 if tree == "zarr" else 3
    group = zarr.open_group(
        url, mode="r", zarr_format=zarr_format, use_consolidated=consolidated, storage_options={"headers": HEADERS}
    )
    members = dict(group.members(max_depth=None))
    expected = {"/".join(node.parts[2:]): node.level for node in walk(tree) if node.level in ("group", "array")}
    assert set(members) == set(expected)
    for path, member in members.items():
        kind = zarr.Group if expected[path] == "group" else zarr.Array
        assert isinstance(member, kind), path


def _members_below(tree: str, node: Node) -> dict[str, str]:
    """Every group and array below ``node``, by path relative to it, with its level."""
    depth = len(node.parts)
    return {
        "/".join(below.parts[depth:]): below.level
        for below in walk(tree)
        if below.level in ("group", "array") and below.parts[:depth] == node.parts and len(below.parts) > depth
    }


@pytest.mark.filterwarnings("ignore:Object at datasource-properties.json is not recognized")
@pytest.mark.parametrize("tree", ["zarr", "zarr3", "xarray"])
def test_clients_that_cannot_list_find_every_member(gateway: Server, tree: str) -> None:
    """zarr-python over obstore's HTTPStore cannot list (it would send WebDAV PROPFIND, answered 405): every
    group of every tree names its members in consolidated metadata, so members() finds them all."""
    from obstore.store import HTTPStore
    from zarr.storage import ObjectStore

    zarr_format: Literal[2, 3] = 2 if tree == "zarr" else 3
    groups = [node for node in walk(tree) if node.level in ("dataset", "group")]
    assert len(groups) == 1 + (len(MAGS) if tree == "xarray" else len(LAYER_NAMES))
    for node in groups:
        store = HTTPStore.from_url(
            f"{gateway.url}/{node.path}", client_options={"allow_http": True, "default_headers": HEADERS}
        )
        group = zarr.open_group(ObjectStore(store, read_only=True), mode="r", zarr_format=zarr_format)
        members = dict(group.members(max_depth=None))
        expected = _members_below(tree, node)
        assert set(members) == set(expected), node
        for path, member in members.items():
            assert isinstance(member, zarr.Group if expected[path] == "group" else zarr.Array), f"{node}{path}"
        # plain zarr-python (fsspec HTTP) takes the same members from the group's own document, unlisted
        plain = zarr.open_group(
            f"{gateway.url}/{node.path}",
            mode="r",
            zarr_format=zarr_format,
            use_consolidated=True,
            storage_options={"headers": HEADERS},
        )
        assert set(dict(plain.members(max_depth=None))) == set(expected), node


def test_organization_listing_names_the_broken_dataset_with_its_reason(gateway: Server) -> None:
    page = requests.get(f"{gateway.url}/data/zarr/{ORG}/", headers=HEADERS, timeout=10).text
    assert "broken_dataset/ &mdash; unavailable:" in page
    assert 'href="/data/zarr/test_org/broken_dataset/' not in page


XARRAY_VARIABLES = [*LAYER_NAMES, "x", "y", "z", *(f"c_{name}" for name in MULTI_CHANNEL)]
MAG_NAMES = [mag_name(m) for m in MAGS]


@pytest.mark.parametrize(
    ("path", "says", "lists"),
    [
        (f"xarray/{ORG}/{DATASET}/8/zarr.json", "no mag '8' in test_org/wk_dataset; there are ", MAG_NAMES),
        (f"xarray/{ORG}/{DATASET}/8/", "no mag '8' in test_org/wk_dataset; there are ", MAG_NAMES),
        (f"xarray/{ORG}/{DATASET}/2-2-1/nope/zarr.json", "no variable 'nope' in mag '2-2-1'", XARRAY_VARIABLES),
        (f"xarray/{ORG}/{DATASET}/2-2-1/nope/c/0/0/0", "no variable 'nope' in mag '2-2-1'", XARRAY_VARIABLES),
        (f"xarray/{ORG}/{DATASET}/color_u8/zarr.json", "no mag 'color_u8' in test_org/wk_dataset", MAG_NAMES),
        (f"zarr3/{ORG}/{DATASET}/nope/zarr.json", "no layer 'nope' in test_org/wk_dataset; there are ", LAYER_NAMES),
        (f"zarr/{ORG}/{DATASET}/color_u8/8/.zarray", "no mag '8' in layer 'color_u8'; there are ", MAG_NAMES),
    ],
)
def test_unknown_names_are_404_naming_what_exists(gateway: Server, path: str, says: str, lists: list[str]) -> None:
    response = requests.get(f"{gateway.url}/data/{path}", headers=HEADERS, timeout=10)
    assert response.status_code == 404, response.text
    message = response.json()["error"]
    assert says in message
    named = message.split("there are ", 1)[1].split(" (")[0]
    assert sorted(named.split(", ")) == sorted(lists), message


def test_the_long_form_of_an_isotropic_mag_is_the_same_array(gateway: Server, session: requests.Session) -> None:
    base = f"{gateway.url}/data/zarr/{ORG}/{DATASET}/color_u8"
    short, long = session.get(f"{base}/1/.zarray"), session.get(f"{base}/1-1-1/.zarray")
    assert (short.status_code, long.status_code) == (200, 200)
    assert short.json() == long.json()
