"""``index-segments`` and ``mesh-segments`` as the field's tools run them, through the real CLI and a real gateway:
voxel counts of the layer (no padding, no coarse levels), ``--dust-threshold`` and ``--segments`` (igneous's
``dust_threshold`` and ``object_ids``), and a dask cluster that listens on loopback only, on the ports set.
"""

import ipaddress
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import requests
import wkw
from support.batch_runs import run_batch
from support.processes import free_port
from support.servers import Server

from gateway.meshes.index import SegmentIndex

pytestmark = pytest.mark.slow  # whole layers indexed and meshed by the CLI, a dask cluster started

ORG, NAME, LAYER = "lab", "selected", "labels"
SHAPE = (100, 90, 70)  # not a multiple of any cube: blocks past the bounding box must not count
BIG, TINY, MEDIUM = 1, 2, 3
DUST = 100  # voxels: TINY has fewer, MEDIUM and BIG more


def labels() -> np.ndarray:
    found = np.zeros(SHAPE, dtype=np.uint32)
    found[10:60, 10:50, 5:40] = BIG
    found[80:82, 70:72, 60:62] = TINY  # 8 voxels
    x, y, z = np.meshgrid(*(np.arange(n) for n in SHAPE), indexing="ij")
    found[(x - 75) ** 2 + (y - 30) ** 2 + (z - 50) ** 2 < 8**2] = MEDIUM
    return found


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A segmentation of two mags (1 and 2-2-2), as webKnossos lays them out, from the origin."""
    root = tmp_path_factory.mktemp("selection")
    dataset = root / ORG / NAME
    data = labels()
    for mag, step in (("1", 1), ("2-2-2", 2)):
        with wkw.Dataset.open(str(dataset / LAYER / mag), wkw.Header(np.uint32, block_type=2, file_len=4)) as ds:
            whole = np.zeros((128, 128, 128), dtype=np.uint32)  # LZ4 files are written whole: one file, padded
            part = data[::step, ::step, ::step]
            whole[: part.shape[0], : part.shape[1], : part.shape[2]] = part
            ds.write((0, 0, 0), whole)
    layer = {
        "name": LAYER,
        "category": "segmentation",
        "elementClass": "uint32",
        "dataFormat": "wkw",
        "boundingBox": {"topLeft": [0, 0, 0], "width": SHAPE[0], "height": SHAPE[1], "depth": SHAPE[2]},
        "mags": [{"mag": [1, 1, 1], "path": f"./{LAYER}/1"}, {"mag": [2, 2, 2], "path": f"./{LAYER}/2-2-2"}],
        "largestSegmentId": MEDIUM,
    }
    document = {"id": {"name": NAME, "team": ORG}, "scale": {"factor": [8, 8, 8]}, "dataLayers": [layer]}
    (dataset / "datasource-properties.json").write_text(json.dumps(document))
    return root


def run(command: str, root: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return run_batch(command, str(root), f"{ORG}/{NAME}", LAYER, *flags)


def summary_voxels(out: str) -> int:
    found = re.search(r"([\d,]+) voxels in", out)
    assert found, out
    return int(found[1].replace(",", ""))


def read_index(root: Path) -> SegmentIndex:
    path = root / ORG / NAME / f"{LAYER}.segment-index.npz"
    return SegmentIndex.from_bytes(path.read_bytes(), str(path))


def manifest(server: Server, segment: int) -> bytes:
    response = requests.get(f"{server.url}/data/meshes/{ORG}/{NAME}/{LAYER}/multires/{segment}.index", timeout=120)
    assert response.status_code == 200, response.text
    return response.content


def eventually(check: Callable[[], bool], what: str) -> None:
    for _ in range(60):  # the gateway takes the data's stamp again within a few seconds: bounded attempts
        if check():
            return
        time.sleep(0.5)
    raise AssertionError(what)


def test_runs_count_the_layers_voxels_and_honour_dust_and_subsets(
    root: Path, server_factory: Callable[..., Server]
) -> None:
    truth = labels()
    layer_voxels = int(np.prod(SHAPE))
    indexed = run("index-segments", root, "--dust-threshold", str(DUST))
    assert indexed.returncode == 0, indexed.stderr
    assert summary_voxels(indexed.stdout) == layer_voxels
    index = read_index(root)
    assert index.ids.tolist() == [BIG, MEDIUM]
    assert index.voxels.tolist() == [int(np.count_nonzero(truth == s)) for s in (BIG, MEDIUM)]
    assert index.meta["selection"]["dust_threshold"] == DUST
    assert index.lookup(BIG) is not None and index.lookup(TINY) is None
    server = server_factory(root)
    empty = manifest(server, 999)  # a segment the data lacks: a manifest of no fragments
    assert manifest(server, TINY) == empty and manifest(server, MEDIUM) != empty  # as the index says
    listed = requests.get(
        f"{server.url}/data/meshes/{ORG}/{NAME}/{LAYER}/multires/segment_properties/info", timeout=120
    ).json()
    assert listed["inline"]["ids"] == [str(BIG), str(MEDIUM)]

    subset = run("mesh-segments", root, "--segments", f"{BIG},{TINY}")
    assert subset.returncode == 0, subset.stderr
    assert summary_voxels(subset.stdout) == layer_voxels  # padding and coarse levels not counted
    stamp = json.loads((root / ORG / NAME / f"{LAYER}.meshes" / "stamp.json").read_text())
    assert stamp["selection"]["segments"] == 2
    eventually(lambda: manifest(server, MEDIUM) == empty, "the subset's set is not served")
    assert manifest(server, BIG) != empty and manifest(server, TINY) != empty

    dusted = run("mesh-segments", root, "--dust-threshold", str(DUST))
    assert dusted.returncode == 0, dusted.stderr
    eventually(lambda: manifest(server, TINY) == empty, "the dust-free set is not served")
    assert manifest(server, BIG) != empty and manifest(server, MEDIUM) != empty

    refused = run("mesh-segments", root, "--segments", "0,1")
    assert refused.returncode == 1 and "segment id" in refused.stderr, refused.stderr


def process_tree(pid: int) -> set[int]:
    """``pid`` and its descendants, from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree = {pid}
    while True:
        grown = tree | {child for child, parent in parents.items() if parent in tree}
        if grown == tree:
            return tree
        tree = grown


