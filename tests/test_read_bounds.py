"""Every read is bounded before it happens: a file, or a span of one, larger than its format allows there is
refused on its size (a stat, a shard index, a jump table), never read into the worker's memory.

Each case plants a sparse 512 MiB file (``os.truncate``: it costs no disk) where a chunk, a shard's inner
chunk, a WKW block or a metadata file lies, asks for it with GET, HEAD and ``Range: bytes=0-0`` in both
trees, and checks the refusal and the reason, and that the serving worker's resident memory grew by less
than 64 MiB over all of them (reading any one of these files whole would add 512 MiB).
"""

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import crc32c
import numpy as np
import pytest
import requests
import wkw
import zarr
from support.format_layers import FORMATS
from support.layers import layer_entry, write_properties
from support.servers import Server, assert_no_unexpected_errors, assert_reason

ORG = "bounds"
DATASET = "sparse"
BIG = 512 << 20
SIZE = (64, 64, 64)
CHUNK = (32, 32, 32)
RSS_GROWTH = 64 << 20


@dataclass(frozen=True)
class Root:
    path: Path
    server: Server


def sparse(path: Path, size: int = BIG) -> None:
    """``path`` replaced by a file of ``size`` bytes that holds no blocks on disk."""
    path.unlink(missing_ok=True)
    path.touch()
    os.truncate(path, size)


def voxels() -> np.ndarray:
    return np.random.default_rng(7).integers(1, 200, SIZE).astype("uint8")


def write_v2_raw(mag: Path) -> None:
    array = zarr.create_array(str(mag), shape=SIZE, chunks=CHUNK, dtype="uint8", compressors=None, zarr_format=2)
    array[...] = voxels()
    sparse(mag / "0.0.0")


def write_v3_sharded(mag: Path) -> None:
    """A shard whose index gives its first inner chunk 512 MiB, in a shard file that long (sparse)."""
    array = zarr.create_array(str(mag), shape=SIZE, chunks=(16, 16, 16), shards=CHUNK, dtype="uint8", zarr_format=3)
    array[...] = voxels()
    count = 8  # 2^3 inner chunks per shard
    table = np.full((count, 2), 2**64 - 1, dtype="<u8")
    table[0] = (0, BIG)
    index = table.tobytes() + crc32c.crc32c(table.tobytes()).to_bytes(4, "little")
    shard = mag / "c" / "0" / "0" / "0"
    sparse(shard, BIG + len(index))
    with open(shard, "r+b") as handle:
        handle.seek(BIG)
        handle.write(index)


def write_wkw(mag: Path) -> None:
    """An LZ4 file whose jump table makes its last block (Morton 7: block (1, 1, 1)) 512 MiB long, in a file that
    long (sparse); the blocks before it are as written."""
    header = wkw.Header(np.uint8, block_type=wkw.Header.BLOCK_TYPE_LZ4, file_len=2)
    with wkw.Dataset.create(str(mag), header) as dataset:
        dataset.write((0, 0, 0), voxels())
    path = mag / "z0" / "y0" / "x0.wkw"
    raw = path.read_bytes()
    data_offset = struct.unpack_from("<Q", raw, 8)[0]
    jumps = np.frombuffer(raw[16:data_offset], dtype="<u8").copy()
    jumps[-1] = jumps[-2] + BIG
    sparse(path, int(jumps[-1]))
    with open(path, "r+b") as handle:
        handle.write(raw[:16] + jumps.tobytes() + raw[data_offset : int(jumps[-2])])


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory, server_factory: Callable[..., Server]) -> Root:
    root = tmp_path_factory.mktemp("bounds")
    dataset = root / ORG / DATASET
    layers = {"v2raw": "zarr", "v3shard": "zarr3", "wkw": "wkw", "bigzarray": "zarr", "bigzarrjson": "zarr3"}
    layers |= {"bigattributes": "n5", "biginfo": "neuroglancerPrecomputed"}
    write_properties(dataset, [layer_entry(name, data_format) for name, data_format in layers.items()])
    write_v2_raw(dataset / "v2raw" / "1")
    write_v3_sharded(dataset / "v3shard" / "1")
    write_wkw(dataset / "wkw" / "1")
    write_v2_raw(dataset / "bigzarray" / "1")
    sparse(dataset / "bigzarray" / "1" / ".zarray")
    write_v3_sharded(dataset / "bigzarrjson" / "1")
    sparse(dataset / "bigzarrjson" / "1" / "zarr.json")
    FORMATS["n5"].write(dataset / "bigattributes" / "1", voxels())
    sparse(dataset / "bigattributes" / "1" / "attributes.json")
    FORMATS["precomputed"].write(dataset / "biginfo" / "1", voxels())
    sparse(dataset / "biginfo" / "info")  # the volume's, above its scale directory "1"
    write_properties(root / ORG / "bigprops", [layer_entry("v2raw", "zarr")])
    sparse(root / ORG / "bigprops" / "datasource-properties.json")
    return Root(root, server_factory(root))


