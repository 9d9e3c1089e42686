"""Tests for ``gateway.sample``: the sample dataset is valid WKW, looks like tissue, and webknossos-libs reads it.

Voxels are read back with the format authors' ``wkw`` package and with ``webknossos``, never with the
project's own reader, so a bug shared by writer and reader cannot hide.
"""

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import wkw

from gateway.sample import make_sample
from gateway_storage import geometry
from gateway_storage.geometry import vec3

TOP_LEFT = (16, 8, 4)
SIZE = (320, 288, 96)
MAGS = {"1": (1, 1, 1), "2-2-1": (2, 2, 1), "4-4-2": (4, 4, 2)}
LAYERS = {"color": ("color", "uint8"), "segmentation": ("segmentation", "uint32")}


def extent(mag: tuple[int, int, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Offset and shape (mag-``mag`` voxels) of the data that covers the bounding box."""
    lo = tuple(t // m for t, m in zip(TOP_LEFT, mag))
    hi = tuple(-(-(t + s) // m) for t, s, m in zip(TOP_LEFT, SIZE, mag))
    return lo, tuple(h - low for low, h in zip(lo, hi))


def read(dataset: Path, layer: str, mag_name: str, grow: int = 0) -> np.ndarray:
    """``[x, y, z]`` voxels over the bounding box at a mag (``grow`` voxels more on every side), via ``wkw``."""
    offset, shape = extent(MAGS[mag_name])
    with wkw.Dataset.open(str(dataset / layer / mag_name)) as ds:
        data: np.ndarray = ds.read(tuple(o - grow for o in offset), tuple(s + 2 * grow for s in shape))
    assert data.shape[0] == 1
    voxels: np.ndarray = data[0]
    return voxels


def windows(data: np.ndarray, factor: tuple[int, int, int]) -> np.ndarray:
    """``[x', y', z', k]``: the ``k`` mag-1 voxels under each coarser voxel."""
    (fx, fy, fz), (nx, ny, nz) = factor, data.shape
    split = data.reshape(nx // fx, fx, ny // fy, fy, nz // fz, fz).transpose(0, 2, 4, 1, 3, 5)
    return split.reshape(nx // fx, ny // fy, nz // fz, -1)


def boundaries(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Voxels where two cells meet along x or y, and voxels deep inside a cell (same label 2 voxels around)."""
    core = labels[2:-2, 2:-2, :]
    edge = np.zeros(core.shape, dtype=bool)
    interior = core > 0
    for axis in (0, 1):
        for shift in (-2, -1, 1, 2):
            other = np.roll(labels, shift, axis=axis)[2:-2, 2:-2, :]
            interior &= other == core
            if abs(shift) == 1:
                edge |= (other != core) & (other > 0) & (core > 0)
    return edge, interior


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sample")
    path = make_sample(root, progress=False)
    assert path == root / "sample_org" / "sample_dataset"
    return path


@pytest.fixture(scope="module")
def properties(dataset: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((dataset / "datasource-properties.json").read_text())
    return document


def test_properties_are_webknossos_style(dataset: Path, properties: dict[str, Any]) -> None:
    assert properties["id"] == {"name": "sample_dataset", "team": ""}
    assert properties["scale"] == {"factor": [11.24, 11.24, 28.0], "unit": "nanometer"}
    assert properties["version"] == 1
    box = {"topLeft": list(TOP_LEFT), "width": SIZE[0], "height": SIZE[1], "depth": SIZE[2]}
    assert [layer["name"] for layer in properties["dataLayers"]] == list(LAYERS)
    for layer in properties["dataLayers"]:
        category, element_class = LAYERS[layer["name"]]
        assert layer["category"] == category
        assert layer["elementClass"] == element_class
        assert layer["numChannels"] == 1
        assert layer["dataFormat"] == "wkw"
        assert layer["boundingBox"] == box
        assert [m["mag"] for m in layer["mags"]] == [list(m) for m in MAGS.values()]
        for mag in layer["mags"]:
            name = geometry.mag_name(vec3(mag["mag"]))
            assert mag["path"] == f"./{layer['name']}/{name}"
            assert mag["cubeLength"] == 1024
            assert mag["axisOrder"] == {"c": 0, "x": 1, "y": 2, "z": 3}
            assert (dataset / layer["name"] / name / "header.wkw").is_file()
    assert "largestSegmentId" not in properties["dataLayers"][0]


@pytest.mark.parametrize("layer", list(LAYERS))
def test_headers_are_lz4hc_with_32_blocks_of_32(dataset: Path, layer: str) -> None:
    for mag_name in MAGS:
        with wkw.Dataset.open(str(dataset / layer / mag_name)) as ds:
            assert ds.header.block_type == wkw.Header.BLOCK_TYPE_LZ4HC
            assert ds.header.block_len == 32
            assert ds.header.file_len == 32
            assert ds.header.voxel_type == np.dtype(LAYERS[layer][1])
            assert ds.header.num_channels == 1


@pytest.mark.parametrize("mag_name", list(MAGS))
def test_data_fills_exactly_the_bounding_box(dataset: Path, mag_name: str) -> None:
    for layer in LAYERS:
        data = read(dataset, layer, mag_name, grow=1)
        inside = data[1:-1, 1:-1, 1:-1]
        shell = data.copy()
        shell[1:-1, 1:-1, 1:-1] = 0
        assert not shell.any(), f"{layer}/{mag_name} has data outside the bounding box"
        assert np.count_nonzero(inside) > 0.9 * inside.size


@pytest.mark.parametrize("mag_name", list(MAGS))
def test_color_looks_like_tissue(dataset: Path, mag_name: str) -> None:
    """Structured, not constant: cell boundaries are dark lines across bright cytoplasm."""
    color = read(dataset, "color", mag_name).astype(np.float64)
    labels = read(dataset, "segmentation", mag_name)
    assert color.std() > 20
    assert 120 < color.mean() < 200
    edge, interior = boundaries(labels)
    core = color[2:-2, 2:-2, :]
    assert edge.sum() > 1000 and interior.sum() > 0.3 * interior.size
    membrane, cytoplasm = core[edge].mean(), core[interior].mean()
    assert membrane < cytoplasm - (50 if mag_name == "1" else 25), (membrane, cytoplasm)
    # Every z-slice has its own structure, so the volume is not one picture repeated.
    slices = color.reshape(-1, color.shape[2]).T
    assert np.all(slices.std(axis=1) > 15)
    assert not np.array_equal(slices[0], slices[-1])


def test_segmentation_labels_cells(dataset: Path, properties: dict[str, Any]) -> None:
    labels = read(dataset, "segmentation", "1")
    largest = properties["dataLayers"][1]["largestSegmentId"]
    assert labels.max() == largest
    assert 30 <= largest <= 150  # a few dozen cells, counting those cut by the box
    present = np.unique(labels)
    assert np.array_equal(present[present > 0], np.arange(1, largest + 1))  # ids 1..N, none skipped
    assert 0 < np.count_nonzero(labels == 0) < 0.1 * labels.size  # a little extracellular space
    for mag_name in ("2-2-1", "4-4-2"):
        assert read(dataset, "segmentation", mag_name).max() <= largest


@pytest.mark.parametrize("mag_name", ["2-2-1", "4-4-2"])
def test_coarser_mags_are_downsampled_mag_1(dataset: Path, mag_name: str) -> None:
    factor = MAGS[mag_name]
    assert read(dataset, "color", mag_name).shape == tuple(s // f for s, f in zip(SIZE, factor))

    color = windows(read(dataset, "color", "1"), factor).astype(np.float64)
    expected = np.floor(color.mean(axis=-1) + 0.5)
    assert np.array_equal(read(dataset, "color", mag_name), expected)

    labels = windows(read(dataset, "segmentation", "1"), factor)
    coarse = read(dataset, "segmentation", mag_name)
    votes = (labels == coarse[..., None]).sum(axis=-1)
    most = np.max([(labels == labels[..., j : j + 1]).sum(axis=-1) for j in range(labels.shape[-1])], axis=0)
    assert np.array_equal(votes, most), "a coarse label is not the most frequent label of its window"
    # Spot check one window by hand.
    x, y, z = 37, 29, 11
    window = labels[x, y, z]
    values, counts = np.unique(window, return_counts=True)
    assert coarse[x, y, z] in values[counts == counts.max()]


@pytest.mark.filterwarnings("ignore:.*Not all image readers could be imported")
def test_webknossos_opens_it(dataset: Path) -> None:
    import webknossos as wk

    ds = wk.Dataset.open(dataset)
    assert set(ds.layers) == set(LAYERS)
    for name in LAYERS:
        layer = ds.get_layer(name)
        assert layer.bounding_box == wk.BoundingBox(TOP_LEFT, SIZE)
        assert set(layer.mags) == {wk.Mag(m) for m in MAGS.values()}
    assert ds.get_segmentation_layer("segmentation").largest_segment_id == read(dataset, "segmentation", "1").max()

    via_webknossos = ds.get_layer("color").get_mag("1").read()
    assert via_webknossos.shape == (1, *SIZE)
    assert np.array_equal(via_webknossos[0], read(dataset, "color", "1"))
    coarse = ds.get_layer("segmentation").get_mag("4-4-2").read()
    assert np.array_equal(coarse[0], read(dataset, "segmentation", "4-4-2"))
