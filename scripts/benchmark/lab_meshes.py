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
import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

from benchmark.meshes import REPO, first_fragment_multires, start_gateway


@contextmanager
def gateway(root: Path, log: Path, *flags: str) -> Iterator[str]:
    process, url = start_gateway(root, log, *flags)
    try:
        yield url
    finally:
        process.terminate()
        process.wait(30)


def scanned(base: str) -> None:
    """The layer's segments found (its scan, without an index), before any clock starts."""
    requests.get(base + "multires/segment_properties/info", timeout=600).raise_for_status()


def row(name: str, values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"| {name} | {len(values)} | {statistics.median(values) * 1000:.0f} | {p90 * 1000:.0f} |"


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
        with gateway(lab.root, Path(scratch) / "ragged.log") as url:
            scanned(url + layer + RAGGED_LAYER + "/")
            rows.append(
                row(
                    f"ragged cells (all {len(ids)})",
                    [first_fragment_multires(url + layer + RAGGED_LAYER + "/", int(i)) for i in ids],
                )
            )
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
                with gateway(lab.root, Path(scratch) / f"{layer_name}-{repeat}.log", *flags) as url:
                    base = url + layer + layer_name + "/"
                    scanned(base)
                    samples.append(first_fragment_multires(base, segment))
            rows.append(row(name, samples))
    print("| segment | samples | median ms | p90 ms |")
    print("|---|---:|---:|---:|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
