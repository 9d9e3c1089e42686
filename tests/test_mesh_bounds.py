"""Mesh and preview work bounded by what it produces, in threads of its own (``mesh_threads``).

Cost follows what is made, not the voxels read: a segment that is a 3-D checkerboard has a surface on every
face of every voxel. Such a box is meshed from its labels two times coarser (where a checkerboard of voxels is
solid) rather than refused; a checkerboard of two-voxel cells is one of voxels there too, and is refused. A
layer of 1-voxel chunks (or of chunks that inflate 1000-fold) costs a preview far more than its bytes on disk.
Each is refused with the reason, or bounded, before the costly work; a preview
whose files are unchanged is revalidated without a byte of them read; and chunks are answered while mesh
requests keep the mesh threads busy. Data are written with the ``wkw`` package and zarr's codecs (numcodecs).
"""

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import requests
import wkw
from anyio import CapacityLimiter
from support.measure import PeakRss, bytes_read, cpu_seconds
from support.servers import Server, assert_no_unexpected_errors, assert_reason

from gateway.meshes.budget import MAX_BOX_SURFACE, MAX_TRIANGLES, MeshBudget, surface_faces
from gateway.meshes.errors import MeshTooLarge, MeshTooSlow
from gateway.meshes.segments import index_place
from gateway.meshes.service import MeshService
from gateway.meshes.surfaces import BOX_SURFACE_BYTES, SURFACE_BYTES
from gateway.previews import MAX_CHUNKS, MAX_DECODED_BYTES
from gateway.sources.catalog import Catalog
from gateway.sources.dataset import Dataset
from gateway.sources.registry import SourceFormats
from gateway_storage import LocalStore

pytestmark = pytest.mark.serial  # CPU seconds of refusals and chunk latency while meshing: measured alone

ORG = "bounded_work"
CHECKER = 130  # voxels per edge: 2.2 M voxels, as the multi-resolution mesh that once took 211 s
BLOBS = (256, 256, 128)
BLOB_STEP = 9  # one 2x2x2 blob of the segment every 9 voxels: a surface under the bound, meshed for real


def wkw_layer(name: str, size: tuple[int, int, int], category: str) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "category": category,
        "boundingBox": {"topLeft": [0, 0, 0], "width": size[0], "height": size[1], "depth": size[2]},
        "elementClass": "uint8",
        "dataFormat": "wkw",
        "mags": [{"mag": [1, 1, 1], "path": f"./{name}/1"}],
    }
    if category == "segmentation":
        entry["largestSegmentId"] = 1
    return entry


def zarr_layer(name: str, size: tuple[int, int, int], chunks: tuple[int, int, int], compressor: Any) -> dict[str, Any]:
    """A Zarr v2 colour layer of ``size`` (x, y, z) whose chunk files the caller writes."""
    entry = wkw_layer(name, size, "color") | {"dataFormat": "zarr"}
    return {
        "meta": entry,
        "zarray": {
            "zarr_format": 2,
            "shape": [1, *size],
            "chunks": [1, *chunks],
            "dtype": "|u1",
            "compressor": compressor,
            "fill_value": 0,
            "order": "C",
            "filters": None,
        },
    }


def write_properties(dataset: Path, layers: list[dict[str, Any]]) -> None:
    dataset.mkdir(parents=True, exist_ok=True)
    document = {"id": {"name": dataset.name, "team": ""}, "scale": {"factor": [4, 4, 40], "unit": "nanometer"}}
    (dataset / "datasource-properties.json").write_text(json.dumps({**document, "dataLayers": layers}))


