"""Malformed requests, paths that try to leave the root, broken datasets and corrupt WKW files.

Every error is a 4xx/5xx with a JSON body ``{"error": ...}``, storage faults are never 404 or
200, and the server keeps serving afterwards.
"""

import http.client
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import numcodecs
import numpy as np
import pytest
import requests
from support.datasets import LAYERS, ORG, TOKEN, WrittenDataset
from support.servers import Server

from gateway_storage import LocalStore
from wkw_adapter import BlockDecodeError, StoredBlock, WkwFileCache, WkwMag, decompress_block

HEADERS = {"X-Auth-Token": TOKEN}
DATASET = f"/data/zarr/{ORG}/wk_dataset"
SECRET = "TOP-SECRET-OUTSIDE-THE-ROOT"


def get(server: Server, path: str, headers: dict[str, str] | None = None) -> requests.Response:
    return requests.get(server.url + path, headers=HEADERS if headers is None else headers, timeout=10)


def raw_get(server: Server, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """A GET whose path reaches the server byte for byte (no client-side normalisation of ``..``)."""
    url = urlsplit(server.url)
    assert url.hostname is not None
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    try:
        connection.request("GET", path, headers=HEADERS if headers is None else headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def assert_error(response: requests.Response, status: int | tuple[int, ...], *words: str) -> str:
    """The answer is one of ``status`` with a JSON error body that mentions every word; returns the message."""
    statuses = (status,) if isinstance(status, int) else status
    assert response.status_code in statuses, (response.status_code, response.text[:300])
    assert response.headers["Content-Type"].startswith("application/json")
    message = response.json()["error"]
    assert isinstance(message, str) and message
    for word in words:
        assert word in message, (word, message)
    return message


def assert_server_error(response: requests.Response) -> str:
    assert 500 <= response.status_code < 600, (response.status_code, response.content[:200])
    return assert_error(response, response.status_code)


def decode_chunk(body: bytes, dtype: str, channels: int, edge: int = 32) -> np.ndarray:
    raw = numcodecs.Blosc().decode(body)
    return np.frombuffer(raw, dtype=dtype).reshape((channels, edge, edge, edge), order="F")


def expected_chunk(test_data: WrittenDataset, layer: str, index: tuple[int, int, int], edge: int = 32) -> np.ndarray:
    whole = test_data.expected(layer, (1, 1, 1))
    out = np.zeros((whole.shape[0], edge, edge, edge), dtype=whole.dtype)
    part = whole[(slice(None), *(slice(i * edge, (i + 1) * edge) for i in index))]
    out[(slice(None), *(slice(0, s) for s in part.shape[1:]))] = part
    return out


def assert_good_chunk(
    server: Server, test_data: WrittenDataset, path: str, layer: str, index: tuple[int, int, int]
) -> None:
    response = get(server, f"{path}/{layer}/1/0.{index[0]}.{index[1]}.{index[2]}")
    assert response.status_code == 200, response.text[:300]
    dtype = next(d for name, d, *_ in LAYERS if name == layer)
    channels = next(c for name, _, c, *_ in LAYERS if name == layer)
    assert np.array_equal(decode_chunk(response.content, dtype, channels), expected_chunk(test_data, layer, index))


# --- malformed and out-of-range keys --------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "0.1.2",
        "0.1.2.3.4",
        "0.a.1.1",
        "-1.0.0.0",
        "0.1.1." + "1" * 30,
        "0..1.1",
        "0.1.1.1.",
        "0.+1.1.1",
        "0.1e1.1.1",
        quote("0.\u0661.1.1"),  # ARABIC-INDIC DIGIT ONE: str.isdigit() but not an index
    ],
)
def test_malformed_v2_key_is_400(gateway: Server, key: str) -> None:
    assert_error(get(gateway, f"{DATASET}/color_u8/1/{key}"), 400, "chunk key")


@pytest.mark.parametrize("key", ["c/0/1/2", "0/0/1/1/1", "c/0/a/1/1", "c/-1/0/0/0", "c/0/1/1/" + "9" * 30])
def test_malformed_v3_key_is_400(gateway: Server, key: str) -> None:
    assert_error(get(gateway, f"/data/zarr3/{ORG}/wk_dataset/color_u8/1/{key}"), 400, "chunk key")


