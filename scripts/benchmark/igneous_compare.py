"""``scripts/bench-meshes --igneous``: the gateway's batch meshing side by side with igneous on the same labels.

The labels (``make_labels``) are what labs' automated segmentations look like to a mesher: Voronoi-like cells
with ragged, noisy boundaries and extracellular space between them, an astrocyte-like segment of thin
perforated sheets, and a tube that spans the volume. They are written once as a WKW segmentation by
webknossos-libs (mags 1, 2, 4 downsampled by mode) for the gateway, and once as a local precomputed volume by
CloudVolume for igneous (in igneous's own venv, ``benchmark.igneous_side``).

Each pipeline runs from scratch with 1 and with 2 workers: the gateway's ``index-segments`` then
``mesh-segments`` (``--workers N``: a dask LocalCluster), igneous's sharded meshing tasks then its sharded
multi-resolution merge (a ``LocalTaskQueue`` of N processes). For each run: wall time, CPU time of every
process of the run, peak memory (the largest sum of resident sets of its processes, sampled every 0.1 s), and
the files and bytes it left. Both mesh sets are then read back by CloudVolume (``vol.mesh.get``, the finest
level: the gateway's through a gateway serving the dataset) and measured against the voxels
(:mod:`benchmark.mesh_fidelity`) for the largest segment, the volume-spanning one and the sheet-like one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .mesh_fidelity import Fidelity, fidelity
from .meshes import REPO, start_gateway

ORG, DATASET, LAYER = "bench_org", "ragged", "segmentation"
RESOLUTION = (8.0, 8.0, 8.0)
MAGS = ((1, 1, 1), (2, 2, 2), (4, 4, 4))
IGNEOUS = "igneous-pipeline==4.37.0"
SPANNING, SHEET = 1, 2  # ids of the volume-spanning tube and the astrocyte-like sheets; cells from 100
SAMPLE_SECONDS = 0.1

Array = np.ndarray[Any, Any]


# --- the labels ---------------------------------------------------------------------------------------------


def _smooth_noise(rng: np.random.Generator, shape: tuple[int, ...], cell: int) -> Array:
    """Noise in [-1, 1] that varies over about ``cell`` voxels (a coarse random grid, linearly upsampled)."""
    from scipy.ndimage import zoom

    coarse = rng.uniform(-1, 1, size=tuple(-(-s // cell) + 2 for s in shape))
    fine = zoom(coarse, cell, order=1)
    return np.asarray(fine[tuple(slice(0, s) for s in shape)], dtype=np.float32)


def make_labels(shape: tuple[int, int, int], seed: int) -> Array:
    """uint32 labels of ``shape``: cells with ragged boundaries and 0 between them, the sheets, the tube."""
    from scipy.spatial import cKDTree

    rng = np.random.default_rng(seed)
    cells = max(8, int(np.prod(shape) / 40**3))
    seeds = rng.uniform(0, shape, size=(cells, 3))
    tree = cKDTree(seeds)
    labels = np.zeros(shape, dtype=np.uint32)
    warp = [4 * _smooth_noise(rng, shape, 12) for _ in range(3)]
    for depth in range(shape[2]):  # a plane at a time: the whole volume's coordinates would not fit in memory
        xs, ys = np.meshgrid(np.arange(shape[0]), np.arange(shape[1]), indexing="ij")
        points = np.stack([xs + warp[0][..., depth], ys + warp[1][..., depth], depth + warp[2][..., depth]], axis=-1)
        points += rng.uniform(-0.8, 0.8, size=points.shape)  # voxel-scale roughness of automated boundaries
        distances, nearest = tree.query(points.reshape(-1, 3), k=2)
        plane = (100 + nearest[:, 0]).astype(np.uint32)
        plane[distances[:, 1] - distances[:, 0] < 1.2] = 0  # extracellular space between cells
        labels[..., depth] = plane.reshape(shape[:2])
    x, y, z = np.meshgrid(*(np.arange(n, dtype=np.float32) for n in shape), indexing="ij")
    holes = _smooth_noise(rng, shape, 6) > 0.55
    sheets = np.zeros(shape, dtype=bool)
    for k in range(3):  # thin, wavy, perforated: the processes of an astrocyte between the cells
        height = shape[2] * (k + 1) / 4 + 5 * np.sin(x / 13 + k) * np.cos(y / 17 - k)
        sheets |= np.abs(z - height) < 1.0
    wall = shape[0] / 2 + 6 * np.sin(y / 11) * np.cos(z / 9)
    sheets |= (np.abs(x - wall) < 1.0) & (y < shape[1] * 0.7)
    labels[sheets & ~holes] = SHEET
    centre_y = shape[1] / 2 + shape[1] / 5 * np.sin(x / 23)
    centre_z = shape[2] / 2 + shape[2] / 5 * np.cos(x / 31)
    labels[(y - centre_y) ** 2 + (z - centre_z) ** 2 < 10.0**2] = SPANNING  # from the low x face to the high one
    return labels


def write_gateway_dataset(root: Path, labels: Array) -> None:
    """The labels as webKnossos writes a segmentation: WKW from the origin, mags downsampled by mode."""
    import webknossos as wk

    dataset = wk.Dataset(root / ORG / DATASET, voxel_size=RESOLUTION)
    layer = dataset.add_layer(LAYER, "segmentation", dtype="uint32", data_format="wkw", largest_segment_id=0)
    layer.bounding_box = wk.BoundingBox((0, 0, 0), labels.shape)
    layer.add_mag(1, chunk_shape=32, shard_shape=1024, compress=True).write(labels)
    layer.downsample(from_mag=wk.Mag(1), coarsest_mag=wk.Mag(MAGS[-1][0]), sampling_mode="isotropic")
    assert isinstance(layer, wk.SegmentationLayer)
    layer.largest_segment_id = int(labels.max())


# --- running and measuring ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    wall_s: float
    cpu_s: float
    peak_mb: float
    files: int
    bytes: int
    failed: str = ""  # the last lines of the failed command's error output; empty when it succeeded


def _tree(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                todo += [int(c) for c in Path(f"/proc/{current}/task/{task}/children").read_text().split()]
        except OSError:
            continue
    return found


def _sample(pids: list[int], cpu: dict[int, float]) -> float:
    """Resident MiB of ``pids`` together; records each one's CPU seconds so far in ``cpu``."""
    tick, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    resident = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            resident += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        except (OSError, IndexError):
            continue
        cpu[pid] = max(cpu.get(pid, 0.0), (int(fields[11]) + int(fields[12])) / tick)
    return resident / 2**20


