"""A layer on an operator's extra root is read with the grant of its dataset alone (issue 24, item 4).

Authorization follows the files: a file must lie in the directory of a dataset the token is granted, or in
one of the operator's ``extra_roots`` (a second volume webKnossos data roots often have), which the operator
trusts as a whole. A dataset whose layers lie there (a layer directory symlinked to the volume, a mag path
naming it absolutely) is read by a token granted that dataset, in every route that reads voxels and at
``/auth``; a token granted another dataset gets the forbidden answer, as for any dataset it is not granted.
"""

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import requests
import wkw
import zarr
from support.datasets import cube_layer, write_layers_properties
from support.servers import Server

EDGE = 32
ORG, DATASET, OTHER = "lab_org", "on_volume", "elsewhere"
GRANTED, OTHER_TOKEN = "granted-token-0123456789", "other-dataset-token-0123456789"
VALUE = 0x3C
ROUTES = {
    "v2": "/data/zarr/{o}/{d}/{layer}/1/0.0.0.0",
    "v3": "/data/zarr3/{o}/{d}/{layer}/1/c/0/0/0/0",
    "xarray": "/data/xarray/{o}/{d}/1/{layer}/c/0/0/0",
    "preview": "/preview/{o}/{d}/{layer}.png",
}
LAYERS = ("linked_wkw", "linked_zarr", "absolute_zarr")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, server_factory: Callable[..., Server]) -> Server:
    base = tmp_path_factory.mktemp("extra-root-grants")
    root, volume = base / "root", base / "volume"
    voxels = np.full((EDGE,) * 3, VALUE, dtype=np.uint8)
    with wkw.Dataset.create(str(volume / "linked_wkw" / "1"), wkw.Header(np.uint8, block_len=EDGE, file_len=1)) as ds:
        ds.write((0, 0, 0), voxels)
    for name in ("linked_zarr", "absolute_zarr"):
        array = zarr.create_array(
            str(volume / name / "1"), shape=(EDGE,) * 3, chunks=(EDGE,) * 3, dtype="uint8", zarr_format=2
        )
        array[...] = voxels
    dataset = root / ORG / DATASET
    layers: list[dict[str, Any]] = [cube_layer("linked_wkw", "wkw", EDGE), cube_layer("linked_zarr", "zarr", EDGE)]
    layers.append(
        cube_layer("absolute_zarr", "zarr", EDGE, [{"mag": [1, 1, 1], "path": str(volume / "absolute_zarr" / "1")}])
    )
    write_layers_properties(dataset, layers)
    for name in ("linked_wkw", "linked_zarr"):
        (dataset / name).symlink_to(volume / name, target_is_directory=True)
    write_layers_properties(root / ORG / OTHER, [])
    tokens = base / "tokens.json"
    tokens.write_text(json.dumps({"tokens": {GRANTED: [f"{ORG}/{DATASET}"], OTHER_TOKEN: [f"{ORG}/{OTHER}"]}}))
    return server_factory(root, tokens_file=tokens, extra_roots=str(volume))


def _get(server: Server, path: str, token: str) -> requests.Response:
    return requests.get(server.url + path, headers={"X-Auth-Token": token}, timeout=60)


@pytest.mark.parametrize("layer", LAYERS)
def test_a_token_granted_the_dataset_reads_its_layers_on_an_extra_root(served: Server, layer: str) -> None:
    for route, path in ROUTES.items():
        answer = _get(served, path.format(o=ORG, d=DATASET, layer=layer), GRANTED)
        assert answer.status_code == 200, (route, answer.status_code, answer.text[:300])
    url = f"{served.url}/data/zarr/{ORG}/{DATASET}/{layer}/1"
    options = {"headers": {"X-Auth-Token": GRANTED}}
    read = np.asarray(zarr.open_array(url, mode="r", zarr_format=2, storage_options=options)[...])
    assert read.shape == (1, EDGE, EDGE, EDGE) and bool(np.all(read == VALUE)), layer
    headers = {"X-Auth-Token": GRANTED, "X-Original-URI": ROUTES["v2"].format(o=ORG, d=DATASET, layer=layer)}
    assert requests.get(served.url + "/auth", headers=headers, timeout=60).status_code == 204, layer


@pytest.mark.parametrize("layer", LAYERS)
def test_a_token_granted_another_dataset_is_forbidden_there(served: Server, layer: str) -> None:
    for route, path in ROUTES.items():
        answer = _get(served, path.format(o=ORG, d=DATASET, layer=layer), OTHER_TOKEN)
        assert answer.status_code == 403, (route, answer.status_code, answer.text[:300])
        assert bytes([VALUE]) * 16 not in answer.content, route
