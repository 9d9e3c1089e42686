"""Nothing outside the data root is ever read, on any path (issue 16, item 1).

A lab member who can write datasets into the data root plants symlinks out of it: chunk files of
Zarr v2 and v3 layers (plain and sharded) pointing at a private array outside the root and at the
gateway's own tokens file, and a WKW ``z0/`` directory swapped for a symlink after the gateway has
read it. A real gateway (with that tokens file) is then read the ways that reach the bytes: a
chunk passed through, a chunk that straddles the bounding box, a re-chunked layout, a preview.
Every such read must be the storage-fault status with a message that the file resolves outside
the data root, naming it relative to the root, and no byte of a target may come back.
"""

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
import requests
import wkw
import zarr
from support.datasets import cube_layer, write_layers_properties
from support.servers import Server

ORG, DATASET = "lab", "hostile"
SECRET_VALUE = 0xAB  # every voxel of the private arrays outside the root
EDGE = 64  # source arrays are (1, 64, 64, 64) in chunks of 32
BOX = 48  # the bounding box: [0, 48) on every axis, so chunks at 32 straddle it
CHUNK = 32
CHUNK_BYTES = CHUNK**3
TOKEN = "containment-token-0123456789"
ZARR_LAYERS: dict[str, tuple[Literal[2, 3], tuple[int, ...] | None]] = {  # layer: (zarr format, shards)
    "v2": (2, None),
    "v3": (3, None),
    "v3_sharded": (3, (1, EDGE, EDGE, EDGE)),
}
# Planted chunk files (source grid coordinates c, x, y, z): one inside the box (passed through as stored)
# pointing at a private chunk, and one straddling the box in the middle Z slice (masked, re-chunked and
# previewed) pointing at the tokens file. A sharded layer holds one shard: it points at a private shard.
INSIDE, STRADDLING = (0, 0, 0, 0), (0, 1, 1, 0)


def _chunk_name(zarr_format: int, coords: tuple[int, ...]) -> str:
    return ".".join(map(str, coords)) if zarr_format == 2 else "c/" + "/".join(map(str, coords))


def _write_zarr(directory: Path, zarr_format: Literal[2, 3], shards: tuple[int, ...] | None, value: int | None) -> None:
    """An uncompressed uint8 array, so a leaked byte would show as itself; random voxels unless ``value``."""
    shape, chunks = (1, EDGE, EDGE, EDGE), (1, CHUNK, CHUNK, CHUNK)
    names = None if zarr_format == 2 else list("cxyz")
    array = zarr.create_array(
        str(directory),
        shape=shape,
        dtype="uint8",
        chunks=chunks,
        shards=shards,
        fill_value=0,
        zarr_format=zarr_format,
        compressors=None,
        dimension_names=names,
    )
    rng = np.random.default_rng(5)
    data = rng.integers(0, 100, shape, dtype=np.uint8) if value is None else np.full(shape, value, dtype=np.uint8)
    array[...] = data