def listening(pid: int) -> set[tuple[str, int]]:
    """The TCP addresses the process and its descendants listen on: their sockets' inodes (/proc/PID/fd) found
    among the listening entries of /proc/net/tcp and tcp6."""
    inodes: set[str] = set()
    for each in process_tree(pid):
        try:
            for fd in Path(f"/proc/{each}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found: set[tuple[str, int]] = set()
    for table, size in (("tcp", 4), ("tcp6", 16)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, size, 4))  # each 32-bit word little-endian
            found.add((str(ipaddress.ip_address(words)), int(port, 16)))
    return found


def test_the_dask_cluster_listens_on_loopback_on_the_ports_set(root: Path, tmp_path: Path) -> None:
    scheduler, dashboard, first = free_port(), free_port(), free_port()
    flags = ["--workers", "1", "--scheduler-port", str(scheduler), "--dashboard-address", f"127.0.0.1:{dashboard}"]
    flags += ["--worker-ports", f"{first}:{first + 20}", "--work-dir", str(tmp_path / "work")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZARR_GATEWAY_")}
    command = [sys.executable, "-m", "gateway", "index-segments", str(root), f"{ORG}/{NAME}", LAYER, *flags]
    with open(tmp_path / "err.txt", "w") as errors:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors, env=env)
        seen: set[tuple[str, int]] = set()
        while process.poll() is None:
            seen |= listening(process.pid)
            time.sleep(0.05)
    err = (tmp_path / "err.txt").read_text()
    assert process.wait(60) == 0, err
    assert seen, "no listening socket was seen while the cluster ran"
    assert {ip for ip, _ in seen} == {"127.0.0.1"}, seen
    ports = {port for _, port in seen}
    assert scheduler in ports and dashboard in ports, (seen, scheduler, dashboard)
    assert any(first <= port <= first + 20 for port in ports), (seen, first)
    assert f"dask dashboard: http://127.0.0.1:{dashboard}/" in err, err