@pytest.mark.parametrize(
    ("layer", "key", "axis"),
    [
        ("color_u8", "1.2.2.1", "c"),
        ("rgb", "1.2.2.1", "c"),  # three channels, all in chunk 0 along c
        ("color_u8", "0.99.0.0", "x"),
        ("color_u8", "0.0.5.0", "y"),  # 141 voxels: chunks 0..4
        ("color_f32", "0.2.2.3", "z"),  # 75 voxels: chunks 0..2
        ("color_u8", "0.1.2." + "9" * 18, "z"),
    ],
)
def test_chunk_index_past_the_array_is_404(gateway: Server, layer: str, key: str, axis: str) -> None:
    assert_error(get(gateway, f"{DATASET}/{layer}/1/{key}"), 404, f"axis {axis}")
    v3_key = "c/" + key.replace(".", "/")
    assert_error(get(gateway, f"/data/zarr3/{ORG}/wk_dataset/{layer}/1/{v3_key}"), 404, f"axis {axis}")


def test_chunk_outside_the_bounding_box_is_404(gateway: Server) -> None:
    assert_error(get(gateway, f"{DATASET}/color_u8/1/0.0.0.0"), 404, "bounding box")
    assert_error(get(gateway, f"/data/zarr3/{ORG}/wk_dataset/color_u8/1/c/0/0/0/0"), 404, "bounding box")
    assert_error(get(gateway, f"{DATASET}/color_u8/1/0.0.4.2"), 404, "bounding box")  # x 0..32 < 37
    # a corner chunk that overlaps the bbox by a few voxels is served
    assert get(gateway, f"{DATASET}/color_u8/1/0.5.0.0").status_code == 200


# --- unknown names --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "named"),
    [
        (f"/data/zarr/{ORG}/no_such_dataset/.zgroup", "no_such_dataset"),
        (f"/data/zarr/{ORG}/no_such_dataset/", "no_such_dataset"),
        (f"{DATASET}/no_such_layer/.zattrs", "no_such_layer"),
        (f"{DATASET}/no_such_layer/1/.zarray", "no_such_layer"),
        (f"{DATASET}/no_such_layer/", "no_such_layer"),
        (f"{DATASET}/color_u8/8/.zarray", "'8'"),
        (f"{DATASET}/color_u8/2-2-2/0.0.0.0", "2-2-2"),
        (f"{DATASET}/color_u8/1-1/.zarray", "1-1"),
        (f"{DATASET}/color_u8/8/", "'8'"),
        ("/data/zarr4/x/y/.zgroup", "zarr4"),
    ],
)
def test_unknown_names_are_404(gateway: Server, path: str, named: str) -> None:
    assert_error(get(gateway, path), 404, named)


def test_long_mag_names_are_accepted(gateway: Server) -> None:
    short = get(gateway, f"{DATASET}/color_u8/1/.zarray")
    assert get(gateway, f"{DATASET}/color_u8/1-1-1/.zarray").json() == short.json()


# --- a root with hostile datasets (open server, so nothing is masked by a 403) --------------------


@dataclass(frozen=True)
class Hostile:
    server: Server
    root: Path
    outside: Path


