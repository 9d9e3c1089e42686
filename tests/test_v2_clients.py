"""The Zarr v2 tree read through real clients (zarr-python, tensorstore, webknossos-libs, UPath) and raw HTTP."""

import json
import re

import numcodecs
import numpy as np
import pytest
import requests
from support.clients import read_webknossos_mags
from support.datasets import LAYERS, MAGS, ORG, TOKEN, WrittenDataset, mag_name
from support.servers import Server

from gateway_storage import LocalStore
from gateway_storage.geometry import Vec3
from wkw_adapter import WkwFileCache, WkwMag

HEADERS = {"X-Auth-Token": TOKEN}
OPTIONS = {"headers": HEADERS}
LAYER_NAMES = [name for name, *_ in LAYERS]
CASES = [pytest.param(layer, mag, id=f"{layer}-{mag_name(mag)}") for layer in LAYER_NAMES for mag in MAGS]


def dataset_url(gateway: Server, tree: str = "zarr") -> str:
    return f"{gateway.url}/data/{tree}/{ORG}/wk_dataset"


def mag_url(gateway: Server, layer: str, mag: tuple[int, int, int]) -> str:
    return f"{dataset_url(gateway)}/{layer}/{mag_name(mag)}"


# --- zarr-python --------------------------------------------------------------------------------


@pytest.mark.parametrize(("layer", "mag"), CASES)
def test_zarr_python_reads_every_mag(gateway: Server, test_data: WrittenDataset, layer: str, mag: Vec3) -> None:
    import zarr

    array = zarr.open_array(mag_url(gateway, layer, mag), mode="r", storage_options=OPTIONS)
    expected = test_data.expected(layer, mag)
    assert array.shape == expected.shape
    assert array.dtype == expected.dtype
    assert np.array_equal(array[...], expected)


@pytest.mark.parametrize("layer", ["color_u8", "rgb", "color_f32"])
def test_zarr_python_reads_a_cut_out(gateway: Server, test_data: WrittenDataset, layer: str) -> None:
    import zarr

    array = zarr.open_array(mag_url(gateway, layer, MAGS[0]), mode="r", storage_options=OPTIONS)
    region = (slice(None), slice(40, 100), slice(30, 77), slice(10, 50))
    expected = test_data.expected(layer, MAGS[0])[region]
    assert expected.any()
    assert np.array_equal(array[region], expected)


def test_zarr_python_opens_the_consolidated_dataset_group(gateway: Server) -> None:
    import zarr

    group = zarr.open_group(
        dataset_url(gateway), mode="r", zarr_format=2, use_consolidated=True, storage_options=OPTIONS
    )
    arrays = {path for path, node in group.members(max_depth=None) if isinstance(node, zarr.Array)}
    assert arrays == {f"{layer}/{mag_name(mag)}" for layer in LAYER_NAMES for mag in MAGS}
    rgb = group[f"rgb/{mag_name(MAGS[1])}"]
    assert isinstance(rgb, zarr.Array) and rgb.shape[0] == 3


# --- tensorstore ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("layer", "mag"), CASES)
def test_tensorstore_reads_every_mag(gateway: Server, test_data: WrittenDataset, layer: str, mag: Vec3) -> None:
    import tensorstore as ts

    spec = {
        "driver": "zarr",
        "kvstore": {
            "driver": "http",
            "base_url": mag_url(gateway, layer, mag) + "/",
            "headers": [f"X-Auth-Token: {TOKEN}"],
        },
    }
    array = ts.open(spec).result()
    assert np.array_equal(array.read().result(), test_data.expected(layer, mag))


# --- webknossos-libs ------------------------------------------------------------------------------


def test_webknossos_libs_reads_every_layer_and_mag(gateway: Server, test_data: WrittenDataset) -> None:
    import webknossos as wk
    from upath import UPath

    dataset = wk.Dataset.open(UPath(dataset_url(gateway), headers=HEADERS))
    assert sorted(dataset.layers) == sorted(LAYER_NAMES)
    for name, dtype, channels, _, category in LAYERS:
        layer = dataset.get_layer(name)
        assert layer.category == category
        assert layer.dtype == np.dtype(dtype)
        assert layer.num_channels == channels
        assert layer.bounding_box == wk.BoundingBox((37, 21, 5), (150, 120, 70))
        if category == "segmentation":
            assert dataset.get_segmentation_layer(name).largest_segment_id == 2**31 - 1
        assert sorted(m.to_tuple() for m in layer.mags) == sorted(MAGS)
        for mag, data, region in read_webknossos_mags(layer):
            assert np.array_equal(data, test_data.expected(name, mag)[region]), f"{name} mag {mag}"


# --- directory semantics (UPath / fsspec) ---------------------------------------------------------


