"""Zarr layers written by webknossos-libs and by zarr-python, what each served array must read as, and checks
that read them through the clients.

``build_zarr_root`` writes both datasets; test_zarr_sources serves them from a directory, test_object_storage
from S3.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numcodecs
import numpy as np
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, TransposeCodec, ZstdCodec

from gateway_storage.geometry import mag_name

from .clients import read_tensorstore, read_zarr_python

ZARR_ORG = "zarr_org"
WK_DATASET = "wk_zarr"  # written by webknossos-libs
ZP_DATASET = "zp_arrays"  # arrays written by zarr-python, properties written here
SERVED_AXES = "cxyz"
TREES = {"zarr": 2, "zarr3": 3}

# --- the webknossos-libs dataset ---------------------------------------------------------------------

WK_TOP_LEFT = (13, 40, 20)
WK_SIZE = (120, 90, 60)
WK_MAGS = ((1, 1, 1), (2, 2, 1))
# name, data_format, dtype per channel, channels
WK_LAYERS = [
    ("color3", "zarr3", "uint8", 1),
    ("color2", "zarr", "uint16", 1),
    ("rgb3", "zarr3", "uint8", 3),
]

# --- the zarr-python dataset -------------------------------------------------------------------------

EXTENT = (70, 50, 40)  # x, y, z of every zarr-python array (and its layer's bounding box)


@dataclass(frozen=True)
class ZarrSpec:
    """One zarr-python array, written into ``<layer>/1`` of the zarr-python dataset."""

    name: str
    zarr_format: int
    axes: str  # the source's dimensions, in order
    dtype: str
    chunks: tuple[int, ...]
    compressor: str | None = None  # blosc, zstd, gzip, lz4 or None
    order: Literal["C", "F"] = "C"  # v2: the array order; v3: "F" adds a transpose codec reversing the dimensions
    shards: tuple[int, ...] | None = None
    crc32c: bool = False  # v3: a crc32c codec after the compressor (not expressible in the v2 tree)
    names: str = "dimension_names"  # v3: "dimension_names"; v2: "axisOrder" or "" (the default x,y,z)
    channels: int = 1
    fill: int | float = 0
    hole: tuple[int, ...] | None = None  # a chunk (source dims) left as the fill value: never stored
    filters: bool = False
    unusable: str = ""  # words of the reason the gateway must give; empty for servable arrays


ZARR_SPECS = [
    ZarrSpec("v2_blosc_c", 2, "cxyz", "uint16", (1, 32, 32, 16), "blosc", "C", names="axisOrder"),
    ZarrSpec("v2_zstd_f", 2, "cxyz", "uint8", (1, 32, 16, 32), "zstd", "F", names="axisOrder"),
    ZarrSpec("v2_gzip_xyz", 2, "xyz", "float32", (32, 32, 32), "gzip", "C", names=""),
    ZarrSpec("v2_raw_f", 2, "cxyz", "uint32", (1, 16, 32, 32), None, "F", names="axisOrder"),
    ZarrSpec("v2_zyx", 2, "zyx", "int16", (16, 32, 32), "blosc", "C", names="axisOrder"),
    ZarrSpec("v3_sharded_rgb", 3, "cxyz", "uint8", (3, 32, 32, 16), "blosc", shards=(3, 64, 64, 32), channels=3),
    ZarrSpec("v3_zstd_f", 3, "cxyz", "uint16", (1, 32, 32, 16), "zstd", "F", fill=7, hole=(0, 1, 0, 1)),
    ZarrSpec("v3_gzip_xyz", 3, "xyz", "int8", (32, 32, 16), "gzip"),
    ZarrSpec("v3_crc_sharded", 3, "cxyz", "uint64", (1, 16, 16, 16), None, shards=(1, 32, 32, 32), crc32c=True),
    ZarrSpec("v3_zyx_sharded", 3, "zyx", "uint16", (16, 32, 32), "zstd", "F", shards=(32, 64, 64)),
    ZarrSpec("v3_yxz", 3, "yxz", "uint8", (32, 32, 16), "blosc"),
    ZarrSpec("bad_tyx", 3, "tyx", "uint8", (4, 32, 32), "zstd", unusable="['t', 'y', 'x']"),
    ZarrSpec("bad_5d", 2, "abxyz", "uint8", (1, 1, 32, 32, 32), "zstd", names="", unusable="5-dimensional"),
    ZarrSpec("bad_lz4", 2, "cxyz", "uint8", (1, 32, 32, 32), "lz4", names="axisOrder", unusable="'lz4'"),
    ZarrSpec(
        "bad_filter", 2, "cxyz", "uint8", (1, 32, 32, 32), "zstd", names="axisOrder", filters=True, unusable="filters"
    ),
]
USABLE_SPECS = [s for s in ZARR_SPECS if not s.unusable]
UNUSABLE_SPECS = [s for s in ZARR_SPECS if s.unusable]
ELEMENT_CLASS = {("uint8", 3): "uint24", ("float32", 1): "float", ("float64", 1): "double"}


@dataclass(frozen=True)
class ServedArray:
    """What one served mag array must read as."""

    dataset: str
    layer: str
    mag: tuple[int, int, int]
    directory: Path  # the source array
    axes: str
    shape: tuple[int, ...]  # served (c, x, y, z)
    bbox_lo: tuple[int, ...]  # at this mag, (x, y, z)
    bbox_hi: tuple[int, ...]
    fill: int | float

    @property
    def mag_name(self) -> str:
        return mag_name(self.mag)

    @property
    def id(self) -> str:
        return f"{self.dataset}/{self.layer}/{self.mag_name}"

    def path(self, tree: str) -> str:
        return f"/data/{tree}/{ZARR_ORG}/{self.dataset}/{self.layer}/{self.mag_name}"

    def expected(self) -> np.ndarray:
        """The source read directly by zarr-python, as ``(c, x, y, z)`` over the served shape."""
        source = zarr.open_array(str(self.directory), mode="r")[...]
        data = np.transpose(source, [self.axes.index(a) for a in SERVED_AXES if a in self.axes])
        if "c" not in self.axes:
            data = data[np.newaxis]
        out = np.full(self.shape, self.fill, dtype=data.dtype)
        common = tuple(slice(0, min(a, b)) for a, b in zip(self.shape, data.shape))
        out[common] = data[common]
        inside = np.zeros(self.shape, dtype=bool)
        inside[(slice(None), *(slice(a, b) for a, b in zip(self.bbox_lo, self.bbox_hi)))] = True
        out[~inside] = self.fill
        return out


def _at_mag(
    top_left: tuple[int, ...], size: tuple[int, ...], mag: tuple[int, ...]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    lo = tuple(t // m for t, m in zip(top_left, mag))
    hi = tuple(-(-(t + s) // m) for t, s, m in zip(top_left, size, mag))
    return lo, hi


def served_arrays(root: Path) -> list[ServedArray]:
    """Every servable array of both datasets under ``root`` (static: usable before they are written)."""
    arrays = []
    for name, _, _, channels in WK_LAYERS:
        for mag in WK_MAGS:
            lo, hi = _at_mag(WK_TOP_LEFT, WK_SIZE, mag)
            directory = root / ZARR_ORG / WK_DATASET / name / mag_name(mag)
            arrays.append(ServedArray(WK_DATASET, name, mag, directory, "cxyz", (channels, *hi), lo, hi, 0))
    for spec in USABLE_SPECS:
        directory = root / ZARR_ORG / ZP_DATASET / spec.name / "1"
        shape = (spec.channels, *EXTENT)
        arrays.append(
            ServedArray(ZP_DATASET, spec.name, (1, 1, 1), directory, spec.axes, shape, (0, 0, 0), EXTENT, spec.fill)
        )
    return arrays


ARRAYS = served_arrays(Path("."))
ARRAY_IDS = [a.id for a in ARRAYS]


# --- writing the datasets ----------------------------------------------------------------------------


def _random(dtype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -100) if info.min < 0 else 10, min(info.max, 2**31), size=shape, dtype=dtype)


def _write_webknossos(path: Path) -> None:
    import webknossos as wk

    rng = np.random.default_rng(5)
    dataset = wk.Dataset(path, voxel_size=(11.24, 11.24, 28.0))
    for name, data_format, dtype, channels in WK_LAYERS:
        layer = dataset.add_layer(name, "color", dtype=dtype, num_channels=channels, data_format=data_format)
        layer.bounding_box = wk.BoundingBox(WK_TOP_LEFT, WK_SIZE)
        for mag in WK_MAGS:
            sharding = {"shard_shape": 64} if data_format == "zarr3" else {}
            view = layer.add_mag(mag, chunk_shape=32, compress=True, **sharding)
            lo, hi = _at_mag(WK_TOP_LEFT, WK_SIZE, mag)
            data = _random(dtype, (channels, *(h - low for low, h in zip(lo, hi))), rng)
            view.write(data if channels > 1 else data[0], absolute_offset=tuple(v * m for v, m in zip(lo, mag)))


def _source_shape(spec: ZarrSpec) -> tuple[int, ...]:
    sizes = {"c": spec.channels, "x": EXTENT[0], "y": EXTENT[1], "z": EXTENT[2], "t": 4, "a": 1, "b": 1}
    return tuple(sizes[a] for a in spec.axes)


def _v2_compressor(name: str | None) -> numcodecs.abc.Codec | None:
    return {
        None: None,
        "blosc": numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE),
        "zstd": numcodecs.Zstd(3),
        "gzip": numcodecs.GZip(6),
        "lz4": numcodecs.LZ4(),
    }[name]


def _v3_compressors(spec: ZarrSpec) -> list[Any]:
    table: dict[str | None, list[Any]] = {
        None: [],
        "blosc": [BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle")],
        "zstd": [ZstdCodec(level=3)],
        "gzip": [GzipCodec(level=6)],
    }
    codecs = table[spec.compressor]
    return [*codecs, Crc32cCodec()] if spec.crc32c else codecs


def _write_zarr_python(path: Path) -> None:
    rng = np.random.default_rng(9)
    layers = []
    for spec in ZARR_SPECS:
        shape = _source_shape(spec)
        data = _random(spec.dtype, shape, rng)
        if spec.hole is not None:
            data[tuple(slice(i * c, (i + 1) * c) for i, c in zip(spec.hole, spec.chunks))] = spec.fill
        directory = path / spec.name / "1"
        if spec.zarr_format == 2:
            array = zarr.create_array(
                str(directory),
                zarr_format=2,
                order=spec.order,
                compressors=_v2_compressor(spec.compressor),
                filters=[numcodecs.Delta(spec.dtype)] if spec.filters else None,
                shape=shape,
                dtype=spec.dtype,
                chunks=spec.chunks,
                fill_value=spec.fill,
            )
        else:
            transpose = [TransposeCodec(order=list(range(len(shape)))[::-1])] if spec.order == "F" else []
            array = zarr.create_array(
                str(directory),
                zarr_format=3,
                shards=spec.shards,
                filters=transpose,
                compressors=_v3_compressors(spec),
                dimension_names=list(spec.axes),
                shape=shape,
                dtype=spec.dtype,
                chunks=spec.chunks,
                fill_value=spec.fill,
            )
        array[...] = data
        mag: dict[str, Any] = {"mag": [1, 1, 1], "path": f"./{spec.name}/1"}
        if spec.names == "axisOrder":
            mag["axisOrder"] = {a: i for i, a in enumerate(spec.axes)}
        element_class = ELEMENT_CLASS.get((spec.dtype, spec.channels), spec.dtype)
        layers.append(
            {
                "name": spec.name,
                "category": "color",
                "boundingBox": {"topLeft": [0, 0, 0], "width": EXTENT[0], "height": EXTENT[1], "depth": EXTENT[2]},
                "elementClass": element_class,
                "dataFormat": "zarr" if spec.zarr_format == 2 else "zarr3",
                "numChannels": spec.channels,
                "mags": [mag],
            }
        )
    properties = {
        "id": {"name": ZP_DATASET, "team": ""},
        "scale": {"factor": [4.0, 4.0, 40.0], "unit": "nanometer"},
        "dataLayers": layers,
        "version": 1,
    }
    (path / "datasource-properties.json").write_text(json.dumps(properties, indent=2))


def build_zarr_root(root: Path) -> list[ServedArray]:
    """Both Zarr datasets under ``root/zarr_org``; returns what every servable array must read as."""
    _write_webknossos(root / ZARR_ORG / WK_DATASET)
    _write_zarr_python(root / ZARR_ORG / ZP_DATASET)
    return served_arrays(root)


# --- reading through the clients ---------------------------------------------------------------------


CLIENTS: dict[str, Callable[[str, int], np.ndarray]] = {
    "tensorstore": read_tensorstore,
    "zarr-python": read_zarr_python,
}


def check_array(base_url: str, array: ServedArray, tree: str, client: str) -> None:
    """One served array through one client equals the source, voxel for voxel."""
    data = CLIENTS[client](base_url + array.path(tree), TREES[tree])
    expected = array.expected()
    assert data.shape == expected.shape, f"{array.id} in {tree} through {client}"
    assert data.dtype == expected.dtype, f"{array.id} in {tree} through {client}"
    np.testing.assert_array_equal(data, expected, err_msg=f"{array.id} in {tree} through {client}")


def check_webknossos(base_url: str, tree: str, dataset: str, arrays: list[ServedArray]) -> None:
    """webknossos-libs opens the served dataset and reads every layer's mags as the source holds them."""
    import webknossos as wk
    from upath import UPath

    opened = wk.Dataset.open(UPath(f"{base_url}/data/{tree}/{ZARR_ORG}/{dataset}"))
    mine = [a for a in arrays if a.dataset == dataset]
    assert sorted(opened.layers) == sorted({a.layer for a in mine})
    for array in mine:
        layer = opened.get_layer(array.layer)
        assert layer.data_format.value == tree
        mag_view = layer.get_mag(array.mag)
        box = layer.bounding_box.align_with_mag(mag_view.mag, ceil=True)
        data = mag_view.read(absolute_bounding_box=box)
        in_mag = box.in_mag(mag_view.mag)
        window = tuple(slice(t, t + s) for t, s in zip(in_mag.topleft, in_mag.size))
        expected = array.expected()[(slice(None), *window)]
        np.testing.assert_array_equal(data.reshape(expected.shape), expected, err_msg=f"{array.id} in {tree}")