def measured(commands: list[list[str]], env: dict[str, str], outputs: Path) -> Run:
    """Run ``commands`` one after the other: wall, CPU (the larger of what was sampled from every process and
    what the waited-for children report), peak memory, and what was left under ``outputs``."""
    before = _files(outputs)
    started = time.perf_counter()
    children = os.times()
    cpu: dict[int, float] = {}
    peak = 0.0
    failed = ""
    for command in commands:
        with tempfile.TemporaryFile() as errors:
            process = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=errors)
            while process.poll() is None:
                peak = max(peak, _sample(_tree(process.pid), cpu))
                time.sleep(SAMPLE_SECONDS)
            if process.returncode != 0:
                errors.seek(0)
                tail = errors.read().decode(errors="replace").strip().splitlines()[-3:]
                failed = f"{Path(command[3] if len(command) > 3 else command[0]).name}: " + " / ".join(tail)
                break
    wall = time.perf_counter() - started
    done = os.times()
    reported = (done.children_user - children.children_user) + (done.children_system - children.children_system)
    after = _files(outputs)
    changed = {path: size for path, size in after.items() if before.get(path) != size}
    return Run(wall, max(reported, sum(cpu.values())), peak, len(changed), sum(changed.values()), failed)


def _files(directory: Path) -> dict[str, int]:
    return {str(p): p.stat().st_size for p in directory.rglob("*") if p.is_file()}


def digest(directory: Path) -> str:
    """One hash of every file's path (below ``directory``) and bytes."""
    total = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        total.update(str(path.relative_to(directory)).encode() + b"\0" + path.read_bytes())
    return total.hexdigest()


