"""Hostile data roots: absurd WKW geometry, corrupt blocks, huge or absent chunks, malformed metadata.

Whoever can write a dataset into the data root can write any of this. Each class must leave the
gateway serving: a layer or dataset it spoils is unusable with a reason, never a 500 "internal
error" and never a broken neighbour; memory and event-loop stalls stay bounded (measured as peak
RSS of the worker and as whether ``/healthz`` is answered while heavy chunks are in flight, with
generous margins); a corrupt stored block never leaves as if it were data; and one ETag names one
body, for every codec.
"""

import json
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lz4.block
import numcodecs
import numpy as np
import pytest
import requests
import wkw
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.datasets import ORG, TOKEN, WrittenDataset
from support.measure import PeakRss, bytes_read
from support.processes import wait_until
from support.servers import Server, assert_no_unexpected_errors, assert_reason

from gateway_storage import LocalStore
from wkw_adapter import BlockType, WkwFileCache, WkwHeader

MIB = 1 << 20
Words = tuple[str, ...]  # what a refusal's message must name


# --- building hostile roots -------------------------------------------------------------------------


def wkw_layer(
    name: str, element_class: str, top_left: list[int], size: list[int], data_format: str = "wkw"
) -> dict[str, Any]:
    return {
        "name": name,
        "category": "color",
        "boundingBox": {"topLeft": top_left, "width": size[0], "height": size[1], "depth": size[2]},
        "elementClass": element_class,
        "dataFormat": data_format,
        "mags": [{"mag": [1, 1, 1], "path": f"./{name}/1"}],
    }


def write_properties(dataset: Path, layers: list[dict[str, Any]], factor: object = (1.0, 1.0, 1.0)) -> None:
    dataset.mkdir(parents=True, exist_ok=True)
    document = {"id": {"name": dataset.name, "team": ""}, "scale": {"factor": factor, "unit": "nanometer"}}
    document["dataLayers"] = layers
    (dataset / "datasource-properties.json").write_text(json.dumps(document))


def write_wkw(mag: Path, data: np.ndarray, block_type: int, block_len: int = 32, file_len: int = 32) -> None:
    """Voxels ``[x, y, z]`` at the origin, written by the format authors' own library."""
    header = wkw.Header(data.dtype, block_len=block_len, file_len=file_len, block_type=block_type)
    with wkw.Dataset.create(str(mag), header) as ds:
        ds.write((0, 0, 0), data)


def write_header(mag: Path, header: WkwHeader) -> None:
    """A crafted ``header.wkw`` (geometry the ``wkw`` library refuses to write, or writes only slowly)."""
    mag.mkdir(parents=True, exist_ok=True)
    (mag / "header.wkw").write_bytes(header.with_data_offset(0).encode())


def crafted(block_len_log2: int, file_len_log2: int, bytes_per_voxel: int = 1) -> WkwHeader:
    return WkwHeader(1, block_len_log2, file_len_log2, BlockType.LZ4, 1, bytes_per_voxel, 0)


def compressible(shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    """Voxels with structure, so LZ4 blocks are small but every block differs."""
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 4, shape) + np.arange(shape[0])[:, None, None] % 7).astype(dtype)


def garble_block(path: Path, index: int) -> None:
    """Overwrite stored LZ4 block ``index`` in place with bytes that cannot decode (a literal run past
    the end); the jump table stays valid, so only decoding the block tells."""
    wkw_file = WkwFileCache(LocalStore()).open(str(path))
    assert wkw_file is not None
    offset, length = wkw_file.block_range(index)
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(b"\xff" * length)


def get(server: Server, path: str, **headers: str) -> requests.Response:
    return requests.get(server.url + path, headers=headers, timeout=120)


# --- 2. geometry no writer produces, and bombs --------------------------------------------------------


@dataclass(frozen=True)
class Root:
    server: Server
    root: Path


@pytest.fixture(scope="module")
def geometry(tmp_path_factory: pytest.TempPathFactory, server_factory: Callable[..., Server]) -> Root:
    root = tmp_path_factory.mktemp("geometry")
    dataset = root / "geo" / "ds"
    layers = ["one_voxel_blocks", "lz4_bomb", "wide_files", "fat_voxels", "good"]
    write_properties(dataset, [wkw_layer(name, "uint8", [0, 0, 0], [64, 64, 64]) for name in layers])
    # 1-voxel blocks, as the wkw library writes them when asked (it accepts any power of two)
    write_wkw(dataset / "one_voxel_blocks" / "1", np.ones((8, 8, 8), "uint8"), wkw.Header.BLOCK_TYPE_RAW, 1, 1)
    # one 1024^3 block: a few MiB on disk that decode to 1 GiB
    write_header(dataset / "lz4_bomb" / "1", crafted(10, 0))
    bomb = dataset / "lz4_bomb" / "1" / "z0" / "y0" / "x0.wkw"
    bomb.parent.mkdir(parents=True)
    block = lz4.block.compress(bytes(16 * MIB), store_size=False)  # its first 16 MiB of zeros
    header = crafted(10, 0).with_data_offset(16 + 8)
    bomb.write_bytes(header.encode() + (24 + len(block)).to_bytes(8, "little") + block)
    write_header(dataset / "wide_files" / "1", crafted(5, 10))  # 1024 blocks per file edge
    write_header(dataset / "fat_voxels" / "1", crafted(6, 0, 255))  # 64^3 voxels of 255 bytes a block
    write_wkw(dataset / "good" / "1", compressible((64, 64, 64), "uint8", 1), wkw.Header.BLOCK_TYPE_LZ4HC, 32, 2)
    return Root(server_factory(root), root)


