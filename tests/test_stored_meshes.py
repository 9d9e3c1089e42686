"""Stored mesh sets (gateway/meshes/stored.py): made block by block as the runner runs them (here serially), written
in Neuroglancer's sharded multi-resolution format, and served by a real gateway in place of on-demand meshes.

The shards are read by tensorstore's ``neuroglancer_uint64_sharded`` key-value store, and the hash by
CloudVolume's, both independent of the writer; the served meshes by a reader written from the format document
(tests/support/mesh_sets.py), checked against the labels the ``wkw`` package wrote.
"""

import gzip
import json
import pickle
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tensorstore as ts
import wkw
from scipy import ndimage
from support import mesh_sets
from support.mesh_sets import SMALL, SMALL_VOXELS, TUBE, VOXEL_NM, ServedMesh, make_mesh_set, read_served, write_cells
from support.servers import Server, assert_no_unexpected_errors, assert_reason

from gateway.batch.mesh_sets import MeshSetTask
from gateway.batch.tasks import BlockTask
from gateway.meshes.stored import MAX_BLOCK_OUTPUT_BYTES, MeshSetBlockFailed
from gateway.shard_formats.neuroglancer_sharded import (
    ShardChunk,
    Sharding,
    encode_shard,
    sharding_document,
    sharding_for,
)
from gateway.sources import precomputed_source
from gateway.sources.metadata import PrecomputedSharding
from gateway.sources.precomputed_source import MAX_MINISHARD_INDEX_BYTES

pytestmark = pytest.mark.slow  # mesh sets written and read back whole

BASE = f"/data/meshes/{mesh_sets.ORGANIZATION}/{mesh_sets.DATASET}/{mesh_sets.LAYER}/multires/"
VOXEL = np.asarray(VOXEL_NM)


@pytest.fixture(scope="module")
def cells_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stored-meshes")
    write_cells(root)
    return root


@pytest.fixture(scope="module")
def labels(cells_root: Path) -> np.ndarray:
    return mesh_sets.cells_labels()


@pytest.fixture(scope="module")
def on_demand(cells_root: Path, server_factory: Callable[..., Server]) -> dict[int, ServedMesh]:
    """Every segment's mesh made on demand, before any set exists (no bound in the way)."""
    server = server_factory(cells_root)
    meshes = {s: read_served(getter(server), BASE, s) for s in (TUBE, 7, 9, SMALL, mesh_sets.EDGE)}
    server.process.terminate()
    return meshes


@pytest.fixture()
def copy_root(cells_root: Path, tmp_path: Path) -> Path:
    """A copy of the dataset, without a mesh set: each test makes its own."""
    root = tmp_path / "root"
    shutil.copytree(cells_root, root)
    return root


def getter(server: Server) -> Callable[..., requests.Response]:
    def get(path: str, **headers: str) -> requests.Response:
        return requests.get(server.url + path, headers=headers, timeout=120)

    return get


def small_bound_server(root: Path, server_factory: Callable[..., Server]) -> Server:
    """A gateway that meshes on demand every level only of segments as small as :data:`SMALL` (of the tube, its
    coarse levels)."""
    return server_factory(root, multires_voxels=SMALL_VOXELS)


TINY_VOXELS = 65**3 - 1  # less than any fragment reads: no level of the tube is made on demand


def lods(manifest: bytes) -> int:
    return int.from_bytes(manifest[24:28], "little")


def open_edges(faces: np.ndarray) -> int:
    edges = np.sort(np.concatenate([faces[:, [0, 1]], faces[:, [1, 2]], faces[:, [2, 0]]]), axis=1)
    _, counts = np.unique(edges, axis=0, return_counts=True)
    return int(np.count_nonzero(counts != 2))


