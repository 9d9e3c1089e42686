"""Every codec and chunk edge reads back; legacy WKW datasets; impossible blocks; files rewritten while served."""

import json
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import requests
import wkw
from support.clients import read_tensorstore, read_zarr_python
from support.datasets import MAGS, ORG, WrittenDataset, mag_name
from support.servers import Server

from gateway_storage import LocalStore
from wkw_adapter import BlockType, WkwFileCache, WkwHeader, WkwMag, write_mag

DATASET = f"{ORG}/wk_dataset"
LAYERS = ("color_u8", "color_u16", "rgb")  # LZ4HC, raw, 3 channels


@pytest.mark.parametrize(
    "settings",
    [
        {"codec": "none"},
        {"codec": "blosc-lz4"},
        {"codec": "blosc-zstd"},
        {"codec": "zstd"},
        {"codec": "gzip"},
        {"chunk_edge": 64},
        {"chunk_edge": 128, "codec": "zstd"},
    ],
    ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()),
)
def test_every_codec_and_chunk_edge_reads_back_exactly(
    test_data: WrittenDataset, server_factory: Callable[..., Server], settings: dict[str, object]
) -> None:
    server = server_factory(test_data.root, **settings)
    edge = settings.get("chunk_edge", 32)
    assert isinstance(edge, int)
    for layer in LAYERS:
        for mag in MAGS:
            expected = test_data.expected(layer, mag)
            for version, tree in ((2, "zarr"), (3, "zarr3")):
                url = f"{server.url}/data/{tree}/{DATASET}/{layer}/{mag_name(mag)}"
                metadata = requests.get(url + ("/.zarray" if version == 2 else "/zarr.json"), timeout=10).json()
                chunks = metadata["chunks"] if version == 2 else metadata["chunk_grid"]["configuration"]["chunk_shape"]
                assert chunks[1:] == [edge] * 3
                for read in (read_zarr_python, read_tensorstore):
                    got = read(url, version)
                    assert np.array_equal(got, expected), (layer, mag, tree, read.__name__)


def _color_layer(**mags: object) -> dict[str, Any]:
    """A 64^3 uint8 WKW color layer at the origin, with its mags in the given form."""
    return {
        "name": "color",
        "category": "color",
        "boundingBox": {"topLeft": [0, 0, 0], "width": 64, "height": 64, "depth": 64},
        "elementClass": "uint8",
        "dataFormat": "wkw",
        **mags,
    }


def _legacy_dataset(root: Path) -> tuple[Path, dict[tuple[int, int, int], np.ndarray]]:
    """A dataset as old webKnossos wrote it: wkwResolutions, scale as a list, written by the wkw package."""
    directory = root / "legacy_org" / "old_dataset"
    rng = np.random.default_rng(7)
    written = {}
    for mag in ((1, 1, 1), (2, 2, 2), (4, 4, 1)):
        header = wkw.Header(np.uint8, block_type=wkw.Header.BLOCK_TYPE_LZ4HC, file_len=2)
        mag_dir = directory / "color" / mag_name(mag)
        data = rng.integers(0, 255, size=(1, 64, 64, 64), dtype=np.uint8)
        with wkw.Dataset.create(str(mag_dir), header) as ds:
            ds.write((0, 0, 0), data)
        written[mag] = data
    properties = {
        "id": {"name": "old_dataset", "team": "legacy_org"},
        "scale": [11.24, 11.24, 25.0],
        "dataLayers": [
            _color_layer(
                wkwResolutions=[
                    {"resolution": 1, "cubeLength": 64},
                    {"resolution": [2, 2, 2], "cubeLength": 64},
                    {"resolution": [4, 4, 1], "cubeLength": 64},
                ]
            )
        ],
    }
    (directory / "datasource-properties.json").write_text(json.dumps(properties))
    return directory, written


