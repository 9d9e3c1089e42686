"""Authorization follows the files, not only the URL (issue 24, item 4).

A lab member who may write datasets into ``evil_org`` points layers of them at ``secret_org``'s files,
every way a properties file or a symlink can: a relative mag path that climbs (``../../secret_org/...``),
an absolute path inside the root, a mag directory that is a symlink into ``secret_org``, and a chunk
file swapped for a symlink into ``secret_org`` after the gateway has read it. A token granted only
``evil_org/*`` must get the forbidden answer (or, for the swapped file, a storage fault naming it),
never a voxel of ``secret_org``, through every route that reads voxels: Zarr v2 and v3 chunks, the
xarray tree, previews. A token granted both organizations reads the linked layers; and the webKnossos
practice of sharing a layer between datasets of one organization by a symlink keeps working for a
token granted both datasets.
"""

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import wkw
import zarr
from support.datasets import cube_layer, write_layers_properties
from support.servers import Server

EDGE = 32  # every layer is one 32³ chunk of uint8
SECRET, EVIL, LAB = "secret_org", "evil_org", "lab_org"
SECRET_VALUE, OWN_VALUE, SHARED_VALUE = 0xAB, 0x11, 0x5C
EVIL_TOKEN, BOTH_TOKEN = "evil-only-token-0123456789", "evil-and-secret-token-0123456789"
SHARED_BOTH_TOKEN, SHARED_B_TOKEN = "lab-both-token-0123456789", "lab-b-only-token-0123456789"
LAYERS = {"color": "wkw", "zcolor": "zarr"}  # one layer of each kind of file: WKW cubes, Zarr v2 chunks
LINKED = ("relative", "absolute", "mag_symlink")  # datasets whose mags are secret_org's (the seen cases)
ROUTES = {  # route name: path below /{tree}/{org}/{dataset}, by layer
    "v2": "/data/zarr/{o}/{d}/{layer}/1/0.0.0.0",
    "v3": "/data/zarr3/{o}/{d}/{layer}/1/c/0/0/0/0",
    "xarray": "/data/xarray/{o}/{d}/1/{layer}/c/0/0/0",
    "preview": "/preview/{o}/{d}/{layer}.png",
}


def _layer(name: str, data_format: str, path: str | None = None) -> dict[str, Any]:
    return cube_layer(name, data_format, EDGE, None if path is None else [{"mag": [1, 1, 1], "path": path}])


def _write_layers(dataset: Path, value: int) -> None:
    """Both layers of ``dataset``, every voxel ``value`` (uncompressed, so a leaked byte shows as itself)."""
    voxels = np.full((EDGE,) * 3, value, dtype=np.uint8)
    with wkw.Dataset.create(str(dataset / "color" / "1"), wkw.Header(np.uint8, block_len=EDGE, file_len=1)) as ds:
        ds.write((0, 0, 0), voxels)
    array = zarr.create_array(
        str(dataset / "zcolor" / "1"),
        shape=(1, EDGE, EDGE, EDGE),
        chunks=(1, EDGE, EDGE, EDGE),
        dtype="uint8",
        fill_value=0,
        zarr_format=2,
        compressors=None,
    )
    array[...] = voxels[None]