@pytest.mark.parametrize(
    ("layer", "words"),
    [
        ("one_voxel_blocks", ("1 voxels per edge", "webKnossos writes 32")),
        ("lz4_bomb", ("1024 voxels per edge",)),
        ("wide_files", ("1024 blocks per file edge",)),
        ("fat_voxels", ("decodes to",)),
    ],
)
def test_geometry_no_writer_produces_makes_the_layer_unusable(geometry: Root, layer: str, words: Words) -> None:
    listing = get(geometry.server, "/data/zarr/geo/ds/")
    assert listing.status_code == 200
    assert layer in listing.text and all(word in listing.text for word in words)
    for path in (f"/data/zarr/geo/ds/{layer}/1/.zarray", f"/data/zarr/geo/ds/{layer}/1/0.0.0.0"):
        assert_reason(get(geometry.server, path), 404, layer, *words)


def test_neighbours_of_absurd_geometry_are_served(geometry: Root) -> None:
    with wkw.Dataset.open(str(geometry.root / "geo" / "ds" / "good" / "1")) as ds:
        expected = ds.read((32, 0, 32), (32, 32, 32))
    response = get(geometry.server, "/data/zarr/geo/ds/good/1/0.1.0.1")
    assert response.status_code == 200
    decoded = np.frombuffer(numcodecs.Blosc().decode(response.content), "uint8").reshape((1, 32, 32, 32), order="F")
    assert np.array_equal(decoded, expected)
    assert_no_unexpected_errors(geometry.server)


# --- 2. memory and the event loop ---------------------------------------------------------------------

HEAVY_EDGE = 256  # the served chunk edge of the heavy gateway: one chunk decodes 16 MiB of uint8
HEAVY_NEED = 48 * MIB  # a heavy chunk's working memory: its 16 MiB of decoded blocks, the chunk, its encoded copy
BUDGET = 64 * MIB  # more than one heavy chunk's working memory, less than two: heavy chunks run one at a time


@pytest.fixture(scope="module")
def heavy(tmp_path_factory: pytest.TempPathFactory, server_factory: Callable[..., Server]) -> Root:
    root = tmp_path_factory.mktemp("heavy")
    edge = [HEAVY_EDGE] * 3
    write_properties(root / "big" / "ds", [wkw_layer("color", "uint8", [0, 0, 0], edge)])
    data = compressible((HEAVY_EDGE,) * 3, "uint8", 2)
    write_wkw(root / "big" / "ds" / "color" / "1", data, wkw.Header.BLOCK_TYPE_LZ4, 32, 8)
    # layers of which nothing is stored: a uint8 chunk is 16 MiB of zeros if made, and a uint64 one 128 MiB,
    # which with its encoded copy is more than the whole budget
    layers = [wkw_layer("ids", "uint8", [0, 0, 0], edge), wkw_layer("ids64", "uint64", [0, 0, 0], edge)]
    write_properties(root / "big" / "empty", layers)
    for name, dtype in (("ids", "uint8"), ("ids64", "uint64")):
        write_header(root / "big" / "empty" / name / "1", WkwHeader.create(dtype, 1, BlockType.LZ4, 32, 8))
    # No answer cache: every request makes its heavy chunk, which is the load these tests put on the worker.
    server = server_factory(root, chunk_edge=HEAVY_EDGE, threads=8, chunk_memory_bytes=BUDGET, answer_cache_bytes=0)
    return Root(server, root)


def test_a_chunk_of_absent_data_is_not_materialized(heavy: Root) -> None:
    get(heavy.server, "/data/zarr/big/empty/ids/1/.zarray").raise_for_status()
    with PeakRss(heavy.server) as peak:
        responses = [get(heavy.server, f"/data/zarr/big/empty/ids/1/0.0.0.{0}") for _ in range(4)]
    for response in responses:
        assert_reason(response, 404, "fill value")  # what Zarr clients read as the fill value, 0
    assert peak.growth < 12 * MIB, f"4 absent 256^3 uint8 chunks grew the worker by {peak.growth / MIB:.0f} MiB"


def test_a_chunk_larger_than_the_whole_budget_is_refused_before_any_work(heavy: Root) -> None:
    """Every tree costs a chunk from the metadata first: past the whole budget it is a 413 with the reason, and
    nothing of it is built (a uint64 chunk of 256^3 voxels holds 384 MiB with its copies; the budget is 64)."""
    paths = [
        "/data/zarr/big/empty/ids64/1/0.0.0.0",
        "/data/zarr3/big/empty/ids64/1/c/0/0/0/0",
        "/data/precomputed/big/empty/ids64/1/0-256_0-256_0-256",
    ]
    with PeakRss(heavy.server) as peak:
        for path in paths:
            assert_reason(get(heavy.server, path), 413, "chunk_memory_bytes", str(BUDGET))
    assert peak.growth < 12 * MIB, f"refused chunks grew the worker by {peak.growth / MIB:.0f} MiB"
    assert get(heavy.server, "/data/zarr/big/empty/ids64/1/.zarray").status_code == 200  # its metadata is served