def _properties(dataset: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((dataset / "datasource-properties.json").read_text())
    return document


def _set_mag_path(document: dict[str, Any], layer: str, mag: list[int], path: str) -> None:
    entry = next(e for e in next(x for x in document["dataLayers"] if x["name"] == layer)["mags"] if e["mag"] == mag)
    entry["path"] = path


def _block_range(path: Path, index: int) -> tuple[int, int]:
    wkw_file = WkwFileCache(LocalStore()).open(str(path))
    assert wkw_file is not None
    return wkw_file.block_range(index)


def _garble_block(path: Path, index: int, rng: np.random.Generator) -> None:
    """Overwrite one stored LZ4 block with bytes that do not decode; the jump table stays valid."""
    offset, length = _block_range(path, index)
    wkw_file = WkwFileCache(LocalStore()).open(str(path))
    assert wkw_file is not None
    header = wkw_file.header
    for _ in range(10):
        garbage = rng.integers(0, 256, length, dtype=np.uint8).tobytes()
        try:
            decompress_block(StoredBlock(garbage, header))
        except BlockDecodeError:
            break
    else:
        raise AssertionError("could not make a block that fails to decode")
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(garbage)


@pytest.fixture(scope="module")
def hostile(
    test_data: WrittenDataset, tmp_path_factory: pytest.TempPathFactory, server_factory: Callable[..., Server]
) -> Hostile:
    base = tmp_path_factory.mktemp("hostile")
    root, outside = base / "root", base / "outside"
    source = test_data.root / ORG / "wk_dataset"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    shutil.copytree(source, outside / "copy")
    (root / "evil_org").mkdir(parents=True)

    # mags and layers that point outside the root in every way a properties file or a symlink can
    evil = root / "evil_org" / "ds"
    shutil.copytree(source, evil)
    document = _properties(evil)
    _set_mag_path(document, "color_u8", [1, 1, 1], "../../../outside/copy/color_u8/1")
    shutil.rmtree(evil / "color_u8" / "1")
    _set_mag_path(document, "color_u16", [1, 1, 1], str(outside / "copy" / "color_u16" / "1"))
    shutil.rmtree(evil / "color_u16" / "1")
    _set_mag_path(document, "color_u16", [2, 2, 1], "file://" + str(outside / "copy" / "color_u16" / "2-2-1"))
    shutil.rmtree(evil / "color_u16" / "2-2-1")
    _set_mag_path(document, "segmentation", [2, 2, 1], "../../../etc")
    (evil / "datasource-properties.json").write_text(json.dumps(document))
    shutil.rmtree(evil / "rgb" / "1")
    (evil / "rgb" / "1").symlink_to(outside / "copy" / "rgb" / "1", target_is_directory=True)
    shutil.rmtree(evil / "color_f32")
    (evil / "color_f32").symlink_to(outside / "copy" / "color_f32", target_is_directory=True)
    data_file = evil / "segmentation" / "1" / "z0" / "y0" / "x0.wkw"
    data_file.unlink()
    data_file.symlink_to(outside / "copy" / "segmentation" / "1" / "z0" / "y0" / "x0.wkw")
    (evil / "segmentation" / "4-4-2" / "header.wkw").unlink()
    (evil / "segmentation" / "4-4-2" / "header.wkw").symlink_to(
        outside / "copy" / "segmentation" / "4-4-2" / "header.wkw"
    )
    # a dataset directory and an organization that are symlinks out of the root
    (root / "evil_org" / "linked").symlink_to(outside / "copy", target_is_directory=True)
    (root / "linked_org").symlink_to(outside, target_is_directory=True)

    # corrupt data files, one fault per layer
    corrupt = root / "corrupt_org" / "ds"
    shutil.copytree(source, corrupt)
    with open(corrupt / "color_u8" / "1" / "z0" / "y0" / "x0.wkw", "r+b") as f:
        f.write(b"XKW")  # bad magic
    raw_file = corrupt / "color_u16" / "1" / "z0" / "y0" / "x0.wkw"
    offset, _ = _block_range(raw_file, 20)
    os.truncate(raw_file, offset + 77)  # raw blocks 20.. are cut off
    rng = np.random.default_rng(7)
    lz4_file = corrupt / "segmentation" / "1" / "z0" / "y0" / "x0.wkw"
    _garble_block(lz4_file, 28, rng)  # block (2, 2, 1): a pass-through chunk
    _garble_block(lz4_file, 1, rng)  # block (1, 0, 0): a chunk masked to the bbox

    return Hostile(server_factory(root), root, outside)


EVIL = "/data/zarr/evil_org/ds"
CORRUPT = "/data/zarr/corrupt_org/ds"


def _assert_no_leak(status: int, body: bytes, outside: Path) -> None:
    assert status in (400, 404), (status, body[:300])
    assert SECRET.encode() not in body
    assert str(outside).encode() not in body
    assert json.loads(body)["error"]


TRAVERSALS = [
    "/data/zarr/../../secret.txt",
    "/data/zarr/evil_org/../../outside/secret.txt",
    "/data/zarr/evil_org/ds/../../../outside/secret.txt",
    "/data/zarr/evil_org/ds/color_u8/../../../../outside/copy/color_u8/1/.zarray",
    "/data/zarr/evil_org/ds/color_u8/2-2-1/../../../../../outside/secret.txt",
    "/data/zarr/%2e%2e/%2e%2e/outside/secret.txt",
    "/data/zarr/evil_org/%2e%2e/%2e%2e/outside/secret.txt",
    "/data/zarr/evil_org/ds/%2E%2E/%2E%2E/%2E%2E/outside/secret.txt",
    "/data/zarr/evil_org/ds/color_u8/2-2-1/.%2e/.%2e/.%2e/.%2e/.%2e/outside/secret.txt",
    "/data/zarr/evil_org/ds/color_u8/2-2-1/..%2f..%2f..%2f..%2f..%2foutside%2fsecret.txt",
    "/data/zarr/evil_org/ds/color_u8/2-2-1/%2e%2e%2f%2e%2e%2f%2e%2e%2f%2e%2e%2f%2e%2e%2foutside%2fsecret.txt",
    "/data/zarr/evil_org/ds/..%5c..%5c..%5coutside%5csecret.txt",
    "/data/zarr/evil_org/ds/color_u8/2-2-1/%00.zarray",
    "/data/zarr/evil_org/ds/./color_u8/2-2-1/.zarray",
    "/data/zarr3/evil_org/ds/color_u8/../../../../outside/copy/color_u8/1/zarr.json",
    "/data/zarr3/%2e%2e/%2e%2e/outside/secret.txt",
]


@pytest.mark.parametrize("path", TRAVERSALS)
def test_path_traversal_is_refused(hostile: Hostile, path: str) -> None:
    status, body = raw_get(hostile.server, path, headers={})
    _assert_no_leak(status, body, hostile.outside)


@pytest.mark.parametrize(
    "path",
    [
        f"{DATASET}/../../other_org/theirs/color_u8/1/.zarray",
        f"/data/zarr/{ORG}/../other_org/theirs/datasource-properties.json",
        f"{DATASET}/%2e%2e/%2e%2e/other_org/theirs/color_u8/1/0.2.2.1",
        "/data/zarr/../../../../../../etc/passwd",
        f"{DATASET}/color_u8/1/..%2f..%2f..%2f..%2f..%2f..%2f..%2f..%2fetc%2fpasswd",
    ],
)
def test_path_traversal_cannot_reach_another_organization(gateway: Server, path: str) -> None:
    status, body = raw_get(gateway, path)
    assert status in (400, 404), (status, body[:300])
    assert b"root:" not in body
    assert json.loads(body)["error"]


@pytest.mark.parametrize(
    ("path", "words"),
    [
        (f"{EVIL}/color_u8/1/.zarray", ("outside",)),  # relative path that climbs out
        (f"{EVIL}/color_u8/1/0.2.2.1", ("outside",)),
        (f"{EVIL}/color_u16/1/.zarray", ("outside",)),  # absolute path outside
        (f"{EVIL}/color_u16/2-2-1/0.2.2.1", ("outside",)),  # file:// URL outside
        (f"{EVIL}/segmentation/2-2-1/.zarray", ("outside",)),  # "../../../etc"
        (f"{EVIL}/rgb/1/.zarray", ("outside",)),  # mag directory is a symlink out
        (f"{EVIL}/color_f32/", ("color_f32",)),  # layer directory is a symlink out
        (f"{EVIL}/color_f32/1/.zarray", ("color_f32",)),
        (f"{EVIL}/segmentation/4-4-2/.zarray", ("4-4-2", "outside")),  # header.wkw is a symlink out
    ],
)
def test_locations_outside_the_root_are_not_served(hostile: Hostile, path: str, words: tuple[str, ...]) -> None:
    response = get(hostile.server, path, headers={})
    assert_error(response, 404, *words)
    assert str(hostile.outside) not in response.text


@pytest.mark.parametrize(
    "path",
    [
        "/data/zarr/evil_org/linked/.zgroup",  # dataset directory is a symlink out
        "/data/zarr/evil_org/linked/color_u8/1/0.2.2.1",
        "/data/zarr/linked_org/copy/.zgroup",  # organization directory is a symlink out
        "/data/zarr/linked_org/copy/datasource-properties.json",
    ],
)
def test_datasets_symlinked_out_of_the_root_are_not_served(hostile: Hostile, path: str) -> None:
    """Such a dataset is a misconfiguration (unusable with the reason, 409), never served."""
    response = get(hostile.server, path, headers={})
    assert_error(response, 409, "outside")
    assert str(hostile.outside) not in response.text
    listing = get(hostile.server, "/data/zarr/evil_org/", headers={}).text
    assert 'href="/data/zarr/evil_org/linked/"' not in listing
    assert 'href="/data/zarr/evil_org/ds/"' in listing


def test_data_file_symlinked_out_of_the_root_is_not_read(hostile: Hostile, test_data: WrittenDataset) -> None:
    response = get(hostile.server, f"{EVIL}/segmentation/1/0.2.2.1", headers={})
    assert response.status_code != 200
    assert response.status_code != 404, "a file that is there must not read as absent (zeros)"
    assert_server_error(response)
    assert str(hostile.outside) not in response.text
    # a file of the same mag that is inside the root still reads
    assert_good_chunk(hostile.server, test_data, EVIL, "segmentation", (4, 2, 1))


def test_hostile_dataset_serves_what_is_inside(hostile: Hostile, test_data: WrittenDataset) -> None:
    properties = get(hostile.server, f"{EVIL}/datasource-properties.json", headers={})
    assert properties.status_code == 200
    assert str(hostile.outside) not in properties.text and "../" not in properties.text
    layers = {layer["name"]: layer for layer in properties.json()["dataLayers"]}
    assert "color_f32" not in layers
    assert [m["mag"] for m in layers["color_u8"]["mags"]] == [[2, 2, 1], [4, 4, 2]]
    assert [m["mag"] for m in layers["segmentation"]["mags"]] == [[1, 1, 1]]
    listing = get(hostile.server, f"{EVIL}/color_u8/", headers={}).text
    assert f"{EVIL}/color_u8/1/" not in listing
    assert f"{EVIL}/color_u8/2-2-1/" in listing
    zarr_path = f"{EVIL}/color_u8/2-2-1/0.1.1.1"
    response = get(hostile.server, zarr_path, headers={})
    assert response.status_code == 200
    expected = test_data.expected("color_u8", (2, 2, 1))[:, 32:64, 32:64, 32:64]
    assert np.array_equal(decode_chunk(response.content, "uint8", 1), expected)


@pytest.mark.parametrize(
    "path",
    [
        "/data/zarr/no_such_org/",
        "/data/zarr/no_such_org",
        "/data/zarr/no_such_org/ds/.zgroup",
        "/data/zarr3/no_such_org/",
    ],
)
def test_unknown_organization_is_404(hostile: Hostile, path: str) -> None:
    assert_error(get(hostile.server, path, headers={}), 404, "no_such_org")


# --- broken datasets ---------------------------------------------------------------------------------


def test_invalid_properties_listed_with_reason(gateway: Server, test_data: WrittenDataset) -> None:
    listing = get(gateway, f"/data/zarr/{ORG}/")
    assert listing.status_code == 200
    assert "broken_dataset" in listing.text
    assert "dataLayers" in listing.text  # the reason names what is wrong
    assert f'href="/data/zarr/{ORG}/broken_dataset/"' not in listing.text
    assert f'href="/data/zarr/{ORG}/wk_dataset/"' in listing.text
    response = get(gateway, f"/data/zarr/{ORG}/broken_dataset/.zgroup")
    assert response.status_code != 200 and response.status_code != 404
    assert_error(response, response.status_code, "dataLayers")
    assert_good_chunk(gateway, test_data, DATASET, "color_u8", (2, 2, 1))


# --- corrupt WKW files ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("layer", "index"),
    [
        ("color_u8", (2, 2, 1)),  # bad magic; a pass-through chunk
        ("color_u8", (1, 1, 1)),  # bad magic; a chunk masked to the bbox
        ("color_u16", (2, 2, 1)),  # truncated raw file; pass-through
        ("color_u16", (2, 3, 2)),  # truncated raw file; masked
        ("segmentation", (1, 0, 0)),  # garbage LZ4 block; masked, so decoded
    ],
)
def test_corrupt_file_is_a_server_error(hostile: Hostile, layer: str, index: tuple[int, int, int]) -> None:
    key = ".".join(map(str, (0, *index)))
    assert_server_error(get(hostile.server, f"{CORRUPT}/{layer}/1/{key}", headers={}))
    v3_key = "/".join(map(str, ("c", 0, *index)))
    assert_server_error(get(hostile.server, f"/data/zarr3/corrupt_org/ds/{layer}/1/{v3_key}", headers={}))


