"""``zarr-gateway index-segments`` on dask.distributed: the same index as one process, resumable, and its faults.

The layers are written by the ``wkw`` package; every run is the real command line in a child process (its
own session, so that the test kills it and every dask process it started), with real LocalClusters and a
real existing cluster (a ``LocalCluster`` of this test process, closed when the module ends).
"""

import contextlib
import os
import pty
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import wkw
from support.layers import write_properties
from support.processes import free_port, wait_until
from support.terminal import read_terminal

from gateway.batch.segment_index import SegmentLayer
from gateway.meshes.build import box_cubes, index_boxes
from gateway.meshes.index import SegmentIndex, build_index

pytestmark = pytest.mark.slow  # dask.distributed clusters, runs killed midway and resumed

REPO = Path(__file__).resolve().parent.parent
ORG, NAME = "batch_org", "cells"
RUN_SECONDS = 300  # a bound on waiting for one run, never a timed assertion
FILE_EDGE = 128  # voxels per edge of one WKW file (file_len 4 of 32-voxel blocks)


def labels(shape: tuple[int, int, int], seed: int) -> np.ndarray:
    """Balls of many sizes over a background, and scattered single voxels: segments within one cube, across
    cubes and blocks, and in a cube's one-voxel margin only."""
    rng = np.random.default_rng(seed)
    data = np.zeros(shape, dtype=np.uint32)
    grid = np.meshgrid(*(np.arange(n) for n in shape), indexing="ij", sparse=True)
    for label in range(1, 40):
        centre = rng.uniform(0, shape)
        radius = rng.uniform(3, 40)
        inside = sum((g - c) ** 2 for g, c in zip(grid, centre)) < radius**2
        data[inside] = label
    spots = tuple(rng.integers(0, n, 300) for n in shape)
    data[spots] = rng.integers(1000, 5000, 300, dtype=np.uint32)
    return data