def test_upath_sees_directories(gateway: Server) -> None:
    from upath import UPath

    dataset = UPath(dataset_url(gateway), headers=HEADERS)
    assert dataset.exists() and dataset.is_dir()
    names = {p.name for p in dataset.iterdir()}
    assert set(LAYER_NAMES) <= names
    assert "datasource-properties.json" in names

    layer = UPath(f"{dataset_url(gateway)}/color_u8", headers=HEADERS)
    assert layer.exists() and layer.is_dir()
    assert {mag_name(m) for m in MAGS} <= {p.name for p in layer.iterdir()}

    mag = UPath(f"{dataset_url(gateway)}/color_u8/{mag_name(MAGS[1])}", headers=HEADERS)
    assert mag.exists() and mag.is_dir()
    assert ".zarray" in {p.name for p in mag.iterdir()}

    assert not UPath(f"{dataset_url(gateway)}/no_such_layer", headers=HEADERS).exists()


# --- documents ----------------------------------------------------------------------------------


def test_rewritten_datasource_properties(gateway: Server, test_data: WrittenDataset) -> None:
    response = requests.get(f"{dataset_url(gateway)}/datasource-properties.json", headers=HEADERS, timeout=10)
    assert response.status_code == 200
    document = response.json()
    layers = {layer["name"]: layer for layer in document["dataLayers"]}
    assert set(layers) == set(LAYER_NAMES)
    original = json.loads((test_data.root / ORG / "wk_dataset" / "datasource-properties.json").read_text())
    assert original["dataLayers"][0]["dataFormat"] == "wkw"
    for name, layer in layers.items():
        assert layer["dataFormat"] == "zarr"
        assert "wkwResolutions" not in layer
        assert sorted(tuple(m["mag"]) for m in layer["mags"]) == sorted(MAGS)
        for entry in layer["mags"]:
            assert entry["path"] == f"./{name}/{mag_name(tuple(entry['mag']))}"
    assert layers["segmentation"]["largestSegmentId"] == 2**31 - 1
    assert document["scale"] == original["scale"]


def test_consolidated_metadata_lists_every_layer_and_mag(gateway: Server) -> None:
    response = requests.get(f"{dataset_url(gateway)}/.zmetadata", headers=HEADERS, timeout=10)
    assert response.status_code == 200
    metadata = response.json()["metadata"]
    for layer in LAYER_NAMES:
        assert "multiscales" in metadata[f"{layer}/.zattrs"]
        for mag in MAGS:
            zarray = metadata[f"{layer}/{mag_name(mag)}/.zarray"]
            direct = requests.get(f"{mag_url(gateway, layer, mag)}/.zarray", headers=HEADERS, timeout=10).json()
            assert zarray == direct
            assert zarray["zarr_format"] == 2


# --- HTTP details ---------------------------------------------------------------------------------

CHUNK = "color_u8/1/0.2.2.1"
ROUTES = {
    "index": "/",
    "tree": "/data/zarr/",
    "organization": f"/data/zarr/{ORG}/",
    "dataset": f"/data/zarr/{ORG}/wk_dataset/",
    "properties": f"/data/zarr/{ORG}/wk_dataset/datasource-properties.json",
    "dataset_zgroup": f"/data/zarr/{ORG}/wk_dataset/.zgroup",
    "dataset_zmetadata": f"/data/zarr/{ORG}/wk_dataset/.zmetadata",
    "layer": f"/data/zarr/{ORG}/wk_dataset/color_u8/",
    "layer_zattrs": f"/data/zarr/{ORG}/wk_dataset/color_u8/.zattrs",
    "mag": f"/data/zarr/{ORG}/wk_dataset/color_u8/1/",
    "zarray": f"/data/zarr/{ORG}/wk_dataset/color_u8/1/.zarray",
    "chunk": f"/data/zarr/{ORG}/wk_dataset/{CHUNK}",
    "masked_chunk": f"/data/zarr/{ORG}/wk_dataset/color_u16/2-2-1/0.1.0.0",
    "v3_zarr_json": f"/data/zarr3/{ORG}/wk_dataset/color_u8/1/zarr.json",
}


def test_content_types(gateway: Server) -> None:
    def content_type(route: str) -> str:
        response = requests.get(gateway.url + ROUTES[route], headers=HEADERS, timeout=10)
        assert response.status_code == 200, route
        return response.headers["Content-Type"].split(";")[0].strip()

    for route in ("chunk", "masked_chunk"):
        assert content_type(route) == "application/octet-stream"
    for route in ("properties", "dataset_zgroup", "dataset_zmetadata", "layer_zattrs", "zarray", "v3_zarr_json"):
        assert content_type(route) == "application/json"
    for route in ("tree", "organization", "dataset", "layer", "mag"):
        assert content_type(route) == "text/html"


