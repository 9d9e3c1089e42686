"""Validators and conditional requests on every route, and ETags that are stable across replicas and exact."""

import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from email.utils import formatdate, parsedate_to_datetime
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import requests
import tensorstore as ts
import wkw
from support.datasets import ORG, TOKEN, mag_name
from support.datasets import WrittenDataset as Data
from support.servers import Server

DATASET = "wk_dataset"
HEADERS = {"X-Auth-Token": TOKEN}
STRONG_ETAG = re.compile(r'^"[\x21\x23-\x7e]+"$')
DAY = 24 * 3600

# path below /data, whether a token is needed (the `gateway` fixture) or the open sharded server answers
RESOURCES = {
    "v2-chunk": ("zarr/{ds}/color_u8/1/0.2.1.1", "gateway"),  # a stored block passed through
    "v2-border-chunk": ("zarr/{ds}/segmentation/1/0.1.0.0", "gateway"),  # masked to the bounding box, encoded
    "v3-chunk": ("zarr3/{ds}/color_u16/2-2-1/c/0/1/1/1", "gateway"),
    "shard": ("zarr3/{ds}/color_u8/1/c/0/0/0/0", "sharded"),
    "border-shard": ("zarr3/{ds}/rgb/1/c/0/1/1/0", "sharded"),
    "zarray": ("zarr/{ds}/color_u8/1/.zarray", "gateway"),
    "zattrs": ("zarr/{ds}/rgb/.zattrs", "gateway"),
    "zmetadata": ("zarr/{ds}/.zmetadata", "gateway"),
    "zarr.json": ("zarr3/{ds}/color_u8/1/zarr.json", "sharded"),
    "properties": ("zarr3/{ds}/datasource-properties.json", "gateway"),
    "listing": ("zarr/{ds}/", "gateway"),
    "layer-listing": ("zarr3/{ds}/rgb/", "sharded"),
    "org-listing": ("zarr/", "gateway"),
}
DATA_RESOURCES = ["v2-chunk", "v2-border-chunk", "v3-chunk", "shard", "border-shard"]


def resource_url(server: Server, name: str) -> str:
    return f"{server.url}/data/" + RESOURCES[name][0].format(ds=f"{ORG}/{DATASET}")


@pytest.fixture(scope="module")
def servers(gateway: Server, sharded_gateway: Server) -> dict[str, Server]:
    return {"gateway": gateway, "sharded": sharded_gateway}


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    with requests.Session() as s:
        s.headers.update(HEADERS)  # the open server ignores it
        yield s


def fetch(
    session: requests.Session, servers: dict[str, Server], name: str, method: str = "GET", **headers: str
) -> requests.Response:
    return session.request(method, resource_url(servers[RESOURCES[name][1]], name), headers=headers)


# --- validators and conditional requests on every route ---------------------------------------------


@pytest.mark.parametrize("name", list(RESOURCES))
def test_conditional_requests(session: requests.Session, servers: dict[str, Server], name: str) -> None:
    first = fetch(session, servers, name)
    assert first.status_code == 200
    etag = first.headers["ETag"]
    assert STRONG_ETAG.match(etag), etag
    assert first.headers["Cache-Control"] == "no-cache"
    assert first.headers["Accept-Ranges"] == "bytes"
    whole = first.content
    assert fetch(session, servers, name).headers["ETag"] == etag  # stable within a process

    for method in ("GET", "HEAD"):
        for candidate in (etag, f"W/{etag}", "*", f'"nope", {etag}'):
            response = fetch(session, servers, name, method, **{"If-None-Match": candidate})
            assert response.status_code == 304, (method, candidate)
            assert response.content == b""
            assert response.headers["ETag"] == etag
            assert "Cache-Control" in response.headers
        response = fetch(session, servers, name, method, **{"If-None-Match": '"nope", W/"nope"'})
        assert response.status_code == 200
        assert response.content == (whole if method == "GET" else b"")

    assert fetch(session, servers, name, **{"If-Match": '"nope"'}).status_code == 412
    assert fetch(session, servers, name, "HEAD", **{"If-Match": '"nope"'}).status_code == 412
    assert fetch(session, servers, name, **{"If-Match": f"W/{etag}"}).status_code == 412  # If-Match is strong
    for candidate in (etag, "*", f'"nope", {etag}'):
        response = fetch(session, servers, name, **{"If-Match": candidate})
        assert response.status_code == 200
        assert response.content == whole

    response = fetch(session, servers, name, **{"If-Range": etag, "Range": "bytes=1-10"})
    assert response.status_code == 206
    assert response.content == whole[1:11]
    assert response.headers["Content-Range"] == f"bytes 1-10/{len(whole)}"
    for stale in ('"stale"', f"W/{etag}"):  # a weak validator never matches If-Range
        response = fetch(session, servers, name, **{"If-Range": stale, "Range": "bytes=1-10"})
        assert response.status_code == 200
        assert response.content == whole
        assert "Content-Range" not in response.headers