class Root:
    def __init__(self, base: Path) -> None:
        self.root = base / "root"
        self.tokens = base / "tokens.json"
        self.secret = self.root / SECRET / "secret_ds"


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Root:
    where = Root(tmp_path_factory.mktemp("file-authorization"))
    grants = {
        EVIL_TOKEN: [f"{EVIL}/*"],
        BOTH_TOKEN: [f"{EVIL}/*", f"{SECRET}/*"],
        SHARED_BOTH_TOKEN: [f"{LAB}/a", f"{LAB}/b"],
        SHARED_B_TOKEN: [f"{LAB}/b"],
    }
    where.tokens.write_text(json.dumps({"tokens": grants}))
    _write_layers(where.secret, SECRET_VALUE)
    write_layers_properties(where.secret, [_layer(name, kind) for name, kind in LAYERS.items()])
    evil = where.root / EVIL
    write_layers_properties(
        evil / "relative", [_layer(n, k, f"../../{SECRET}/secret_ds/{n}/1") for n, k in LAYERS.items()]
    )
    write_layers_properties(evil / "absolute", [_layer(n, k, str(where.secret / n / "1")) for n, k in LAYERS.items()])
    write_layers_properties(evil / "mag_symlink", [_layer(n, k) for n, k in LAYERS.items()])
    for name in LAYERS:
        (evil / "mag_symlink" / name).mkdir()
        (evil / "mag_symlink" / name / "1").symlink_to(where.secret / name / "1", target_is_directory=True)
    _write_layers(evil / "swapped", OWN_VALUE)  # its own data, until a chunk file is swapped for a link
    write_layers_properties(evil / "swapped", [_layer(n, k) for n, k in LAYERS.items()])
    # the shared-layer practice: lab_org/b's layers are symlinks to lab_org/a's
    _write_layers(where.root / LAB / "a", SHARED_VALUE)
    for name in ("a", "b"):
        write_layers_properties(where.root / LAB / name, [_layer(n, k) for n, k in LAYERS.items()])
    for name in LAYERS:
        (where.root / LAB / "b" / name).symlink_to(Path("..") / "a" / name, target_is_directory=True)
    return where


@pytest.fixture(scope="module")
def served(planted: Root, server_factory: Callable[..., Server]) -> Server:
    return server_factory(planted.root, tokens_file=planted.tokens)


def _get(server: Server, path: str, token: str) -> requests.Response:
    return requests.get(server.url + path, headers={"X-Auth-Token": token}, timeout=60)


def _voxels(server: Server, organization: str, dataset: str, layer: str, token: str) -> np.ndarray[Any, Any]:
    """The layer's voxels as zarr-python reads them through the gateway's Zarr v2 tree."""
    url = f"{server.url}/data/zarr/{organization}/{dataset}/{layer}/1"
    options = {"headers": {"X-Auth-Token": token}}
    return np.asarray(zarr.open_array(url, mode="r", zarr_format=2, storage_options=options)[...])


def _assert_no_secret(answer: requests.Response, what: str) -> None:
    assert answer.status_code != 200, f"{what}: served"
    assert bytes([SECRET_VALUE]) * 16 not in answer.content, f"{what}: secret voxels were served"
    assert answer.headers["Content-Type"].startswith("application/json"), what


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("dataset", LINKED)
def test_a_layer_of_another_organization_is_forbidden(served: Server, dataset: str, layer: str, route: str) -> None:
    path = ROUTES[route].format(o=EVIL, d=dataset, layer=layer)
    answer = _get(served, path, EVIL_TOKEN)
    _assert_no_secret(answer, path)
    assert answer.status_code == 403, (path, answer.status_code, answer.text)
    assert "does not grant access" in answer.json()["error"], answer.text


@pytest.mark.parametrize("dataset", LINKED)
def test_every_document_of_such_a_dataset_is_forbidden(served: Server, dataset: str) -> None:
    """A dataset's documents describe all its layers: forbidden like its chunks (metadata is data too), and
    so are its meshes."""
    for path in (
        f"/data/zarr/{EVIL}/{dataset}/.zgroup",
        f"/data/zarr/{EVIL}/{dataset}/color/1/.zarray",
        f"/data/zarr3/{EVIL}/{dataset}/zarr.json",
        f"/data/xarray/{EVIL}/{dataset}/zarr.json",
        f"/data/zarr/{EVIL}/{dataset}/",
        f"/data/meshes/{EVIL}/{dataset}/color/multires/info",
    ):
        answer = _get(served, path, EVIL_TOKEN)
        assert answer.status_code == 403, (path, answer.status_code, answer.text)


