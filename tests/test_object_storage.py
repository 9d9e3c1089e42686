"""A data root in S3-protocol object storage (moto in server mode on a loopback port).

The bucket holds the WKW test root and the Zarr datasets of ``support.zarr_datasets``; gateways are
started with ``--root s3://gateway-data/root``. One gateway talks to moto directly, another through a
counting proxy (``support.s3.CountingProxy``) that records every request and injects faults, so the
tests can show what one chunk costs in store requests, that store faults are 5xx (never 404, never
wrong bytes) and heal, and that two gateway processes over one store answer byte for byte alike.
"""

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import requests
from support.clients import read_zarr_python
from support.datasets import LAYERS, MAGS, ORG, WrittenDataset, mag_name
from support.processes import free_port, wait_until
from support.s3 import CountingProxy, Moto, aws_environment, start_moto, upload_tree
from support.servers import Server, assert_healed
from support.zarr_datasets import (
    ARRAY_IDS,
    CLIENTS,
    TREES,
    WK_DATASET,
    ZARR_ORG,
    ZP_DATASET,
    ServedArray,
    check_array,
    check_webknossos,
    served_arrays,
)

from gateway_storage import LocalStore
from wkw_adapter import WkwFileCache, WkwMag

pytestmark = pytest.mark.slow  # moto's S3 server, every layer read whole by each client

BUCKET = "gateway-data"
PREFIX = "root"
WAIT = 60.0  # a bound on waiting for the mapping folders to be listed again (every 10 s), not a measured time
WKW_DATASET = "wk_dataset"
WKW_LAYERS = [name for name, *_ in LAYERS]


@dataclass(frozen=True)
class S3Root:
    url: str
    arrays: dict[str, ServedArray]