def rss(server: Server) -> int:
    """The serving worker's resident memory in bytes."""
    for line in Path(f"/proc/{server.serving_pid()}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


# (c, x, y, z) of the chunk each layer's planted file lies in, and of a good chunk beside it
CHUNKS = {
    "v2raw": ((0, 0, 0, 0), (0, 1, 1, 1)),
    "v3shard": ((0, 0, 0, 0), (0, 2, 2, 2)),  # inner chunks of 16: (0, 2, 2, 2) lies in another shard
    "wkw": ((0, 1, 1, 1), (0, 0, 0, 0)),
}


def chunk_urls(layer: str, index: tuple[int, ...]) -> list[str]:
    base = f"/data/{{}}/{ORG}/{DATASET}/{layer}/1/"
    return [base.format("zarr") + ".".join(map(str, index)), base.format("zarr3") + "c/" + "/".join(map(str, index))]


def test_oversized_chunks_blocks_and_metadata_are_refused_before_they_are_read(bounded: Root) -> None:
    server = bounded.server
    session = requests.Session()
    # warm up: the catalog loads the datasets, and a good chunk of each layer is served
    for layer, (_, good) in CHUNKS.items():
        for url in chunk_urls(layer, good):
            assert session.get(server.url + url, timeout=60).status_code == 200, url
    session.get(f"{server.url}/data/zarr/{ORG}/", timeout=60)
    before = rss(server)
    for layer, (bad, _) in CHUNKS.items():
        for url in chunk_urls(layer, bad):
            for method, headers in (("GET", {}), ("HEAD", {}), ("GET", {"Range": "bytes=0-0"})):
                response = session.request(method, server.url + url, headers=headers, timeout=60)
                assert response.status_code == 500, (method, url, headers, response.status_code)
                if method == "GET":
                    message = assert_reason(response, 500, "bytes")
                    assert "more than" in message or "larger than any" in message, message
    for layer, name in (
        ("bigzarray", ".zarray"),
        ("bigzarrjson", "zarr.json"),
        ("bigattributes", "attributes.json"),
        ("biginfo", "info"),
    ):
        for tree, document in (("zarr", ".zarray"), ("zarr3", "zarr.json")):
            response = session.get(f"{server.url}/data/{tree}/{ORG}/{DATASET}/{layer}/1/{document}", timeout=60)
            assert_reason(response, 404, name, "its format allows there")
    response = session.get(f"{server.url}/data/zarr/{ORG}/bigprops/.zattrs", timeout=60)
    assert_reason(response, 409, "datasource-properties.json", "its format allows there")
    listing = session.get(f"{server.url}/data/zarr/{ORG}/", timeout=60)
    assert listing.status_code == 200 and "bigprops" in listing.text
    grown = rss(server) - before
    assert grown < RSS_GROWTH, f"the worker grew by {grown >> 20} MiB"
    assert_no_unexpected_errors(server)


@pytest.mark.parametrize("layer", list(CHUNKS))
def test_the_good_chunks_beside_them_are_served_exactly(bounded: Root, layer: str) -> None:
    expected = voxels()
    array = zarr.open_array(f"{bounded.server.url}/data/zarr3/{ORG}/{DATASET}/{layer}/1", mode="r")
    _, good = CHUNKS[layer]
    edge = array.chunks[1]
    x, y, z = (slice(i * edge, (i + 1) * edge) for i in good[1:])
    assert np.array_equal(np.asarray(array[0, x, y, z]), expected[x, y, z])