def test_heavy_chunks_in_flight_stay_within_the_memory_budget(heavy: Root) -> None:
    with wkw.Dataset.open(str(heavy.root / "big" / "ds" / "color" / "1")) as ds:
        expected = ds.read((0, 0, 0), (HEAVY_EDGE,) * 3)
    results: list[requests.Response] = []

    def fetch() -> None:
        results.append(get(heavy.server, "/data/zarr/big/ds/color/1/0.0.0.0"))

    with PeakRss(heavy.server) as peak:
        threads = [threading.Thread(target=fetch) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(results) == 8
    for response in results:
        assert response.status_code == 200
        decoded = np.frombuffer(numcodecs.Blosc().decode(response.content), "uint8")
        assert np.array_equal(decoded.reshape(expected.shape, order="F"), expected)
    # Measured here: about 50 MiB with the budget (one chunk at a time), about 195 MiB without it.
    assert peak.growth < 120 * MIB, f"8 heavy chunks at once grew the worker by {peak.growth / MIB:.0f} MiB"


def test_healthz_is_answered_while_heavy_chunks_are_in_flight(heavy: Root) -> None:
    done: list[float] = []

    def fetch() -> None:
        get(heavy.server, "/data/zarr/big/ds/color/1/0.0.0.0").raise_for_status()
        done.append(time.monotonic())

    threads = [threading.Thread(target=fetch) for _ in range(12)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)  # let them queue up behind the memory budget
    health = requests.get(heavy.server.url + "/healthz", timeout=60)
    answered = time.monotonic()
    for thread in threads:
        thread.join()
    assert health.status_code == 200
    still_in_flight = sum(1 for t in done if t > answered)
    assert still_in_flight > 0, "every heavy chunk had finished before /healthz was answered"


def test_bytes_decoded_decide_event_loop_or_thread(tmp_path: Path) -> None:
    """A small served chunk of large blocks decodes whole blocks: it goes to a thread, not the loop."""
    from gateway.sources.properties import BoundingBox
    from gateway.sources.wkw_source import WkwMagSource
    from gateway.zarr.chunks import served_mag
    from gateway.zarr.codecs import Codec
    from gateway.zarr.layout import ArrayLayout
    from gateway.zarr.nodes import INLINE_ENCODE_BYTES, SourceArray

    box = BoundingBox.model_validate({"topLeft": (0, 0, 0), "width": 64, "height": 64, "depth": 64})
    for dtype, inline in (("uint8", True), ("uint64", False)):
        mag = tmp_path / dtype
        write_wkw(mag, np.ones((64, 64, 64), dtype), wkw.Header.BLOCK_TYPE_LZ4, 64, 1)
        source = WkwMagSource((1, 1, 1), str(mag), box, WkwFileCache(LocalStore(str(tmp_path))))
        assert source.decoded_bytes((32, 32, 32)) == 64**3 * np.dtype(dtype).itemsize
        layout = ArrayLayout((1, 64, 64, 64), (1, 32, 32, 32), np.dtype(dtype), Codec.BLOSC_LZ4)
        array = SourceArray(served_mag(source, layout), ("c", "x", "y", "z"))
        assert (32**3 * np.dtype(dtype).itemsize <= INLINE_ENCODE_BYTES) is True  # served bytes are small
        assert (array.cheap_chunk((0, 0, 0, 0)) is not None) is inline
        assert np.all(np.frombuffer(numcodecs.Blosc().decode(array.costly_chunk((0, 1, 1, 1)).body), dtype) == 1)


# --- 2. virtual shards: only the stored segments a range covers; multipart streamed -----------------


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory, server_factory: Callable[..., Server]) -> tuple[Root, Root]:
    root = tmp_path_factory.mktemp("shards")
    # sparse: only the column of blocks (0, 0, 0..7) of a 16 MiB raw file lies in the box, and in Morton
    # order blocks (0, 0, 3) and (0, 0, 4) are 219 blocks (7 MiB) apart in the file
    write_properties(root / "sh" / "sparse", [wkw_layer("color", "uint8", [0, 0, 0], [32, 32, 256])])
    column = compressible((32, 32, 256), "uint8", 3)
    write_wkw(root / "sh" / "sparse" / "color" / "1", column, wkw.Header.BLOCK_TYPE_RAW, 32, 8)
    # large: one raw file of 256^3 uint16, 32 MiB of shard
    write_properties(root / "sh" / "large", [wkw_layer("color", "uint16", [0, 0, 0], [256, 256, 256])])
    write_wkw(root / "sh" / "large" / "color" / "1", compressible((256,) * 3, "uint16", 4), 1, 32, 8)
    # corrupt: an LZ4 file of 2^3 blocks whose block 0 does not decode
    write_properties(root / "sh" / "corrupt", [wkw_layer("color", "uint8", [0, 0, 0], [64, 64, 64])])
    write_wkw(root / "sh" / "corrupt" / "color" / "1", compressible((64,) * 3, "uint8", 5), 2, 32, 2)
    garble_block(root / "sh" / "corrupt" / "color" / "1" / "z0" / "y0" / "x0.wkw", 0)
    plain = server_factory(root)
    sharded = server_factory(root, v3_layout="sharded")
    return Root(sharded, root), Root(plain, root)