def gateway_run(root: Path, workers: int) -> tuple[Run, str]:
    """index-segments then mesh-segments from scratch; the mesh set's digest."""
    dataset_dir = root / ORG / DATASET
    for leftover in dataset_dir.glob(f"{LAYER}.*"):  # the index, the mesh set, the work directory
        if leftover.is_dir():
            shutil.rmtree(leftover)
        else:
            leftover.unlink()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZARR_GATEWAY_")} | {"PYTHONPATH": str(REPO)}
    base = [sys.executable, "-m", "gateway"]
    where = [str(root), f"{ORG}/{DATASET}", LAYER, "--workers", str(workers)]
    run = measured([[*base, "index-segments", *where], [*base, "mesh-segments", *where]], env, dataset_dir)
    return run, "" if run.failed else digest(dataset_dir / f"{LAYER}.meshes")


def igneous_run(python: str, volume: Path, workers: int, task_edge: int, lods: int) -> tuple[Run, str]:
    """igneous's meshing and multi-resolution merge from scratch; the mesh directory's digest."""
    for leftover in volume.iterdir():
        if leftover.is_dir() and leftover.name.startswith("mesh"):
            shutil.rmtree(leftover)
    info = json.loads((volume / "info").read_text())
    info.pop("mesh", None)
    (volume / "info").write_text(json.dumps(info))
    env = dict(os.environ) | {"PYTHONPATH": str(REPO / "scripts")}
    command = [python, "-m", "benchmark.igneous_side", "mesh", str(volume), str(workers), str(task_edge), str(lods)]
    run = measured([command], env, volume)
    return run, "" if run.failed else digest(volume / json.loads((volume / "info").read_text())["mesh"])


# --- fidelity -----------------------------------------------------------------------------------------------


def segment_fidelity(volume: Any, labels: Array, segment: int) -> Fidelity:
    """The finest level of ``segment``'s mesh as CloudVolume reads it, against its voxels."""
    mesh = volume.mesh.get([segment], lod=0)[segment]
    found = np.argwhere(labels == segment)
    lo = np.maximum(found.min(axis=0) - 1, 0)
    hi = found.max(axis=0) + 2
    mask = labels[tuple(slice(a, b) for a, b in zip(lo, hi))] == segment
    faces = np.asarray(mesh.faces, dtype=np.int64).reshape(-1, 3)
    return fidelity(np.asarray(mesh.vertices, dtype=np.float64), faces, mask, np.array(RESOLUTION), lo)


def chosen_segments(labels: Array) -> dict[str, int]:
    """The largest cell (the sheets may be larger still: they are measured on their own), the tube, the sheets."""
    ids, counts = np.unique(labels[labels >= 100], return_counts=True)
    return {"largest cell": int(ids[counts.argmax()]), "volume-spanning": SPANNING, "sheet-like": SHEET}


# --- the report ---------------------------------------------------------------------------------------------


def _ratio(gateway: float, igneous: float) -> str:
    return f"{gateway / igneous:.2f}" if igneous else "n/a"