@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("dataset", LINKED)
def test_a_token_granted_both_reads_the_linked_layers(served: Server, dataset: str, layer: str) -> None:
    voxels = _voxels(served, EVIL, dataset, layer, BOTH_TOKEN)
    assert voxels.shape == (1, EDGE, EDGE, EDGE) and (voxels == SECRET_VALUE).all()
    for route, template in ROUTES.items():
        path = template.format(o=EVIL, d=dataset, layer=layer)
        answer = _get(served, path, BOTH_TOKEN)
        assert answer.status_code == 200, (route, path, answer.status_code, answer.text[:300])


def test_the_proxy_auth_answer_follows_the_files(served: Server) -> None:
    """``/auth`` (the proxy's subrequest) makes the same decision as the routes it guards."""
    original = f"/data/zarr/{EVIL}/relative/color/1/0.0.0.0"
    for token, status in ((EVIL_TOKEN, 403), (BOTH_TOKEN, 204)):
        headers = {"X-Auth-Token": token, "X-Original-URI": original}
        answer = requests.get(served.url + "/auth", headers=headers, timeout=60)
        assert answer.status_code == status, (token, answer.status_code, answer.text)


@pytest.mark.parametrize("layer", list(LAYERS))
def test_a_chunk_swapped_for_a_link_into_another_dataset_is_refused(served: Server, planted: Root, layer: str) -> None:
    """Read once (checked and kept open), then the stored file is replaced by a symlink into secret_org: the
    read-time check refuses it for any token, with the file named relative to the root; no secret voxel."""
    first = _voxels(served, EVIL, "swapped", layer, EVIL_TOKEN)
    assert (first == OWN_VALUE).all()
    stored = {"color": Path("color/1/z0/y0/x0.wkw"), "zcolor": Path("zcolor/1/0.0.0.0")}[layer]
    swapped = planted.root / EVIL / "swapped" / stored
    swapped.unlink()
    os.symlink(planted.secret / stored, swapped)
    for token in (EVIL_TOKEN, BOTH_TOKEN):
        for route, template in ROUTES.items():
            path = template.format(o=EVIL, d="swapped", layer=layer)
            answer = _get(served, path, token)
            _assert_no_secret(answer, f"{route} {path}")
            assert answer.status_code == 500, (path, answer.status_code, answer.text)
            message = answer.json()["error"]
            assert "outside its dataset's directory" in message and f"{EVIL}/swapped/{layer}/" in message, message
            assert str(planted.root) not in message, message


@pytest.mark.parametrize("layer", list(LAYERS))
def test_a_layer_shared_by_symlink_works_for_a_token_granted_both_datasets(served: Server, layer: str) -> None:
    for dataset in ("a", "b"):
        voxels = _voxels(served, LAB, dataset, layer, SHARED_BOTH_TOKEN)
        assert (voxels == SHARED_VALUE).all(), dataset
        for route, template in ROUTES.items():
            answer = _get(served, template.format(o=LAB, d=dataset, layer=layer), SHARED_BOTH_TOKEN)
            assert answer.status_code == 200, (route, dataset, answer.status_code, answer.text[:300])


@pytest.mark.parametrize("route", list(ROUTES))
def test_a_shared_layer_is_forbidden_to_a_token_granted_only_the_linking_dataset(served: Server, route: str) -> None:
    answer = _get(served, ROUTES[route].format(o=LAB, d="b", layer="color"), SHARED_B_TOKEN)
    assert answer.status_code == 403, (route, answer.status_code, answer.text)
    assert bytes([SHARED_VALUE]) * 16 not in answer.content


def test_listings_still_show_what_the_url_grants(served: Server) -> None:
    """Listings filter by the URL's grant alone (names only, no dataset loaded): the linked datasets are
    listed for the token granted evil_org, and answer 403 when opened."""
    tree = _get(served, "/data/zarr/", EVIL_TOKEN)
    assert tree.status_code == 200 and f"{EVIL}/" in tree.text and SECRET not in tree.text, tree.text
    organization = _get(served, f"/data/zarr/{EVIL}/", EVIL_TOKEN)
    assert organization.status_code == 200, organization.text
    assert all(name in organization.text for name in (*LINKED, "swapped")), organization.text
