"""Chunk files rewritten in place are never served torn (issue 24, item 7a), in every format.

A Zarr chunk file is read whole; a writer that rewrites it in place with bytes of the same length (an
uncompressed chunk, a Blosc chunk stored as is) leaves it, between two of its write calls, with the new
version's length and time stamps and some of the old bytes: the length check cannot tell. The settle rule
(``Store.read_whole(..., settled=True)``, as ``Store.read`` applies it) does: such a file is a 503 with
Retry-After until it is quiet, and neither a mixed body nor an answer kept from before is ever given.

- A writer process rewrites uncompressed Zarr v2 and v3 chunks and a memcpyed Blosc one while clients
  read them (passed through in both Zarr trees, re-encoded by the precomputed tree): every 200 body is
  exactly one version, one ETag names one body, and the last version comes through once the writer stops.
- In every format, a chunk file rewritten within the settle time (its very bytes again) is a 503 in every
  tree, never the answer the worker kept, then served again once quiet.
"""

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numcodecs
import numpy as np
import pytest
import requests
import zarr
from support.format_layers import EDGE, FORMATS
from support.layers import layer_entry, write_properties
from support.rewrites import Answer, InPlaceWriter, assert_each_body_is_one_version, hammering, wait_until_served
from support.servers import Server, assert_no_unexpected_errors

from gateway_storage import FileUnsettledError, LocalStore

pytestmark = pytest.mark.slow  # writer processes rewrite chunks for seconds while readers read them

ORG, DATASET = "rewrites", "ds"
REWRITE_EDGE = 128  # one chunk of 2 MiB per array: a rewrite of it takes long enough to be overlapped by reads
STEP = 32 << 10  # the bytes of each write call when the writer goes piece by piece
# layer: (zarr format, compressor); a Blosc chunk without compression has the same length in every version
REWRITTEN: dict[str, tuple[Literal[2, 3], Any]] = {
    "raw_v2": (2, None),
    "raw_v3": (3, None),
    "memcpy_blosc_v2": (2, numcodecs.Blosc(cname="lz4", clevel=0, shuffle=numcodecs.Blosc.NOSHUFFLE)),
}


def random_volume(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (REWRITE_EDGE,) * 3).astype("uint8")


def write_array(mag: Path, zarr_format: Literal[2, 3], compressor: Any, data: np.ndarray) -> Path:
    """The array of one chunk at ``mag``; the path of its chunk file."""
    array = zarr.create_array(
        str(mag),
        shape=data.shape,
        chunks=data.shape,
        dtype="uint8",
        zarr_format=zarr_format,
        compressors=compressor,
    )
    array[...] = data
    return mag / ("0.0.0" if zarr_format == 2 else "c/0/0/0")


PRECOMPUTED_EDGE = 32  # the precomputed tree's chunks: each made from the whole stored chunk, re-encoded raw
PRECOMPUTED_KEYS = {"96-128_96-128_96-128": (96, 96, 96), "0-32_32-64_64-96": (0, 32, 64)}


def routes(server: Server, layer: str) -> dict[str, tuple[str, list[str]]]:
    """Reader name: base URL and chunk keys, for the layer's chunk passed through in both Zarr trees and
    chunks of the precomputed tree made from it."""
    return {
        f"{layer} v2": (f"{server.url}/data/zarr/{ORG}/{DATASET}/{layer}/1", ["0.0.0.0"]),
        f"{layer} v3": (f"{server.url}/data/zarr3/{ORG}/{DATASET}/{layer}/1", ["c/0/0/0/0"]),
        f"{layer} precomputed": (
            f"{server.url}/data/precomputed_raw/{ORG}/{DATASET}/{layer}/1",
            list(PRECOMPUTED_KEYS),
        ),
    }


def read_zarr_trees(server: Server, layer: str) -> list[np.ndarray]:
    """The layer's voxels as zarr-python reads them through both Zarr trees, as ``(x, y, z)``."""
    base = f"{server.url}/data/{{}}/{ORG}/{DATASET}/{layer}/1"
    return [
        np.asarray(zarr.open_array(base.format("zarr"), mode="r", zarr_format=2)[0]),
        np.asarray(zarr.open_array(base.format("zarr3"), mode="r", zarr_format=3)[0]),
    ]


def precomputed_voxels(body: bytes) -> np.ndarray:
    """A raw precomputed chunk of one channel as ``(x, y, z)``: x fastest."""
    return np.frombuffer(body, dtype=np.uint8).reshape((PRECOMPUTED_EDGE,) * 3, order="F")