# --- fixtures ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Moto]:
    server = start_moto(tmp_path_factory.mktemp("moto") / "moto.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def s3_root(moto: Moto, test_data: WrittenDataset, zarr_root: Path) -> S3Root:
    """The session's data root and the Zarr datasets, uploaded file by file under ``s3://gateway-data/root``."""
    arrays = served_arrays(zarr_root)
    client = moto.client()
    client.create_bucket(Bucket=BUCKET)
    assert upload_tree(client, test_data.root, BUCKET, PREFIX) > 50
    assert upload_tree(client, zarr_root, BUCKET, PREFIX) > 50
    return S3Root(f"s3://{BUCKET}/{PREFIX}", {a.id: a for a in arrays})


@pytest.fixture(scope="module")
def proxy(moto: Moto) -> Iterator[CountingProxy]:
    proxy = CountingProxy(moto.endpoint)
    proxy.start()
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def direct_gateway(s3_root: S3Root, moto: Moto, server_factory: Callable[..., Server]) -> Server:
    """Reads moto directly; the v3 tree of WKW layers is sharded."""
    with aws_environment(moto.endpoint):
        return server_factory(s3_root.url, v3_layout="sharded")


@pytest.fixture(scope="module")
def proxied_gateway(s3_root: S3Root, proxy: CountingProxy, server_factory: Callable[..., Server]) -> Server:
    """The same settings, reading through the counting proxy."""
    with aws_environment(proxy.endpoint):
        return server_factory(s3_root.url, v3_layout="sharded")


def get(server: Server, path: str, headers: dict[str, str] | None = None) -> requests.Response:
    return requests.get(server.url + path, headers=headers, timeout=60)


def log_tail(server: Server, lines: int = 12) -> str:
    """For failure messages: whether the process still runs, and the end of its log."""
    tail = "\n".join(server.log().splitlines()[-lines:])
    return f"gateway pid {server.process.pid} exit code {server.process.poll()}; log ends:\n{tail}"


# --- the client checks, from object storage ------------------------------------------------------


@pytest.mark.parametrize("client", list(CLIENTS))
@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("array_id", ARRAY_IDS)
def test_clients_read_zarr_layers_from_s3(
    direct_gateway: Server, s3_root: S3Root, array_id: str, tree: str, client: str
) -> None:
    check_array(direct_gateway.url, s3_root.arrays[array_id], tree, client)


@pytest.mark.parametrize("dataset", [WK_DATASET, ZP_DATASET])
@pytest.mark.parametrize("tree", list(TREES))
def test_webknossos_libs_reads_zarr_layers_from_s3(
    direct_gateway: Server, s3_root: S3Root, tree: str, dataset: str
) -> None:
    check_webknossos(direct_gateway.url, tree, dataset, list(s3_root.arrays.values()))


@pytest.mark.parametrize("client", list(CLIENTS))
@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("layer", WKW_LAYERS)
def test_clients_read_wkw_layers_from_s3(
    direct_gateway: Server, test_data: WrittenDataset, layer: str, tree: str, client: str
) -> None:
    for mag in MAGS:
        url = f"{direct_gateway.url}/data/{tree}/{ORG}/{WKW_DATASET}/{layer}/{mag_name(mag)}"
        data = CLIENTS[client](url, TREES[tree])
        expected = test_data.expected(layer, mag)
        assert data.dtype == expected.dtype
        np.testing.assert_array_equal(data, expected, err_msg=f"{layer} {mag_name(mag)} in {tree} via {client}")


@pytest.mark.parametrize("tree", list(TREES))
def test_webknossos_libs_reads_wkw_layers_from_s3(direct_gateway: Server, test_data: WrittenDataset, tree: str) -> None:
    import webknossos as wk
    from upath import UPath

    dataset = wk.Dataset.open(UPath(f"{direct_gateway.url}/data/{tree}/{ORG}/{WKW_DATASET}"))
    assert sorted(dataset.layers) == sorted(WKW_LAYERS)
    for name, layer in dataset.layers.items():
        for mag_view in layer.mags.values():
            box = layer.bounding_box.align_with_mag(mag_view.mag, ceil=True)
            data = mag_view.read(absolute_bounding_box=box)
            in_mag = box.in_mag(mag_view.mag)
            window = tuple(slice(t, t + s) for t, s in zip(in_mag.topleft, in_mag.size))
            expected = test_data.expected(name, mag_view.mag.to_tuple())[(slice(None), *window)]
            np.testing.assert_array_equal(data.reshape(expected.shape), expected, err_msg=f"{name} {mag_view.mag}")


def test_an_s3_root_is_ready(direct_gateway: Server) -> None:
    response = get(direct_gateway, "/readyz")
    assert response.status_code == 200, response.text
    assert "answers" in direct_gateway.log()


# --- what one chunk costs --------------------------------------------------------------------------

# color_u8 mag 1 (LZ4): blocks (2, 1, 1) and (3, 1, 1) lie inside the bounding box, in file z0/y0/x0.wkw
COUNTED_LAYER = "color_u8"
COUNTED_BLOCK = (2, 1, 1)
WARM_UP_BLOCK = (3, 1, 1)


def _v2_chunk(layer: str, block: tuple[int, int, int], mag: tuple[int, int, int] = (1, 1, 1)) -> str:
    return f"/data/zarr/{ORG}/{WKW_DATASET}/{layer}/{mag_name(mag)}/0.{block[0]}.{block[1]}.{block[2]}"


def test_one_chunk_reads_only_its_block(
    proxied_gateway: Server, proxy: CountingProxy, test_data: WrittenDataset
) -> None:
    """After a warm-up in the same file, a pass-through chunk is one ranged GET of exactly its block, plus HEADs."""
    mag_dir = test_data.mag_dir(COUNTED_LAYER, (1, 1, 1))
    local = WkwMag(str(mag_dir), WkwFileCache(LocalStore()))
    cube, block_index = local.locate_block(COUNTED_BLOCK)
    assert local.locate_block(WARM_UP_BLOCK)[0] == cube
    file_path = Path(local.file_path(cube))
    wkw_file = local.open_file(cube)
    assert wkw_file is not None and wkw_file.jump_table is not None
    offset, length = wkw_file.block_range(block_index)
    key = f"{PREFIX}/{file_path.relative_to(test_data.root).as_posix()}"

    assert get(proxied_gateway, _v2_chunk(COUNTED_LAYER, WARM_UP_BLOCK)).status_code == 200
    proxy.take()
    response = get(proxied_gateway, _v2_chunk(COUNTED_LAYER, COUNTED_BLOCK))
    fetches = proxy.take()
    assert response.status_code == 200
    assert response.content[-length:] == file_path.read_bytes()[offset : offset + length]

    gets = [f for f in fetches if f.method == "GET"]
    assert len(gets) == 1, (fetches, log_tail(proxied_gateway))
    assert gets[0].path.endswith(key)
    assert gets[0].range == f"bytes={offset}-{offset + length - 1}"
    assert gets[0].body_bytes == length
    others = [f for f in fetches if f.method != "GET"]
    assert all(f.method == "HEAD" and f.body_bytes == 0 for f in others), fetches
    assert sum(f.body_bytes for f in fetches) == length


# --- faults ----------------------------------------------------------------------------------------

FAULT_PATHS = {
    "wkw pass-through": _v2_chunk(COUNTED_LAYER, COUNTED_BLOCK),
    "wkw re-chunked": _v2_chunk("color_u16", (1, 0, 0)),
    "wkw metadata": f"/data/zarr/{ORG}/{WKW_DATASET}/color_u8/1/.zarray",
    "zarr pass-through": f"/data/zarr/{ZARR_ORG}/{ZP_DATASET}/v2_blosc_c/1/0.1.0.1",
    "zarr inner chunk of a shard": f"/data/zarr3/{ZARR_ORG}/{ZP_DATASET}/v3_sharded_rgb/1/c/0/0/0/0",
    "zarr re-chunked": f"/data/zarr/{ZARR_ORG}/{ZP_DATASET}/v3_yxz/1/0.1.0.0",
    "webknossos zarr3 border": f"/data/zarr3/{ZARR_ORG}/{WK_DATASET}/color3/1/c/0/0/1/0",
}
WKW_SHARD = f"/data/zarr3/{ORG}/{WKW_DATASET}/rgb/1/c/0/0/0/0"
METADATA = {"wkw metadata"}


def _answers(server: Server) -> dict[str, requests.Response]:
    return {name: get(server, path) for name, path in FAULT_PATHS.items()}


def _assert_server_errors(
    answers: dict[str, requests.Response], good: dict[str, requests.Response], when: str, server: Server
) -> None:
    """Chunks are 5xx with a JSON body. Metadata may also come from the gateway's short-lived dataset cache
    (it re-checks datasource-properties.json about once a second): then it is the same bytes as before."""
    for name, response in answers.items():
        message = f"{name} while {when}: {response.status_code} {response.text[:200]}; {log_tail(server, 40)}"
        if name in METADATA and response.status_code == 200:
            assert response.content == good[name].content, message
            continue
        assert response.status_code >= 500, message
        assert response.headers["content-type"].startswith("application/json"), name


def _assert_healed(server: Server, good: dict[str, requests.Response], when: str) -> None:
    assert_healed(_answers(server), good, when)


@pytest.fixture
def healthy_proxy(proxy: CountingProxy) -> Iterator[CountingProxy]:
    """The proxy, put back to forwarding (and listening) whatever the test did to it."""
    yield proxy
    proxy.mode, proxy.fail_only, proxy.fail_methods = "forward", None, None
    if not proxy.running:
        proxy.start()


def test_store_faults_are_server_errors_and_heal(proxied_gateway: Server, healthy_proxy: CountingProxy) -> None:
    proxy = healthy_proxy
    good = _answers(proxied_gateway)
    assert all(r.status_code == 200 for r in good.values()), {k: r.status_code for k, r in good.items()}
    for mode in ("error", "close"):
        proxy.mode = mode
        answers = _answers(proxied_gateway)
        _assert_server_errors(answers, good, f"every store request fails ({mode})", proxied_gateway)
        proxy.mode = "forward"
        _assert_healed(proxied_gateway, good, mode)
    # only the data fails: the dataset is known, the chunk reads fail, and they say "retry"
    proxy.mode, proxy.fail_only = "error", "/color_u"
    for name in ("wkw pass-through", "wkw re-chunked"):
        response = get(proxied_gateway, FAULT_PATHS[name])
        assert response.status_code == 503, (name, response.text, log_tail(proxied_gateway))
        assert response.headers["retry-after"]
    proxy.fail_only = f"/{ZP_DATASET}/v"
    for name in ("zarr pass-through", "zarr inner chunk of a shard", "zarr re-chunked"):
        response = get(proxied_gateway, FAULT_PATHS[name])
        assert response.status_code == 503, (name, response.text, log_tail(proxied_gateway))
        assert response.headers["retry-after"]
    proxy.mode, proxy.fail_only = "forward", None
    _assert_healed(proxied_gateway, good, "data faults")


def test_a_fault_while_a_dataset_loads_is_not_remembered(proxied_gateway: Server, healthy_proxy: CountingProxy) -> None:
    """other_org/theirs has not been read by this gateway yet. Its properties, then its layer's header, are
    found (HEAD) but cannot be read (GET fails): each is a 503, and neither the dataset nor the layer is
    remembered as broken: once the store answers, the chunk serves."""
    proxy = healthy_proxy
    path = f"/data/zarr/other_org/theirs/color_u8/1/0.{COUNTED_BLOCK[0]}.{COUNTED_BLOCK[1]}.{COUNTED_BLOCK[2]}"
    proxy.mode, proxy.fail_methods = "error", {"GET"}
    for failing in ("/theirs/datasource-properties.json", "/theirs/color_u8/"):
        proxy.take()
        proxy.fail_only = failing
        response = get(proxied_gateway, path)
        assert response.status_code == 503, (failing, response.text, log_tail(proxied_gateway))
        assert response.headers["retry-after"]
        assert any(f.method == "GET" and f.status == 500 and failing in f.path for f in proxy.take())
    proxy.mode, proxy.fail_only, proxy.fail_methods = "forward", None, None
    response = get(proxied_gateway, path)
    assert response.status_code == 200, response.text
    assert response.content == get(proxied_gateway, FAULT_PATHS["wkw pass-through"]).content  # a copy of the data


def test_a_stopped_store_is_a_server_error(proxied_gateway: Server, healthy_proxy: CountingProxy) -> None:
    proxy = healthy_proxy
    good = _answers(proxied_gateway)
    shard = get(proxied_gateway, WKW_SHARD)
    assert shard.status_code == 200
    proxy.stop()
    answers = _answers(proxied_gateway)
    answers["wkw shard"] = get(proxied_gateway, WKW_SHARD)
    _assert_server_errors(answers, {**good, "wkw shard": shard}, "the store is stopped", proxied_gateway)
    assert all(answers[name].status_code == 503 for name in answers if name not in METADATA), answers
    ready = get(proxied_gateway, "/readyz")
    assert ready.status_code == 503
    assert "cannot be reached" in ready.json()["problem"]
    proxy.start()
    _assert_healed(proxied_gateway, good, "the store came back")
    assert get(proxied_gateway, WKW_SHARD).content == shard.content
    assert get(proxied_gateway, "/readyz").status_code == 200


# --- replicas --------------------------------------------------------------------------------------

REPLICA_REQUESTS: list[tuple[str, dict[str, str]]] = [
    (path, {})
    for path in (
        "/data/zarr/",
        f"/data/zarr3/{ORG}/",
        f"/data/zarr/{ORG}/{WKW_DATASET}/",
        f"/data/zarr/{ORG}/{WKW_DATASET}/datasource-properties.json",
        f"/data/zarr3/{ORG}/{WKW_DATASET}/datasource-properties.json",
        f"/data/zarr/{ORG}/{WKW_DATASET}/.zmetadata",
        f"/data/zarr3/{ORG}/{WKW_DATASET}/zarr.json",
        f"/data/zarr/{ORG}/{WKW_DATASET}/rgb/2-2-1/.zarray",
        f"/data/zarr3/{ORG}/{WKW_DATASET}/rgb/2-2-1/zarr.json",
        f"/data/zarr/{ORG}/{WKW_DATASET}/rgb/.zattrs",
        f"/data/zarr3/{ZARR_ORG}/{ZP_DATASET}/",
        f"/data/zarr3/{ZARR_ORG}/{ZP_DATASET}/zarr.json",
        f"/data/zarr/{ZARR_ORG}/{ZP_DATASET}/v3_zyx_sharded/1/.zarray",
        f"/data/zarr3/{ZARR_ORG}/{ZP_DATASET}/bad_lz4/",
        f"/data/zarr3/{ZARR_ORG}/{ZP_DATASET}/v3_zstd_f/1/c/0/1/0/1",  # absent: 404
        WKW_SHARD,
        f"/data/zarr3/{ORG}/{WKW_DATASET}/color_f32/4-4-2/c/0/0/0/0",
        *FAULT_PATHS.values(),
    )
] + [
    (WKW_SHARD, {"Range": "bytes=-1028"}),  # the shard index, as zarr-python asks for it
    (WKW_SHARD, {"Range": "bytes=100-20000"}),
    (f"/data/zarr3/{ORG}/{WKW_DATASET}/segmentation/1/c/0/1/0/0", {"Range": "bytes=-1028"}),
]


def test_two_gateways_over_one_store_answer_alike(direct_gateway: Server, proxied_gateway: Server) -> None:
    for path, asked in REPLICA_REQUESTS:
        # Replicas behind a proxy are asked for the same public host; dataset pages name it in their links.
        headers = {"Host": "gateway.example.org", **asked}
        first, second = get(direct_gateway, path, headers), get(proxied_gateway, path, headers)
        where = f"{path} {headers}"
        assert first.status_code == second.status_code, where
        assert first.status_code in (200, 206, 404), (where, first.text[:200])
        assert first.content == second.content, where
        assert first.headers.get("etag") == second.headers.get("etag"), where
        assert first.headers.get("content-range") == second.headers.get("content-range"), where
    statuses = {get(direct_gateway, p, h).status_code for p, h in REPLICA_REQUESTS}
    assert statuses == {200, 206, 404}


# --- mappings put into and deleted from the store ------------------------------------------------------------


def test_a_mapping_put_into_the_store_is_a_layer_and_a_deleted_one_is_gone(
    s3_root: S3Root, moto: Moto, test_data: WrittenDataset, server_factory: Callable[..., Server]
) -> None:
    """A JSON mapping put beside the segmentation in the bucket becomes the layer ``segmentation__joined``
    without a restart (an object store's mapping folders are listed every REMOTE_MAPPINGS_SECONDS, a listing
    being a request), reading as the labels with its class joined; deleted, the layer is gone again."""
    with aws_environment(moto.endpoint):
        gateway = server_factory(s3_root.url)
    base = f"{gateway.url}/data/zarr/{ORG}/{test_data.dataset}"

    def layers() -> set[str]:
        document = get(gateway, f"/data/zarr/{ORG}/{test_data.dataset}/datasource-properties.json").json()
        return {layer["name"] for layer in document["dataLayers"]}

    assert "segmentation" in layers() and "segmentation__joined" not in layers()
    raw = read_zarr_python(f"{base}/segmentation/4-4-2", 2)
    first, second = (int(i) for i in np.unique(raw)[:2])  # ids are never 0 here
    key = f"{PREFIX}/{ORG}/{test_data.dataset}/segmentation/mappings/joined.json"
    client = moto.client()
    client.put_object(Bucket=BUCKET, Key=key, Body=json.dumps({"classes": [[first, second]]}).encode())
    try:
        assert wait_until(lambda: "segmentation__joined" in layers(), timeout=WAIT, interval=0.5), layers()
        expected = raw.copy()
        expected[raw == second] = first
        np.testing.assert_array_equal(read_zarr_python(f"{base}/segmentation__joined/4-4-2", 2), expected)
    finally:
        client.delete_object(Bucket=BUCKET, Key=key)
    assert wait_until(lambda: "segmentation__joined" not in layers(), timeout=WAIT, interval=0.5), layers()


# --- bad input at start-up -------------------------------------------------------------------------


def test_an_unreachable_data_root_is_reported_at_start_up(server_factory: Callable[..., Server]) -> None:
    """The gateway starts (the store may come back), says the root cannot be reached, and is not ready."""
    closed = free_port()
    with aws_environment(f"http://127.0.0.1:{closed}"):
        server = server_factory(f"s3://{BUCKET}/prefix")
    log = server.log()
    assert "data root s3://gateway-data/prefix cannot be reached" in log, log
    assert f"127.0.0.1:{closed}" in log
    assert server.process.poll() is None
    assert get(server, "/healthz").status_code == 200
    ready = get(server, "/readyz")
    assert ready.status_code == 503
    assert "cannot be reached" in ready.json()["problem"]
    listing = get(server, "/data/zarr/")
    assert listing.status_code == 503
    assert listing.headers["retry-after"]


def test_an_empty_local_root_starts(server_factory: Callable[..., Server], tmp_path: Path) -> None:
    empty = tmp_path / "empty_root"
    empty.mkdir()
    server = server_factory(empty)
    assert get(server, "/readyz").status_code == 200
    for tree in TREES:
        listing = get(server, f"/data/{tree}/")
        assert listing.status_code == 200
        assert "<a href" not in listing.text
        assert get(server, f"/data/{tree}/{ORG}/{WKW_DATASET}/.zgroup").status_code == 404
    assert "cannot be reached" not in server.log()
    assert f"data root {empty} holds no datasets yet" in server.log()  # said at start-up
