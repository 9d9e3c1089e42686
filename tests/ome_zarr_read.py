"""Read one OME-Zarr multiscale image over HTTP the way napari's OME-Zarr plugin does, and dump it.

Runs inside the ome-zarr venv (scripts/ome-zarr-venv), not the project's:
``python ome_zarr_read.py OUT_DIR URL...`` writes, for the i-th URL, ``OUT_DIR/i.json`` (the reader's node
metadata and, per level, shape and dtype) and ``OUT_DIR/i.npz`` (every level's voxels as ``level0``,
``level1``, ...) for the test to compare against the ``wkw`` truth. One process reads every URL, so the
reader is imported once.
"""

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from ome_zarr.io import parse_url
from ome_zarr.reader import Multiscales, Reader


def read(url: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    location = parse_url(url, mode="r")
    if location is None:
        raise SystemExit(f"ome-zarr found no Zarr group at {url}")
    nodes = list(Reader(location)())
    images = [node for node in nodes if node.load(Multiscales) is not None]
    if not images:
        raise SystemExit(f"ome-zarr found no multiscale image at {url}; nodes: {[str(n) for n in nodes]}")
    node = images[0]
    levels = {f"level{i}": np.asarray(level) for i, level in enumerate(node.data)}
    metadata = {
        "version": location.version,
        "axes": node.metadata.get("axes"),
        "coordinateTransformations": node.metadata.get("coordinateTransformations"),
        "name": node.metadata.get("name"),
        "levels": [{"shape": list(a.shape), "dtype": str(a.dtype)} for a in levels.values()],
        "nodes": len(nodes),
    }
    return metadata, levels


def main() -> None:
    out_dir = Path(sys.argv[1])
    for index, url in enumerate(sys.argv[2:]):
        metadata, levels = read(url)
        (out_dir / f"{index}.json").write_text(json.dumps(metadata, default=str))
        np.savez(out_dir / f"{index}.npz", allow_pickle=False, **levels)


if __name__ == "__main__":
    main()
