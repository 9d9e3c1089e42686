"""napari's reader: ome-zarr-py opens the layer groups of both trees, every mag voxel for voxel.

napari's OME-Zarr plugin reads with ``ome_zarr.io.parse_url`` and ``ome_zarr.reader.Reader``. That
package requires ``fsspec[s3]``, whose pins clash with the project's boto3, so it lives in its own venv
(``scripts/ome-zarr-venv``) and ``tests/ome_zarr_read.py`` runs there; this test compares what it read
against the ``wkw`` package's read of the same files (OME-NGFF 0.4 from the v2 tree, 0.5 from v3).
"""

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.datasets import LAYERS, MAGS, ORG, WrittenDataset
from support.servers import Server

pytestmark = pytest.mark.slow  # napari's reader, and ome-zarr from a venv of its own

REPO = Path(__file__).resolve().parents[1]
VOXEL_SIZE = (11.24, 11.24, 28.0)  # what the main test dataset declares, in nanometres
TREES = {"zarr": "0.4", "zarr3": "0.5", "zarr3-sharded": "0.5"}


@pytest.fixture(scope="module")
def ome_zarr_python() -> str:
    """The ome-zarr venv's interpreter, made on first use by the project's script."""
    result = subprocess.run([str(REPO / "scripts" / "ome-zarr-venv")], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.fail(f"scripts/ome-zarr-venv could not install ome-zarr (it needs the package index):\n{result.stderr}")
    return result.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def read_by_ome_zarr(
    ome_zarr_python: str,
    test_data: WrittenDataset,
    server_factory: Callable[..., Server],
    sharded_gateway: Server,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[tuple[str, str], tuple[dict[str, Any], dict[str, np.ndarray]]]:
    """(tree, layer) -> the reader's metadata and levels, for every layer of both trees (one reader process)."""
    plain = server_factory(test_data.root)
    cases = [(tree, name) for tree in TREES for name, *_ in LAYERS]
    urls = []
    for tree, layer in cases:
        server, path = (sharded_gateway, "zarr3") if tree == "zarr3-sharded" else (plain, tree)
        urls.append(f"{server.url}/data/{path}/{ORG}/{test_data.dataset}/{layer}")
    out_dir = tmp_path_factory.mktemp("ome-zarr")
    result = subprocess.run(
        [ome_zarr_python, str(REPO / "tests" / "ome_zarr_read.py"), str(out_dir), *urls], capture_output=True, text=True
    )
    assert result.returncode == 0, f"ome-zarr failed:\n{result.stderr[-4000:]}"
    for server in (plain, sharded_gateway):
        failures = [line for line in server.log().splitlines() if '"status": 5' in line]
        assert not failures, failures
    read = {}
    for index, case in enumerate(cases):
        metadata = json.loads((out_dir / f"{index}.json").read_text())
        with np.load(out_dir / f"{index}.npz") as levels:
            read[case] = (metadata, {key: levels[key] for key in levels.files})
    return read


@pytest.mark.parametrize("layer", [name for name, *_ in LAYERS])
@pytest.mark.parametrize("tree", TREES)
def test_ome_zarr_reads_every_mag(
    read_by_ome_zarr: dict[tuple[str, str], tuple[dict[str, Any], dict[str, np.ndarray]]],
    test_data: WrittenDataset,
    tree: str,
    layer: str,
) -> None:
    metadata, levels = read_by_ome_zarr[(tree, layer)]
    assert metadata["version"] == TREES[tree]
    assert metadata["name"] == layer
    assert [axis["name"] for axis in metadata["axes"]] == ["c", "x", "y", "z"]
    assert [axis["type"] for axis in metadata["axes"]] == ["channel", "space", "space", "space"]
    assert {axis.get("unit") for axis in metadata["axes"][1:]} == {"nanometer"}
    assert len(levels) == len(MAGS)
    for index, mag in enumerate(MAGS):
        (transform,) = [t for t in metadata["coordinateTransformations"][index] if t["type"] == "scale"]
        np.testing.assert_allclose(transform["scale"], [1.0, *(v * m for v, m in zip(VOXEL_SIZE, mag))])
        expected = test_data.expected(layer, mag)
        data = levels[f"level{index}"]
        assert data.shape == expected.shape, (mag, data.shape, expected.shape)
        assert data.dtype == expected.dtype, (mag, data.dtype)
        np.testing.assert_array_equal(data, expected, err_msg=f"{tree} {layer} mag {mag}")
        assert np.count_nonzero(data) > 0  # the comparison is not over two empty arrays