def write_layer(
    dataset: Path, name: str, top_left: tuple[int, int, int], size: tuple[int, int, int], seed: int
) -> dict[str, Any]:
    """A uint32 WKW segmentation of whole LZ4 files (the wkw package writes compressed files whole)."""
    extent = tuple(-(-(t + s) // FILE_EDGE) * FILE_EDGE for t, s in zip(top_left, size))
    with wkw.Dataset.open(str(dataset / name / "1"), wkw.Header(np.uint32, block_type=2, file_len=4)) as ds:
        ds.write((0, 0, 0), labels((extent[0], extent[1], extent[2]), seed))
    return {
        "name": name,
        "category": "segmentation",
        "boundingBox": {"topLeft": list(top_left), "width": size[0], "height": size[1], "depth": size[2]},
        "elementClass": "uint32",
        "dataFormat": "wkw",
        "largestSegmentId": 5000,
        "mags": [{"mag": [1, 1, 1], "path": f"./{name}/1"}],
    }


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``cells``: a box off the cube grid at both ends; ``aligned``: one whose upper faces lie on cube faces (its
    last cells belong to the cubes past it); ``large``: enough blocks for a run to be killed midway."""
    root = tmp_path_factory.mktemp("batch")
    dataset = root / ORG / NAME
    write_properties(
        dataset,
        [
            write_layer(dataset, "cells", (5, 3, 2), (230, 200, 100), seed=1),
            write_layer(dataset, "aligned", (0, 0, 0), (128, 128, 64), seed=2),
            write_layer(dataset, "large", (0, 0, 0), (384, 256, 256), seed=3),
        ],
    )
    return root


def environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("ZARR_GATEWAY_")}


def command(root: Path, layer: str, index_dir: Path, *flags: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gateway",
        "index-segments",
        str(root),
        f"{ORG}/{NAME}",
        layer,
        "--segment-index-dir",
        str(index_dir),
        *flags,
    ]


def start(root: Path, layer: str, index_dir: Path, *flags: str) -> "subprocess.Popen[str]":
    return subprocess.Popen(
        command(root, layer, index_dir, *flags),
        cwd=REPO,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the test ends the whole session: the command and every dask process
    )


def finish(process: "subprocess.Popen[str]") -> tuple[int, str, str]:
    """Wait for the command; whatever happens, nothing of its session is left running."""
    try:
        out, err = process.communicate(timeout=RUN_SECONDS)
        return process.returncode, out, err
    finally:
        end_session(process)


def end_session(process: "subprocess.Popen[str]") -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.communicate(timeout=30)  # and its pipes closed


def index_segments(root: Path, layer: str, index_dir: Path, *flags: str) -> tuple[int, str, str]:
    return finish(start(root, layer, index_dir, *flags))


def index_file(index_dir: Path, layer: str) -> Path:
    return index_dir / ORG / NAME / f"{layer}.segment-index.npz"


def read_index(index_dir: Path, layer: str) -> SegmentIndex:
    path = index_file(index_dir, layer)
    return SegmentIndex.from_bytes(path.read_bytes(), str(path))


def assert_same_index(built: SegmentIndex, reference: SegmentIndex) -> None:
    assert built.meta == reference.meta
    for name in ("ids", "voxels", "bboxes", "starts", "cubes"):
        a, b = getattr(built, name), getattr(reference, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert built.to_bytes() == reference.to_bytes()


def one_process_index(root: Path, layer: str) -> SegmentIndex:
    """The index as the gateway makes it when it scans a layer itself: one process, no blocks."""
    meshes = SegmentLayer(str(root), ORG, NAME, layer).open()[1]
    from gateway.meshes.index import data_stamp

    return build_index(meshes.grid, layer, data_stamp(meshes.layer.mags))


def summary_counts(out: str) -> tuple[int, int, int]:
    """(blocks, run now, kept from an earlier run) from the summary."""
    found = re.search(r"(\d+) blocks: (\d+) run on .*, (\d+) kept from an earlier run", out)
    assert found, out
    blocks, run, kept = (int(g) for g in found.groups())
    return blocks, run, kept


def work_outputs(index_dir: Path, layer: str) -> list[Path]:
    return [p for p in (index_dir / ORG / NAME / f"{layer}.batch-work").glob("segment-index/*/*") if p.is_file()]


# --- the same index ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("layer", ["cells", "aligned", "large"])
@pytest.mark.parametrize("block_cubes", [1, 2, 3])
def test_the_blocks_own_every_cube_of_the_layer_once(root: Path, layer: str, block_cubes: int) -> None:
    """The boxes tile the bounding box, and their cubes are the one-process build's, each in one box."""
    _, meshes = SegmentLayer(str(root), ORG, NAME, layer).open()
    grid = meshes.grid
    owned = [cube for _, lo, hi in index_boxes(grid, block_cubes) for cube in box_cubes(grid, lo, hi)]
    assert sorted(owned) == sorted(grid.cubes_of_finest())
    assert len(owned) == len(set(owned))
    voxels = sum(int(np.prod(np.subtract(hi, lo))) for _, lo, hi in index_boxes(grid, block_cubes))
    assert voxels == grid.voxels


@pytest.mark.parametrize("layer", ["cells", "aligned"])
def test_the_one_process_run_of_blocks_equals_the_scan(root: Path, tmp_path: Path, layer: str) -> None:
    code, out, err = index_segments(root, layer, tmp_path, "--block-cubes", "1")
    assert code == 0, err
    assert_same_index(read_index(tmp_path, layer), one_process_index(root, layer))
    assert summary_counts(out)[1] >= 4  # several blocks, so the assembly of parts is what was checked
    assert not (tmp_path / ORG / NAME / f"{layer}.batch-work").exists(), "spent outputs are removed"


@pytest.mark.parametrize("workers", [1, 2])
def test_the_distributed_index_equals_the_one_process_index(root: Path, tmp_path: Path, workers: int) -> None:
    code, out, err = index_segments(root, "cells", tmp_path, "--workers", str(workers), "--block-cubes", "1")
    assert code == 0, err
    assert_same_index(read_index(tmp_path, "cells"), one_process_index(root, "cells"))
    blocks, run, kept = summary_counts(out)
    assert run == blocks and kept == 0
    assert f"{workers} local dask worker processes" in out
    assert "dask dashboard: http" in err and "Traceback" not in err, err
    assert re.search(r"a memory limit of \d+ MiB each", err), err


@pytest.fixture(scope="module")
def scheduler() -> Iterator[str]:
    """An existing cluster: one worker process, closed when the module ends."""
    import distributed

    cluster_of: Any = distributed.LocalCluster  # untyped
    with cluster_of(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        yield str(cluster.scheduler_address)


def test_an_existing_cluster_makes_the_same_index(root: Path, tmp_path: Path, scheduler: str) -> None:
    code, out, err = index_segments(root, "cells", tmp_path, "--scheduler", scheduler, "--block-cubes", "2")
    assert code == 0, err
    assert_same_index(read_index(tmp_path, "cells"), one_process_index(root, "cells"))
    assert f"the dask cluster at {scheduler}" in out


def test_a_terminal_shows_dask_s_progress_bar_and_the_output_is_the_summary(root: Path, tmp_path: Path) -> None:
    controller, terminal = pty.openpty()
    with subprocess.Popen(
        command(root, "cells", tmp_path, "--workers", "1"),
        cwd=REPO,
        env=environment() | {"COLUMNS": "200", "TERM": "xterm"},
        stdout=subprocess.PIPE,
        stderr=terminal,
        text=True,
        start_new_session=True,
    ) as process:
        os.close(terminal)
        shown = read_terminal(controller)
        out = process.stdout.read() if process.stdout else ""
    os.close(controller)
    assert process.returncode == 0, shown
    seen = shown.decode(errors="replace")
    assert "| 100% Completed |" in seen and "dask dashboard: http" in seen, seen
    assert out.startswith(f"{len(read_index(tmp_path, 'cells'))} segments of") and "Completed" not in out, out


# --- resumable -----------------------------------------------------------------------------------------------


def test_a_run_killed_midway_resumes_without_redoing_its_blocks(root: Path, tmp_path: Path) -> None:
    """Killed (the whole session, at once) once some blocks have their output; the next run submits the others
    only, on two workers, and the index is the one-process index."""
    process = start(root, "large", tmp_path, "--block-cubes", "1")
    try:
        assert wait_until(lambda: len(work_outputs(tmp_path, "large")) >= 5, timeout=RUN_SECONDS, interval=0.01)
    finally:
        end_session(process)
    assert process.returncode == -signal.SIGKILL, "the run ended before it was killed: make the layer larger"
    kept = len(work_outputs(tmp_path, "large"))
    assert not index_file(tmp_path, "large").exists()
    code, out, err = index_segments(root, "large", tmp_path, "--block-cubes", "1", "--workers", "2")
    assert code == 0, err
    blocks, run, reused = summary_counts(out)
    assert reused == kept and run == blocks - kept, out
    assert f"{blocks - kept} of {blocks} blocks to run" in err
    assert_same_index(read_index(tmp_path, "large"), one_process_index(root, "large"))


def worker_processes(process: "subprocess.Popen[str]") -> list[int]:
    """The dask worker processes of the command: its children that multiprocessing spawned to run a worker."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            spawned = b"spawn_main" in (entry / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):  # not a process, or one that just ended
            continue
        if parent == process.pid and spawned:
            found.append(int(entry.name))
    return found


def test_a_killed_worker_is_one_line_and_its_blocks_run_again(root: Path, tmp_path: Path) -> None:
    process = start(root, "large", tmp_path, "--block-cubes", "1", "--workers", "2")
    try:
        assert wait_until(lambda: work_outputs(tmp_path, "large"), timeout=RUN_SECONDS, interval=0.01)
        workers = wait_until(lambda: len(worker_processes(process)) == 2 and worker_processes(process))
        assert workers, "no dask worker process found"
        os.kill(workers[0], signal.SIGKILL)
        code, _out, err = finish(process)
    finally:
        end_session(process)
    assert code == 0, err
    died = [line for line in err.splitlines() if "died" in line]
    assert len(died) == 1 and "the scheduler runs them again" in died[0], err
    assert "Traceback" not in err, err
    assert_same_index(read_index(tmp_path, "large"), one_process_index(root, "large"))


# --- faults ---------------------------------------------------------------------------------------------------


@pytest.fixture()
def damaged(root: Path, tmp_path: Path) -> Path:
    """A copy of the root whose ``cells`` file at x = 1 (voxels 128-255) has garbage in its compressed blocks."""
    copy = tmp_path / "damaged"
    shutil.copytree(root, copy)
    path = copy / ORG / NAME / "cells" / "1" / "z0" / "y0" / "x1.wkw"
    data = bytearray(path.read_bytes())
    start = len(data) // 4  # past the header and its jump table
    data[start:] = np.random.default_rng(7).integers(0, 256, len(data) - start, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(data))
    return copy


@pytest.mark.parametrize("flags", [(), ("--workers", "2")], ids=["one process", "two workers"])
def test_blocks_of_corrupt_chunks_fail_with_the_block_and_reason_and_nothing_is_finished(
    damaged: Path, tmp_path: Path, flags: tuple[str, ...]
) -> None:
    index_dir = tmp_path / "indexes"
    code, _out, err = index_segments(damaged, "cells", index_dir, "--block-cubes", "1", *flags)
    assert code != 0 and "Traceback" not in err, err
    found = re.search(r"(\d+) of (\d+) blocks failed, nothing was finished", err)
    assert found, err
    failed = re.findall(r"^  block (\d+)_(\d+)_(\d+): (.+)$", err, flags=re.MULTILINE)
    assert len(failed) == int(found.group(1)) > 0, err
    for x, _, _, reason in failed:
        # A cube's window reaches one voxel below it: cubes 1-4 read the file of voxels 128-255 along x.
        assert 1 <= int(x) <= 4 and reason, err
    assert not index_file(index_dir, "cells").exists(), "no partial index is written"
    kept = work_outputs(index_dir, "cells")
    assert len(kept) == int(found.group(2)) - len(failed), "the good blocks' outputs wait for the next run"


def test_an_unreachable_scheduler_is_one_line(root: Path, tmp_path: Path) -> None:
    address = f"tcp://127.0.0.1:{free_port()}"
    code, _out, err = index_segments(root, "cells", tmp_path, "--scheduler", address)
    assert code == 1, err
    lines = [line for line in err.splitlines() if line.strip() and "blocks to run" not in line]
    assert len(lines) == 1 and lines[0].startswith(
        f"zarr-gateway: index-segments: cannot reach the dask scheduler at {address}"
    )
    assert not index_file(tmp_path, "cells").exists()


def test_flags_a_user_can_get_wrong_are_one_line(root: Path, tmp_path: Path) -> None:
    for flags, message in (
        (("--workers", "0"), "at least one worker process"),
        (("--block-cubes", "0"), "at least one cube per edge"),
    ):
        code, _, err = index_segments(root, "cells", tmp_path, *flags)
        assert code == 1 and message in err and "Traceback" not in err, err
