"""Zarr chunks and metadata as the format's rules and its reference reader take them.

- An uncompressed chunk holds exactly its voxels: one cut short (a torn or truncated rewrite) or empty is a
  500 with the reason in both trees, never a short or empty 200.
- Metadata values no array can hold (a fill value its data type cannot, an extent past webKnossos' 32-bit
  bound) make the layer unusable with the reason.
- A Blosc chunk with bytes after the frame its header declares (as z5py writes them) reads with numcodecs,
  the Zarr v2 reference reader; through the gateway zarr-python and tensorstore read it voxel-exactly.
"""

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numcodecs
import numpy as np
import pytest
import requests
import zarr
from support.clients import read_tensorstore, read_zarr_python
from support.layers import layer_entry, write_properties
from support.servers import Server, assert_no_unexpected_errors, assert_reason

ORG = "integrity"
DATASET = "ds"
SIZE = (64, 64, 64)
CHUNK = (32, 32, 32)
TRAILING = bytes(range(16))  # what follows the Blosc frame in each chunk file, as z5py leaves it


@dataclass(frozen=True)
class Root:
    path: Path
    server: Server


def voxels() -> np.ndarray:
    return np.random.default_rng(11).integers(1, 200, SIZE).astype("uint8")


def write_array(mag: Path, zarr_format: Literal[2, 3], compressors: Any = None) -> None:
    array = zarr.create_array(
        str(mag), shape=SIZE, chunks=CHUNK, dtype="uint8", zarr_format=zarr_format, compressors=compressors
    )
    array[...] = voxels()


def patch_document(path: Path, **fields: Any) -> None:
    document = json.loads(path.read_text())
    document.update(fields)
    path.write_text(json.dumps(document))


LAYERS = {
    "raw_v2": "zarr",
    "raw_v3": "zarr3",
    "blosc_tail": "zarr",
    "huge_fill": "zarr",
    "huge_fill_v3": "zarr3",
    "huge_shape": "zarr",
    "huge_shape_v3": "zarr3",
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, server_factory: Callable[..., Server]) -> Root:
    root = tmp_path_factory.mktemp("integrity")
    dataset = root / ORG / DATASET
    write_properties(dataset, [layer_entry(name, data_format) for name, data_format in LAYERS.items()])
    for name in ("raw_v2", "raw_v3"):
        mag = dataset / name / "1"
        write_array(mag, 2 if name == "raw_v2" else 3)
        chunk = mag / ("0.0.0" if name == "raw_v2" else "c/0/0/0")
        chunk.write_bytes(chunk.read_bytes()[: 32**3 // 2])  # truncated, as a rewrite cut short leaves it
        (mag / ("0.0.1" if name == "raw_v2" else "c/0/0/1")).write_bytes(b"")  # truncated, not yet written
    mag = dataset / "blosc_tail" / "1"
    write_array(mag, 2, numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE))
    for chunk in mag.glob("*.*.*"):
        frame = chunk.read_bytes()
        assert int.from_bytes(frame[12:16], "little") == len(frame)
        chunk.write_bytes(frame + TRAILING)
    absurd: dict[str, Any] = {"huge_fill": {"fill_value": 2**70}, "huge_shape": {"shape": [2**63] * 3}}
    for name, fields in absurd.items():
        write_array(dataset / name / "1", 2)
        patch_document(dataset / name / "1" / ".zarray", **fields)
        write_array(dataset / f"{name}_v3" / "1", 3)
        patch_document(dataset / f"{name}_v3" / "1" / "zarr.json", **fields)
    return Root(root, server_factory(root))


def chunk_urls(server: Server, layer: str, coords: tuple[int, ...]) -> list[str]:
    base = f"{server.url}/data/{{}}/{ORG}/{DATASET}/{layer}/1/"
    return [
        base.format("zarr") + ".".join(map(str, (0, *coords))),
        base.format("zarr3") + "c/0/" + "/".join(map(str, coords)),
    ]


@pytest.mark.parametrize("layer", ["raw_v2", "raw_v3"])
def test_an_uncompressed_chunk_of_the_wrong_length_is_a_fault(served: Root, layer: str) -> None:
    for coords, length in (((0, 0, 0), 32**3 // 2), ((0, 0, 1), 0)):
        for url in chunk_urls(served.server, layer, coords):
            for headers in ({}, {"Range": "bytes=0-0"}):
                response = requests.get(url, headers=headers, timeout=30)
                assert_reason(response, 500, f"uncompressed chunk of {length} bytes", "32768")
    good = read_zarr_python(
        f"{served.server.url}/data/zarr/{ORG}/{DATASET}/{layer}/1", 2, region=(slice(0, 1), slice(32, None))
    )
    assert np.array_equal(good[0], voxels()[32:])
    assert_no_unexpected_errors(served.server)


@pytest.mark.parametrize(
    ("layer", "reason"),
    [
        ("huge_fill", "fill_value"),
        ("huge_fill_v3", "fill_value"),
        ("huge_shape", "shape"),
        ("huge_shape_v3", "shape"),
    ],
)
def test_metadata_values_no_array_can_hold_make_the_layer_unusable(served: Root, layer: str, reason: str) -> None:
    base = f"{served.server.url}/data/zarr/{ORG}/{DATASET}"
    for path in (f"{layer}/", f"{layer}/1/.zarray", f"{layer}/1/0.0.0.0"):
        response = requests.get(f"{base}/{path}", timeout=30)
        assert_reason(response, 404, reason)
    listing = requests.get(f"{base}/", timeout=30)
    line = next(line for line in listing.text.splitlines() if re.search(rf"\b{layer}\b(?!_)", line))
    assert "unavailable" in line and reason in line, line
    preview = requests.get(f"{served.server.url}/preview/{ORG}/{DATASET}/{layer}.png", timeout=30)
    assert preview.status_code < 500, preview.text[:200]


def test_a_blosc_chunk_with_trailing_bytes_reads_as_its_reference_reader_reads_it(served: Root) -> None:
    mag = served.path / ORG / DATASET / "blosc_tail" / "1"
    assert np.array_equal(zarr.open_array(str(mag), mode="r")[...], voxels())  # numcodecs reads it from disk
    for tree, zarr_format in (("zarr", 2), ("zarr3", 3)):
        url = f"{served.server.url}/data/{tree}/{ORG}/{DATASET}/blosc_tail/1"
        assert np.array_equal(read_zarr_python(url, zarr_format)[0], voxels()), tree
        assert np.array_equal(read_tensorstore(url, zarr_format)[0], voxels()), tree
    assert_no_unexpected_errors(served.server)
