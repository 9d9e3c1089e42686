"""``python -m benchmark.mappings``: figures of mapped layers from one run (scripts/bench-mappings).

A WKW segmentation (uint32, LZ4HC) and an HDF5 agglomerate file of ``--entries`` entries (10^8 by default: 800 MB,
as a real lab's) are written to a scratch directory. The labels hold ids clustered in id space per 64^3 region, as
a blockwise watershed numbers its supervoxels, spread over the whole mapping. Then, per chunk edge (32, 64):

- chunks/s of the raw layer and of the mapped layer, ``cold`` (a fresh gateway: no mapping piece cached; the
  files in the page cache for both) and ``warm`` (the same keys again: the pieces cached, every chunk made again:
  the answer cache is off), and ``kept`` (the answer cache on, a second pass);
- the worker's resident memory (VmRSS) after start and after serving every mapped chunk, and its peak (VmHWM),
  against the raw layer's gateway;
- the time to the first agglomerate mesh on demand (a multi-resolution manifest and its first fragment) after
  ``index-segments`` of the mapped layer, and how long that index took.

Every fetch runs with ``--threads`` client threads on loopback against one worker; times are wall-clock seconds of
the client, so compare the ratios of a run, not figures across machines.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .config import MAPPING, REPO, SEGMENTATION
from .dataset import agglomerate_of, segmentation_labels, write_agglomerate_file
from .processes import Client, Server, clean_env, free_port, status_kib

ORG, DATASET, LAYER = "bench", "mapped", SEGMENTATION
SHAPE = (512, 512, 128)


def write_dataset(root: Path, entries: int) -> int:
    """The labels (those of scripts/bench's mapped rows) and the agglomerate file; returns an agglomerate id that
    is present."""
    import wkw

    labels = segmentation_labels(SHAPE, entries)
    layer = root / ORG / DATASET / LAYER
    header = wkw.Header(np.uint32, block_type=wkw.Header.BLOCK_TYPE_LZ4HC, file_len=4)
    with wkw.Dataset.create(str(layer / "1"), header) as ds:
        ds.write((0, 0, 0), labels)
    properties = {
        "id": {"name": DATASET, "team": ""},
        "scale": {"factor": [8.0, 8.0, 16.0], "unit": "nanometer"},
        "dataLayers": [
            {
                "name": LAYER,
                "category": "segmentation",
                "boundingBox": {"topLeft": [0, 0, 0], "width": SHAPE[0], "height": SHAPE[1], "depth": SHAPE[2]},
                "elementClass": "uint32",
                "dataFormat": "wkw",
                "mags": [{"mag": [1, 1, 1], "path": f"./{LAYER}/1"}],
            }
        ],
    }
    (root / ORG / DATASET / "datasource-properties.json").write_text(json.dumps(properties))
    write_agglomerate_file(layer / "agglomerates" / f"{MAPPING}.hdf5", entries)
    return int(agglomerate_of(labels[SHAPE[0] // 2, SHAPE[1] // 2, SHAPE[2] // 2]))


def start(root: Path, logs: Path, edge: int, kept: bool) -> Server:
    port = free_port()
    args = [sys.executable, "-m", "gateway", "serve", "--root", str(root), "--port", str(port), "--workers", "1"]
    args += ["--chunk-edge", str(edge)] + ([] if kept else ["--answer-cache-bytes", "0"])
    env = {**clean_env(), "PYTHONPATH": str(REPO)}
    server = Server(f"gateway edge {edge}", args, port, logs / f"gateway-{edge}-{port}.log", env)
    server.wait_ready(f"/data/zarr/{ORG}/{DATASET}/{LAYER}/1/.zarray", 1)
    return server


def keys(layer: str, edge: int) -> list[str]:
    grid = [s // edge for s in SHAPE]
    return [
        f"/data/zarr/{ORG}/{DATASET}/{layer}/1/0.{x}.{y}.{z}"
        for x in range(grid[0])
        for y in range(grid[1])
        for z in range(grid[2])
    ]


def fetch_all(server: Server, paths: list[str], threads: int) -> float:
    """Chunks per second of one pass over ``paths``."""
    client = Client(server.port)
    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        for body in pool.map(client.get_ok, paths):
            assert body
    elapsed = time.perf_counter() - started
    client.close()
    return len(paths) / elapsed


def worker_kib(server: Server, name: str) -> float:
    values = [status_kib(pid, name) for pid in server.workers()]
    return max(v for v in values if v is not None) / 1024


def measure_edge(root: Path, logs: Path, edge: int, threads: int) -> dict[str, float]:
    figures: dict[str, float] = {}
    for layer, label in ((LAYER, "raw"), (f"{LAYER}__{MAPPING}", "mapped")):
        paths = keys(layer, edge)
        server = start(root, logs, edge, kept=False)
        try:
            figures[f"{label} rss start MB"] = worker_kib(server, "VmRSS")
            figures[f"{label} cold"] = fetch_all(server, paths, threads)
            figures[f"{label} warm"] = statistics.median(fetch_all(server, paths, threads) for _ in range(3))
            figures[f"{label} rss end MB"] = worker_kib(server, "VmRSS")
            figures[f"{label} rss peak MB"] = worker_kib(server, "VmHWM")
        finally:
            server.stop()
        server = start(root, logs, edge, kept=True)
        try:
            fetch_all(server, paths, threads)
            figures[f"{label} kept"] = statistics.median(fetch_all(server, paths, threads) for _ in range(3))
        finally:
            server.stop()
    return figures


def first_mesh(root: Path, logs: Path, agglomerate: int) -> dict[str, float]:
    layer = f"{LAYER}__{MAPPING}"
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "index-segments", str(root), f"{ORG}/{DATASET}", layer],
        capture_output=True,
        text=True,
        env={**clean_env(), "PYTHONPATH": str(REPO)},
    )
    indexed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(done.stdout + done.stderr)
    server = start(root, logs, 32, kept=True)
    try:
        base = f"/data/meshes/{ORG}/{DATASET}/{layer}/multires"
        while True:  # the index just written is 503 until it has settled, as for any client: wait that out first
            started = time.perf_counter()
            status, manifest, headers = server.client.get(f"{base}/{agglomerate}.index")
            if status != 503:
                break
            time.sleep(float(headers.get("retry-after", 1)))
        if status != 200:
            raise RuntimeError(f"the manifest of {agglomerate}: HTTP {status} {manifest[:200]!r}")
        status, body, _ = server.client.get(f"{base}/{agglomerate}", {"Range": "bytes=0-65535"})
        mesh = time.perf_counter() - started
        if status not in (200, 206) or not manifest:
            raise RuntimeError(f"the mesh of {agglomerate}: HTTP {status} {body[:200]!r}")
    finally:
        server.stop()
    return {"index-segments s": indexed, "first mesh s": mesh}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=100_000_000, help="entries of segment_to_agglomerate")
    parser.add_argument("--threads", type=int, default=4, help="client threads")
    parser.add_argument("--scratch", type=Path, default=None, help="where to write the data (a temporary dir)")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    options = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-mappings-", dir=options.scratch))
    try:
        root, logs = scratch / "root", scratch / "logs"
        logs.mkdir(parents=True)
        started = time.perf_counter()
        agglomerate = write_dataset(root, options.entries)
        print(f"wrote {SHAPE} labels and {options.entries:,} entries in {time.perf_counter() - started:.1f} s")
        results: dict[str, dict[str, float]] = {}
        for edge in (32, 64):
            results[f"{edge}³"] = figures = measure_edge(root, logs, edge, options.threads)
            print(f"\n{edge}³ chunks, chunks/s (mapped / raw):")
            for phase in ("cold", "warm", "kept"):
                raw, mapped = figures[f"raw {phase}"], figures[f"mapped {phase}"]
                print(f"  {phase:5} raw {raw:8.0f}  mapped {mapped:8.0f}  ratio {mapped / raw:.2f}")
            for label in ("raw", "mapped"):
                start_mb, end_mb = figures[f"{label} rss start MB"], figures[f"{label} rss end MB"]
                peak = figures[f"{label} rss peak MB"]
                print(
                    f"  worker RSS, {label:6}: {start_mb:.0f} MB at start, {end_mb:.0f} MB after serving, "
                    f"peak {peak:.0f} MB"
                )
        results["meshes"] = mesh = first_mesh(root, logs, agglomerate)
        print(
            f"\nindex-segments of the mapped layer: {mesh['index-segments s']:.1f} s; "
            f"first agglomerate mesh on demand (manifest and data): {mesh['first mesh s']:.2f} s"
        )
        if options.out:
            options.out.write_text(json.dumps(results, indent=2))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
