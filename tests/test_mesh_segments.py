"""``zarr-gateway mesh-segments``: a layer's stored mesh set made by the command, in one process or on a dask
LocalCluster, equal to the set the block task makes serially, serving every level of a segment too large to mesh
whole on demand; a block that cannot be read, or a segment's fragment past a request's bounds, left out of a set
finished without them and listed (the run exits non-zero for them only with ``--strict``).
"""

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import requests
from support.mesh_sets import (
    DATASET,
    HOSTILE,
    LAYER,
    ORGANIZATION,
    SMALL_VOXELS,
    TUBE,
    make_mesh_set,
    set_directory,
    write_cells,
)
from support.servers import Server, assert_no_unexpected_errors

from gateway.meshes.stored import STAMP

pytestmark = pytest.mark.slow  # dask.distributed clusters making mesh sets

REPO = Path(__file__).resolve().parent.parent
RUN_SECONDS = 600  # bound of one run (never a measured time)
MANIFEST = f"/data/meshes/{ORGANIZATION}/{DATASET}/{LAYER}/multires/{TUBE}.index"


@pytest.fixture(scope="module")
def cells_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cells")
    write_cells(root)
    return root


@pytest.fixture(scope="module")
def serial_set(cells_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The set the block task makes when every block runs here in turn (what the contract promises)."""
    root = tmp_path_factory.mktemp("serial") / "root"
    shutil.copytree(cells_root, root)
    make_mesh_set(root)
    return set_directory(root)


@pytest.fixture
def copy_root(cells_root: Path, tmp_path: Path) -> Path:
    root = tmp_path / "root"
    shutil.copytree(cells_root, root)
    return root


def mesh_segments(root: Path, *flags: str) -> tuple[int, str, str]:
    """The command in a session of its own, ended whatever happens (no dask process is left behind)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ZARR_GATEWAY_")}
    arguments = [sys.executable, "-m", "gateway", "mesh-segments", str(root), f"{ORGANIZATION}/{DATASET}", LAYER]
    process = subprocess.Popen(
        [*arguments, *flags],
        cwd=REPO,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=RUN_SECONDS)
        return process.returncode, out, err
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=30)


def set_files(directory: Path) -> dict[str, bytes]:
    """The set's files but its stamp (which holds the data's modification times, another copy's own)."""
    return {
        path.name: path.read_bytes() for path in sorted(directory.iterdir()) if path.is_file() and path.name != STAMP
    }


@pytest.mark.parametrize("flags", [(), ("--workers", "2")], ids=["one process", "two workers"])
def test_the_command_makes_the_set_the_block_task_makes(
    copy_root: Path, serial_set: Path, flags: tuple[str, ...]
) -> None:
    code, out, err = mesh_segments(copy_root, *flags)
    assert code == 0, err
    assert "Traceback" not in err, err
    directory = set_directory(copy_root)
    assert f"written to {directory}" in out, out
    assert re.search(r"(\d+) blocks: \1 run on", out), out
    assert (directory / STAMP).is_file()
    made, expected = set_files(directory), set_files(serial_set)
    assert made.keys() == expected.keys() and any(name.endswith(".shard") for name in made), sorted(made)
    assert made == expected, "the command's set differs from the serial one"
    assert not (copy_root / ORGANIZATION / DATASET / f"{LAYER}.batch-work" / "meshes").exists() or not any(
        (copy_root / ORGANIZATION / DATASET / f"{LAYER}.batch-work" / "meshes").rglob("*_*")
    ), "block outputs are removed once the set is written"


def lods(manifest: bytes) -> int:
    return int.from_bytes(manifest[24:28], "little")


def test_a_segment_too_large_for_on_demand_meshing_is_served_whole_after_the_command(
    copy_root: Path, server_factory: Callable[..., Server]
) -> None:
    """Before the run, the tube gets on demand only its coarse levels (once a 413); after it, every level."""
    server = server_factory(copy_root, multires_voxels=SMALL_VOXELS)
    before = requests.get(server.url + MANIFEST, timeout=60)
    assert before.status_code == 200, before.text[:300]
    code, _out, err = mesh_segments(copy_root, "--workers", "2")
    assert code == 0, err
    answer = requests.get(server.url + MANIFEST, timeout=60)
    assert answer.status_code == 200, answer.text[:300]
    assert len(answer.content) > 16 and answer.headers["ETag"]
    assert 0 < lods(before.content) < lods(answer.content) == 3, (lods(before.content), lods(answer.content))
    assert_no_unexpected_errors(server)


def test_an_unreadable_block_is_left_out_listed_and_fails_a_strict_run(tmp_path: Path) -> None:
    """A block whose chunks do not decode (LZ4 blocks overwritten) is listed with its key and reason, the set is
    finished with every other block, and ``--strict`` makes the run end non-zero (never with a traceback)."""
    root = tmp_path / "root"
    write_cells(root, block_type=2)
    path = root / ORGANIZATION / DATASET / LAYER / "1" / "z0" / "y0" / "x0.wkw"
    data = bytearray(path.read_bytes())
    start = len(data) // 4  # past the header and its jump table
    data[start:] = np.random.default_rng(3).integers(0, 256, len(data) - start, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(data))
    code, out, err = mesh_segments(root, "--workers", "2", "--strict")
    assert code != 0 and "Traceback" not in err, err
    found = re.search(r"left out of the set \((\d+) blocks, (\d+) fragments\)", out)
    assert found and int(found.group(1)) > 0, out
    assert re.search(r"^  block \S+: .+$", out, flags=re.MULTILINE), out
    assert "could not be meshed (--strict)" in err, err
    assert (set_directory(root) / STAMP).exists(), "the set was not finished with the other blocks"


def test_a_hostile_segment_is_left_out_and_every_other_one_is_meshed(
    tmp_path: Path, server_factory: Callable[..., Server]
) -> None:
    """A checkerboard of two-voxel cells (past the surface bound even two times coarser) planted in the cells: its
    level-0 fragments are left out and listed with the reason, the run exits 0 (non-zero with ``--strict``), and
    the set serves every other segment, the hostile one with its coarser levels."""
    root = tmp_path / "root"
    write_cells(root, hostile=True)
    code, out, err = mesh_segments(root)
    assert code == 0 and "Traceback" not in err, err
    found = re.search(r"left out of the set \(0 blocks, (\d+) fragments\)", out)
    assert found and int(found.group(1)) > 0, out
    listed = re.findall(r"^  segment (\d+) at level (\d+) .*two times coarser.*$", out, flags=re.MULTILINE)
    assert listed and all(segment == str(HOSTILE) for segment, _ in listed), out
    assert (set_directory(root) / STAMP).exists()
    server = server_factory(root)
    for segment in (TUBE, HOSTILE):
        answer = requests.get(
            f"{server.url}/data/meshes/{ORGANIZATION}/{DATASET}/{LAYER}/multires/{segment}", timeout=60
        )
        assert answer.status_code == 200 and len(answer.content) > 0, (segment, answer.text[:300])
    strict, _out, err = mesh_segments(root, "--strict")
    assert strict != 0 and "could not be meshed (--strict)" in err and "Traceback" not in err, err
    assert_no_unexpected_errors(server)