SEGMENT = 16 + 32**3  # a raw block framed as a Blosc chunk


def test_a_range_of_a_sparse_shard_reads_only_the_segments_it_covers(shards: tuple[Root, Root]) -> None:
    sharded = shards[0].server
    url = "/data/zarr3/sh/sparse/color/1/c/0/0/0/0"
    whole = get(sharded, url)
    assert whole.status_code == 200
    start = 4 * SEGMENT - 1  # the last byte of the inner chunk of block (0, 0, 3) and the first of (0, 0, 4)
    before = bytes_read(sharded)
    ranged = get(sharded, url, Range=f"bytes={start}-{start + 1}")
    read = bytes_read(sharded) - before
    assert ranged.status_code == 206 and ranged.content == whole.content[start : start + 2]
    assert read < 1 * MIB, f"a 2-byte range read {read / MIB:.1f} MiB"


def test_multipart_answers_are_streamed_part_by_part(shards: tuple[Root, Root]) -> None:
    sharded = shards[0].server
    url = "/data/zarr3/sh/large/color/1/c/0/0/0/0"
    size = int(requests.head(sharded.url + url, timeout=60).headers["Content-Length"])
    half = size // 2
    with PeakRss(sharded) as peak:
        response = get(sharded, url, Range=f"bytes=0-{half - 1},{half}-{size - 1}")
    assert response.status_code == 206
    assert response.headers["Content-Type"].startswith("multipart/byteranges")
    assert len(response.content) == int(response.headers["Content-Length"]) > size
    with PeakRss(sharded) as single:
        whole = get(sharded, url)
    assert whole.status_code == 200 and whole.content[:100] in response.content
    assert whole.content[half : half + 1000] in response.content
    # streamed in pieces (STREAM_PIECE), as one range is; joined whole, 32 MiB in two parts took over 100 MiB more
    # (the bound is generous: a busy machine moves the peak by a few MiB)
    assert peak.growth < max(2 * single.growth, 40 * MIB), (peak.growth / MIB, single.growth / MIB)


STALLED_READERS = 40  # the probe: 40 stalled readers held 7.5 MiB each, and most of it after they left