class Planted:
    def __init__(self, base: Path) -> None:
        self.root = base / "root"
        self.outside = base / "outside"  # private data the gateway can read but must never serve
        self.tokens = self.outside / "tokens.json"
        self.dataset = self.root / ORG / DATASET

    def relative(self, path: Path) -> str:
        return str(path.relative_to(self.root))


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Planted:
    where = Planted(tmp_path_factory.mktemp("containment"))
    where.outside.mkdir()
    # The tokens file is exactly one uncompressed chunk long (JSON allows the trailing spaces), so a
    # chunk file linked to it would decode: its bytes would be served as voxels.
    document = json.dumps({"tokens": {TOKEN: [f"{ORG}/*"]}}).encode()
    where.tokens.write_bytes(document + b" " * (CHUNK_BYTES - len(document)))
    layers = []
    for name, (zarr_format, shards) in ZARR_LAYERS.items():
        mag = where.dataset / name / "1"
        _write_zarr(mag, zarr_format, shards, None)
        private = where.outside / name
        _write_zarr(private, zarr_format, shards, SECRET_VALUE)
        layers.append(cube_layer(name, "zarr" if zarr_format == 2 else "zarr3", BOX))
        if shards is not None:
            _plant(mag / _chunk_name(3, INSIDE), private / _chunk_name(3, INSIDE))
            continue
        _plant(mag / _chunk_name(zarr_format, INSIDE), private / _chunk_name(zarr_format, INSIDE))
        _plant(mag / _chunk_name(zarr_format, STRADDLING), where.tokens)
    wkw_mag = where.dataset / "wkw" / "1"
    with wkw.Dataset.create(str(wkw_mag), wkw.Header(np.uint8, block_len=CHUNK, file_len=1)) as ds:
        ds.write((0, 0, 0), np.random.default_rng(6).integers(1, 100, (EDGE, EDGE, EDGE), dtype=np.uint8))
    with wkw.Dataset.create(str(where.outside / "wkw"), wkw.Header(np.uint8, block_len=CHUNK, file_len=1)) as ds:
        ds.write((0, 0, 0), np.full((EDGE, EDGE, EDGE), SECRET_VALUE, dtype=np.uint8))
    layers.append(cube_layer("wkw", "wkw", BOX))
    write_layers_properties(where.dataset, layers)
    return where


def _plant(link: Path, target: Path) -> None:
    assert target.is_file(), target
    link.unlink()
    link.symlink_to(target)


@pytest.fixture(scope="module")
def served(planted: Planted, server_factory: Callable[..., Server]) -> Server:
    return server_factory(planted.root, tokens_file=planted.tokens)


@pytest.fixture(scope="module")
def rechunked(planted: Planted, server_factory: Callable[..., Server]) -> Server:
    """Served in 64³ chunks over 32³ source chunks: every chunk is read, masked and encoded anew."""
    return server_factory(planted.root, tokens_file=planted.tokens, chunk_edge=64)


def _get(server: Server, path: str) -> requests.Response:
    return requests.get(server.url + path, headers={"X-Auth-Token": TOKEN}, timeout=60)


def _assert_refused(answer: requests.Response, planted: Planted, what: str) -> None:
    """The storage-fault status, the reason, the path relative to the root, and no byte of any target."""
    assert answer.status_code == 500, f"{what}: {answer.status_code} {answer.content[:200]!r}"
    message = answer.json()["error"]
    assert "resolves outside the data root" in message, f"{what}: {message}"
    assert f"{ORG}/{DATASET}/" in message, f"{what}: {message}"
    assert str(planted.root) not in message and str(planted.outside) not in message, f"{what}: {message}"
    assert TOKEN.encode() not in answer.content, f"{what}: the tokens file was served"
    assert bytes([SECRET_VALUE]) * 16 not in answer.content, f"{what}: private voxels were served"


def _v3_key(index: tuple[int, ...]) -> str:
    return "c/" + "/".join(map(str, index))


# a chunk inside the box is passed through; a straddling one is masked to the bounding box, so read through
# the decoding path (tensorstore before this fix)
@pytest.mark.parametrize("chunk", [INSIDE, STRADDLING], ids=["inside_the_box", "straddling"])
@pytest.mark.parametrize("layer", list(ZARR_LAYERS))
@pytest.mark.parametrize("tree", ["zarr", "zarr3"])
def test_a_chunk_linked_out_of_the_root_is_refused(
    served: Server, planted: Planted, layer: str, tree: str, chunk: tuple[int, ...]
) -> None:
    key = ".".join(map(str, chunk)) if tree == "zarr" else _v3_key(chunk)
    _assert_refused(_get(served, f"/data/{tree}/{ORG}/{DATASET}/{layer}/1/{key}"), planted, f"{tree} {layer}")


