"""No storage fault reads as zeros: a chunk is 404 only when its format says it is absent, in a mag directory
that is there. A volume that went, a data root that went and a dangling chunk symlink are storage faults
(503 with Retry-After), with the reason, in both trees, for Zarr v2 and v3 layers.
"""

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
import requests
import zarr
from support.layers import layer_entry, write_properties
from support.servers import Server, assert_reason

ORG = "faults"
DATASET = "ds"
SIZE = (64, 64, 64)
CHUNK = (32, 32, 32)
LAYERS: dict[str, tuple[str, Literal[2, 3]]] = {"v2": ("zarr", 2), "v3": ("zarr3", 3)}
# a chunk each layer stores, and one it does not store (only zeros were written there)
STORED, HOLE = (0, 0, 0), (1, 1, 1)


def write_dataset(dataset: Path, layer_dirs: dict[str, Path]) -> None:
    """Both layers (in ``layer_dirs``, wherever they lie), with data everywhere but the chunk at HOLE."""
    write_properties(dataset, [layer_entry(name, data_format) for name, (data_format, _) in LAYERS.items()])
    data = np.random.default_rng(3).integers(1, 200, SIZE).astype("uint8")
    data[32:, 32:, 32:] = 0
    for name, (_, zarr_format) in LAYERS.items():
        array = zarr.create_array(
            str(layer_dirs[name] / "1"), shape=SIZE, chunks=CHUNK, dtype="uint8", zarr_format=zarr_format
        )
        array[...] = data


def chunk_url(server: Server, layer: str, tree: str, coords: tuple[int, ...]) -> str:
    base = f"{server.url}/data/{tree}/{ORG}/{DATASET}/{layer}/1/"
    return base + (".".join(map(str, (0, *coords))) if tree == "zarr" else "c/" + "/".join(map(str, (0, *coords))))


def answers(server: Server, coords: tuple[int, ...]) -> dict[tuple[str, str], requests.Response]:
    return {
        (layer, tree): requests.get(chunk_url(server, layer, tree, coords), timeout=30)
        for layer in LAYERS
        for tree in ("zarr", "zarr3")
    }


def assert_fault(found: dict[tuple[str, str], requests.Response], *words: str) -> None:
    for where, response in found.items():
        assert response.status_code == 503, (where, response.status_code, response.text[:300])
        assert response.headers.get("retry-after"), where
        assert_reason(response, 503, *words)


def assert_absent_chunks_are_404(server: Server) -> None:
    for where, response in answers(server, HOLE).items():
        assert response.status_code == 404 and "fill value" in response.json()["error"], where
    for where, response in answers(server, STORED).items():
        assert response.status_code == 200, where


def test_layers_on_a_volume_that_went_are_faults_not_zeros(
    tmp_path: Path, server_factory: Callable[..., Server]
) -> None:
    root, volume = tmp_path / "root", tmp_path / "volume"
    dataset = root / ORG / DATASET
    write_dataset(dataset, {name: volume / name for name in LAYERS})
    for name in LAYERS:
        (dataset / name).symlink_to(volume / name, target_is_directory=True)
    server = server_factory(root, extra_roots=str(volume))
    assert_absent_chunks_are_404(server)
    os.rename(volume, tmp_path / "unmounted")
    volume.mkdir()  # an empty mount point stays behind
    for coords in (STORED, HOLE):
        assert_fault(answers(server, coords), "not there")
    os.rmdir(volume)  # and when it is gone too
    assert_fault(answers(server, HOLE), "not there")


def test_a_data_root_that_went_is_a_fault_not_an_absent_dataset(
    tmp_path: Path, server_factory: Callable[..., Server]
) -> None:
    root = tmp_path / "root"
    dataset = root / ORG / DATASET
    write_dataset(dataset, {name: dataset / name for name in LAYERS})
    server = server_factory(root)
    assert_absent_chunks_are_404(server)
    os.rename(root, tmp_path / "gone")
    time.sleep(1.5)  # past the catalog's revalidation of the properties file
    for coords in (STORED, HOLE):
        assert_fault(answers(server, coords), "data root")
    for tree, name in (("zarr", ".zarray"), ("zarr3", "zarr.json")):
        response = requests.get(f"{server.url}/data/{tree}/{ORG}/{DATASET}/v2/1/{name}", timeout=30)
        assert_reason(response, 503, "data root")
        assert str(tmp_path) not in response.text


@pytest.mark.parametrize("layer", list(LAYERS))
def test_a_dangling_chunk_symlink_is_a_fault_not_zeros(
    tmp_path: Path, server_factory: Callable[..., Server], layer: str
) -> None:
    root = tmp_path / "root"
    dataset = root / ORG / DATASET
    write_dataset(dataset, {name: dataset / name for name in LAYERS})
    mag = dataset / layer / "1"
    chunk = mag / ("0.0.0" if LAYERS[layer][1] == 2 else "c/0/0/0")
    chunk.unlink()
    chunk.symlink_to(mag / "moved-away")
    server = server_factory(root)
    for tree in ("zarr", "zarr3"):
        response = requests.get(chunk_url(server, layer, tree, STORED), timeout=30)
        assert_reason(response, 503, "symlink whose target is gone")
