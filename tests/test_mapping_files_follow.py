"""Mapping files come and go as layers do (issue 43): a new agglomerate file, Zarr agglomerate group or JSON
mapping beside a running gateway's segmentation layer is a layer ``<layer>__<mapping>`` once it has settled
(a second or so later: the catalog looks at the mapping folders whenever it checks the properties file),
read exactly by zarr-python, without a dataset reload or restart; a removed one is gone again, its chunks 404
with the layers that remain named (until the catalog has looked again: a storage fault, 500, never zeros).
Written in place while the gateway is being asked: a file still being
written is never listed as a broken layer."""

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import requests
import wkw
import zarr
from support.clients import read_zarr_python
from support.processes import wait_until
from support.servers import Server, assert_no_unexpected_errors, assert_reason

ORG = "follow_org"
DATASET = "follow"
LAYER = "segmentation"
SIZE = (64, 64, 32)
ENTRIES = 4000
WAIT = 30.0  # a bound on waiting, not a timed assertion: the catalog looks again every second


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("follow")
    dataset = root / ORG / DATASET
    rng = np.random.default_rng(4343)
    blocks = rng.integers(0, ENTRIES + 500, size=(16, 16, 8), dtype=np.uint32)  # some ids past the mappings
    labels = np.repeat(np.repeat(np.repeat(blocks, 4, 0), 4, 1), 4, 2)
    header = wkw.Header(np.uint32, block_type=wkw.Header.BLOCK_TYPE_LZ4HC, file_len=1)
    with wkw.Dataset.create(str(dataset / LAYER / "1"), header) as ds:
        ds.write((0, 0, 0), labels)
    np.save(root / "labels.npy", labels)
    box = {"topLeft": [0, 0, 0], "width": SIZE[0], "height": SIZE[1], "depth": SIZE[2]}
    layer = {"name": LAYER, "category": "segmentation", "boundingBox": box, "elementClass": "uint32"}
    properties = {
        "id": {"name": DATASET, "team": ""},
        "scale": {"factor": [8.0, 8.0, 8.0], "unit": "nanometer"},
        "dataLayers": [{**layer, "dataFormat": "wkw", "largestSegmentId": ENTRIES + 500, "mags": [{"mag": [1, 1, 1]}]}],
    }
    (dataset / "datasource-properties.json").write_text(json.dumps(properties))
    return root


@pytest.fixture(scope="module")
def gateway(root: Path, server_factory: Callable[..., Server]) -> Server:
    return server_factory(root, settle_seconds=1)  # the default: a mapping file still being written is held back


def layers(server: Server) -> set[str]:
    url = f"{server.url}/data/zarr/{ORG}/{DATASET}/datasource-properties.json"
    return {layer["name"] for layer in requests.get(url, timeout=30).json()["dataLayers"]}