def closed(mesh: ServedMesh, lod: int = 0, leave_out: int | None = None) -> bool:
    """Whether the fragments of ``lod`` (but the one at ``leave_out``), coincident vertices merged, form a closed
    surface."""
    parts = [f for f in mesh.fragments if f.lod == lod]
    parts = [f for i, f in enumerate(parts) if i != leave_out]
    vertices = np.concatenate([f.vertices for f in parts])
    offsets = np.cumsum([0] + [len(f.vertices) for f in parts[:-1]])
    faces = np.concatenate([f.faces + o for f, o in zip(parts, offsets)])
    _, inverse = np.unique(np.round(vertices, 3), axis=0, return_inverse=True)
    merged = inverse.reshape(-1)[faces]
    merged = merged[(merged[:, 0] != merged[:, 1]) & (merged[:, 1] != merged[:, 2]) & (merged[:, 0] != merged[:, 2])]
    return open_edges(merged) == 0


def farthest_from_the_voxels(vertices: np.ndarray, labels: np.ndarray, segment: int) -> float:
    """Nanometers from the farthest vertex to the nearest voxel of ``segment`` (voxel centres)."""
    distance = ndimage.distance_transform_edt(labels != segment, sampling=VOXEL)
    index = np.clip(np.floor(vertices / VOXEL).astype(int), 0, np.asarray(labels.shape) - 1)
    return float(distance[index[:, 0], index[:, 1], index[:, 2]].max())


# --- the format, read by others ---------------------------------------------------------------------


def sharding_of(directory: Path) -> Sharding:
    return precomputed_source.sharding_of(
        PrecomputedSharding.model_validate(json.loads((directory / "info").read_text())["sharding"])
    )


def test_tensorstore_reads_every_manifest_of_a_written_set(copy_root: Path, on_demand: dict[int, ServedMesh]) -> None:
    make_mesh_set(copy_root)
    directory = mesh_sets.set_directory(copy_root)
    info = json.loads((directory / "info").read_text())
    assert info["@type"] == "neuroglancer_multilod_draco" and info["vertex_quantization_bits"] == 16
    sharding = info["sharding"]
    assert sharding["@type"] == "neuroglancer_uint64_sharded_v1" and sharding["hash"] == "murmurhash3_x86_128"
    assert sharding["minishard_index_encoding"] == "gzip" and sharding["data_encoding"] == "raw"
    store = ts.KvStore.open(
        {"driver": "neuroglancer_uint64_sharded", "base": f"file://{directory}/", "metadata": sharding}
    ).result()
    shard = (directory / sharding_of(directory).shard_name(0)).read_bytes()
    for segment, mesh in on_demand.items():
        manifest = store.read(np.uint64(segment).tobytes()[::-1]).result().value  # keys are big-endian there
        assert manifest == mesh.manifest, segment
        at = shard.index(manifest)  # the fragment data lies just before its manifest
        assert shard[at - len(mesh.data) : at] == mesh.data
    assert store.read(np.uint64(999).tobytes()[::-1]).result().state == "missing"
    stamp = json.loads((directory / "stamp.json").read_text())
    assert stamp["files"] == {p.name: p.stat().st_size for p in directory.iterdir() if p.name != "stamp.json"}


def test_shards_spread_over_files_when_there_are_many_keys(tmp_path: Path) -> None:
    many = sharding_for(3_000_000)
    assert many.shard_bits >= 2 and many.minishard_bits == 9
    assert sharding_for(10, 10 << 30, 256 << 20).shard_bits >= 6  # 40 shards of 256 MiB at least
    small = Sharding(0, "identity", 2, 1, True, False)  # 4 minishards in each of 2 shards
    values = {key: bytes([key]) * key for key in range(1, 40, 2)}
    shards: dict[int, list[ShardChunk]] = {}
    for key, value in values.items():
        shards.setdefault(small.locate(key)[0], []).append(ShardChunk(key, value, prefix=b"ahead"))
    assert sorted(shards) == [0, 1]
    for shard, chunks in shards.items():
        (tmp_path / small.shard_name(shard)).write_bytes(encode_shard(small, chunks))
    store = ts.KvStore.open(
        {"driver": "neuroglancer_uint64_sharded", "base": f"file://{tmp_path}/", "metadata": sharding_document(small)}
    ).result()
    for key, value in values.items():
        assert store.read(np.uint64(key).tobytes()[::-1]).result().value == value


# --- served as stored -----------------------------------------------------------------------------------


