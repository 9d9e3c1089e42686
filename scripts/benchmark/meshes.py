"""``python -m benchmark.meshes``: mesh figures from one run on the sample dataset (scripts/bench-meshes).

- the index build rate: ``index-segments`` over the segmentation's finest mag, in voxels per second;
- the time to a segment's first fragment, as Neuroglancer asks for it: the multi-resolution manifest
  ``{id}.index`` then a byte range of ``{id}`` (cold: nothing cached in the worker; cached: asked again),
  and the legacy manifest ``{id}:0`` then its first fragment;
- the time the gateway takes to scan the layer when it has no index (the first mesh request pays it).

Each segment is asked once cold, so the cold figures are medians over segments, the cached ones over
repeats. The gateway runs with one worker on loopback; times are wall-clock seconds of the client.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[2]
LAYER = "segmentation"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_gateway(root: Path, log: Path, *flags: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZARR_GATEWAY_")}
    env["PYTHONPATH"] = str(REPO)
    args = [
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--root",
        str(root),
        "--port",
        str(port),
        "--workers",
        "1",
        *flags,
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            requests.get(url + "/", timeout=1)
            return process, url
        except requests.ConnectionError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"the gateway did not start: {log.read_text()}")


def first_fragment_multires(base: str, segment: int) -> float:
    """Seconds from asking for the manifest to holding the first non-empty fragment."""
    started = time.perf_counter()
    manifest = requests.get(f"{base}multires/{segment}.index", timeout=600)
    manifest.raise_for_status()
    raw = manifest.content
    (lods,) = struct.unpack_from("<I", raw, 24)
    offset = 28 + 4 * lods + 12 * lods
    counts = struct.unpack_from(f"<{lods}I", raw, offset)
    offset += 4 * lods
    start = 0
    for count in counts:
        offset += 12 * count
        sizes = struct.unpack_from(f"<{count}I", raw, offset)
        offset += 4 * count
        for size in sizes:
            if size:
                part = requests.get(
                    f"{base}multires/{segment}", headers={"Range": f"bytes={start}-{start + size - 1}"}, timeout=600
                )
                part.raise_for_status()
                return time.perf_counter() - started
            start += size
    raise RuntimeError(f"segment {segment} has no fragment")


def first_fragment_legacy(base: str, segment: int) -> float:
    started = time.perf_counter()
    manifest = requests.get(f"{base}legacy/{segment}:0", timeout=600)
    manifest.raise_for_status()
    fragment = requests.get(f"{base}legacy/{manifest.json()['fragments'][0]}", timeout=600)
    fragment.raise_for_status()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench-meshes", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--segments", type=int, default=8, help="segments asked for cold (default 8, the largest)")
    parser.add_argument("--repeats", type=int, default=20, help="cached requests per segment (default 20)")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(REPO))
    from gateway.cli import main as cli
    from gateway.sample import DATASET, ORGANIZATION, make_sample

    with tempfile.TemporaryDirectory(prefix="bench-meshes-") as scratch:
        root = Path(scratch) / "root"
        make_sample(root, progress=False)
        dataset = f"{ORGANIZATION}/{DATASET}"

        process, url = start_gateway(root, Path(scratch) / "gateway-scan.log")
        try:
            base = f"{url}/data/meshes/{dataset}/{LAYER}/"
            started = time.perf_counter()
            properties = requests.get(base + "multires/segment_properties/info", timeout=600)
            properties.raise_for_status()
            scan_seconds = time.perf_counter() - started
        finally:
            process.terminate()
            process.wait(30)

        started = time.perf_counter()
        cli(["index-segments", str(root), dataset, LAYER])
        index_seconds = time.perf_counter() - started
        index_file = root / ORGANIZATION / DATASET / f"{LAYER}.segment-index.npz"
        assert index_file.exists()

        document = properties.json()["inline"]
        (voxel_property,) = [p for p in document["properties"] if p["id"] == "voxels"]
        by_size = sorted(zip(voxel_property["values"], map(int, document["ids"])), reverse=True)
        segments = [segment for _, segment in by_size[: args.segments]]

        process, url = start_gateway(root, Path(scratch) / "gateway.log")
        try:
            base = f"{url}/data/meshes/{dataset}/{LAYER}/"
            requests.get(base + "multires/info", timeout=60).raise_for_status()  # loads the index
            figures: dict[str, list[float]] = {key: [] for key in ("multires cold", "multires cached")}
            figures |= {"legacy cold": [], "legacy cached": []}
            for segment in segments:
                figures["multires cold"].append(first_fragment_multires(base, segment))
                figures["legacy cold"].append(first_fragment_legacy(base, segment))
                for _ in range(args.repeats):
                    figures["multires cached"].append(first_fragment_multires(base, segment))
                    figures["legacy cached"].append(first_fragment_legacy(base, segment))
        finally:
            process.terminate()
            process.wait(30)

    from gateway.sample import SIZE

    voxels = SIZE[0] * SIZE[1] * SIZE[2]
    print(f"sample segmentation: {voxels:,} voxels at mag 1, {len(document['ids'])} segments")
    print(f"index-segments (whole command, start-up included): {index_seconds:.2f} s")
    print(f"scan on demand without an index (first segment_properties request): {scan_seconds:.2f} s")
    print()
    print("| request | segments | median ms | p90 ms |")
    print("|---|---:|---:|---:|")
    for name, values in figures.items():
        ordered = sorted(values)
        p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
        median = statistics.median(values)
        print(f"| first fragment, {name} | {len(segments)} | {median * 1000:.1f} | {p90 * 1000:.1f} |")
    print()
    print(json.dumps({"index_seconds": index_seconds, "scan_seconds": scan_seconds}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