def test_garbage_lz4_passed_through_never_decodes_to_voxels(hostile: Hostile) -> None:
    """Pass-through does not decode (issue 4): a garbage block is either refused or sent as stored, undecodable."""
    response = get(hostile.server, f"{CORRUPT}/segmentation/1/0.2.2.1", headers={})
    if response.status_code >= 500:
        assert_server_error(response)
        return
    assert response.status_code == 200
    mag = hostile.root / "corrupt_org" / "ds" / "segmentation" / "1"
    stored = WkwMag(str(mag), WkwFileCache(LocalStore())).stored_block((2, 2, 1))
    assert stored is not None and response.content[24:] == stored.data
    with pytest.raises(Exception):  # noqa: B017 - the client's decoder refuses it: no silent zeros
        numcodecs.Blosc().decode(response.content)


@pytest.mark.parametrize(
    ("layer", "index"),
    [
        ("color_u8", (4, 2, 1)),  # another file of the layer with the bad magic
        ("color_u16", (4, 2, 1)),
        ("segmentation", (3, 3, 1)),  # an intact block of the file with garbage blocks
        ("segmentation", (4, 2, 1)),
        ("rgb", (2, 2, 1)),
    ],
)
def test_intact_chunks_next_to_corrupt_ones_read(
    hostile: Hostile, test_data: WrittenDataset, layer: str, index: tuple[int, int, int]
) -> None:
    assert_good_chunk(hostile.server, test_data, CORRUPT, layer, index)