@pytest.mark.parametrize("name", DATA_RESOURCES)
def test_last_modified(session: requests.Session, servers: dict[str, Server], name: str) -> None:
    first = fetch(session, servers, name)
    last_modified = first.headers["Last-Modified"]
    when = parsedate_to_datetime(last_modified).timestamp()
    assert time.time() - DAY < when <= time.time()  # the test data was written in this session
    for since, status in [
        (last_modified, 304),
        (formatdate(when + DAY, usegmt=True), 304),
        (formatdate(when - DAY, usegmt=True), 200),
        ("not a date", 200),
    ]:
        for method in ("GET", "HEAD"):
            response = fetch(session, servers, name, method, **{"If-Modified-Since": since})
            assert response.status_code == status, (since, method)
            assert response.headers["Last-Modified"] == last_modified
    # If-None-Match wins over If-Modified-Since
    response = fetch(session, servers, name, **{"If-None-Match": '"nope"', "If-Modified-Since": last_modified})
    assert response.status_code == 200
    assert response.content == first.content
    # If-Range with the date works like the ETag
    response = fetch(session, servers, name, **{"If-Range": last_modified, "Range": "bytes=0-3"})
    assert response.status_code == 206
    assert response.content == first.content[:4]


@pytest.mark.parametrize("name", ["zarray", "zarr.json", "properties", "listing"])
def test_if_modified_since_without_last_modified(
    session: requests.Session, servers: dict[str, Server], name: str
) -> None:
    response = fetch(session, servers, name, **{"If-Modified-Since": formatdate(2**31, usegmt=True)})
    assert response.status_code in (200, 304)
    if "Last-Modified" not in response.headers:
        assert response.status_code == 200


def test_cache_control_is_configurable(test_data: Data, server_factory: Callable[..., Server]) -> None:
    value = "public, max-age=3600"
    server = server_factory(test_data.root, cache_control=value, v3_layout="sharded")
    for name in ("v2-chunk", "shard", "zarray", "zarr.json", "listing", "properties"):
        url = resource_url(server, name)
        response = requests.get(url)
        assert response.status_code == 200, name
        assert response.headers["Cache-Control"] == value, name
        again = requests.get(url, headers={"If-None-Match": response.headers["ETag"]})
        assert again.status_code == 304
        assert again.headers["Cache-Control"] == value


# --- ETags across replicas and settings -----------------------------------------------------------


@pytest.fixture(scope="module")
def twin(test_data: Data, server_factory: Callable[..., Server]) -> Server:
    """A second process with the same settings as the sharded server."""
    return server_factory(test_data.root, v3_layout="sharded")


@pytest.mark.parametrize("name", [n for n, (_, which) in RESOURCES.items() if n != "v3-chunk"])
def test_replicas_agree(servers: dict[str, Server], twin: Server, name: str) -> None:
    # v2-tree resources of `gateway` are served the same by the open sharded server (the v2 tree is never sharded).
    # Replicas behind a proxy are asked for the same public host; dataset pages name it in their links.
    public = {"Host": "gateway.example.org"}
    one = requests.get(resource_url(servers["sharded"], name), headers=public)
    two = requests.get(resource_url(twin, name), headers=public)
    assert one.status_code == two.status_code == 200
    assert one.headers["ETag"] == two.headers["ETag"]
    assert one.content == two.content
    assert one.headers.get("Last-Modified") == two.headers.get("Last-Modified")


