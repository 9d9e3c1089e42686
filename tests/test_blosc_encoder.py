"""The Blosc encoder of re-encoded chunks (gateway/zarr/blosc.py): every client decodes what it makes.

A 64³ chunk is sampled (in c-blosc's own blocks) before it is compressed: noise that LZ4 shrinks by less
than a tenth (c-blosc alone would still compress it) is served as a memcpyed Blosc-1 chunk, smooth data is
compressed. A segmentation layer's chunks are compressed without the sample (runs of ids always compress):
the same noise as labels is compressed, however little that saves. Whatever is chosen (a chunk half of which
is empty included), numcodecs, blosc2, zarr-python and tensorstore (v2 and v3 trees) read back exactly the
voxels the wkw package wrote.
"""

import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blosc2
import numcodecs
import numpy as np
import pytest
import requests
import wkw
from support.clients import read_tensorstore, read_zarr_python
from support.datasets import cube_layer, write_layers_properties
from support.servers import Server

EDGE = 128  # the layer: two 64³ chunks a side
FLAG_MEMCPYED = 0x02


def _voxels() -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(11)
    noise = rng.integers(0, 256, size=(1, EDGE, EDGE, EDGE), dtype=np.uint8)
    grain = noise.copy()
    grain[:, [x for x in range(EDGE) if x % 64 < 8]] = 0  # runs of 8 zeros in 64 bytes: LZ4 saves about 6 %
    ramp = np.broadcast_to(np.arange(EDGE, dtype=np.uint8)[None, :, None, None] // 8, (1, EDGE, EDGE, EDGE)).copy()
    half = noise.copy()
    half[:, :, :, : EDGE // 4] = 0  # within each chunk of the first row in z, half of it is zeros
    return {"grain": grain, "smooth": ramp, "half": half, "grain_labels": grain}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray[Any, Any]]]:
    root = tmp_path_factory.mktemp("blosc-encoder")
    dataset = root / "org" / "encoded"
    voxels = _voxels()
    for name, data in voxels.items():
        header = wkw.Header(np.uint8, block_type=wkw.Header.BLOCK_TYPE_LZ4HC, file_len=4)
        with wkw.Dataset.create(str(dataset / name / "1"), header) as ds:
            ds.write((0, 0, 0), data)
    layers = [cube_layer(name, "wkw", EDGE) for name in voxels]
    for layer in layers:
        if layer["name"].endswith("_labels"):
            layer["category"] = "segmentation"
    write_layers_properties(dataset, layers)
    return root, voxels


def _header(body: bytes) -> tuple[int, int, int]:
    """(flags, uncompressed bytes, compressed bytes) of a Blosc-1 chunk."""
    _, _, flags, _, nbytes, _, cbytes = struct.unpack("<BBBBIII", body[:16])
    return flags, nbytes, cbytes


def test_each_chunk_is_compressed_only_where_it_pays_and_every_decoder_reads_it(
    served: tuple[Path, dict[str, np.ndarray[Any, Any]]], server_factory: Callable[..., Server]
) -> None:
    root, voxels = served
    server = server_factory(root, chunk_edge=64, codec="blosc-lz4")
    base = f"{server.url}/data/zarr/org/encoded"
    for name, data in voxels.items():
        response = requests.get(f"{base}/{name}/1/0.0.0.0", timeout=30)
        assert response.status_code == 200, response.text[:300]
        body = response.content
        flags, nbytes, cbytes = _header(body)
        assert nbytes == 64**3 and cbytes == len(body)
        if name == "grain":
            assert (
                len(numcodecs.Blosc("lz4", 5, 0).encode(np.frombuffer(numcodecs.Blosc().decode(body), np.uint8)))
                < nbytes
            )
            assert flags & FLAG_MEMCPYED and cbytes == nbytes + 16, (name, flags, cbytes)
        elif name == "grain_labels":
            assert not flags & FLAG_MEMCPYED and cbytes < nbytes, (name, flags, cbytes)
        elif name == "smooth":
            assert not flags & FLAG_MEMCPYED and cbytes < 0.75 * nbytes, (name, flags, cbytes)
        expected = np.asfortranarray(data[:, :64, :64, :64]).tobytes(order="F")
        assert bytes(numcodecs.Blosc().decode(body)) == expected, name
        assert bytes(blosc2.decompress(body)) == expected, name
        for version, tree in ((2, "zarr"), (3, "zarr3")):
            url = f"{server.url}/data/{tree}/org/encoded/{name}/1"
            for read in (read_zarr_python, read_tensorstore):
                assert np.array_equal(read(url, version), data), (name, tree, read.__name__)


def test_the_same_voxels_give_the_same_bytes_and_etag(
    served: tuple[Path, dict[str, np.ndarray[Any, Any]]], server_factory: Callable[..., Server]
) -> None:
    """One ETag names one body: two gateways (two replicas) encode a chunk to the same bytes."""
    root, _ = served
    answers = []
    for _ in range(2):
        server = server_factory(root, chunk_edge=64, codec="blosc-lz4")
        response = requests.get(f"{server.url}/data/zarr/org/encoded/half/1/0.1.0.0", timeout=30)
        assert response.status_code == 200
        answers.append((response.headers["etag"], response.content))
    assert answers[0] == answers[1]