@pytest.mark.parametrize("layer", list(ZARR_LAYERS))
def test_a_rechunked_layout_refuses_chunks_linked_out_of_the_root(
    rechunked: Server, planted: Planted, layer: str
) -> None:
    for tree, key in (("zarr", "0.0.0.0"), ("zarr3", "c/0/0/0/0")):
        _assert_refused(_get(rechunked, f"/data/{tree}/{ORG}/{DATASET}/{layer}/1/{key}"), planted, f"{tree} {layer}")


@pytest.mark.parametrize("layer", list(ZARR_LAYERS))
def test_a_preview_refuses_chunks_linked_out_of_the_root(served: Server, planted: Planted, layer: str) -> None:
    _assert_refused(_get(served, f"/preview/{ORG}/{DATASET}/{layer}.png"), planted, f"preview {layer}")


@pytest.mark.parametrize("layer", ["v2", "v3"])
@pytest.mark.parametrize("tree", ["zarr", "zarr3"])
def test_chunks_not_linked_out_are_still_served(served: Server, planted: Planted, layer: str, tree: str) -> None:
    """The refusals above are about the links: a chunk of the same layers that is not linked reads as written."""
    source = zarr.open_array(str(planted.dataset / layer / "1"), mode="r")
    url = f"{served.url}/data/{tree}/{ORG}/{DATASET}/{layer}/1"
    options = {"headers": {"X-Auth-Token": TOKEN}}
    array = zarr.open_array(url, mode="r", zarr_format=2 if tree == "zarr" else 3, storage_options=options)
    window = (slice(0, 1), slice(32, BOX), slice(0, 32), slice(0, 32))  # inside chunk (0, 1, 0, 0) and the box
    np.testing.assert_array_equal(array[window], source[window])


def test_a_wkw_directory_swapped_for_a_symlink_after_a_first_read_is_refused(served: Server, planted: Planted) -> None:
    path = f"/data/zarr/{ORG}/{DATASET}/wkw/1/0.0.0.0"
    first = _get(served, path)
    assert first.status_code == 200, first.text  # read, checked and its descriptor kept open
    z0 = planted.dataset / "wkw" / "1" / "z0"
    shutil.rmtree(z0)
    os.symlink(planted.outside / "wkw" / "z0", z0)
    for attempt in (path, f"/data/zarr3/{ORG}/{DATASET}/wkw/1/c/0/0/0/0", f"/preview/{ORG}/{DATASET}/wkw.png"):
        _assert_refused(_get(served, attempt), planted, attempt)


def test_the_decoding_path_serves_each_read_from_its_own_chunks(served: Server, planted: Planted) -> None:
    """Chunks decoded in memory are dropped after each read: a chunk deleted reads as the fill value, and
    a chunk rewritten reads as its new bytes, never as what an earlier read held."""
    dataset = planted.root / ORG / "mutable"
    _write_zarr(dataset / "v2" / "1", 2, None, None)
    write_layers_properties(dataset, [cube_layer("v2", "zarr", BOX)])
    source = zarr.open_array(str(dataset / "v2" / "1"), mode="r+")
    options = {"headers": {"X-Auth-Token": TOKEN}}
    window = (slice(0, 1), slice(32, BOX), slice(0, 32), slice(0, 32))  # chunk (0, 1, 0, 0): masked, so decoded

    def served_window() -> np.ndarray:
        url = f"{served.url}/data/zarr/{ORG}/mutable/v2/1"
        return np.asarray(zarr.open_array(url, mode="r", zarr_format=2, storage_options=options)[window])

    np.testing.assert_array_equal(served_window(), source[window])
    (dataset / "v2" / "1" / "0.1.0.0").unlink()
    np.testing.assert_array_equal(served_window(), np.zeros((1, BOX - 32, 32, 32), dtype=np.uint8))
    source[0:1, 32:64, 0:32, 0:32] = np.full((1, 32, 32, 32), 42, dtype=np.uint8)
    np.testing.assert_array_equal(served_window(), np.full((1, BOX - 32, 32, 32), 42, dtype=np.uint8))