@pytest.mark.parametrize("name", ["v2-chunk", "v2-border-chunk", "zarray", "zmetadata", "zattrs"])
def test_token_and_open_servers_agree_on_the_v2_tree(
    session: requests.Session, servers: dict[str, Server], name: str
) -> None:
    with_token = session.get(resource_url(servers["gateway"], name))
    open_server = requests.get(resource_url(servers["sharded"], name))
    assert with_token.headers["ETag"] == open_server.headers["ETag"]
    assert with_token.content == open_server.content


@pytest.fixture(scope="module")
def other_settings(test_data: Data, server_factory: Callable[..., Server]) -> dict[str, Server]:
    return {
        "zstd": server_factory(test_data.root, codec="zstd"),
        "edge64": server_factory(test_data.root, chunk_edge=64),
    }


@pytest.mark.parametrize("setting", ["zstd", "edge64"])
@pytest.mark.parametrize(
    "path",
    [
        "zarr/{ds}/color_u8/1/0.2.1.1",
        "zarr/{ds}/color_u8/1/0.1.0.0",
        "zarr3/{ds}/color_u8/1/c/0/1/1/1",
        "zarr3/{ds}/color_f32/4-4-2/c/0/0/0/0",
    ],
)
def test_etag_changes_with_codec_and_grid(
    session: requests.Session, servers: dict[str, Server], other_settings: dict[str, Server], setting: str, path: str
) -> None:
    path = path.format(ds=f"{ORG}/{DATASET}")
    default = session.get(f"{servers['gateway'].url}/data/{path}")
    changed = requests.get(f"{other_settings[setting].url}/data/{path}")
    assert default.status_code == changed.status_code == 200
    assert default.headers["ETag"] != changed.headers["ETag"]
    assert default.content != changed.content
    again = requests.get(f"{other_settings[setting].url}/data/{path}")
    assert again.headers["ETag"] == changed.headers["ETag"]
    # a client holding the other server's ETag gets the new bytes, not a 304
    response = requests.get(
        f"{other_settings[setting].url}/data/{path}", headers={"If-None-Match": default.headers["ETag"]}
    )
    assert response.status_code == 200


def test_zstd_chunks_decode_to_the_same_voxels(
    session: requests.Session, servers: dict[str, Server], other_settings: dict[str, Server]
) -> None:
    path = f"zarr/{ORG}/{DATASET}/color_u8/1/0.2.1.1"
    lz4 = numcodecs.Blosc().decode(session.get(f"{servers['gateway'].url}/data/{path}").content)
    zstd = numcodecs.Zstd().decode(requests.get(f"{other_settings['zstd'].url}/data/{path}").content)
    assert bytes(lz4) == bytes(zstd)


# --- ETags follow the data file ---------------------------------------------------------------------

REWRITTEN = ("color_u8", (1, 1, 1), (0, 0, 0))
WATCHED = {
    "passthrough chunk": "zarr/{ds}/color_u8/1/0.2.1.1",
    "border chunk": "zarr/{ds}/color_u8/1/0.1.1.1",
    "v3 chunk": "zarr3/{ds}/color_u8/1/c/0/3/3/1",
    "shard": "zarr3/{ds}/color_u8/1/c/0/0/0/0",
}
UNTOUCHED = {
    "chunk in another file": "zarr/{ds}/color_u8/1/0.4.1.1",
    "shard of another file": "zarr3/{ds}/color_u8/1/c/0/1/0/0",
    "another mag": "zarr/{ds}/color_u8/2-2-1/0.1.1.1",
}


def _data_file(root: Path) -> Path:
    layer, mag, (x, y, z) = REWRITTEN
    return root / ORG / DATASET / layer / mag_name(mag) / f"z{z}" / f"y{y}" / f"x{x}.wkw"