def test_zarr_chunks_rewritten_in_place_are_never_served_mixed(
    tmp_path: Path, server_factory: Callable[..., Server]
) -> None:
    versions = [random_volume(seed) for seed in (1, 2)]
    root = tmp_path / "root"
    dataset = root / ORG / DATASET
    size = (REWRITE_EDGE,) * 3
    write_properties(
        dataset, [layer_entry(name, "zarr" if f == 2 else "zarr3", size) for name, (f, _) in REWRITTEN.items()]
    )
    targets, copies = {}, {}
    for name, (zarr_format, compressor) in REWRITTEN.items():
        copies[name] = [
            write_array(tmp_path / f"{name}-{n}", zarr_format, compressor, data) for n, data in enumerate(versions)
        ]
        assert copies[name][0].stat().st_size == copies[name][1].stat().st_size  # the same length, as the case needs
        targets[name] = write_array(dataset / name / "1", zarr_format, compressor, versions[0])
    inodes = {name: target.stat().st_ino for name, target in targets.items()}
    server = server_factory(root, settle_seconds=1)  # the default settle time
    readers = {reader: route for name in REWRITTEN for reader, route in routes(server, name).items()}

    def body(reader: str, key: str) -> bytes:
        return wait_until_served(f"{readers[reader][0]}/{key}").content

    # each chunk's body of the first version, once the files written just now have settled: those bodies
    bodies = {(reader, key): [body(reader, key)] for reader, (_, keys) in readers.items() for key in keys}
    for name in REWRITTEN:
        assert all(np.array_equal(read, versions[0]) for read in read_zarr_trees(server, name)), name
    writers = [InPlaceWriter(targets[name], STEP, copies[name]) for name in REWRITTEN]
    try:
        with hammering(readers) as answers:
            for final in (1, 0, 1):
                for writer in writers:
                    writer.start_burst(60, final)
                for writer in writers:
                    writer.wait_for_burst()
                # The writers have stopped: the final version must come through, and only it.
                for (reader, key), known in bodies.items():
                    served = body(reader, key)
                    if len(known) == final:
                        known.append(served)  # the first time this version is served
                    assert served == known[final], (reader, key, final)
    finally:
        for writer in writers:
            writer.close()
    assert {name: target.stat().st_ino for name, target in targets.items()} == inodes, "rewritten, not replaced"
    assert all(old != new for old, new in bodies.values()), "each reader has seen both versions"

    def version_of(answer: Answer) -> list[int]:
        return [n for n, known in enumerate(bodies[(answer.server, answer.key)]) if answer.body == known]

    assert_each_body_is_one_version(answers, version_of)
    for name in REWRITTEN:  # the bodies named as the versions are those versions, voxel by voxel
        assert all(np.array_equal(read, versions[1]) for read in read_zarr_trees(server, name)), name
        for key, corner in PRECOMPUTED_KEYS.items():
            box = tuple(slice(c, c + PRECOMPUTED_EDGE) for c in corner)
            for number, version_body in enumerate(bodies[(f"{name} precomputed", key)]):
                assert np.array_equal(precomputed_voxels(version_body), versions[number][box]), (name, key, number)
    assert_no_unexpected_errors(server)


# --- every format: a chunk file rewritten within the settle time --------------------------------------------

SETTLE_SECONDS = 10  # long enough that every chunk is asked for within it on a busy machine
TREES = ("zarr", "zarr3", "precomputed")


def origin_urls(server: Server, layer: str) -> list[str]:
    base = f"{server.url}/data/{{}}/{ORG}/{DATASET}/{layer}/1/"
    return [
        base.format("zarr") + "0.0.0.0",
        base.format("zarr3") + "c/0/0/0/0",
        base.format("precomputed") + "0-32_0-32_0-32",
    ]


def trust_at_once(directory: Path) -> None:
    """Every file below ``directory`` as a finished writer leaves it (ctime past mtime): served at once."""
    for path in directory.rglob("*"):
        if path.is_file() and not path.is_symlink():
            st = path.stat()
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_chunk_file_rewritten_within_the_settle_time_is_never_served_in_any_format(
    tmp_path: Path, server_factory: Callable[..., Server]
) -> None:
    root = tmp_path / "root"
    dataset = root / ORG / DATASET
    write_properties(dataset, [layer_entry(name, kind.data_format) for name, kind in FORMATS.items()])
    data = np.random.default_rng(9).integers(1, 200, (2 * EDGE,) * 3).astype("uint8")
    for name, kind in FORMATS.items():
        kind.write(dataset / name / "1", data)
    trust_at_once(root)
    server = server_factory(root, settle_seconds=SETTLE_SECONDS)
    first = {}
    with requests.Session() as session:
        for name in FORMATS:
            for url in origin_urls(server, name):
                for _ in range(2):  # the second answer is the one the worker kept
                    response = session.get(url, timeout=60)
                    assert response.status_code == 200, (url, response.status_code, response.text[:300])
                first[url] = response.content
        for name, kind in FORMATS.items():
            stored = dataset / name / "1" / kind.origin_file
            with open(stored, "r+b") as handle:  # its very bytes again, in place: a writer the store cannot see end
                handle.write(stored.read_bytes())
        for url in first:
            response = session.get(url, timeout=60)
            assert response.status_code == 503, (url, response.status_code, response.text[:300])
            assert int(response.headers["Retry-After"]) >= 1, url
            assert "written" in response.json()["error"], url
    for url, body in first.items():  # once quiet, served again: the same voxels
        assert wait_until_served(url).content == body, url
    assert_no_unexpected_errors(server)


def test_read_whole_applies_the_settle_rule_only_to_chunk_files(tmp_path: Path) -> None:
    """``Store.read_whole(..., settled=True)`` holds a fresh file back as ``Store.read`` does; a metadata
    document (``settled`` left out) is trusted at once; a file whose writer has finished (ctime moved past
    mtime) is trusted at once too."""
    root = tmp_path / "root"
    root.mkdir()
    path = root / "0.0.0"
    path.write_bytes(b"v" * 4096)
    store = LocalStore(str(root), settle_seconds=SETTLE_SECONDS)
    with pytest.raises(FileUnsettledError) as raised:
        store.read_whole(str(path), limit=4096, settled=True)
    assert 0 < raised.value.retry_after <= SETTLE_SECONDS
    found = store.read_whole(str(path), limit=4096)
    assert found is not None and found[0] == b"v" * 4096
    trust_at_once(root)
    found = store.read_whole(str(path), limit=4096, settled=True)
    assert found is not None and found[0] == b"v" * 4096