@pytest.mark.parametrize("route", list(ROUTES))
def test_head_matches_get(gateway: Server, route: str) -> None:
    got = requests.get(gateway.url + ROUTES[route], headers=HEADERS, timeout=10)
    head = requests.head(gateway.url + ROUTES[route], headers=HEADERS, timeout=10)
    assert got.status_code == head.status_code == 200
    assert got.content
    assert head.content == b""
    assert int(head.headers["Content-Length"]) == len(got.content)
    assert head.headers["Content-Type"] == got.headers["Content-Type"]
    if "ETag" in got.headers:
        assert head.headers["ETag"] == got.headers["ETag"]


def _check_cors(response: requests.Response) -> None:
    assert response.headers["Access-Control-Allow-Origin"] == "*"
    exposed = {h.strip().lower() for h in response.headers["Access-Control-Expose-Headers"].split(",")}
    assert {"content-length", "content-range", "etag"} <= exposed


def test_cors_on_success_and_error(gateway: Server) -> None:
    origin = {"Origin": "https://viewer.example"}
    ok = requests.get(gateway.url + ROUTES["chunk"], headers={**HEADERS, **origin}, timeout=10)
    assert ok.status_code == 200
    _check_cors(ok)
    ranged = requests.get(
        gateway.url + ROUTES["chunk"], headers={**HEADERS, **origin, "Range": "bytes=0-9"}, timeout=10
    )
    assert ranged.status_code == 206
    _check_cors(ranged)
    for url, headers in [
        (gateway.url + ROUTES["chunk"], origin),  # 401: no token
        (f"{dataset_url(gateway)}/color_u8/1/0.0.0.0", {**HEADERS, **origin}),  # 404: outside the bbox
        (f"{dataset_url(gateway)}/color_u8/1/0.x.0.0", {**HEADERS, **origin}),  # 400
    ]:
        error = requests.get(url, headers=headers, timeout=10)
        assert error.status_code >= 400
        _check_cors(error)


def test_cors_preflight(gateway: Server) -> None:
    response = requests.options(
        gateway.url + ROUTES["chunk"],
        headers={
            "Origin": "https://viewer.example",
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "range, x-auth-token",
        },
        timeout=10,
    )
    assert 200 <= response.status_code < 300
    assert response.headers["Access-Control-Allow-Origin"] in ("*", "https://viewer.example")
    assert "GET" in response.headers["Access-Control-Allow-Methods"]
    allowed = {h.strip().lower() for h in response.headers["Access-Control-Allow-Headers"].split(",")}
    assert {"range", "x-auth-token"} <= allowed


# --- compressed pass-through --------------------------------------------------------------------


def test_passthrough_chunk_carries_the_stored_lz4_block(gateway: Server, test_data: WrittenDataset) -> None:
    import wkw

    mag_dir = test_data.mag_dir("color_u8", MAGS[0])
    stored = WkwMag(str(mag_dir), WkwFileCache(LocalStore())).stored_block((2, 2, 1))
    assert stored is not None and stored.block_type.compressed
    response = requests.get(f"{dataset_url(gateway)}/{CHUNK}", headers=HEADERS, timeout=10)
    assert response.status_code == 200
    body = response.content
    assert body[24:] == stored.data, "the stored LZ4 block is not passed through unchanged at offset 24"
    decoded = np.frombuffer(numcodecs.Blosc().decode(body), dtype=np.uint8).reshape((1, 32, 32, 32), order="F")
    with wkw.Dataset.open(str(mag_dir)) as dataset:
        truth = dataset.read((64, 64, 32), (32, 32, 32))
    assert np.array_equal(decoded, truth)


# --- the other version's metadata names are plain 404s -----------------------------------------


@pytest.mark.parametrize("level", ["", "/color_u8", "/color_u8/1"])
def test_v2_tree_has_no_zarr_json(gateway: Server, level: str) -> None:
    response = requests.get(f"{dataset_url(gateway)}{level}/zarr.json", headers=HEADERS, timeout=10)
    assert response.status_code == 404
    assert "error" in response.json()


@pytest.mark.parametrize("name", [".zarray", ".zgroup", ".zattrs", ".zmetadata"])
@pytest.mark.parametrize("level", ["", "/color_u8", "/color_u8/1"])
def test_v3_tree_has_no_v2_metadata(gateway: Server, level: str, name: str) -> None:
    response = requests.get(f"{dataset_url(gateway, 'zarr3')}{level}/{name}", headers=HEADERS, timeout=10)
    assert response.status_code == 404
    assert "error" in response.json()


def test_listing_links_are_absolute_and_complete(gateway: Server) -> None:
    page = requests.get(f"{dataset_url(gateway)}/color_u8/", headers=HEADERS, timeout=10).text
    links = set(re.findall(r'href="([^"]+)"', page))
    base = f"/data/zarr/{ORG}/wk_dataset/color_u8/"
    assert {base + mag_name(m) + "/" for m in MAGS} <= links
    assert base + ".zattrs" in links