def apply_table(labels: np.ndarray[Any, Any], table: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    wide = labels.astype(np.uint64)
    inside = wide < table.size
    wide[inside] = table[wide[inside]]
    return wide


def write_hdf5(path: Path, table: np.ndarray[Any, Any]) -> None:
    with h5py.File(path, "w") as f:  # in place, as webKnossos' tools write it
        f.create_dataset("segment_to_agglomerate", data=table)


def write_zarr_group(path: Path, table: np.ndarray[Any, Any]) -> None:
    group = zarr.open_group(str(path), mode="w", zarr_format=3)
    group.create_array("segment_to_agglomerate", data=table, chunks=(1024,))


def write_json(path: Path, classes: list[list[int]]) -> None:
    path.write_text(json.dumps({"name": path.stem, "classes": classes}))


def appears(server: Server, name: str, settled: bool) -> float:
    """Seconds until ``name`` is listed and served (asked all the while). ``settled``: a file caught while being
    written must never be listed as a layer that cannot be served (an HDF5 or JSON file is held back until it
    has settled); a Zarr group caught before its array's metadata is written is listed with that reason until
    the metadata is there."""
    started, broken = time.monotonic(), []

    def served() -> bool:
        if name not in layers(server):
            return False
        status = requests.get(f"{server.url}/data/zarr/{ORG}/{DATASET}/{name}/1/.zarray", timeout=30).status_code
        if status != 200:
            broken.append(status)
        return status == 200

    assert wait_until(served, timeout=WAIT, interval=0.1), (name, layers(server), broken)
    assert not (settled and broken), broken
    return time.monotonic() - started


def disappears(server: Server, name: str) -> float:
    started = time.monotonic()
    gone = wait_until(lambda: name not in layers(server), timeout=WAIT, interval=0.1)
    assert gone, (name, layers(server))
    return time.monotonic() - started


@pytest.mark.parametrize("kind", ["hdf5", "zarr", "json"])
def test_a_new_mapping_is_a_layer_and_a_removed_one_is_gone(gateway: Server, root: Path, kind: str) -> None:
    labels = np.load(root / "labels.npy")
    layer_directory = root / ORG / DATASET / LAYER
    name = f"added_{kind}"
    target = f"{LAYER}__{name}"
    assert target not in layers(gateway)
    rng = np.random.default_rng(len(kind))
    table = rng.integers(1, 1 << 20, size=ENTRIES, dtype=np.uint64)
    table[0] = 0
    if kind == "hdf5":
        (layer_directory / "agglomerates").mkdir(exist_ok=True)
        path = layer_directory / "agglomerates" / f"{name}.hdf5"
        write_hdf5(path, table)
        truth = apply_table(labels, table)
    elif kind == "zarr":
        (layer_directory / "agglomerates").mkdir(exist_ok=True)
        path = layer_directory / "agglomerates" / name
        write_zarr_group(path, table)
        truth = apply_table(labels, table)
    else:
        (layer_directory / "mappings").mkdir(exist_ok=True)
        path = layer_directory / "mappings" / f"{name}.json"
        ids = rng.permutation(np.arange(1, ENTRIES))[:600].tolist()
        classes = [ids[i : i + 20] for i in range(0, len(ids), 20)]
        write_json(path, classes)
        joined = {member: min(members) for members in classes for member in members}
        truth = labels.copy()
        for member, smallest in joined.items():
            truth[labels == member] = smallest
    took = appears(gateway, target, settled=kind != "zarr")
    url = f"{gateway.url}/data/zarr/{ORG}/{DATASET}/{target}/1"
    np.testing.assert_array_equal(read_zarr_python(url, 2)[0], truth)
    print(f"{kind}: listed {took:.2f} s after it was written")

    chunk = f"{url}/0.0.0.0"
    assert requests.get(chunk, timeout=30).status_code == 200
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    seen: list[int] = []

    def chunk_gone() -> bool:
        response = requests.get(chunk, timeout=30)
        seen.append(response.status_code)
        return response.status_code == 404

    assert wait_until(chunk_gone, timeout=WAIT, interval=0.05), seen
    assert set(seen) <= {500, 404}, seen  # the removed mapping's fault until the catalog looked again
    took = disappears(gateway, target)
    print(f"{kind}: gone {took:.2f} s after it was removed ({len(seen)} chunk answers: {sorted(set(seen))})")
    assert_reason(requests.get(f"{url}/.zarray", timeout=30), 404, target)
    assert_reason(requests.get(chunk, timeout=30), 404, target, LAYER)  # a layer that is gone: never zeros
    assert LAYER in layers(gateway)
    assert_no_unexpected_errors(gateway)


def test_a_mapping_renamed_into_place_is_a_layer_and_the_source_reads_on(gateway: Server, root: Path) -> None:
    """Written elsewhere and renamed in (trusted at once: its writer had finished); the raw layer is unchanged."""
    labels = np.load(root / "labels.npy")
    agglomerates = root / ORG / DATASET / LAYER / "agglomerates"
    agglomerates.mkdir(exist_ok=True)
    table = np.arange(ENTRIES, dtype=np.uint64) // 10
    staged = root / "staged.hdf5"
    write_hdf5(staged, table)
    staged.rename(agglomerates / "renamed.hdf5")
    appears(gateway, f"{LAYER}__renamed", settled=True)
    base = f"{gateway.url}/data/zarr/{ORG}/{DATASET}"
    np.testing.assert_array_equal(read_zarr_python(f"{base}/{LAYER}__renamed/1", 2)[0], apply_table(labels, table))
    np.testing.assert_array_equal(read_zarr_python(f"{base}/{LAYER}/1", 2)[0], labels)
    assert_no_unexpected_errors(gateway)