def test_etag_changes_when_the_file_is_rewritten(
    test_data: Data, server_factory: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("caching_copy")
    shutil.copytree(test_data.root / ORG / DATASET, root / ORG / DATASET)
    copy = Data(root, DATASET)
    plain = server_factory(root)
    sharded = server_factory(root, v3_layout="sharded")
    urls = {
        **{k: f"{plain.url}/data/" + v.format(ds=f"{ORG}/{DATASET}") for k, v in {**WATCHED, **UNTOUCHED}.items()},
    }
    urls["shard"] = f"{sharded.url}/data/" + WATCHED["shard"].format(ds=f"{ORG}/{DATASET}")
    urls["shard of another file"] = f"{sharded.url}/data/" + UNTOUCHED["shard of another file"].format(
        ds=f"{ORG}/{DATASET}"
    )
    before = {k: requests.get(u) for k, u in urls.items()}
    assert all(r.status_code == 200 for r in before.values())

    path = _data_file(root)
    old = path.stat()
    layer, mag, _ = REWRITTEN
    new_data = np.random.default_rng(99).integers(1, 255, (1, 128, 128, 128), dtype=np.uint8)
    with wkw.Dataset.open(str(copy.mag_dir(layer, mag))) as ds:
        ds.write((0, 0, 0), new_data)
    later = max(old.st_mtime_ns, path.stat().st_mtime_ns) + 2 * 10**9
    os.utime(path, ns=(later, later))
    expected = copy.expected(layer, mag)
    assert not np.array_equal(expected, test_data.expected(layer, mag))

    after = {k: requests.get(u) for k, u in urls.items()}
    for key in WATCHED:
        assert after[key].status_code == 200
        assert after[key].headers["ETag"] != before[key].headers["ETag"], key
        assert after[key].content != before[key].content, key
        assert after[key].headers["Last-Modified"] == formatdate(later / 10**9, usegmt=True), key
        stale = requests.get(urls[key], headers={"If-None-Match": before[key].headers["ETag"]})
        assert stale.status_code == 200
        assert stale.content == after[key].content
    for key in UNTOUCHED:
        assert after[key].headers["ETag"] == before[key].headers["ETag"], key
        assert after[key].content == before[key].content, key

    # the new bodies are the new data
    chunk = np.frombuffer(numcodecs.Blosc().decode(after["passthrough chunk"].content), dtype=np.uint8)
    np.testing.assert_array_equal(chunk.reshape((1, 32, 32, 32), order="F"), expected[:, 64:96, 32:64, 32:64])
    chunk = np.frombuffer(numcodecs.Blosc().decode(after["border chunk"].content), dtype=np.uint8)
    np.testing.assert_array_equal(chunk.reshape((1, 32, 32, 32), order="F"), expected[:, 32:64, 32:64, 32:64])
    for url, driver in [
        (f"{plain.url}/data/zarr/{ORG}/{DATASET}/{layer}/1/", "zarr"),
        (f"{plain.url}/data/zarr3/{ORG}/{DATASET}/{layer}/1/", "zarr3"),
        (f"{sharded.url}/data/zarr3/{ORG}/{DATASET}/{layer}/1/", "zarr3"),
    ]:
        spec = {"driver": driver, "kvstore": {"driver": "http", "base_url": url}}
        data = ts.open(spec, read=True).result().read().result()
        np.testing.assert_array_equal(data, expected, err_msg=url)


@pytest.mark.parametrize("path", ["color_u8/4-4-2/c/0/0/0/0", "color_u8/4-4-2/zarr.json"])
def test_etag_differs_between_layouts(session: requests.Session, servers: dict[str, Server], path: str) -> None:
    url = f"/data/zarr3/{ORG}/{DATASET}/{path}"
    plain = session.get(servers["gateway"].url + url)
    sharded = session.get(servers["sharded"].url + url)
    assert plain.status_code == sharded.status_code == 200
    assert plain.headers["ETag"] != sharded.headers["ETag"]
    assert plain.content != sharded.content