def write_wkw(mag: Path, data: np.ndarray, block_type: int = wkw.Header.BLOCK_TYPE_LZ4) -> None:
    """``data`` at the origin, padded with zeros to whole files (a compressed file is written whole)."""
    header = wkw.Header(np.uint8, block_len=32, file_len=4, block_type=block_type)
    edge = 32 * 4
    padded = np.zeros(tuple(-(-n // edge) * edge for n in data.shape), dtype=np.uint8)
    padded[tuple(slice(0, n) for n in data.shape)] = data
    with wkw.Dataset.create(str(mag), header) as written:
        written.write((0, 0, 0), padded)


def checkerboard(edge: int, cell: int = 1) -> np.ndarray:
    x, y, z = np.indices((edge, edge, edge)) // cell
    board: np.ndarray = ((x + y + z) % 2 == 0).astype(np.uint8)
    return board


def blobs(size: tuple[int, int, int]) -> np.ndarray:
    data = np.zeros(size, dtype=np.uint8)
    for dx in range(2):
        for dy in range(2):
            for dz in range(2):
                data[dx::BLOB_STEP, dy::BLOB_STEP, dz::BLOB_STEP] = 1
    return data


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bombs (meshes, previews, a colour layer to read chunks of) and a layer rewritten by a test."""
    root = tmp_path_factory.mktemp("bounded-work")
    bombs = root / ORG / "bombs"
    write_wkw(bombs / "checker" / "1", checkerboard(CHECKER))
    write_wkw(bombs / "checker2" / "1", checkerboard(CHECKER, cell=2))
    write_wkw(bombs / "blobs" / "1", blobs(BLOBS))
    write_wkw(bombs / "color" / "1", np.random.default_rng(1).integers(0, 255, (256, 256, 64), dtype=np.uint8))
    write_wkw(bombs / "sparse" / "1", blobs((128, 128, 128)))  # one file of a layer of eight: the rest absent
    layers = [
        wkw_layer("checker", (CHECKER,) * 3, "segmentation"),
        wkw_layer("checker2", (CHECKER,) * 3, "segmentation"),
        wkw_layer("blobs", BLOBS, "segmentation"),
        wkw_layer("color", (256, 256, 64), "color"),
        wkw_layer("sparse", (256, 256, 256), "segmentation"),
    ]
    # A layer of 1-voxel chunks, 1024 x 1024 of them in its middle slice, a few hundred stored (uncompressed).
    ones = zarr_layer("ones", (1024, 1024, 1), (1, 1, 1), None)
    ones_dir = bombs / "ones" / "1"
    ones_dir.mkdir(parents=True)
    for i in range(300):
        (ones_dir / f"0.{400 + i}.{400 + i}.0").write_bytes(b"\xc8")
    # Sixteen zlib chunks of 128 MiB each, about 130 KB each on disk.
    inflating = zarr_layer("inflating", (16384, 16384, 8), (4096, 4096, 8), {"id": "zlib", "level": 9})
    inflating_dir = bombs / "inflating" / "1"
    inflating_dir.mkdir(parents=True)
    chunk = numcodecs.Zlib(level=9).encode(np.zeros(4096 * 4096 * 8, dtype=np.uint8))
    for x in range(4):
        for y in range(4):
            (inflating_dir / f"0.{x}.{y}.0").write_bytes(chunk)
    for layer, directory in ((ones, ones_dir), (inflating, inflating_dir)):
        (directory / ".zarray").write_text(json.dumps(layer["zarray"]))
        layers.append(layer["meta"])
    write_properties(bombs, layers)
    # A raw (uncompressed) layer rewritten in place by a test: 8 MiB read and decoded per preview.
    write_wkw(
        root / ORG / "pictures" / "color" / "1",
        np.random.default_rng(2).integers(0, 255, (512, 512, 64), dtype=np.uint8),
        wkw.Header.BLOCK_TYPE_RAW,
    )
    write_properties(root / ORG / "pictures", [wkw_layer("color", (512, 512, 64), "color")])
    return root


@pytest.fixture(scope="module")
def server(root: Path, server_factory: Callable[..., Server]) -> Server:
    return server_factory(root, mesh_threads=1, chunk_edge=128)


def get(server: Server, path: str, **headers: str) -> requests.Response:
    return requests.get(server.url + path, headers=headers, timeout=300)


MESHES = f"/data/meshes/{ORG}/bombs"


class Spent:
    """CPU seconds and wall seconds of the serving process while the block runs."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.cpu = self.wall = 0.0

    def __enter__(self) -> "Spent":
        self._cpu, self._wall = cpu_seconds(self.server), time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cpu, self.wall = cpu_seconds(self.server) - self._cpu, time.monotonic() - self._wall


# --- meshes ----------------------------------------------------------------------------------------------------


def legacy_vertices(body: bytes) -> np.ndarray:
    count = int.from_bytes(body[:4], "little")
    return np.frombuffer(body, "<f4", 3 * count, 4).reshape(-1, 3)


def test_a_voxel_checkerboard_is_meshed_from_coarser_labels_cheaply(server: Server) -> None:
    """Meshing this cube at its mag once cost 1.4 s of CPU and made 21 MB: its surface is counted first
    (milliseconds), found past the bound, and the cube is meshed from its labels two times coarser, where the
    board is solid: a small mesh within the cube's cells, in milliseconds more."""
    with Spent(server) as spent:
        answer = get(server, f"{MESHES}/checker/legacy/1:0:0_0_0")
    assert answer.status_code == 200, answer.text[:300]
    assert spent.cpu < 1.0, f"one coarser fragment cost {spent.cpu:.2f} s of CPU"
    assert len(answer.content) < 1 << 20, len(answer.content)
    voxels = legacy_vertices(answer.content) / np.asarray([4.0, 4.0, 40.0])  # the layer's voxel size in nm
    assert len(voxels) > 0
    # the coarser surface lies on faces of the labels two times coarser, within the cube's cells [-0.5, 63.5]
    assert voxels.min() >= -0.5 - 1e-3 and voxels.max() <= 63.5 + 1e-3, (voxels.min(0), voxels.max(0))
    assert np.allclose(voxels.min(0), 0.0, atol=1e-3), voxels.min(0)  # the board starts at the origin's face
    with Spent(server) as whole:
        manifest = get(server, f"{MESHES}/checker/multires/1.index")
        data = get(server, f"{MESHES}/checker/multires/1")
    for found in (manifest, data):
        assert found.status_code == 200, found.text[:300]
    assert len(data.content) > 0
    # the index scan of the layer (2.2 M voxels, once) and 27 + 8 coarser boxes; at their mag each took seconds
    assert whole.cpu < 15.0, f"the coarser multi-resolution mesh cost {whole.cpu:.2f} s of CPU"
    assert_no_unexpected_errors(server)


def test_a_checkerboard_of_two_voxel_cells_is_refused_once_its_coarser_labels_are_too(server: Server) -> None:
    """Two times coarser by mode, a board of two-voxel cells is one of voxels: the cheap fallback fails too, and
    the request ends with the reason, both counts of faces in it, before any marching cubes."""
    with Spent(server) as spent:
        answer = get(server, f"{MESHES}/checker2/legacy/1:0:0_0_0")
    assert_reason(answer, 413, "voxel faces", "two times coarser", f"more than the {MAX_BOX_SURFACE}", "was stopped")
    assert spent.cpu < 1.0, f"refusing one fragment cost {spent.cpu:.2f} s of CPU"
    with Spent(server) as spent:
        manifest = get(server, f"{MESHES}/checker2/multires/1.index")
        data = get(server, f"{MESHES}/checker2/multires/1")
    for answer in (manifest, data):
        assert_reason(answer, 413, "voxel faces", "two times coarser", "the work was stopped")
    # the index scan of the layer (2.2 M voxels, once) and two refusals; each box would be seconds more
    assert spent.cpu < 15.0, f"the refusals cost {spent.cpu:.2f} s of CPU"
    listing = get(server, f"{MESHES}/checker2/legacy/1:0")
    assert listing.status_code == 200 and len(listing.json()["fragments"]) == 27, listing.text[:300]
    assert_no_unexpected_errors(server)


def test_a_segment_id_past_the_layers_data_type_is_a_400(server: Server) -> None:
    """300 cannot be a label of a uint8 layer: the client asked for the wrong layer, and is told so."""
    for path in ("legacy/300:0", "legacy/300:0:0_0_0", "multires/300.index", "multires/300"):
        assert_reason(get(server, f"{MESHES}/checker/{path}"), 400, "uint8", "ids up to 255")
    assert get(server, f"{MESHES}/checker/legacy/255:0").status_code == 200


def test_a_surface_under_the_bound_is_meshed(server: Server) -> None:
    """The bound refuses noise, not meshes: a box of many small blobs (below it) is made, with every blob."""
    answer = get(server, f"{MESHES}/blobs/legacy/1:0:1_1_1")
    assert answer.status_code == 200, answer.text[:300]
    vertices = int.from_bytes(answer.content[:4], "little")
    triangles = (len(answer.content) - 4 - 12 * vertices) // 12
    blobs_in_cube = (64 // BLOB_STEP + 1) ** 3
    assert triangles >= 8 * blobs_in_cube // 2, (triangles, blobs_in_cube)


SLOW_MESH_SECONDS = 0.2  # the blob layer's multi-resolution mesh takes seconds of meshing: far past this


def test_a_mesh_request_past_its_time_is_stopped_and_answered_503(
    root: Path, server_factory: Callable[..., Server]
) -> None:
    """With ``mesh_seconds`` small, the blob layer's multi-resolution mesh (75 boxes, seconds of meshing) is
    stopped at the first box past the deadline: a 503 with Retry-After and the reason, and once it is sent the
    serving process spends no more CPU on it (the work stopped; it does not go on in a thread)."""
    slow = server_factory(root, mesh_threads=1, mesh_seconds=SLOW_MESH_SECONDS)
    answer = get(slow, f"{MESHES}/blobs/multires/1.index")
    assert_reason(answer, 503, f"took more than the {SLOW_MESH_SECONDS:g} s", "the work was stopped")
    assert int(answer.headers["Retry-After"]) > 0
    with Spent(slow) as after:
        time.sleep(2.0)
    # meshing would keep a core busy; an idle worker spends milliseconds (its metrics timer, the lag probe)
    assert after.cpu < 0.3, f"the worker spent {after.cpu:.2f} s of CPU in the 2 s after the 503"
    assert_no_unexpected_errors(slow)


def test_a_mesh_request_is_costed_against_the_memory_budget_before_any_work(
    root: Path, server_factory: Callable[..., Server]
) -> None:
    """A mesh request holds its cost of the one memory budget, costed from the layer's metadata (the largest
    window a level reads, its labels, the most surface a request makes): past the whole budget a 413 with the
    reason before any scan or meshing (in either tree), within it concurrent requests wait their turn."""
    small = server_factory(root, mesh_threads=2, chunk_memory_bytes=32 << 20)
    paths = [
        f"{MESHES}/blobs/multires/1.index",
        f"{MESHES}/blobs/multires/1",
        f"/data/precomputed/{ORG}/bombs/blobs/mesh/1.index",
    ]
    with Spent(small) as spent:
        refused = [get(small, path) for path in paths]
    for answer in refused:
        assert_reason(answer, 413, "this mesh request would hold", "chunk_memory_bytes")
    assert spent.cpu < 1.0, f"refusing {len(paths)} mesh requests cost {spent.cpu:.2f} s of CPU: work was done"
    need = int(refused[0].json()["error"].split("would hold ")[1].split(" bytes")[0])
    assert SURFACE_BYTES < need < SURFACE_BYTES + (128 << 20), need  # this layer's windows, not the read bound
    assert get(small, f"/data/zarr/{ORG}/bombs/color/1/0.0.0.0").status_code == 200  # chunks within it: served
    # a legacy fragment meshes one box: it holds what one box makes, not the whole surface bound
    assert get(small, f"{MESHES}/blobs/legacy/1:0:1_1_1").status_code == 200
    one_at_a_time = server_factory(root, mesh_threads=2, chunk_memory_bytes=need + need // 2)
    answers: dict[str, int] = {}
    fragments = [f"{MESHES}/blobs/legacy/1:0:{x}_{y}_1" for x in range(2) for y in range(2)]
    threads = [
        threading.Thread(target=lambda p=path: answers.update({p: get(one_at_a_time, p).status_code}))
        for path in fragments
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == dict.fromkeys(fragments, 200), "each waited for the budget rather than being refused"
    assert_no_unexpected_errors(one_at_a_time)


def test_a_mesh_request_holds_the_surface_of_the_boxes_that_hold_data_not_the_whole_bound(
    root: Path, server_factory: Callable[..., Server]
) -> None:
    """Under a budget below the most surface one request makes (``SURFACE_BYTES``, 144 MiB), legacy fragments
    are served, where the layer holds data and where it does not (each was a 413, charged the whole bound);
    what each holds is its window and the surface of its box where a stored file lies in the window
    (``BOX_SURFACE_BYTES``), none where none does, from a stat of the files and the metadata."""
    budgeted = server_factory(root, mesh_threads=2, chunk_memory_bytes=48 << 20)
    fragments = [f"{MESHES}/blobs/legacy/1:0:1_1_1", f"{MESHES}/sparse/legacy/1:0:3_3_3"]
    for path in fragments:
        answer = get(budgeted, path)
        assert answer.status_code == 200, (path, answer.text[:300])
    assert_no_unexpected_errors(budgeted)
    # what each holds, asked of the mesh service the gateway runs over the same files
    catalog = Catalog(LocalStore(str(root)), SourceFormats(LocalStore(str(root)), 1 << 24))
    dataset = catalog.dataset(ORG, "bombs")
    assert isinstance(dataset, Dataset)
    meshes = MeshService(LocalStore(str(root)), index_place(LocalStore(str(root)), None), 1 << 24, CapacityLimiter(1))
    held, empty = (meshes.file_bytes(dataset, layer, "legacy", "1:0:" + cube) for layer, cube in FRAGMENTS)
    assert held - empty == BOX_SURFACE_BYTES, (held, empty)  # the same window, and one box's surface where data lies
    assert empty < BOX_SURFACE_BYTES < SURFACE_BYTES


FRAGMENTS = [("sparse", "0_0_0"), ("sparse", "3_3_3")]  # a cube of the layer's one file, and one far from it


def test_the_budget_stops_at_its_time_and_its_totals() -> None:
    slow = MeshBudget("a test mesh", seconds=0.0)
    slow.check_time()  # the first box starts the clock
    time.sleep(0.01)
    with pytest.raises(MeshTooSlow, match="took more than the 0 s"):
        slow.check_time()
    large = MeshBudget("a test mesh")
    large.count(MAX_TRIANGLES - 1, 10)
    with pytest.raises(MeshTooLarge, match=f"more than {MAX_TRIANGLES} triangles"):
        large.count(2, 10)
    one = np.zeros((3, 3, 3), dtype=bool)
    one[1, 1, 1] = True
    assert surface_faces(one) == 6
    assert surface_faces(checkerboard(4).astype(bool)) == 3 * 3 * 4 * 4


def test_chunks_are_answered_while_mesh_requests_keep_the_mesh_threads_busy(server: Server) -> None:
    """Four clients ask for the multi-resolution mesh of the blob layer (a scan, then 75 boxes meshed, for
    seconds) while a fifth reads chunks that are re-chunked in a thread (``chunk_edge`` 128 over 32^3 blocks)."""
    answers: list[requests.Response] = []

    def mesh_client() -> None:
        answers.append(get(server, f"{MESHES}/blobs/multires/1.index"))

    clients = [threading.Thread(target=mesh_client) for _ in range(4)]
    for client in clients:
        client.start()
    latencies = []  # of the chunks asked for while a mesh request was still running
    try:
        time.sleep(0.5)  # the mesh thread is taken, and three requests wait for it
        for i in range(600):  # until the meshes are made (a quiet machine makes them in a few seconds)
            meshing = any(client.is_alive() for client in clients)
            if not meshing and i >= 30:
                break
            started = time.monotonic()
            answer = get(server, f"/data/zarr/{ORG}/bombs/color/1/0.{i % 2}.{i // 2 % 2}.0")
            assert answer.status_code == 200, answer.text[:300]
            if meshing:
                latencies.append(time.monotonic() - started)
            time.sleep(0.05)
    finally:
        for client in clients:
            client.join()
    assert [answer.status_code for answer in answers] == [200] * 4, [answer.text[:200] for answer in answers]
    assert latencies and max(latencies) < 2.0, f"chunk latencies while meshing: {sorted(latencies)[-5:]}"
    assert len(latencies) >= 5, f"only {len(latencies)} chunks were read while the meshes were made"


# --- previews --------------------------------------------------------------------------------------------------


def test_a_preview_of_one_voxel_chunks_reads_a_bounded_window(server: Server) -> None:
    """Once 14.8 s and +1.16 GiB a preview: now at most ``MAX_CHUNKS`` chunks are read (the central window)."""
    with PeakRss(server) as peak, Spent(server) as spent:
        answer = get(server, f"/preview/{ORG}/bombs/ones.png")
    assert answer.status_code == 200 and answer.content.startswith(b"\x89PNG"), answer.text[:300]
    assert peak.growth < 128 << 20, f"RSS grew by {peak.growth >> 20} MiB"
    assert spent.cpu < 10.0, f"the preview cost {spent.cpu:.2f} s of CPU"
    assert MAX_CHUNKS <= 64 * 64  # the window the layer gets: 64 x 64 chunks of one voxel


def test_a_preview_of_inflating_chunks_is_refused_before_a_chunk_is_decoded(server: Server) -> None:
    """16 zlib chunks of 128 MiB (2 MB on disk) once cost +256 MiB: one chunk decodes past the bound."""
    with PeakRss(server) as peak:
        answer = get(server, f"/preview/{ORG}/bombs/inflating.png")
    assert_reason(answer, 413, "too large or too many to preview", f"more than the {MAX_DECODED_BYTES} bytes")
    assert peak.growth < 64 << 20, f"RSS grew by {peak.growth >> 20} MiB"
    assert_no_unexpected_errors(server)


def test_a_preview_is_revalidated_without_reading_its_files(server: Server, root: Path) -> None:
    """The first answer reads 8 MiB of blocks; a revalidation stats the files and reads none of them, and a
    rewritten file makes a new preview."""
    path = f"/preview/{ORG}/pictures/color.png"
    first = get(server, path)
    assert first.status_code == 200, first.text[:300]
    etag = first.headers["ETag"]
    before = bytes_read(server)
    for _ in range(5):
        again = get(server, path, **{"If-None-Match": etag})
        assert again.status_code == 304 and again.headers["ETag"] == etag
    read = bytes_read(server) - before
    assert read < 1 << 20, f"five revalidations read {read} bytes (one preview reads 8 MiB)"
    mag = root / ORG / "pictures" / "color" / "1"
    with wkw.Dataset.open(str(mag)) as dataset:
        dataset.write((0, 0, 31), np.full((1, 64, 64, 1), 255, dtype=np.uint8))
    changed = get(server, path, **{"If-None-Match": etag})
    assert changed.status_code == 200 and changed.headers["ETag"] != etag
    assert changed.content != first.content
