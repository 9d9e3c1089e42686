"""``python -m benchmark.lab_meshes`` (from scripts/): on-demand mesh latency on labels as labs have them
(benchmark/lab_labels.py, which tests/test_mesh_lab_labels.py reads too: a glial sheet, a ragged automated
segmentation, one layer with one mag), the figures of issue 42's closing note.

The time to a segment's first fragment as Neuroglancer asks for it (the multi-resolution manifest ``{id}.index``,
then a byte range of ``{id}``), cold: each sample from a gateway that has meshed nothing yet (the ragged cells one
gateway for all, each asked once; the sheet and the largest cell a fresh gateway per sample). The layer's scan
(it has no index) is paid before the clock starts. Times are wall-clock seconds of the client, on loopback.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

from benchmark.meshes import REPO, first_fragment_multires, start_gateway


@contextmanager
def gateway(root: Path, log: Path, *flags: str) -> Iterator[tuple[str, int]]:
    """A gateway's URL and process id (one worker: the process that meshes)."""
    process, url = start_gateway(root, log, *flags)
    try:
        yield url, process.pid
    finally:
        process.terminate()
        process.wait(30)


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of a process and its waited-for children so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def timed(pid: int, base: str, segment: int) -> tuple[float, float]:
    """Wall seconds to the first fragment, and the gateway's CPU seconds meanwhile (a figure the load of a busy
    machine does not stretch)."""
    before = cpu_seconds(pid)
    wall = first_fragment_multires(base, segment)
    return wall, cpu_seconds(pid) - before


def scanned(base: str) -> None:
    """The layer's segments found (its scan, without an index), before any clock starts."""
    requests.get(base + "multires/segment_properties/info", timeout=600).raise_for_status()


def row(name: str, samples: list[tuple[float, float]]) -> str:
    cells = []
    for values in ([wall for wall, _ in samples], [cpu for _, cpu in samples]):
        ordered = sorted(values)
        p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
        cells += [f"{statistics.median(values) * 1000:.0f}", f"{p90 * 1000:.0f}"]
    return f"| {name} | {len(samples)} | {' | '.join(cells)} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lab_meshes", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="cold samples of the sheet and the largest cell")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import numpy as np

    from benchmark.lab_labels import DATASET, ORGANIZATION, RAGGED_LAYER, SHEET, SHEET_LAYER, write_lab_labels

    rows = []
    with tempfile.TemporaryDirectory(prefix="lab-meshes-") as scratch:
        lab = write_lab_labels(Path(scratch) / "root")
        ids, counts = np.unique(lab.ragged, return_counts=True)
        largest = int(ids[counts.argmax()])
        layer = f"/data/meshes/{ORGANIZATION}/{DATASET}/"
        with gateway(lab.root, Path(scratch) / "ragged.log") as (url, pid):
            scanned(url + layer + RAGGED_LAYER + "/")
            samples = [timed(pid, url + layer + RAGGED_LAYER + "/", int(i)) for i in ids]
            rows.append(row(f"ragged cells (all {len(ids)})", samples))
        cases = [
            ("glial sheet (0.9 M voxels)", SHEET_LAYER, SHEET, ()),
            (f"largest cell ({counts.max() / 1e6:.1f} M voxels)", RAGGED_LAYER, largest, ()),
            (
                "largest cell, coarse levels (multires_voxels 3 M)",
                RAGGED_LAYER,
                largest,
                ("--multires-voxels", "3000000"),
            ),
        ]
        for name, layer_name, segment, flags in cases:
            samples = []
            for repeat in range(args.repeats):
                with gateway(lab.root, Path(scratch) / f"{layer_name}-{repeat}.log", *flags) as (url, pid):
                    base = url + layer + layer_name + "/"
                    scanned(base)
                    samples.append(timed(pid, base, segment))
            rows.append(row(name, samples))
    print("| segment | samples | wall median ms | wall p90 ms | gateway CPU median ms | gateway CPU p90 ms |")
    print("|---|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
