"""Real gateways over Google Cloud Storage, Azure Blob Storage and HTTPS data roots, and over remote mags
(on those and on S3).

conftest's WKW datasets and the Zarr datasets of ``test_zarr_sources`` are uploaded to fake-gcs-server,
to Azurite and into the directory of a local HTTPS server (tests/support/emulators.py, tests/support/https.py),
and a gateway serves each. GCS and Azure are reached through ``support.s3.CountingProxy`` (a plain HTTP
proxy that can fail on purpose), the HTTPS server fails on its own. Every answer is compared voxel for
voxel through tensorstore and zarr-python; store faults are 5xx with Retry-After and heal; an object
replaced between the lookup of its version and its read is a 503, never mixed bytes.

A webKnossos "remote dataset" (a local properties file whose mags are ``https://`` URLs of public Zarr
arrays, or ``s3://`` URLs in a bucket of moto's S3 server) is served when its URLs lie below a
``remote_roots`` entry, and refused, without a request to the URL, when they do not.
"""

import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pytest
import requests
from support.datasets import MAGS, ORG, WrittenDataset, mag_name
from support.emulators import Azurite, FakeGcs, environment, start_azurite, start_fake_gcs
from support.https import Certificate, FileServer, make_certificate
from support.s3 import CountingProxy, Moto, aws_environment, start_moto, upload_tree
from support.servers import Server, assert_healed
from support.zarr_datasets import (
    ARRAY_IDS,
    CLIENTS,
    TREES,
    ZARR_ORG,
    ZP_DATASET,
    ServedArray,
    build_zarr_root,
    check_array,
)

pytestmark = pytest.mark.slow  # object-store emulators and an HTTPS server, layers read whole by two clients

BUCKET = "gateway-data"
PREFIX = "root"
WKW_DATASET = "wk_dataset"
WKW_LAYERS = ["color_u8", "rgb", "segmentation"]
STORES = ["gcs", "azure", "https"]
_CLEARED = (
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_SERVICE_ACCOUNT",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_ENDPOINT",
)


class Faults(Protocol):
    """What stands between a gateway and its store and can fail: a CountingProxy or the HTTPS server itself."""

    mode: str

    def start(self) -> None: ...

    def stop(self) -> None: ...


@dataclass
class Served:
    gateway: Server
    faults: Faults
    arrays: dict[str, ServedArray]


# --- the data, and the stores holding it ------------------------------------------------------------


@dataclass(frozen=True)
class Tree:
    root: Path  # one directory with both conftest's data root and the Zarr datasets
    arrays: dict[str, ServedArray]


@pytest.fixture(scope="module")
def tree(test_data: WrittenDataset, tmp_path_factory: pytest.TempPathFactory) -> Tree:
    root = tmp_path_factory.mktemp("remote-tree") / PREFIX
    shutil.copytree(test_data.root, root)
    arrays = build_zarr_root(root)
    return Tree(root, {a.id: a for a in arrays})


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Certificate]:
    made = make_certificate(tmp_path_factory.mktemp("certificate"))
    with environment({"SSL_CERT_FILE": str(made.authority)}, cleared=_CLEARED):
        yield made


@pytest.fixture(scope="module")
def https(tree: Tree, certificate: Certificate) -> Iterator[FileServer]:
    server = FileServer(tree.root.parent, certificate)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gcs_proxy() -> Iterator[CountingProxy]:
    """The proxy in front of fake-gcs-server, whose address the emulator must know before it starts."""
    proxy = CountingProxy("127.0.0.1:0")  # its upstream is set once the emulator runs
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def gcs(tree: Tree, gcs_proxy: CountingProxy, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGcs]:
    server = start_fake_gcs(tmp_path_factory.mktemp("gcs") / "gcs.log", public_host=f"127.0.0.1:{gcs_proxy.port}")
    gcs_proxy.upstream = server.endpoint.removeprefix("http://")
    server.create_bucket(BUCKET)
    assert server.upload_tree(tree.root, BUCKET, PREFIX) > 50
    yield server
    server.stop()


