"""The xarray tree through xarray itself (zarr-python and fsspec underneath, dask for the reads).

A dataset is a DataTree with one group per mag; a mag is one Dataset with a variable per layer on
the dataset's grid (the largest extent of its layers at that mag), physical coordinates, and dask
chunks equal to the served chunks. Every voxel is compared with the ``wkw`` package's read of the
data, zero outside each layer's bounding box; chunk bytes are the zarr3 tree's bytes.
"""

import warnings
from collections.abc import Callable
from pathlib import Path

import aiohttp
import numpy as np
import pytest
import requests
import wkw
import xarray as xr
from support.datasets import LAYERS, MAGS, ORG, TOKEN, mag_name
from support.datasets import WrittenDataset as Data
from support.servers import Server

warnings.filterwarnings("ignore", message="Not all image readers could be imported")

HEADERS = {"X-Auth-Token": TOKEN}
STORAGE = {"headers": HEADERS}
EDGE = 32  # the served chunk edge (the gateway's default)
LAYER_NAMES = [layer[0] for layer in LAYERS]
CHANNELS = {layer[0]: layer[2] for layer in LAYERS}
VOXEL_SIZE = (11.24, 11.24, 28.0)  # what the main test dataset declares

# A dataset whose two layers have different bounding boxes (mag-1 voxels): ``wide`` from the origin, and
# ``offset``, smaller and shifted, reaching further in y and z. The grid is the largest extent of both.
SHIFTED = "shifted_dataset"
SHIFTED_VOXEL_SIZE = (4.0, 5.0, 30.0)
BOXES = {  # layer: (topLeft, size, dtype, compressed, mags); only "offset" has mag 4-4-2
    "wide": ((0, 0, 0), (100, 64, 40), "uint8", True, ((1, 1, 1), (2, 2, 1))),
    "offset": ((40, 50, 10), (30, 40, 50), "uint16", False, ((1, 1, 1), (2, 2, 1), (4, 4, 2))),
}
SHIFTED_MAGS = ((1, 1, 1), (2, 2, 1), (4, 4, 2))
OUTSIDE_WRITTEN = "offset"  # its raw files also hold voxels before its box along x (written with wkw)


def xarray_url(server: Server, *parts: str, dataset: str = "wk_dataset") -> str:
    return "/".join([server.url, "data", "xarray", ORG, dataset, *parts])