def report(
    runs: dict[tuple[str, int], Run], same: dict[str, bool], fidelities: dict[tuple[str, str], Fidelity | str]
) -> str:
    """The markdown tables: each run, the ratios gateway / igneous, and the fidelity of each chosen segment."""
    lines = ["| run | wall s | CPU s | peak MiB | files | MiB written |", "|---|---:|---:|---:|---:|---:|"]
    for (tool, workers), run in runs.items():
        lines.append(
            f"| {tool}, {workers} worker{'s' if workers > 1 else ''} | {run.wall_s:.1f} | {run.cpu_s:.1f} | "
            f"{run.peak_mb:.0f} | {run.files} | {run.bytes / 2**20:.1f} |"
        )
    failures = [f"{tool} with {workers}: {run.failed}" for (tool, workers), run in runs.items() if run.failed]
    lines += ["", *(f"FAILED: {failure}" for failure in failures)]
    lines += ["| gateway / igneous | wall | CPU | peak memory | files | bytes |", "|---|---:|---:|---:|---:|---:|"]
    for workers in sorted({w for _, w in runs}):
        g, i = runs[("gateway", workers)], runs[("igneous", workers)]
        lines.append(
            f"| {workers} worker{'s' if workers > 1 else ''} | {_ratio(g.wall_s, i.wall_s)} | "
            f"{_ratio(g.cpu_s, i.cpu_s)} | {_ratio(g.peak_mb, i.peak_mb)} | {_ratio(g.files, i.files)} | "
            f"{_ratio(g.bytes, i.bytes)} |"
        )
    lines += ["", "same mesh set with 1 and 2 workers: " + ", ".join(f"{t}: {s}" for t, s in same.items()), ""]
    lines += [
        "| segment | mesh | vertices | max distance nm | mean distance nm | volume / voxels | open edges |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for (segment, tool), found in fidelities.items():
        if isinstance(found, str):
            lines.append(f"| {segment} | {tool} | {found} | | | | |")
            continue
        lines.append(
            f"| {segment} | {tool} | {found.vertices} | {found.max_distance_nm:.2f} | "
            f"{found.mean_distance_nm:.2f} | {found.volume_ratio:.4f} | {found.open_edges} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench-meshes --igneous", description=__doc__.split("\n\n")[0])
    parser.add_argument("--igneous", action="store_true", help="this mode (what scripts/bench-meshes dispatches on)")
    parser.add_argument("--size", default="256,256,128", help="x,y,z voxels of the labels (default 256,256,128)")
    parser.add_argument("--task-edge", type=int, default=128, help="igneous's task shape edge (default 128)")
    parser.add_argument("--lods", type=int, default=2, help="igneous's num_lod (default 2: three levels)")
    parser.add_argument("--out", type=Path, help="also write the table and figures here (results.md/.json)")
    args = parser.parse_args(argv)
    shape = tuple(int(v) for v in args.size.split(","))
    assert len(shape) == 3
    venv = subprocess.run(
        [str(REPO / "scripts" / "side-venv"), "igneous-venv", IGNEOUS], check=True, capture_output=True, text=True
    ).stdout.strip()
    python = f"{venv}/bin/python"

    with tempfile.TemporaryDirectory(prefix="bench-igneous-") as scratch_name:
        scratch = Path(scratch_name)
        labels = make_labels((shape[0], shape[1], shape[2]), 42)
        np.save(scratch / "labels.npy", labels)
        root, volume = scratch / "root", scratch / "igneous" / LAYER
        write_gateway_dataset(root, labels)
        side_env = dict(os.environ) | {"PYTHONPATH": str(REPO / "scripts")}
        resolution = ",".join(str(r) for r in RESOLUTION)
        write = [python, "-m", "benchmark.igneous_side", "write", str(volume), str(scratch / "labels.npy"), resolution]
        subprocess.run(write, check=True, env=side_env, cwd=REPO)

        runs: dict[tuple[str, int], Run] = {}
        digests: dict[tuple[str, int], str] = {}
        for workers in (1, 2):
            runs[("gateway", workers)], digests[("gateway", workers)] = gateway_run(root, workers)
            runs[("igneous", workers)], digests[("igneous", workers)] = igneous_run(
                python, volume, workers, args.task_edge, args.lods
            )
        same = {tool: digests[(tool, 1)] == digests[(tool, 2)] for tool in ("gateway", "igneous")}

        from cloudvolume import CloudVolume

        process, url = start_gateway(root, scratch / "gateway.log")
        try:
            served = CloudVolume(
                f"precomputed://{url}/data/precomputed/{ORG}/{DATASET}/{LAYER}", use_https=False, progress=False
            )
            local = CloudVolume(f"file://{volume}", progress=False)
            volumes = {"gateway": served, "igneous": local}
            fidelities: dict[tuple[str, str], Fidelity | str] = {}
            for name, segment in chosen_segments(labels).items():
                label = f"{name} ({int((labels == segment).sum()):,} voxels)"
                for tool, read in volumes.items():
                    made = not runs[(tool, 2)].failed
                    fidelities[(label, tool)] = segment_fidelity(read, labels, segment) if made else "no mesh set"
        finally:
            process.terminate()
            process.wait(30)

    segments = len(np.unique(labels)) - 1
    print(f"labels: {shape[0]} x {shape[1]} x {shape[2]} voxels of {RESOLUTION[0]:g} nm, {segments} segments")
    table = report(runs, same, fidelities)
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.md").write_text(table + "\n")
        document = {
            "shape": shape,
            "segments": segments,
            "runs": {f"{tool} {workers}": asdict(run) for (tool, workers), run in runs.items()},
            "same_with_1_and_2_workers": same,
            "fidelity": {
                f"{segment} {tool}": found if isinstance(found, str) else asdict(found)
                for (segment, tool), found in fidelities.items()
            },
        }
        (args.out / "results.json").write_text(json.dumps(document, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