@pytest.fixture(scope="module")
def azurite(tree: Tree, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    server = start_azurite(tmp_path_factory.mktemp("azurite"))
    server.create_container(BUCKET)
    assert server.upload_tree(tree.root, BUCKET, PREFIX) > 50
    yield server
    server.stop()


@pytest.fixture(scope="module", params=STORES)
def served(
    request: pytest.FixtureRequest, tree: Tree, certificate: Certificate, server_factory: Callable[..., Server]
) -> Iterator[Served]:
    """A gateway whose data root is in one store; its v3 tree of WKW layers is sharded."""
    kind = request.param
    proxy: CountingProxy | None = None
    if kind == "https":
        server: FileServer = request.getfixturevalue("https")
        faults: Faults = server
        with environment({}):
            gateway = server_factory(f"{server.url}/{PREFIX}", v3_layout="sharded")
    elif kind == "gcs":
        request.getfixturevalue("gcs")
        faults = gcs_proxy = request.getfixturevalue("gcs_proxy")
        gcs_proxy.start()
        with environment({"STORAGE_EMULATOR_HOST": gcs_proxy.endpoint}):
            gateway = server_factory(f"gs://{BUCKET}/{PREFIX}", v3_layout="sharded")
    else:
        azure: Azurite = request.getfixturevalue("azurite")
        faults = proxy = CountingProxy(azure.endpoint.rpartition("/")[0])
        proxy.start()
        moved = azure.connection_string.replace(azure.endpoint, f"{proxy.endpoint}/devstoreaccount1")
        with environment({"AZURE_STORAGE_CONNECTION_STRING": moved}):
            gateway = server_factory(f"az://{BUCKET}/{PREFIX}", v3_layout="sharded")
    yield Served(gateway, faults, tree.arrays)
    if proxy is not None:
        proxy.stop()


def get(server: Server, path: str, headers: dict[str, str] | None = None) -> requests.Response:
    return requests.get(server.url + path, headers=headers, timeout=60)


def log_tail(server: Server, lines: int = 20) -> str:
    return "\n".join(server.log().splitlines()[-lines:])


# --- voxels ------------------------------------------------------------------------------------------


def test_the_root_is_ready(served: Served) -> None:
    response = get(served.gateway, "/readyz")
    assert response.status_code == 200, (response.text, log_tail(served.gateway))
    listed = get(served.gateway, "/data/zarr/").text
    assert ORG in listed and ZARR_ORG in listed  # listed: every store here can list


@pytest.mark.parametrize("client", list(CLIENTS))
@pytest.mark.parametrize("tree_name", list(TREES))
def test_wkw_layers_read_voxel_for_voxel(
    served: Served, test_data: WrittenDataset, tree_name: str, client: str
) -> None:
    for layer in WKW_LAYERS:
        for mag in MAGS:
            url = f"{served.gateway.url}/data/{tree_name}/{ORG}/{WKW_DATASET}/{layer}/{mag_name(mag)}"
            data = CLIENTS[client](url, TREES[tree_name])
            expected = test_data.expected(layer, mag)
            assert data.dtype == expected.dtype
            np.testing.assert_array_equal(
                data, expected, err_msg=f"{layer} {mag_name(mag)} in {tree_name} via {client}"
            )


@pytest.mark.parametrize(("tree_name", "client"), [("zarr", "zarr-python"), ("zarr3", "tensorstore")])
def test_zarr_layers_read_voxel_for_voxel(served: Served, tree_name: str, client: str) -> None:
    for array_id in ARRAY_IDS:
        check_array(served.gateway.url, served.arrays[array_id], tree_name, client)


# --- faults ------------------------------------------------------------------------------------------

FAULT_PATHS = {
    "wkw pass-through": f"/data/zarr/{ORG}/{WKW_DATASET}/color_u8/1/0.2.1.1",
    "wkw re-chunked": f"/data/zarr/{ORG}/{WKW_DATASET}/color_u16/1/0.1.0.0",
    "wkw shard": f"/data/zarr3/{ORG}/{WKW_DATASET}/rgb/1/c/0/0/0/0",
    "zarr pass-through": f"/data/zarr/{ZARR_ORG}/{ZP_DATASET}/v2_blosc_c/1/0.1.0.1",
    "zarr re-chunked": f"/data/zarr/{ZARR_ORG}/{ZP_DATASET}/v3_yxz/1/0.1.0.0",
}


def _answers(server: Server) -> dict[str, requests.Response]:
    return {name: get(server, path) for name, path in FAULT_PATHS.items()}


def _assert_healed(server: Server, good: dict[str, requests.Response], when: str) -> None:
    assert_healed(_answers(server), good, when)


@pytest.fixture
def faults(served: Served) -> Iterator[Faults]:
    """The fault injector, put back to forwarding (and listening) whatever the test did to it."""
    yield served.faults
    served.faults.mode = "forward"
    served.faults.stop()  # idempotent; started again below in every case, on the same port
    served.faults.start()


def test_store_faults_are_503_and_heal(served: Served, faults: Faults) -> None:
    good = _answers(served.gateway)
    assert all(r.status_code == 200 for r in good.values()), {k: r.status_code for k, r in good.items()}
    for mode in ("error", "close", "stopped"):
        if mode == "stopped":
            faults.stop()
        else:
            faults.mode = mode
        for name, response in _answers(served.gateway).items():
            where = f"{name} while the store fails ({mode}): {response.status_code} {response.text[:200]}"
            assert response.status_code == 503, (where, log_tail(served.gateway))
            assert response.headers["retry-after"], where
            assert response.json()["status"] == 503
        if mode == "stopped":
            ready = get(served.gateway, "/readyz")
            assert ready.status_code == 503 and "cannot be reached" in ready.json()["problem"]
            faults.start()
        faults.mode = "forward"
        _assert_healed(served.gateway, good, mode)
    assert get(served.gateway, "/readyz").status_code == 200


def test_two_gateways_over_one_https_root_answer_alike(
    https: FileServer, tree: Tree, server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    """A replica at another prefix (another mount of the same files) answers byte for byte alike, ETags too."""
    replica = Path(https.root) / "replica"
    if not replica.exists():
        shutil.copytree(tree.root, replica)
    first = server_factory(f"{https.url}/{PREFIX}", v3_layout="sharded")
    second = server_factory(f"{https.url}/replica", v3_layout="sharded")
    for path in [*FAULT_PATHS.values(), f"/data/zarr3/{ORG}/{WKW_DATASET}/zarr.json", "/data/zarr/"]:
        one, other = (
            get(first, path, {"Host": "gateway.example.org"}),
            get(second, path, {"Host": "gateway.example.org"}),
        )
        assert one.status_code == other.status_code == 200, (path, one.text[:200], other.text[:200])
        assert one.content == other.content, path
        assert one.headers.get("etag") == other.headers.get("etag"), path


@pytest.mark.parametrize("replacements", [1, 20])
def test_an_object_replaced_mid_read_is_never_mixed(
    https: FileServer, tree: Tree, server_factory: Callable[..., Server], replacements: int
) -> None:
    """The WKW file is replaced (another version, other bytes) right after the gateway looked up its version,
    before it read a byte. The read names the version it expects (If-Match), so it never gets the new bytes
    under the old identity: once, the gateway looks the file up again and answers the new version whole;
    replaced at every lookup, it answers 503 with Retry-After. Never the old bytes, never a mix."""
    name = f"replaced-{replacements}"
    copy = Path(https.root) / name
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(tree.root, copy)
    gateway = server_factory(f"{https.url}/{name}")
    path = FAULT_PATHS["wkw pass-through"]
    before = get(server_factory(f"{https.url}/{PREFIX}"), path)  # the original version, from another gateway
    assert before.status_code == 200, before.text
    target = copy / ORG / WKW_DATASET / "color_u8" / "1" / "z0" / "y0" / "x0.wkw"
    # the same cube of another dataset holding the same data, with every block's last byte changed:
    # a valid WKW file (same header and jump table) with other voxels in the chunk asked for
    original = target.read_bytes()
    seen = 0

    def replace(found: Path) -> bool:
        nonlocal seen
        if found != target.resolve():
            return False
        seen += 1
        changed = bytearray(original)
        changed[-1] ^= seen & 0xFF
        changed[len(changed) // 2] ^= 0xFF
        temporary = target.with_name("x0.wkw.new")
        temporary.write_bytes(bytes(changed))
        temporary.replace(target)  # a new version: a new mtime, so a new ETag
        return seen >= replacements

    https.after_head = replace  # this gateway has not read the file yet: it looks its version up first
    try:
        during = get(gateway, path)
    finally:
        https.after_head = None
    assert seen >= 1
    if replacements > 1:
        assert during.status_code == 503, (during.status_code, during.text[:200], log_tail(gateway))
        assert during.headers["retry-after"]
        return
    assert during.status_code == 200, (during.status_code, during.text[:200], log_tail(gateway))
    fresh = get(server_factory(f"{https.url}/{name}"), path)  # what the file now holds, read from scratch
    assert fresh.status_code == 200
    assert during.content == fresh.content and during.headers["etag"] == fresh.headers["etag"]
    assert during.headers["etag"] != before.headers["etag"]


# --- remote mags: a webKnossos remote dataset --------------------------------------------------------


def _remote_dataset(root: Path, base: str) -> dict[str, Any]:
    """zp_arrays' properties, with every mag path the https:// URL of the same array on the server."""
    source: dict[str, Any] = json.loads((root / ZARR_ORG / ZP_DATASET / "datasource-properties.json").read_text())
    for layer in source["dataLayers"]:
        for mag in layer["mags"]:
            mag["path"] = f"{base}/{ZARR_ORG}/{ZP_DATASET}/{mag['path'].removeprefix('./')}"
    return source


def _local_root(directory: Path, properties: dict[str, Any]) -> Path:
    (directory / ZARR_ORG / ZP_DATASET).mkdir(parents=True)
    (directory / ZARR_ORG / ZP_DATASET / "datasource-properties.json").write_text(json.dumps(properties))
    return directory


def _check_remote_dataset(gateway: Server, tree: Tree) -> None:
    """Every array of the remote dataset read voxel for voxel, and the remote root said to answer at start-up."""
    zp_arrays = [a for a in tree.arrays.values() if a.dataset == ZP_DATASET]
    assert zp_arrays
    for array in zp_arrays:
        check_array(gateway.url, array, "zarr3", "tensorstore")
        check_array(gateway.url, array, "zarr", "zarr-python")
    assert "remote root" in gateway.log() and "answers" in gateway.log()


def test_a_remote_dataset_below_an_allowed_root_is_served(
    https: FileServer, tree: Tree, server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    base = f"{https.url}/{PREFIX}"
    root = _local_root(tmp_path / "local", _remote_dataset(tree.root, base))
    with environment({}):
        gateway = server_factory(root, remote_roots=base)
    _check_remote_dataset(gateway, tree)


@pytest.fixture(scope="module")
def s3_copy(tree: Tree, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Moto]:
    """The tree's files in a bucket of moto's S3 server, below PREFIX."""
    server = start_moto(tmp_path_factory.mktemp("moto") / "moto.log")
    try:
        client = server.client()
        client.create_bucket(Bucket=BUCKET)
        upload_tree(client, tree.root, BUCKET, PREFIX)
        yield server
    finally:
        server.stop()


def test_a_remote_dataset_in_a_bucket_is_served_from_an_s3_remote_root(
    s3_copy: Moto, tree: Tree, server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    """Mags at ``s3://`` URLs beside a local data root: read through obstore with the AWS environment's
    credentials and endpoint, voxel for voxel; the same URLs without ``remote_roots`` are refused."""
    base = f"s3://{BUCKET}/{PREFIX}"
    root = _local_root(tmp_path / "local", _remote_dataset(tree.root, base))
    with aws_environment(s3_copy.endpoint):
        gateway = server_factory(root, remote_roots=base)
        refusing = server_factory(root)
    _check_remote_dataset(gateway, tree)
    layer = next(a for a in tree.arrays.values() if a.dataset == ZP_DATASET).layer
    refused = get(refusing, f"/data/zarr/{ZARR_ORG}/{ZP_DATASET}/{layer}/.zattrs")
    assert refused.status_code == 404, (refused.status_code, refused.text[:300])
    assert "no servable" in refused.json()["error"] and "remote_roots" in refused.json()["error"]


def test_a_remote_dataset_outside_every_allowed_root_is_refused_without_a_request(
    https: FileServer, tree: Tree, server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    """Whoever writes a properties file cannot make the gateway fetch a URL the operator did not allow:
    not without remote_roots, not below another allowed prefix, not by climbing out of one with '..'."""
    cases = {
        "no remote roots": (f"{https.url}/{PREFIX}", {}),
        "another prefix": (f"{https.url}/{PREFIX}", {"remote_roots": f"{https.url}/elsewhere"}),
        "climbing out": (f"{https.url}/allowed/../{PREFIX}", {"remote_roots": f"{https.url}/allowed"}),
        "another host": ("https://127.0.0.2:1/" + PREFIX, {"remote_roots": f"{https.url}/{PREFIX}"}),
    }
    for case, (base, settings) in cases.items():
        root = _local_root(tmp_path / case.replace(" ", "-"), _remote_dataset(tree.root, base))
        gateway = server_factory(root, **settings)
        https.take()
        layer = next(a for a in tree.arrays.values() if a.dataset == ZP_DATASET).layer
        response = get(gateway, f"/data/zarr/{ZARR_ORG}/{ZP_DATASET}/{layer}/.zattrs")
        assert response.status_code == 404, (case, response.status_code, response.text)
        message = response.json()["error"]
        assert "no servable" in message and "remote_roots" in message, (case, message)
        assert not [r for r in https.take() if ZP_DATASET in r[1]], f"{case}: the refused URL was fetched"
        assert "remote_roots" in gateway.log(), case


def test_an_unreachable_remote_root_is_503(
    tree: Tree, certificate: Certificate, server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    """A remote root that does not answer: its layers are 503 (retry), never 404, and start-up says so."""
    from support.processes import free_port

    base = f"https://127.0.0.1:{free_port()}/{PREFIX}"
    root = _local_root(tmp_path / "local", _remote_dataset(tree.root, base))
    gateway = server_factory(root, remote_roots=base)
    layer = next(a for a in tree.arrays.values() if a.dataset == ZP_DATASET).layer
    response = get(gateway, f"/data/zarr/{ZARR_ORG}/{ZP_DATASET}/{layer}/1/.zarray")
    assert response.status_code == 503, (response.status_code, response.text)
    assert response.headers["retry-after"]
    assert f"remote root {base} cannot be reached" in gateway.log()


def test_bad_credentials_are_503_naming_the_store(
    azurite: Azurite, certificate: Certificate, server_factory: Callable[..., Server]
) -> None:
    wrong = azurite.connection_string.replace("AccountKey=", "AccountKey=AAAA")
    with environment({"AZURE_STORAGE_CONNECTION_STRING": wrong}):
        gateway = server_factory(f"az://{BUCKET}/{PREFIX}")
    response = get(gateway, f"/data/zarr/{ORG}/{WKW_DATASET}/color_u8/1/.zarray")
    assert response.status_code == 503, (response.status_code, response.text)
    assert f"az://{BUCKET}" in response.json()["error"] and "credentials" in response.json()["error"]
    ready = get(gateway, "/readyz")
    assert ready.status_code == 503
    assert f"az://{BUCKET}" in gateway.log()


def test_a_remote_root_that_wants_a_token_gets_it_from_the_headers_file(
    tree: Tree, certificate: Certificate, server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    token = {"Authorization": "Bearer lab-token"}
    server = FileServer(tree.root.parent, certificate, required=token)
    server.start()
    try:
        base = f"{server.url}/{PREFIX}"
        root = _local_root(tmp_path / "local", _remote_dataset(tree.root, base))
        headers_file = tmp_path / "headers.json"
        headers_file.write_text(json.dumps({base: token}))
        gateway = server_factory(root, remote_roots=base, store_headers_file=headers_file)
        array = next(a for a in tree.arrays.values() if a.dataset == ZP_DATASET)
        check_array(gateway.url, array, "zarr3", "tensorstore")
        without = server_factory(root, remote_roots=base)
        response = get(without, f"/data/zarr/{ZARR_ORG}/{ZP_DATASET}/{array.layer}/1/.zarray")
        assert response.status_code == 503, (response.status_code, response.text)
        assert "credentials" in response.json()["error"] and server.url in response.json()["error"]
    finally:
        server.stop()


def test_a_bad_headers_file_stops_start_up_naming_it(server_factory: Callable[..., Server], tmp_path: Path) -> None:
    headers_file = tmp_path / "headers.json"
    headers_file.write_text('{"https://host/x": "not an object of headers"}')
    with pytest.raises(RuntimeError, match="store_headers_file: headers file"):
        server_factory(tmp_path, store_headers_file=headers_file)


def test_granian_workers_serve_an_https_root(
    https: FileServer, test_data: WrittenDataset, server_factory: Callable[..., Server]
) -> None:
    """Granian forks its workers from the process that checked the root at start-up: they must still read."""
    gateway = server_factory(f"{https.url}/{PREFIX}", server="granian", workers=2)
    assert get(gateway, "/readyz").status_code == 200
    for _ in range(4):  # over both workers, most likely
        url = f"{gateway.url}/data/zarr/{ORG}/{WKW_DATASET}/color_u8/1"
        np.testing.assert_array_equal(CLIENTS["tensorstore"](url, 2), test_data.expected("color_u8", (1, 1, 1)))
