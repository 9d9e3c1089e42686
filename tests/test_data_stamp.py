"""The data stamp of a segmentation layer (gateway/meshes/layers.py), through a real gateway.

A rewrite that keeps a file's size and modification time (a copy that keeps times, a writer that sets them back)
is seen by segment lists, meshes and stored mesh sets once the stamp is taken again; a mag of more files than the
stamp walks is refused with the reason, and while it is, a neighbouring dataset's chunks keep answering.
"""

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import requests
import wkw
from support.servers import Server, assert_reason

from gateway.batch.mesh_sets import MeshSetTask

ORG = "lab"
EDGE = 64
RADIUS = 20
SEGMENT = 7


def ball(radius: int) -> np.ndarray:
    x, y, z = np.meshgrid(*(np.arange(EDGE),) * 3, indexing="ij")
    inside = (x - 32) ** 2 + (y - 30) ** 2 + (z - 28) ** 2 < radius**2
    return np.where(inside, SEGMENT, 0).astype(np.uint32)


def write_labels(mag: Path, labels: np.ndarray) -> None:
    """Uncompressed WKW: a file's size is the same whatever it holds."""
    with wkw.Dataset.open(str(mag), wkw.Header(np.uint32, block_type=1, file_len=2)) as ds:
        ds.write((0, 0, 0), labels)


def write_dataset(root: Path, name: str, category: str = "segmentation") -> Path:
    """A 64^3 layer ``layer`` at mag 1 from the origin (block-aligned, as webKnossos writes it); its mag."""
    dtype = "uint32" if category == "segmentation" else "uint8"
    layer = {
        "name": "layer",
        "category": category,
        "elementClass": dtype,
        "dataFormat": "wkw",
        "boundingBox": {"topLeft": [0, 0, 0], "width": EDGE, "height": EDGE, "depth": EDGE},
        "wkwResolutions": [{"resolution": 1, "cubeLength": 64}],
        **({"largestSegmentId": SEGMENT} if category == "segmentation" else {}),
    }
    dataset = root / ORG / name
    dataset.mkdir(parents=True)
    document = {"id": {"name": name, "team": ORG}, "scale": {"factor": [4, 4, 4]}, "dataLayers": [layer]}
    (dataset / "datasource-properties.json").write_text(json.dumps(document))
    mag = dataset / "layer" / "1"
    if category == "segmentation":
        write_labels(mag, ball(RADIUS))
    else:
        with wkw.Dataset.open(str(mag), wkw.Header(np.uint8, block_type=1, file_len=2)) as ds:
            ds.write((0, 0, 0), (np.arange(EDGE**3) % 251).astype(np.uint8).reshape((EDGE,) * 3))
    return mag


