"""No storage fault reads as zeros, for every source format and through every tree (issue 24, item 5).

One dataset holds a layer of each format a mag can be stored in: WKW, Zarr v2, Zarr v3, N5, Neuroglancer
precomputed and sharded precomputed, each written by its own writer (``wkw``, zarr-python, tensorstore),
with data everywhere but one chunk that no file holds (absent by its format's rules). Then a storage fault:
the volume the layers are symlinked to goes (an empty mount point stays behind, then none), a mag directory
is deleted, or a chunk file (a shard, a WKW cube) is swapped for a dangling symlink. Every chunk the fault
reaches, stored or absent, must then be a 503 with ``Retry-After`` and the reason in the Zarr v2, Zarr v3
and precomputed trees: never a 404, which clients read as the fill value.
"""

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import requests
from support.format_layers import EDGE, FORMATS
from support.layers import layer_entry, write_properties
from support.processes import wait_until
from support.servers import Server, assert_reason

from gateway_storage import AnchoredStore, LocalStore, StoreUnavailableError

ORG, DATASET = "faults", "formats"
SIZE = 2 * EDGE  # every layer is 2³ chunks
STORED, HOLE = (0, 0, 0), (1, 1, 1)  # a chunk every layer stores, and the one none does (it reads as zeros)
TREES = ("zarr", "zarr3", "precomputed")


def voxels() -> np.ndarray:
    data = np.random.default_rng(5).integers(1, 200, (SIZE,) * 3).astype("uint8")
    data[EDGE:, EDGE:, EDGE:] = 0  # the chunk at HOLE: no writer stores a chunk of fill values
    return data


def write_dataset(dataset: Path, layer_dirs: dict[str, Path]) -> None:
    """A layer of every format (each in ``layer_dirs``, wherever that lies) with its mag ``1``."""
    write_properties(dataset, [layer_entry(name, kind.data_format) for name, kind in FORMATS.items()])
    data = voxels()
    for name, kind in FORMATS.items():
        kind.write(layer_dirs[name] / "1", data)
        assert (layer_dirs[name] / "1" / kind.origin_file).is_file(), name


def chunk_url(server: Server, layer: str, tree: str, coords: tuple[int, ...]) -> str:
    base = f"{server.url}/data/{tree}/{ORG}/{DATASET}/{layer}/1/"
    if tree == "zarr":
        return base + ".".join(map(str, (0, *coords)))
    if tree == "zarr3":
        return base + "c/" + "/".join(map(str, (0, *coords)))
    return base + "_".join(f"{c * EDGE}-{(c + 1) * EDGE}" for c in coords)


def answers(server: Server, coords: tuple[int, ...], layers: list[str]) -> dict[tuple[str, str], requests.Response]:
    with requests.Session() as session:
        return {
            (layer, tree): session.get(chunk_url(server, layer, tree, coords), timeout=60)
            for layer in layers
            for tree in TREES
        }


def assert_faults(found: dict[tuple[str, str], requests.Response], *words: str) -> None:
    """Every answer a 503 with Retry-After and a reason holding ``words``: a storage fault, never absent data."""
    for where, response in found.items():
        assert response.status_code == 503, (where, response.status_code, response.text[:300])
        assert int(response.headers["Retry-After"]) >= 1, where
        assert_reason(response, 503, *words)


def assert_served(server: Server) -> None:
    """Before the fault: the stored chunk is data in every tree, the one not stored absent (or, where the tree
    makes chunks of voxels, zeros), never a fault."""
    for where, response in answers(server, STORED, list(FORMATS)).items():
        assert response.status_code == 200, (where, response.status_code, response.text[:300])
    for where, response in answers(server, HOLE, list(FORMATS)).items():
        assert response.status_code in (200, 404), (where, response.status_code, response.text[:300])
        if response.status_code == 404:
            reason = response.json()["error"]  # the Zarr trees name the fill value; the precomputed tree zeros
            assert "fill value" in reason or "reads as zeros" in reason, (where, reason)


def layers_on_a_volume(tmp_path: Path, server_factory: Callable[..., Server]) -> tuple[Server, Path]:
    root, volume = tmp_path / "root", tmp_path / "volume"
    dataset = root / ORG / DATASET
    write_dataset(dataset, {name: volume / name for name in FORMATS})
    for name in FORMATS:
        (dataset / name).symlink_to(volume / name, target_is_directory=True)
    return server_factory(root, extra_roots=str(volume)), volume