def test_legacy_wkw_resolutions_dataset(tmp_path: Path, server_factory: Callable[..., Server]) -> None:
    _, written = _legacy_dataset(tmp_path)
    server = server_factory(tmp_path)
    base = f"{server.url}/data/zarr/legacy_org/old_dataset"
    properties = requests.get(f"{base}/datasource-properties.json", timeout=10).json()
    layer = properties["dataLayers"][0]
    assert [m["mag"] for m in layer["mags"]] == [[1, 1, 1], [2, 2, 2], [4, 4, 1]]
    assert layer["dataFormat"] == "zarr" and "wkwResolutions" not in layer
    for mag, data in written.items():
        lo_size = (64, 64, 64)
        shape = tuple(-(-s // m) for s, m in zip(lo_size, mag))
        expected = np.zeros((1, *shape), dtype=np.uint8)
        expected[...] = data[(slice(None), *(slice(0, n) for n in shape))]
        for name in {mag_name(mag), "-".join(map(str, mag))}:  # short and long mag names
            got = read_zarr_python(f"{base}/color/{name}", 2)
            assert np.array_equal(got, expected), (mag, name)
    multiscales = requests.get(f"{base}/color/.zattrs", timeout=10).json()["multiscales"][0]
    assert multiscales["datasets"][1]["coordinateTransformations"][0]["scale"] == [1.0, 22.48, 22.48, 50.0]


def _copy_dataset(test_data: WrittenDataset, root: Path) -> Path:
    target = root / ORG / "wk_dataset"
    shutil.copytree(test_data.root / ORG / "wk_dataset", target)
    return target / "color_u8" / "1"


def test_absurd_stored_block_size_is_a_5xx_for_that_chunk_only(
    test_data: WrittenDataset, tmp_path: Path, server_factory: Callable[..., Server]
) -> None:
    mag_dir = _copy_dataset(test_data, tmp_path)
    path = mag_dir / "z0" / "y0" / "x1.wkw"  # blocks x 4..7, y 0..3, z 0..3 of mag 1
    header = WkwMag(str(mag_dir), WkwFileCache(LocalStore())).header
    count = header.blocks_per_file
    data = bytearray(path.read_bytes())
    jumps = np.frombuffer(bytes(data[16 : 16 + 8 * count]), dtype="<u8").copy()
    # Block (4, 1, 1), wholly inside the bounding box, is local (0, 1, 1): Morton index 6. It is made to
    # claim far more bytes than LZ4 can take for 32 KiB; the later blocks move along with padding.
    index = 6
    extra = 5 * header.block_bytes
    insert_at = int(jumps[index])
    data[insert_at:insert_at] = b"\0" * extra
    jumps[index:] += np.uint64(extra)
    data[16 : 16 + 8 * count] = jumps.astype("<u8").tobytes()
    path.write_bytes(bytes(data))
    server = server_factory(tmp_path)
    base = f"{server.url}/data/zarr/{DATASET}/color_u8/1"
    broken = requests.get(f"{base}/0.4.1.1", timeout=10)
    assert broken.status_code >= 500 and "larger than any" in broken.json()["error"]
    neighbour = requests.get(f"{base}/0.4.2.1", timeout=10)  # the later blocks of the file are intact
    assert neighbour.status_code == 200
    expected = test_data.expected("color_u8", (1, 1, 1))[:, 128:160, 64:96, 32:64]
    decoded = np.frombuffer(numcodecs.Blosc().decode(neighbour.content), dtype=np.uint8)
    assert np.array_equal(decoded.reshape((1, 32, 32, 32), order="F"), expected)


def test_file_rewritten_while_served_never_mixes_bytes_and_etags(
    tmp_path: Path, server_factory: Callable[..., Server]
) -> None:
    """Two versions of a file replace each other under load: every ETag always names one and the same body."""
    root = tmp_path / "root"
    mag_dir = root / "org" / "ds" / "color" / "1"
    header = WkwHeader.create("uint8", 1, BlockType.LZ4HC, block_len=32, file_len=2)
    versions = []
    for seed in (1, 2):
        data = np.random.default_rng(seed).integers(0, 255, size=(1, 64, 64, 64), dtype=np.uint8)
        version_dir = tmp_path / f"v{seed}"
        write_mag(str(version_dir), header, data)
        versions.append((data, (version_dir / "z0" / "y0" / "x0.wkw").read_bytes()))
    write_mag(str(mag_dir), header, versions[0][0])
    properties = {
        "id": {"name": "ds", "team": ""},
        "scale": {"factor": [1.0, 1.0, 1.0], "unit": "nanometer"},
        "dataLayers": [_color_layer(mags=[{"mag": [1, 1, 1], "path": "./color/1"}])],
    }
    (root / "org" / "ds" / "datasource-properties.json").write_text(json.dumps(properties))
    # re-encoded: a chunk is read from several blocks' worth of work; atomic replacement needs no settle time
    server = server_factory(root, codec="zstd", settle_seconds=0)
    target = mag_dir / "z0" / "y0" / "x0.wkw"
    stop = threading.Event()

    def rewrite() -> None:
        turn = 0
        while not stop.is_set():
            turn += 1
            staged = target.with_suffix(f".tmp{turn % 2}")
            staged.write_bytes(versions[turn % 2][1])
            # Replaced atomically, as careful writers do. (A writer that rewrites a file in place within
            # one kernel timestamp tick cannot be told apart by size, mtime and inode: not covered.)
            os.replace(staged, target)

    bodies: dict[str, bytes] = {}
    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        with requests.Session() as session:
            for i in range(300):
                key = f"0.{i % 2}.{(i // 2) % 2}.{(i // 4) % 2}"
                response = session.get(f"{server.url}/data/zarr/org/ds/color/1/{key}", timeout=10)
                if response.status_code == 503:  # rewritten mid-read twice in a row: retry later
                    continue
                assert response.status_code == 200, response.text
                etag = response.headers["ETag"]
                assert bodies.setdefault(etag + key, response.content) == response.content
                voxels = np.frombuffer(numcodecs.Zstd().decode(response.content), dtype=np.uint8)
                chunk = voxels.reshape((1, 32, 32, 32), order="F")
                x, y, z = (int(v) * 32 for v in key.split(".")[1:])
                candidates = [data[:, x : x + 32, y : y + 32, z : z + 32] for data, _ in versions]
                assert any(np.array_equal(chunk, c) for c in candidates)
    finally:
        stop.set()
        writer.join()
    assert len({etag for etag in bodies}) > 4  # both versions were seen, under different ETags