def rewrite_keeping_size_and_mtime(mag: Path, labels: np.ndarray) -> None:
    """New labels in place, then the file's times set back: only its change time (and maybe inode) moves."""
    data_file = mag / "z0" / "y0" / "x0.wkw"
    before = data_file.stat()
    write_labels(mag, labels)
    os.utime(data_file, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = data_file.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert after.st_ctime_ns != before.st_ctime_ns or after.st_ino != before.st_ino


def get(server: Server, path: str) -> requests.Response:
    return requests.get(server.url + path, timeout=120)


def meshes(name: str, file: str) -> str:
    return f"/data/meshes/{ORG}/{name}/layer/multires/{file}"


def voxels_listed(server: Server, name: str) -> list[int]:
    document = get(server, meshes(name, "segment_properties/info")).json()
    (voxels,) = (p["values"] for p in document["inline"]["properties"] if p["id"] == "voxels")
    return [int(v) for v in voxels]


def eventually(check: Callable[[], bool], what: str, attempts: int = 60) -> None:
    """Until ``check()`` holds: the stamp is taken again within a few seconds (bounded in attempts, not time)."""
    for _ in range(attempts):
        if check():
            return
        time.sleep(0.5)
    raise AssertionError(what)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stamps")
    write_dataset(root, "rewritten")
    write_dataset(root, "stored")
    planted = write_dataset(root, "planted")
    for i in range(PLANTED):  # empty files in one's own mag: more than the gateway below walks
        (planted / "z9" / f"y{i // 100}").mkdir(parents=True, exist_ok=True)
        (planted / "z9" / f"y{i // 100}" / f"x{i}.wkw").touch()
    write_dataset(root, "neighbour", "color")
    return root


PLANTED = 700
STAMP_FILES = 500  # the gateway's bound here: the other layers hold a few files


@pytest.fixture(scope="module")
def server(root: Path, server_factory: Callable[..., Server]) -> Server:
    # Segments beyond 1000 voxels are meshed only from a stored set: whether one is served shows at once.
    return server_factory(root, stamp_files=STAMP_FILES, multires_voxels=1000)


@pytest.mark.slow  # meshing, and seconds until the stamp is taken again
def test_a_rewrite_that_keeps_size_and_mtime_is_seen_by_segment_lists_and_meshes(root: Path, server: Server) -> None:
    before = ball(RADIUS)
    assert voxels_listed(server, "rewritten") == [int(np.count_nonzero(before))]
    legacy = f"/data/meshes/{ORG}/rewritten/layer/legacy/{SEGMENT}:0"
    fragments_before = get(server, legacy).json()["fragments"]
    assert fragments_before
    grown = ball(RADIUS + 6)
    rewrite_keeping_size_and_mtime(root / ORG / "rewritten" / "layer" / "1", grown)
    eventually(
        lambda: voxels_listed(server, "rewritten") == [int(np.count_nonzero(grown))],
        "the segment list still counts the old voxels",
    )
    fragment = f"/data/meshes/{ORG}/rewritten/layer/legacy/{SEGMENT}:0:{fragments_before[0].split(':')[-1]}"
    assert get(server, fragment).status_code == 200
    precomputed = f"/data/precomputed/{ORG}/rewritten/layer/mesh/segment_properties/info"
    (voxels,) = (p["values"] for p in get(server, precomputed).json()["inline"]["properties"] if p["id"] == "voxels")
    assert voxels == [int(np.count_nonzero(grown))]


@pytest.mark.slow  # a mesh set made, and seconds until the stamp is taken again
def test_a_stored_set_is_stale_once_a_rewrite_keeps_size_and_mtime(root: Path, server: Server) -> None:
    manifest = meshes("stored", f"{SEGMENT}.index")
    assert_reason(get(server, manifest), 413, "mesh-segments")  # too large on demand, and no set
    task = MeshSetTask.for_layer(str(root), f"{ORG}/stored", "layer")
    outputs = {block.key: task.run(block) for block in task.blocks()}
    task.finish(lambda block: outputs[block.key])
    eventually(lambda: get(server, manifest).status_code == 200, "the fresh set is not served")
    rewrite_keeping_size_and_mtime(root / ORG / "stored" / "layer" / "1", ball(RADIUS - 3))
    eventually(lambda: get(server, manifest).status_code == 409, "the stale set is still served")
    assert_reason(get(server, manifest), 409, "stale", "mesh-segments")


def test_a_mag_of_too_many_files_is_refused_and_its_neighbours_chunks_keep_answering(server: Server) -> None:
    for path in (meshes("planted", "segment_properties/info"), meshes("planted", f"{SEGMENT}.index")):
        assert_reason(get(server, path), 413, "stamp_files", str(STAMP_FILES))
    chunk = "/data/zarr/lab/neighbour/layer/1/0.0.0.0"
    assert get(server, chunk).status_code == 200
    hammering = threading.Event()
    refused: list[int] = []

    def hammer() -> None:
        """Mesh, segment and page requests of the planted layer, each of which needs its stamp."""
        paths = [meshes("planted", "segment_properties/info"), "/data/zarr/lab/planted/", meshes("planted", "7.index")]
        with requests.Session() as session:
            while hammering.is_set():
                for path in paths:
                    refused.append(session.get(server.url + path, timeout=120).status_code)

    hammering.set()
    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for thread in threads:
        thread.start()
    answered, latencies = [], []
    try:
        with requests.Session() as session:
            for _ in range(40):
                started = time.perf_counter()
                answered.append(session.get(server.url + chunk, timeout=120).status_code)
                latencies.append(time.perf_counter() - started)
    finally:
        hammering.clear()
        for thread in threads:
            thread.join()
    assert answered == [200] * 40
    assert refused and set(refused) <= {200, 413}, set(refused)  # the page answers; mesh routes say why
    assert 413 in refused
    print(
        f"neighbour chunk latency while refused: median {np.median(latencies) * 1e3:.1f} ms, "
        f"max {max(latencies) * 1e3:.1f} ms over {len(latencies)}; {len(refused)} refused-layer requests"
    )