def test_every_format_on_a_volume_that_went_is_a_fault_not_zeros(
    tmp_path: Path, server_factory: Callable[..., Server]
) -> None:
    server, volume = layers_on_a_volume(tmp_path, server_factory)
    assert_served(server)
    os.rename(volume, tmp_path / "unmounted")
    volume.mkdir()  # an empty mount point stays behind
    for coords in (STORED, HOLE):
        assert_faults(answers(server, coords, list(FORMATS)), "not there")
    os.rmdir(volume)  # and then none
    for coords in (STORED, HOLE):
        assert_faults(answers(server, coords, list(FORMATS)), "not there")


def test_every_format_on_a_volume_away_when_it_is_loaded_is_a_fault_not_zeros(
    tmp_path: Path, server_factory: Callable[..., Server]
) -> None:
    """The volume is away before the dataset is first loaded: its layers are listed as unavailable with the
    reason, their chunks are 503s in every tree (as after the load), and they are served once it is back."""
    server, volume = layers_on_a_volume(tmp_path, server_factory)
    os.rename(volume, tmp_path / "unmounted")  # the dataset is loaded by the first request that names it
    for coords in (STORED, HOLE):
        assert_faults(answers(server, coords, list(FORMATS)), "cannot be reached", "symlink")
    listing = requests.get(f"{server.url}/data/zarr/{ORG}/{DATASET}/", timeout=60)
    assert listing.status_code == 200 and listing.text.count("volume that is away") >= len(FORMATS), listing.text
    os.rename(tmp_path / "unmounted", volume)
    assert wait_until(lambda: all(r.status_code == 200 for r in answers(server, STORED, list(FORMATS)).values()), 60)
    assert_served(server)


def layers_in_the_root(tmp_path: Path) -> tuple[Path, Path]:
    """The data root and the dataset in it, whose layers lie in its own directory."""
    root = tmp_path / "root"
    dataset = root / ORG / DATASET
    write_dataset(dataset, {name: dataset / name for name in FORMATS})
    return root, dataset


def test_every_format_whose_mag_directory_was_deleted_is_a_fault_not_zeros(
    tmp_path: Path, server_factory: Callable[..., Server]
) -> None:
    root, dataset = layers_in_the_root(tmp_path)
    server = server_factory(root)
    assert_served(server)
    for name in FORMATS:
        shutil.rmtree(dataset / name / "1")  # a precomputed scale's directory: its volume's info stays
    for coords in (STORED, HOLE):
        assert_faults(answers(server, coords, list(FORMATS)), "not there")


def test_a_dangling_chunk_symlink_of_every_format_is_a_fault_not_zeros(
    tmp_path: Path, server_factory: Callable[..., Server]
) -> None:
    root, dataset = layers_in_the_root(tmp_path)
    for name, kind in FORMATS.items():  # a chunk file, a WKW cube, a shard: linked to a file that went
        mag = dataset / name / "1"
        (mag / kind.origin_file).unlink()
        (mag / kind.origin_file).symlink_to(mag / "moved-away")
    server = server_factory(root)
    assert_faults(answers(server, STORED, list(FORMATS)), "symlink whose target is gone")


def test_the_anchored_store_answers_absent_only_in_a_directory_that_is_there(tmp_path: Path) -> None:
    """The one mechanism, on its own: below its directory a missing file is None (absent) only while the
    directory is there; a file elsewhere is the inner store's answer alone."""
    root = tmp_path / "root"
    mag = root / "org" / "ds" / "layer" / "1"
    mag.mkdir(parents=True)
    (mag / "chunk").write_bytes(b"voxels")
    store = AnchoredStore(LocalStore(str(root)), str(mag))
    assert store.identity(str(mag / "absent")) is None
    assert store.read_whole(str(mag / "absent"), limit=16) is None
    found = store.read_whole(str(mag / "chunk"), limit=16, settled=True)
    assert found is not None and found[0] == b"voxels"
    shutil.rmtree(mag)
    for lookup in (
        lambda: store.identity(str(mag / "chunk")),
        lambda: store.read_whole(str(mag / "chunk"), limit=16),
        lambda: store.read_whole(str(mag / "deep" / "absent"), limit=16, settled=True),
    ):
        with pytest.raises(StoreUnavailableError, match="not there"):
            lookup()
    assert store.identity(str(root / "org" / "ds" / "info")) is None  # not below the mag: absent as it is