def test_stored_meshes_are_the_on_demand_meshes_byte_for_byte(
    copy_root: Path, on_demand: dict[int, ServedMesh], server_factory: Callable[..., Server]
) -> None:
    """Blocks that hold every level: the same manifests and fragments as on demand, from the shard."""
    make_mesh_set(copy_root)
    server = server_factory(copy_root)
    for segment, expected in on_demand.items():
        served = read_served(getter(server), BASE, segment)
        assert served.manifest == expected.manifest and served.data == expected.data, segment
        assert served.data_etag != expected.data_etag  # named by the shard's version, not by a hash of bytes
    assert_no_unexpected_errors(server)


def test_finer_blocks_make_the_same_surfaces(
    copy_root: Path, on_demand: dict[int, ServedMesh], labels: np.ndarray, server_factory: Callable[..., Server]
) -> None:
    """Blocks of one level-0 cube, coarser levels a cube per block: every fragment made on demand is stored as
    it is; fragments a coarse block adds lie on the segment (within a voxel of its mag); surfaces are closed."""
    task = make_mesh_set(copy_root, fine_lod=0)
    assert len(task.blocks()) > 8
    server = server_factory(copy_root)
    for segment, expected in on_demand.items():
        served = read_served(getter(server), BASE, segment)
        stored = {(f.lod, f.position): f.data for f in served.fragments}
        for fragment in expected.fragments:
            assert stored.get((fragment.lod, fragment.position)) == fragment.data, (segment, fragment.lod)
        for fragment in served.fragments:
            mag = 2**fragment.lod
            assert farthest_from_the_voxels(fragment.vertices, labels, segment) <= np.linalg.norm(VOXEL * mag)
        assert closed(served), segment
        if sum(f.lod == 0 for f in served.fragments) > 1:  # the check can fail: a fragment less leaves a hole
            assert not closed(served, leave_out=0), segment


def test_a_segment_too_large_for_on_demand_meshing_is_served_from_the_set(
    copy_root: Path, labels: np.ndarray, server_factory: Callable[..., Server]
) -> None:
    server = small_bound_server(copy_root, server_factory)
    get = getter(server)
    coarse = read_served(get, BASE, TUBE)  # at once: its coarse levels, made on demand
    assert 0 < lods(coarse.manifest) < 3 and coarse.fragments, lods(coarse.manifest)
    assert lods(get(f"{BASE}{SMALL}.index").content) == 3
    tiny = server_factory(copy_root, multires_voxels=TINY_VOXELS)
    assert_reason(getter(tiny)(f"{BASE}{TUBE}.index"), 413, "mesh-segments", str(TINY_VOXELS))
    make_mesh_set(copy_root)
    served = read_served(get, BASE, TUBE)
    assert lods(served.manifest) == 3
    lod0 = np.concatenate([f.vertices for f in served.fragments if f.lod == 0])
    assert farthest_from_the_voxels(lod0, labels, TUBE) <= np.linalg.norm(VOXEL)
    where = np.argwhere(labels == TUBE)
    np.testing.assert_allclose(lod0.min(axis=0), where.min(axis=0) * VOXEL, atol=float(VOXEL.max()))
    np.testing.assert_allclose(lod0.max(axis=0), (where.max(axis=0) + 1) * VOXEL, atol=float(VOXEL.max()))
    assert closed(served)
    again = get(f"{BASE}{TUBE}", **{"If-None-Match": served.data_etag})
    assert again.status_code == 304
    assert get(f"{BASE}{TUBE}.index").headers["ETag"] == served.manifest_etag
    precomputed = f"/data/precomputed/{mesh_sets.ORGANIZATION}/{mesh_sets.DATASET}/{mesh_sets.LAYER}/mesh/"
    assert get(f"{precomputed}{TUBE}.index").content == served.manifest  # the precomputed tree's mesh is this source
    assert read_served(get, BASE, 999).fragments == []  # a set lists every segment: one it lacks has no voxels
    assert_no_unexpected_errors(server)