def _rss(server: Server) -> int:
    for line in Path(f"/proc/{server.serving_pid()}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


# What a stalled reader may hold, per server: uvicorn waits for its write buffer to drain (one piece); Granian
# queues a few pieces of its own. Before, 8.6 MiB (uvicorn, 4 MiB pieces) and the whole 32 MiB shard (Granian).
HELD_PER_STALLED_READER = {"uvicorn": 3 * MIB, "granian": 8 * MIB}
# What may stay in the process once they left: the allocator keeps some of what it returned (Granian's more, and
# more on a busy machine: 33 to 66 MiB seen). Before, +180 MiB (uvicorn) and +279 MiB (Granian).
HELD_AFTER_THEY_LEFT = {"uvicorn": 64 * MIB, "granian": 128 * MIB}


@pytest.mark.parametrize("server", list(HELD_PER_STALLED_READER))
def test_stalled_readers_of_a_virtual_shard_hold_one_piece_each_and_give_it_back(
    shards: tuple[Root, Root], server_factory: Callable[..., Server], server: str
) -> None:
    """A reader that stops reading holds the pieces being sent, not the answer read ahead of it: uvicorn held
    the first piece and the next one read (4 MiB pieces: +344 MiB for 40, +180 MiB still held after they
    closed); Granian took the whole shard (+1,320 MiB for 40, +279 MiB after)."""
    sharded = (
        shards[0].server if server == "uvicorn" else server_factory(shards[0].root, v3_layout="sharded", server=server)
    )
    url = "/data/zarr3/sh/large/color/1/c/0/0/0/0"
    assert get(sharded, url).status_code == 200  # the shard's plan is made and kept: not counted below
    host, port = sharded.url.removeprefix("http://").rsplit(":", 1)
    before = _rss(sharded)
    readers = []
    with PeakRss(sharded) as peak:
        try:
            for _ in range(STALLED_READERS):
                reader = socket.socket()
                reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # takes almost nothing
                reader.connect((host, int(port)))
                reader.sendall(f"GET {url} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                readers.append(reader)
            time.sleep(3)  # each answer's first piece is read and sent, as far as the reader lets it
            assert requests.get(sharded.url + "/healthz", timeout=30).status_code == 200
        finally:
            for reader in readers:
                reader.close()
    held = peak.growth / STALLED_READERS
    assert held < HELD_PER_STALLED_READER[server], f"{held / MIB:.1f} MiB per stalled reader"
    assert wait_until(lambda: _rss(sharded) - before < HELD_AFTER_THEY_LEFT[server], timeout=10), (
        f"{(_rss(sharded) - before) / MIB:.0f} MiB still held after the readers left"
    )
    assert get(sharded, url).status_code == 200


# --- 4. no silent corruption ----------------------------------------------------------------------------


def test_a_corrupt_block_is_never_passed_through(shards: tuple[Root, Root]) -> None:
    plain = shards[1].server
    for path in ("/data/zarr/sh/corrupt/color/1/0.0.0.0", "/data/zarr3/sh/corrupt/color/1/c/0/0/0/0"):
        response = get(plain, path)
        assert 500 <= response.status_code < 600, (response.status_code, response.content[:100])
        assert "LZ4" in response.json()["error"]
    intact = get(plain, "/data/zarr/sh/corrupt/color/1/0.1.0.0")
    assert intact.status_code == 200
    with wkw.Dataset.open(str(shards[1].root / "sh" / "corrupt" / "color" / "1")) as ds:
        expected = ds.read((32, 0, 0), (32, 32, 32))
    decoded = np.frombuffer(numcodecs.Blosc().decode(intact.content), "uint8").reshape((1, 32, 32, 32), order="F")
    assert np.array_equal(decoded, expected)


def test_a_shard_read_covering_a_corrupt_block_is_a_storage_fault(shards: tuple[Root, Root]) -> None:
    sharded = shards[0].server
    url = "/data/zarr3/sh/corrupt/color/1/c/0/0/0/0"
    for headers in ({}, {"Range": "bytes=0-9"}, {"Range": "bytes=5-6,100-200"}):
        response = get(sharded, url, **headers)
        assert 500 <= response.status_code < 600, (headers, response.status_code)
        assert "LZ4" in response.json()["error"]
    index = get(sharded, url, Range=f"bytes=-{8 * 16 + 4}")  # the index alone: 8 offset/size pairs, a crc32c
    assert index.status_code == 206
    offsets = np.frombuffer(index.content[:-4], "<u8").reshape(8, 2)
    offset, nbytes = (int(v) for v in offsets[1])  # in C order of the (x, y, z) grid, (0, 0, 1) is position 1
    inner = get(sharded, url, Range=f"bytes={offset}-{offset + nbytes - 1}")
    assert inner.status_code == 206
    with wkw.Dataset.open(str(shards[0].root / "sh" / "corrupt" / "color" / "1")) as ds:
        expected = ds.read((0, 0, 32), (32, 32, 32))
    decoded = np.frombuffer(numcodecs.Blosc().decode(inner.content), "uint8").reshape((1, 32, 32, 32), order="F")
    assert np.array_equal(decoded, expected)


def test_every_stored_encoding_has_one_framing_and_unknown_ones_are_refused() -> None:
    import enum

    from gateway.sources.mag import StoredEncoding
    from gateway.zarr.framing import FRAMINGS, UnknownEncoding, framing_for

    assert set(FRAMINGS) == set(StoredEncoding)
    Other = enum.Enum("Other", {"ZSTD_BLOCK": "zstd-block"})
    unknown = Other.ZSTD_BLOCK
    with pytest.raises(UnknownEncoding, match="zstd-block"):
        framing_for(unknown)  # type: ignore[arg-type]


@pytest.mark.parametrize("codec", ["none", "blosc-lz4", "blosc-zstd", "zstd", "gzip"])
def test_one_etag_names_one_body_across_requests_and_replicas(
    codec: str, test_data: WrittenDataset, server_factory: Callable[..., Server]
) -> None:
    replicas = [server_factory(test_data.root, codec=codec) for _ in range(2)]
    # chunk (1, 1, 1) straddles the bounding box's corner: it is read, masked and encoded per request
    path = f"/data/zarr/{ORG}/{test_data.dataset}/color_u16/1/0.1.1.1"
    token = {"X-Auth-Token": TOKEN}
    first = get(replicas[0], path, **token)
    time.sleep(1.1)  # past the one-second resolution of a gzip header's time stamp
    answers = [first, get(replicas[0], path, **token), get(replicas[1], path, **token)]
    for answer in answers:
        assert answer.status_code == 200
        assert answer.headers["ETag"] == first.headers["ETag"]
        assert answer.content == first.content


# --- 3. bad metadata -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def metadata(tmp_path_factory: pytest.TempPathFactory, server_factory: Callable[..., Server]) -> Root:
    root = tmp_path_factory.mktemp("metadata")
    good = root / "meta" / "good"
    write_properties(good, [wkw_layer("color", "uint8", [0, 0, 0], [64, 64, 64])])
    write_wkw(good / "color" / "1", compressible((64,) * 3, "uint8", 6), wkw.Header.BLOCK_TYPE_LZ4, 32, 2)
    deep = root / "meta" / "deep"
    deep.mkdir()
    (deep / "datasource-properties.json").write_text("[" * 100_000 + "]" * 100_000)
    for name, factor in (("nan", "NaN"), ("huge", "1e999"), ("infinite", "Infinity")):
        write_properties(root / "meta" / name, [wkw_layer("color", "uint8", [0, 0, 0], [64, 64, 64])], [1, 1, 1])
        path = root / "meta" / name / "datasource-properties.json"
        path.write_text(path.read_text().replace('"factor": [1, 1, 1]', f'"factor": [{factor}, 1, 1]'))
        (root / "meta" / name / "color").symlink_to(good / "color")
    write_properties(root / "meta" / "negative", [wkw_layer("color", "uint8", [-64, 0, 0], [32, 64, 64])])
    (root / "meta" / "negative" / "color").symlink_to(good / "color")
    write_properties(root / "meta" / "vast", [wkw_layer("color", "uint8", [0, 0, 0], [2**40, 64, 64])])
    (root / "meta" / "vast" / "color").symlink_to(good / "color")
    write_properties(root / "meta" / "wide", [wkw_layer("color", "uint8", [0, 0, 0], [2**25, 64, 64])])
    (root / "meta" / "wide" / "color").symlink_to(good / "color")
    (root / bytes.fromhex("ff6f7267").decode("utf-8", "surrogateescape")).mkdir()  # b"\xfforg": not UTF-8
    return Root(server_factory(root), root)


@pytest.mark.parametrize(
    ("dataset", "words"),
    [
        ("deep", ("nests deeper",)),
        ("nan", ("NaN is not JSON",)),
        ("infinite", ("Infinity is not JSON",)),
        ("huge", ("does not fit a double",)),
        ("negative", ("topLeft", "negative")),
        ("vast", ("largest extent",)),
    ],
)
def test_bad_properties_make_the_dataset_unusable_with_a_reason(metadata: Root, dataset: str, words: Words) -> None:
    listing = get(metadata.server, "/data/zarr/meta/")
    assert listing.status_code == 200
    assert dataset in listing.text and all(word in listing.text for word in words)
    for tree, name in (("zarr", ".zattrs"), ("zarr3", "zarr.json"), ("xarray", "zarr.json")):
        assert_reason(get(metadata.server, f"/data/{tree}/meta/{dataset}/{name}"), 409, "cannot be served", *words)
    assert get(metadata.server, "/data/zarr/meta/good/color/1/0.0.0.0").status_code == 200
    assert_no_unexpected_errors(metadata.server)


def test_metadata_documents_are_strict_json(metadata: Root) -> None:
    for path in ("/data/zarr/meta/good/color/.zattrs", "/data/zarr3/meta/good/color/zarr.json"):
        response = get(metadata.server, path)
        assert response.status_code == 200
        json.loads(response.text, parse_constant=_refuse_constant)


def test_a_directory_name_that_is_not_utf8_is_left_out(metadata: Root) -> None:
    for tree in ("zarr", "zarr3", "xarray"):
        listing = get(metadata.server, f"/data/{tree}/")
        assert listing.status_code == 200
        organizations = set(re.findall(rf'href="/data/{tree}/([^/"]+)/"', listing.text))
        assert "meta" in organizations and organizations <= {"meta", "fuzz"}, organizations


def test_xarray_coordinates_are_computed_not_materialized(metadata: Root) -> None:
    with PeakRss(metadata.server) as peak:
        document = get(metadata.server, "/data/xarray/meta/wide/zarr.json")
    assert document.status_code == 200
    x = document.json()["consolidated_metadata"]["metadata"]["1/x"]
    assert x["shape"] == [2**25]
    assert peak.growth < 64 * MIB, f"one zarr.json grew the worker by {peak.growth / MIB:.0f} MiB"
    edge = x["chunk_grid"]["configuration"]["chunk_shape"][0]
    last = 2**25 // edge - 1
    for index in (0, last):
        chunk = get(metadata.server, f"/data/xarray/meta/wide/1/x/c/{index}")
        assert chunk.status_code == 200
        assert np.array_equal(np.frombuffer(chunk.content, "<f8"), np.arange(index * edge, (index + 1) * edge))
    assert get(metadata.server, f"/data/xarray/meta/wide/1/x/c/{last + 1}").status_code == 404


# Generated metadata: every JSON type in each field that matters, one fresh dataset per example.

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=8,
)
ZARRAY = {
    "zarr_format": 2,
    "shape": [1, 64, 64, 64],
    "chunks": [1, 32, 32, 32],
    "dtype": "|u1",
    "compressor": None,
    "fill_value": 0,
    "order": "C",
    "filters": None,
}
ZARR_JSON = {
    "zarr_format": 3,
    "node_type": "array",
    "shape": [1, 64, 64, 64],
    "data_type": "uint8",
    "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1, 32, 32, 32]}},
    "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
    "fill_value": 0,
    "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
}
ZARR_FIELDS = {2: [*ZARRAY, "dimension_separator"], 3: [*ZARR_JSON, "dimension_names"]}
SHARDED: dict[str, Any] = {
    "name": "sharding_indexed",
    "configuration": {
        "chunk_shape": [1, 16, 16, 16],
        "codecs": [{"name": "bytes"}],
        "index_codecs": [{"name": "bytes"}, {"name": "crc32c"}],
    },
}


def _sharding(inner: list[int]) -> dict[str, Any]:
    """A shard codec whose inner chunks are ``inner``."""
    return {"name": "sharding_indexed", "configuration": {**SHARDED["configuration"], "chunk_shape": inner}}


def _grid(chunk_shape: list[int]) -> dict[str, Any]:
    return {"name": "regular", "configuration": {"chunk_shape": chunk_shape}}


PROPERTY_FIELDS = ["id", "scale", "dataLayers", "name", "category", "boundingBox", "topLeft", "width"]
PROPERTY_FIELDS += ["elementClass", "dataFormat", "numChannels", "mags", "mag", "path", "axisOrder"]
_examples = iter(range(10**9))


def _answers(server: Server, dataset: str) -> list[requests.Response]:
    paths = [
        "/data/zarr/fuzz/",
        f"/data/zarr/fuzz/{dataset}/",
        f"/data/zarr/fuzz/{dataset}/.zmetadata",
        f"/data/zarr/fuzz/{dataset}/color/1/.zarray",
        f"/data/zarr/fuzz/{dataset}/color/1/0.0.0.0",
        f"/data/zarr3/fuzz/{dataset}/zarr.json",
        f"/data/zarr3/fuzz/{dataset}/color/1/c/0/1/0/0",
        f"/data/xarray/fuzz/{dataset}/zarr.json",
        f"/preview/fuzz/{dataset}/color.png",  # a preview decodes: absurd fill values and shapes must not reach it
    ]
    return [get(server, path) for path in paths]


def _refuse_constant(constant: str) -> None:
    raise AssertionError(f"{constant} in a served document")


def _check_answers(server: Server, dataset: str) -> None:
    for response in _answers(server, dataset):
        assert response.status_code in (200, 404, 409, 500), (response.url, response.status_code, response.text[:300])
        if response.status_code != 200:
            assert "internal error" not in response.json()["error"], (response.url, response.text[:300])
        elif response.headers["Content-Type"].startswith("application/json"):
            json.loads(response.text, parse_constant=_refuse_constant)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(version=st.sampled_from([2, 3]), field=st.data(), value=JSON_VALUES, sharded=st.booleans())
def test_zarr_metadata_of_every_json_type(
    metadata: Root, version: int, field: st.DataObject, value: object, sharded: bool
) -> None:
    name = field.draw(st.sampled_from(ZARR_FIELDS[version]))
    document = dict(ZARRAY if version == 2 else ZARR_JSON)
    if version == 3 and sharded:
        document["chunk_grid"] = {"name": "regular", "configuration": {"chunk_shape": [1, 32, 32, 32]}}
        document["codecs"] = [json.loads(json.dumps(SHARDED))]
    document[name] = value
    dataset = f"z{next(_examples)}"
    layer = wkw_layer("color", "uint8", [0, 0, 0], [64, 64, 64], "zarr" if version == 2 else "zarr3")
    write_properties(metadata.root / "fuzz" / dataset, [layer])
    mag = metadata.root / "fuzz" / dataset / "color" / "1"
    mag.mkdir(parents=True)
    (mag / (".zarray" if version == 2 else "zarr.json")).write_text(json.dumps(document))
    _check_answers(metadata.server, dataset)
    assert_no_unexpected_errors(metadata.server)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(field=st.sampled_from(PROPERTY_FIELDS), value=JSON_VALUES)
def test_properties_of_every_json_type(metadata: Root, field: str, value: object) -> None:
    dataset = f"p{next(_examples)}"
    directory = metadata.root / "fuzz" / dataset
    layer = wkw_layer("color", "uint8", [0, 0, 0], [64, 64, 64])
    write_properties(directory, [layer])
    document = json.loads((directory / "datasource-properties.json").read_text())
    for holder in (document, document["dataLayers"][0], document["dataLayers"][0]["boundingBox"]):
        if field in holder:
            holder[field] = value
    for entry in document["dataLayers"][0]["mags"] if field in ("mag", "path", "axisOrder") else []:
        entry[field] = value
    (directory / "datasource-properties.json").write_text(json.dumps(document))
    (directory / "color").symlink_to(metadata.root / "meta" / "good" / "color")
    _check_answers(metadata.server, dataset)
    assert_no_unexpected_errors(metadata.server)


@pytest.mark.parametrize(
    ("document", "words"),
    [
        ('"x"', ("object",)),
        (json.dumps({**ZARRAY, "compressor": "zstd"}), ("compressor",)),
        (json.dumps({**ZARRAY, "chunks": [1, 0, 32, 32]}), ("chunks",)),
        (json.dumps({**ZARR_JSON, "chunk_grid": None}), ("chunk_grid",)),
        (json.dumps({**ZARRAY, "chunks": [1, 1024, 1024, 1024]}), ("decodes to 1073741824 bytes",)),
        (
            json.dumps({**ZARR_JSON, "chunk_grid": _grid([1, 128, 64, 64]), "codecs": [_sharding([1, 1, 1, 1])]}),
            ("524288 chunks per shard are more",),
        ),
    ],
)
def test_malformed_zarr_metadata_makes_the_layer_unusable(
    metadata: Root, document: str, words: tuple[str, ...]
) -> None:
    dataset = f"m{next(_examples)}"
    version = 3 if "node_type" in document else 2
    layer = wkw_layer("color", "uint8", [0, 0, 0], [64, 64, 64], "zarr3" if version == 3 else "zarr")
    write_properties(metadata.root / "fuzz" / dataset, [layer])
    mag = metadata.root / "fuzz" / dataset / "color" / "1"
    mag.mkdir(parents=True)
    (mag / (".zarray" if version == 2 else "zarr.json")).write_text(document)
    if document == '"x"':
        (mag / "zarr.json").write_text(document)
    listing = get(metadata.server, "/data/zarr/fuzz/")
    assert listing.status_code == 200
    page = get(metadata.server, f"/data/zarr/fuzz/{dataset}/")
    assert page.status_code == 200 and all(word in page.text for word in words)
    assert_reason(get(metadata.server, f"/data/zarr/fuzz/{dataset}/color/.zattrs"), 404, *words)
    assert get(metadata.server, "/data/zarr/meta/good/color/1/0.0.0.0").status_code == 200
    assert_no_unexpected_errors(metadata.server)


def test_chunks_for_clients_that_left_are_skipped(heavy: Root) -> None:
    """16 clients ask for a heavy chunk and hang up at once: chunks still queued are never produced."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(heavy.server.url)
    path = "/data/zarr3/big/ds/color/1/c/0/0/0/0"  # asked for by no other test: its log lines are these
    request = f"GET {path} HTTP/1.1\r\nHost: {url.hostname}\r\n\r\n".encode()
    clients = [socket.create_connection((url.hostname, url.port), timeout=10) for _ in range(16)]
    for client in clients:
        client.sendall(request)
    time.sleep(0.3)  # every request has arrived; the memory budget lets one chunk run at a time
    for client in clients:
        client.close()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        statuses = [line["status"] for line in heavy.server.access_lines() if line.get("path") == path]
        if len(statuses) == 16:
            break
        time.sleep(0.5)
    assert len(statuses) == 16, statuses
    skipped = statuses.count(499)
    assert skipped >= 8, f"only {skipped} of 16 abandoned chunks were skipped: {statuses}"
    assert set(statuses) <= {200, 499}
    assert get(heavy.server, path).status_code == 200  # the worker serves on


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_zarr_source_s_gzip_chunks_encode_to_one_body(
    zarr_format: int, tmp_path_factory: pytest.TempPathFactory, server_factory: Callable[..., Server]
) -> None:
    """A Zarr source's own gzip encoding, used for chunks that straddle the box, is deterministic too."""
    import tensorstore as ts

    root = tmp_path_factory.mktemp(f"gzip{zarr_format}")
    dataset = root / "z" / "ds"
    write_properties(
        dataset, [wkw_layer("color", "uint8", [0, 0, 0], [50, 64, 64], f"zarr{'3' if zarr_format == 3 else ''}")]
    )
    kvstore = {"driver": "file", "path": str(dataset / "color" / "1")}
    if zarr_format == 2:
        metadata: dict[str, Any] = {"compressor": {"id": "gzip", "level": 5}, "chunks": [1, 32, 32, 32], "dtype": "|u1"}
        spec = {"driver": "zarr", "kvstore": kvstore, "metadata": {**metadata, "shape": [1, 64, 64, 64]}}
    else:
        codecs = [{"name": "bytes"}, {"name": "gzip", "configuration": {"level": 5}}]
        grid = {"name": "regular", "configuration": {"chunk_shape": [1, 32, 32, 32]}}
        metadata = {"shape": [1, 64, 64, 64], "data_type": "uint8", "chunk_grid": grid, "codecs": codecs}
        spec = {"driver": "zarr3", "kvstore": kvstore, "metadata": metadata}
    array = ts.open(spec, create=True).result()
    array[...] = compressible((1, 64, 64, 64), "uint8", 7)
    replicas = [server_factory(root) for _ in range(2)]
    path = "/data/zarr3/z/ds/color/1/c/0/1/0/0"  # x 32..64 straddles the box's end at 50: re-encoded
    first = get(replicas[0], path)
    time.sleep(1.1)
    for answer in (get(replicas[0], path), get(replicas[1], path)):
        assert answer.status_code == 200 == first.status_code
        assert (answer.headers["ETag"], answer.content) == (first.headers["ETag"], first.content)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    lengths=st.integers(0, 255),
    block_type=st.integers(0, 4),
    voxel_type=st.integers(0, 11),
    bytes_per_voxel=st.integers(0, 255),
    payload=st.binary(max_size=4096),
)
def test_wkw_headers_of_every_geometry(
    geometry: Root, lengths: int, block_type: int, voxel_type: int, bytes_per_voxel: int, payload: bytes
) -> None:
    """Any header byte values, in header.wkw and in a data file whose body is arbitrary bytes: the layer
    is served or unusable with a reason, and a chunk is data, absent or a storage fault, never a crash."""
    import struct

    dataset = geometry.root / "geo" / f"h{next(_examples)}"
    write_properties(dataset, [wkw_layer("color", "uint8", [0, 0, 0], [64, 64, 64])])
    header = struct.pack("<3sBBBBBQ", b"WKW", 1, lengths, block_type, voxel_type, bytes_per_voxel, 0)
    mag = dataset / "color" / "1"
    (mag / "z0" / "y0").mkdir(parents=True)
    (mag / "header.wkw").write_bytes(header)
    data_offset = 16 + (8 * 8 ** (lengths >> 4) if block_type in (2, 3) and lengths >> 4 <= 2 else 0)
    (mag / "z0" / "y0" / "x0.wkw").write_bytes(header[:8] + struct.pack("<Q", data_offset) + payload)
    base = f"/data/zarr/geo/{dataset.name}"
    assert get(geometry.server, "/data/zarr/geo/").status_code == 200
    for path in (f"{base}/", f"{base}/color/1/.zarray", f"{base}/color/1/0.0.0.0", f"{base}/color/1/0.1.1.1"):
        response = get(geometry.server, path)
        assert response.status_code in (200, 404, 500), (path, response.status_code)
        if response.status_code != 200:
            assert "internal error" not in response.json()["error"], (path, response.text[:300])
    assert_no_unexpected_errors(geometry.server)