def test_corrupt_layer_still_reads_through_zarr_python_elsewhere(hostile: Hostile, test_data: WrittenDataset) -> None:
    import zarr

    array = zarr.open_array(hostile.server.url + f"{CORRUPT}/segmentation/1", mode="r")
    region = (slice(None), slice(128, 160), slice(64, 128), slice(32, 64))
    assert np.array_equal(array[region], test_data.expected("segmentation", (1, 1, 1))[region])
    with pytest.raises(Exception):  # noqa: B017 - whatever the client raises, it must not be zeros
        array[:, 64:96, 64:96, 32:64]


# --- after all of the above, the servers still serve -------------------------------------------------


def test_servers_keep_serving(gateway: Server, hostile: Hostile, test_data: WrittenDataset) -> None:
    for key in ("0.1.2", "-1.0.0.0", "1.2.2.1"):
        get(gateway, f"{DATASET}/color_u8/1/{key}")
    assert_good_chunk(gateway, test_data, DATASET, "color_u8", (2, 2, 1))
    assert_good_chunk(gateway, test_data, DATASET, "segmentation", (3, 3, 1))
    assert_good_chunk(hostile.server, test_data, CORRUPT, "rgb", (3, 3, 1))
    assert hostile.server.process.poll() is None and gateway.process.poll() is None


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "TRACE"])
@pytest.mark.parametrize(
    "path",
    ["/", "/healthz", "/readyz", "/metrics", "/auth", "/nowhere", f"{DATASET}/", f"{DATASET}/color_u8/1/0.1.1.1"],
)
def test_other_methods_are_405_on_every_path(gateway: Server, method: str, path: str) -> None:
    response = requests.request(method, gateway.url + path, headers=HEADERS, timeout=10)
    assert response.status_code == 405
    assert response.headers["Allow"] == "GET, HEAD, OPTIONS"
    assert method in response.json()["error"]


@pytest.mark.parametrize(
    "path, nearest",
    [
        ("/data/zarr/test_org/wk_dataset/.zarray", "dataset level"),
        ("/data/zarr/test_org/wk_dataset/color_u8/.zarray", "group level"),
        ("/data/zarr/test_org/wk_dataset/nope/1/.zarray", "'nope'"),
        ("/data/zarr/test_org/wk_dataset/color_u8/7/.zarray", "there are 1, 2-2-1, 4-4-2"),
        ("/data/zarr3/test_org/wk_dataset/color_u8/1/.zarray", "other Zarr version"),
        ("/data/nope/test_org/", "there are zarr, zarr3, xarray"),
    ],
)
def test_an_unknown_target_is_a_404_naming_the_nearest_level(gateway: Server, path: str, nearest: str) -> None:
    response = requests.get(gateway.url + path, headers=HEADERS, timeout=10)
    assert response.status_code == 404
    assert nearest in response.json()["error"]