def wait_for(check: Callable[[], bool], what: str, seconds: float = 60) -> None:
    """Until ``check()`` holds (the gateway takes a layer's data stamp again every few seconds)."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


def test_a_stale_set_is_never_served(
    copy_root: Path, labels: np.ndarray, server_factory: Callable[..., Server]
) -> None:
    make_mesh_set(copy_root)
    server = small_bound_server(copy_root, server_factory)
    get = getter(server)
    assert get(f"{BASE}{TUBE}.index").status_code == 200
    small_before = read_served(get, BASE, SMALL)
    # The data changes: segment 13 grows by a voxel at mag 1 (rewritten in place by the wkw package).
    with wkw.Dataset.open(str(copy_root / mesh_sets.ORGANIZATION / mesh_sets.DATASET / "cells" / "1")) as ds:
        ds.write((100, 100, 37), np.full((1, 1, 1), SMALL, dtype=np.uint32))
    assert lods(get(f"{BASE}{TUBE}.index").content) == 3
    wait_for(lambda: lods(get(f"{BASE}{TUBE}.index").content) < 3, "the stale set is still served")
    tiny = server_factory(copy_root, multires_voxels=TINY_VOXELS)
    assert_reason(getter(tiny)(f"{BASE}{TUBE}.index"), 409, "stale", "mesh-segments")
    small_after = read_served(get, BASE, SMALL)  # made on demand from the data as it is now
    assert small_after.manifest_etag != small_before.manifest_etag
    make_mesh_set(copy_root)  # made again: fresh, served
    wait_for(lambda: lods(get(f"{BASE}{TUBE}.index").content) == 3, "the fresh set is not served")
    assert_no_unexpected_errors(server)


def test_an_incomplete_set_is_never_served(copy_root: Path, server_factory: Callable[..., Server]) -> None:
    make_mesh_set(copy_root)
    (mesh_sets.set_directory(copy_root) / "stamp.json").unlink()  # as a run that failed, or is still writing
    server = small_bound_server(copy_root, server_factory)
    get = getter(server)
    assert 0 < lods(get(f"{BASE}{TUBE}.index").content) < 3  # its coarse levels on demand, not the set's
    assert get(f"{BASE}{SMALL}.index").status_code == 200  # on demand
    tiny = server_factory(copy_root, multires_voxels=TINY_VOXELS)
    assert_reason(getter(tiny)(f"{BASE}{TUBE}.index"), 409, "incomplete", "mesh-segments")


def test_a_failing_block_names_itself_and_nothing_is_marked_complete(copy_root: Path) -> None:
    task = make_mesh_set(copy_root)
    stamp = mesh_sets.set_directory(copy_root) / "stamp.json"
    stamp.unlink()
    mag = copy_root / mesh_sets.ORGANIZATION / mesh_sets.DATASET / "cells" / "1"
    victim = mag / "z0" / "y0" / "x0.wkw"
    with open(victim, "r+b") as f:
        f.truncate(victim.stat().st_size // 2)
    with pytest.raises(MeshSetBlockFailed) as failed:
        [task.run(block) for block in task.blocks()]
    assert task.blocks()[0].key in str(failed.value) and "cells" in str(failed.value)
    assert not stamp.exists()


def test_the_task_is_a_block_task_that_travels_to_workers(cells_root: Path) -> None:
    task: BlockTask = MeshSetTask.for_layer(
        str(cells_root), f"{mesh_sets.ORGANIZATION}/{mesh_sets.DATASET}", mesh_sets.LAYER
    )
    assert task.name == "meshes" and len(task.version()) == 32
    shipped = pickle.loads(pickle.dumps(task))
    block = task.blocks()[0]
    assert shipped.run(block) == task.run(block)
    assert MAX_BLOCK_OUTPUT_BYTES < task.memory_bytes() < MAX_BLOCK_OUTPUT_BYTES + (64 << 20)
    keys = [b.key for b in task.blocks()]
    assert len(set(keys)) == len(keys)


# --- hostile sets ---------------------------------------------------------------------------------------


def restamp(directory: Path) -> None:
    """A stamp that lists the files as they are now (a crafted set carries a crafted stamp)."""
    path = directory / "stamp.json"
    stamp = json.loads(path.read_text())
    stamp["files"] = {name: (directory / name).stat().st_size for name in stamp["files"]}
    path.unlink()
    path.write_text(json.dumps(stamp))


@pytest.fixture()
def hostile(copy_root: Path, server_factory: Callable[..., Server]) -> Iterator[tuple[Path, Server]]:
    make_mesh_set(copy_root)
    server = small_bound_server(copy_root, server_factory)
    yield mesh_sets.set_directory(copy_root), server
    assert getter(server)("/healthz").status_code == 200
    assert_no_unexpected_errors(server)


def shard_with(directory: Path, craft: Callable[[bytearray, Sharding], bytearray]) -> None:
    sharding = sharding_of(directory)
    path = directory / sharding.shard_name(0)
    body = craft(bytearray(path.read_bytes()), sharding)
    path.unlink()
    path.write_bytes(bytes(body))
    restamp(directory)


def entry_of(sharding: Sharding, segment: int) -> int:
    return int(sharding.locate(segment)[1]) * 16


def test_a_shard_index_pointing_past_the_file_is_a_5xx(hostile: tuple[Path, Server]) -> None:
    directory, server = hostile

    def craft(body: bytearray, spec: Sharding) -> bytearray:
        at = entry_of(spec, TUBE)
        body[at : at + 16] = np.asarray([16, len(body) + 1000], dtype="<u8").tobytes()
        return body

    shard_with(directory, craft)
    assert_reason(getter(server)(f"{BASE}{TUBE}.index"), 500, "ends past the end of the shard")


def test_a_huge_minishard_index_is_refused_before_it_is_read(hostile: tuple[Path, Server]) -> None:
    directory, server = hostile

    def craft(body: bytearray, spec: Sharding) -> bytearray:
        at = entry_of(spec, TUBE)
        body[at : at + 16] = np.asarray([0, 2 * MAX_MINISHARD_INDEX_BYTES], dtype="<u8").tobytes()
        return body + bytearray(2 * MAX_MINISHARD_INDEX_BYTES)

    shard_with(directory, craft)
    assert_reason(getter(server)(f"{BASE}{TUBE}.index"), 500, "more than the", str(MAX_MINISHARD_INDEX_BYTES))


def test_a_minishard_index_that_inflates_without_end_is_stopped(hostile: tuple[Path, Server]) -> None:
    directory, server = hostile

    def craft(body: bytearray, spec: Sharding) -> bytearray:
        bomb = gzip.compress(bytes(4 * MAX_MINISHARD_INDEX_BYTES))
        at = entry_of(spec, TUBE)
        start = len(body) - spec.index_bytes
        body[at : at + 16] = np.asarray([start, start + len(bomb)], dtype="<u8").tobytes()
        return body + bytearray(bomb)

    shard_with(directory, craft)
    assert_reason(getter(server)(f"{BASE}{TUBE}.index"), 500, "decompresses to more than")


def test_a_chunk_pointing_past_the_file_is_a_5xx(hostile: tuple[Path, Server]) -> None:
    directory, server = hostile

    def craft(body: bytearray, spec: Sharding) -> bytearray:
        index = np.frombuffer(gzip.compress(np.asarray([[TUBE], [10**9], [100]], "<u8").tobytes()), np.uint8)
        at = entry_of(spec, TUBE)
        start = len(body) - spec.index_bytes
        body[at : at + 16] = np.asarray([start, start + len(index)], dtype="<u8").tobytes()
        return body + bytearray(index.tobytes())

    shard_with(directory, craft)
    assert_reason(getter(server)(f"{BASE}{TUBE}.index"), 500, "points past the end of the shard")


def test_a_shard_that_is_not_the_one_stamped_is_a_5xx(hostile: tuple[Path, Server]) -> None:
    directory, server = hostile
    with open(directory / sharding_of(directory).shard_name(0), "ab") as shard:
        shard.write(b"more")
    assert_reason(getter(server)(f"{BASE}{TUBE}.index"), 500, "its stamp lists")


def test_a_stamp_that_is_not_one_is_a_5xx(hostile: tuple[Path, Server]) -> None:
    directory, server = hostile
    (directory / "stamp.json").unlink()
    (directory / "stamp.json").write_text('{"format": "zarr-gateway-mesh-set", "version": 1, "files": [1]}')
    assert_reason(getter(server)(f"{BASE}{TUBE}.index"), 500, "stamp")