def box_at_mag(layer: str, mag: tuple[int, int, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The mag-``mag`` voxels a layer's box covers, rounded outward."""
    top_left, size = BOXES[layer][:2]
    lo = tuple(t // m for t, m in zip(top_left, mag))
    hi = tuple(-(-(t + s) // m) for t, s, m in zip(top_left, size, mag))
    return lo, hi


def layers_with(mag: tuple[int, int, int]) -> list[str]:
    return [layer for layer, spec in BOXES.items() if mag in spec[4]]


def shifted_grid(mag: tuple[int, int, int]) -> tuple[int, ...]:
    """The dataset's grid at ``mag``: the largest extent of the layers that have it."""
    return tuple(max(box_at_mag(layer, mag)[1][axis] for layer in layers_with(mag)) for axis in range(3))


@pytest.fixture(scope="module")
def shifted_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root holding the two-box dataset, written by webknossos-libs in WKW format."""
    import webknossos as wk

    root = tmp_path_factory.mktemp("xarray_root")
    rng = np.random.default_rng(11)
    dataset = wk.Dataset(root / ORG / SHIFTED, voxel_size=SHIFTED_VOXEL_SIZE)
    for name, (top_left, size, dtype, compressed, mags) in BOXES.items():
        layer = dataset.add_layer(name, "color", dtype=dtype, data_format="wkw")
        layer.bounding_box = wk.BoundingBox(top_left, size)
        for mag in mags:
            view = layer.add_mag(mag, chunk_shape=EDGE, shard_shape=2 * EDGE, compress=compressed)
            lo, hi = box_at_mag(name, mag)
            data = rng.integers(1, 250, size=tuple(h - low for low, h in zip(lo, hi))).astype(dtype)
            view.write(data, absolute_offset=tuple(v * m for v, m in zip(lo, mag)))
    for mag in BOXES[OUTSIDE_WRITTEN][4]:  # voxels in the files but outside the box, which must never be served
        lo, hi = box_at_mag(OUTSIDE_WRITTEN, mag)
        with wkw.Dataset.open(str(root / ORG / SHIFTED / OUTSIDE_WRITTEN / mag_name(mag))) as ds:
            ds.write((0, lo[1], lo[2]), np.full((1, lo[0], hi[1] - lo[1], hi[2] - lo[2]), 7, dtype=np.uint16))
    return root


@pytest.fixture(scope="module")
def shifted_gateway(shifted_root: Path, tokens_file: Path, server_factory: Callable[..., Server]) -> Server:
    return server_factory(shifted_root, tokens_file=tokens_file)


def shifted_truth(root: Path, layer: str, mag: tuple[int, int, int]) -> np.ndarray:
    """The wkw package's read of the dataset's grid at ``mag``, zero outside the layer's box."""
    grid = shifted_grid(mag)
    with wkw.Dataset.open(str(root / ORG / SHIFTED / layer / mag_name(mag))) as ds:
        data: np.ndarray = ds.read((0, 0, 0), grid)[0]
    out = np.zeros_like(data)
    box = tuple(slice(a, b) for a, b in zip(*box_at_mag(layer, mag)))
    out[box] = data[box]
    return out


def check_coordinates(
    ds: xr.Dataset, grid: tuple[int, ...], voxel_size: tuple[float, ...], mag: tuple[int, ...]
) -> None:
    for axis, name in enumerate("xyz"):
        coordinate = ds[name]
        assert coordinate.dims == (name,)
        assert coordinate.attrs["units"] == "nanometer"
        np.testing.assert_allclose(coordinate.values, np.arange(grid[axis]) * voxel_size[axis] * mag[axis], rtol=1e-12)


def check_dask_chunks(variable: xr.DataArray) -> None:
    """Dask chunks are the served chunks: 32 along x, y, z (the last one what is left), one along c."""
    for dim, chunks in zip(variable.dims, variable.chunks or ()):
        if str(dim).startswith("c_"):
            assert chunks == (variable.sizes[dim],), dim
            continue
        size = variable.sizes[dim]
        assert chunks == (EDGE,) * (size // EDGE) + ((size % EDGE,) if size % EDGE else ()), dim


# --- the main test dataset: five layers, three mags ------------------------------------------------


def test_datatree_has_one_group_per_mag(gateway: Server) -> None:
    tree = xr.open_datatree(xarray_url(gateway) + "/", engine="zarr", storage_options=STORAGE)
    assert set(tree.children) == {mag_name(m) for m in MAGS}
    for mag in MAGS:
        group = tree[mag_name(mag)]
        assert set(group.data_vars) == set(LAYER_NAMES)
        assert group.sizes["x"] == group["color_u8"].sizes["x"]
    assert not tree.to_dataset().data_vars  # the dataset level holds only groups


@pytest.mark.parametrize("mag", MAGS, ids=mag_name)
def test_a_mag_is_one_dataset_equal_to_the_wkw_truth(
    gateway: Server, test_data: Data, mag: tuple[int, int, int]
) -> None:
    ds = xr.open_zarr(xarray_url(gateway, mag_name(mag)), storage_options=STORAGE)
    assert set(ds.data_vars) == set(LAYER_NAMES)
    grid = test_data.expected("color_u8", mag).shape[1:]
    check_coordinates(ds, grid, VOXEL_SIZE, mag)
    channel_dims = {dim for dim in ds.dims if str(dim).startswith("c_")}
    assert channel_dims == {f"c_{name}" for name, channels in CHANNELS.items() if channels > 1} == {"c_rgb"}
    for name in LAYER_NAMES:
        variable = ds[name]
        expected = test_data.expected(name, mag)
        if CHANNELS[name] > 1:
            assert variable.dims == (f"c_{name}", "x", "y", "z")
        else:
            assert variable.dims == ("x", "y", "z")
            expected = expected[0]
        assert variable.dtype == expected.dtype
        check_dask_chunks(variable)
        assert variable.attrs["long_name"] == name
        np.testing.assert_array_equal(variable.compute().values, expected, err_msg=f"{name} mag {mag_name(mag)}")


@pytest.mark.parametrize(
    ("layer", "mag"), [("color_u8", (4, 4, 2)), ("color_u16", (2, 2, 1)), ("rgb", (1, 1, 1)), ("color_f32", (1, 1, 1))]
)
def test_chunk_bytes_are_the_zarr3_trees(gateway: Server, layer: str, mag: tuple[int, int, int]) -> None:
    """The xarray tree's ``c/x/y/z`` (``c/0/x/y/z`` with channels) is the zarr3 tree's ``c/0/x/y/z``, byte for byte."""
    base = f"{gateway.url}/data/{{}}/{ORG}/wk_dataset"
    with requests.Session() as http:
        http.headers.update(HEADERS)
        shape = http.get(f"{base.format('zarr3')}/{layer}/{mag_name(mag)}/zarr.json").json()["shape"]
        grid = [-(-s // EDGE) for s in shape[1:]]
        compared = absent = 0
        for x in range(grid[0]):
            for y in range(grid[1]):
                for z in range(min(grid[2], 2)):
                    key = f"{x}/{y}/{z}" if CHANNELS[layer] == 1 else f"0/{x}/{y}/{z}"
                    own = http.get(f"{base.format('xarray')}/{mag_name(mag)}/{layer}/c/{key}")
                    zarr3 = http.get(f"{base.format('zarr3')}/{layer}/{mag_name(mag)}/c/0/{x}/{y}/{z}")
                    assert own.status_code == zarr3.status_code, f"{x}/{y}/{z}"
                    assert own.status_code in (200, 404), own.text
                    assert own.content == zarr3.content, f"{x}/{y}/{z}"
                    compared += own.status_code == 200
                    absent += own.status_code == 404
    assert compared > 0
    # At mag 1 the first chunks along x lie before the box (topLeft x 37); at coarser mags every chunk meets it.
    assert (absent > 0) == (mag == (1, 1, 1))


def test_the_xarray_tree_is_plain_when_the_v3_tree_is_sharded(gateway: Server, sharded_gateway: Server) -> None:
    """xarray reads chunk by chunk: its tree keeps plain chunks whatever ``v3_layout`` says."""
    path = f"data/xarray/{ORG}/wk_dataset/1/color_u8"
    plain = requests.get(f"{gateway.url}/{path}/zarr.json", headers=HEADERS, timeout=10).json()
    sharded = requests.get(f"{sharded_gateway.url}/{path}/zarr.json", timeout=10).json()
    assert sharded == plain
    assert [codec["name"] for codec in sharded["codecs"]] == ["transpose", "bytes", "blosc"]
    for key in ("1/1/0", "2/1/1", "0/0/0"):
        plain_chunk = requests.get(f"{gateway.url}/{path}/c/{key}", headers=HEADERS, timeout=10)
        sharded_chunk = requests.get(f"{sharded_gateway.url}/{path}/c/{key}", timeout=10)
        assert (sharded_chunk.status_code, sharded_chunk.content) == (plain_chunk.status_code, plain_chunk.content)


def test_without_the_token_xarray_is_refused(gateway: Server) -> None:
    with pytest.raises(aiohttp.ClientResponseError) as raised:
        xr.open_zarr(xarray_url(gateway, "1"))
    assert raised.value.status == 401


# --- layers with different bounding boxes on one grid -------------------------------------------


@pytest.mark.parametrize("mag", SHIFTED_MAGS, ids=mag_name)
def test_layers_share_the_datasets_grid(shifted_gateway: Server, shifted_root: Path, mag: tuple[int, int, int]) -> None:
    ds = xr.open_zarr(xarray_url(shifted_gateway, mag_name(mag), dataset=SHIFTED), storage_options=STORAGE)
    grid = shifted_grid(mag)
    assert dict(ds.sizes) == dict(zip("xyz", grid))
    assert set(ds.data_vars) == set(layers_with(mag))
    # x from "wide", y and z from "offset"; where only "offset" has the mag, its own extent.
    extent = (100, 90, 60) if mag != (4, 4, 2) else (70, 90, 60)
    assert grid == tuple(-(-e // m) for e, m in zip(extent, mag))
    check_coordinates(ds, grid, SHIFTED_VOXEL_SIZE, mag)
    for layer in layers_with(mag):
        variable = ds[layer]
        assert variable.dims == ("x", "y", "z") and variable.dtype == BOXES[layer][2]
        check_dask_chunks(variable)
        truth = shifted_truth(shifted_root, layer, mag)
        if layer == OUTSIDE_WRITTEN:  # the files hold data before the box: the mask is what keeps it out
            with wkw.Dataset.open(str(shifted_root / ORG / SHIFTED / layer / mag_name(mag))) as stored:
                lo, hi = box_at_mag(layer, mag)
                assert np.all(stored.read((0, lo[1], lo[2]), (lo[0], hi[1] - lo[1], hi[2] - lo[2])) == 7)
        assert np.count_nonzero(truth) == np.prod(np.subtract(*box_at_mag(layer, mag)[::-1]))  # data fills the box
        np.testing.assert_array_equal(variable.compute().values, truth, err_msg=f"{layer} mag {mag_name(mag)}")
    # A cut-out across chunk edges and both layers' box edges (mag 1: x 40 and 70, y 50 and 64, z 10 and 40).
    window = {
        name: slice(start // m, -(-stop // m)) for name, start, stop, m in zip("xyz", (25, 30, 5), (75, 70, 45), mag)
    }
    cut = ds.isel(window).compute()
    for layer in layers_with(mag):
        truth = shifted_truth(shifted_root, layer, mag)[window["x"], window["y"], window["z"]]
        assert truth.shape == cut[layer].shape
        assert np.any(truth == 0) and np.any(truth != 0)  # the cut-out crosses the box
        np.testing.assert_array_equal(cut[layer].values, truth, err_msg=f"cut-out of {layer} at {mag_name(mag)}")


def test_datatree_groups_hold_the_layers_that_have_the_mag(shifted_gateway: Server) -> None:
    tree = xr.open_datatree(xarray_url(shifted_gateway, dataset=SHIFTED) + "/", engine="zarr", storage_options=STORAGE)
    assert set(tree.children) == {mag_name(m) for m in SHIFTED_MAGS}
    for mag in SHIFTED_MAGS:
        group = tree[mag_name(mag)]
        assert set(group.data_vars) == set(layers_with(mag)), mag
        assert dict(group.sizes) == dict(zip("xyz", shifted_grid(mag)))


def test_chunks_outside_a_layers_box_are_absent(shifted_gateway: Server) -> None:
    base = xarray_url(shifted_gateway, "1", dataset=SHIFTED)
    with requests.Session() as http:
        http.headers.update(HEADERS)

        def status(layer: str, key: str) -> int:
            return http.get(f"{base}/{layer}/c/{key}").status_code

        assert status("offset", "0/0/0") == 404  # x < 32 lies before the box (from 40), though its file has data
        assert status("offset", "1/1/0") == 200  # x 32..64, y 32..64, z 0..32 meets it
        assert status("wide", "0/2/0") == 404  # y 64..96 lies past the box (to 64), inside the grid (90)
        assert status("wide", "0/0/1") == 200  # z 32..64 meets the box (to 40)
        assert status("wide", "3/0/0") == 200  # x 96..128: the last, partial chunk of the grid
        past = http.get(f"{base}/wide/c/4/0/0")  # past the grid: absent, and says so
        assert past.status_code == 404 and "past the array" in past.json()["error"]
        assert http.get(f"{base}/wide/c/0/0").status_code == 400  # wrong rank is the client's mistake
