"""Zarr layers (v2 and v3, written by webknossos-libs and by zarr-python) served through both trees.

Every array is read through tensorstore, zarr-python and webknossos-libs in the v2 and the v3 tree and
compared voxel for voxel with the source read directly by zarr-python (over ``[0, served shape)``, the
fill value outside the bounding box). Axis orders other than ``(c, x, y, z)`` are mapped; arrays that
cannot be mapped or decoded make their layer unusable with the reason; chunks the tree can declare in
the source's own encoding are passed through byte for byte.

The datasets are built here (``build_zarr_root``); ``test_object_storage`` serves the same ones from S3.
"""

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import requests
import tensorstore as ts
import zarr
from conftest import Server
from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, TransposeCodec, ZstdCodec

warnings.filterwarnings("ignore", message="Not all image readers could be imported")

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
    order: str = "C"  # v2: the array order; v3: "F" adds a transpose codec reversing the dimensions
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
    shape: tuple[int, int, int, int]  # served (c, x, y, z)
    bbox_lo: tuple[int, int, int]  # at this mag
    bbox_hi: tuple[int, int, int]
    fill: int | float

    @property
    def mag_name(self) -> str:
        return str(self.mag[0]) if len(set(self.mag)) == 1 else "-".join(map(str, self.mag))

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


def _at_mag(top_left: tuple[int, ...], size: tuple[int, ...], mag: tuple[int, ...]) -> tuple[tuple, tuple]:
    lo = tuple(t // m for t, m in zip(top_left, mag))
    hi = tuple(-(-(t + s) // m) for t, s, m in zip(top_left, size, mag))
    return lo, hi


def served_arrays(root: Path) -> list[ServedArray]:
    """Every servable array of both datasets under ``root`` (static: usable before they are written)."""
    arrays = []
    for name, _, _, channels in WK_LAYERS:
        for mag in WK_MAGS:
            lo, hi = _at_mag(WK_TOP_LEFT, WK_SIZE, mag)
            directory = root / ZARR_ORG / WK_DATASET / name / "-".join(map(str, mag))
            if len(set(mag)) == 1:
                directory = directory.parent / str(mag[0])
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
        layer = dataset.add_layer(
            name, "color", dtype_per_channel=dtype, num_channels=channels, data_format=data_format
        )
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


def _v3_compressors(spec: ZarrSpec) -> list:
    codecs = {
        None: [],
        "blosc": [BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle")],
        "zstd": [ZstdCodec(level=3)],
        "gzip": [GzipCodec(level=6)],
    }[spec.compressor]
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
        common = {"shape": shape, "dtype": spec.dtype, "chunks": spec.chunks, "fill_value": spec.fill}
        if spec.zarr_format == 2:
            array = zarr.create_array(
                str(directory),
                zarr_format=2,
                order=spec.order,
                compressors=_v2_compressor(spec.compressor),
                filters=[numcodecs.Delta(spec.dtype)] if spec.filters else None,
                **common,
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
                **common,
            )
        array[...] = data
        mag: dict = {"mag": [1, 1, 1], "path": f"./{spec.name}/1"}
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


def read_tensorstore(url: str, version: int) -> np.ndarray:
    spec = {"driver": "zarr" if version == 2 else "zarr3", "kvstore": {"driver": "http", "base_url": url + "/"}}
    return ts.open(spec, read=True).result().read().result()


def read_zarr_python(url: str, version: int) -> np.ndarray:
    return zarr.open_array(url, mode="r", zarr_format=version)[...]


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


# --- fixtures ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def zarr_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("zarr_root")
    build_zarr_root(root)
    return root


@pytest.fixture(scope="module")
def zarr_gateway(zarr_root: Path, server_factory: Callable[..., Server]) -> Server:
    return server_factory(zarr_root)


@pytest.fixture(scope="module")
def arrays(zarr_root: Path) -> dict[str, ServedArray]:
    return {a.id: a for a in served_arrays(zarr_root)}


def get(server: Server, path: str, **kwargs: object) -> requests.Response:
    return requests.get(server.url + path, timeout=30, **kwargs)  # type: ignore[arg-type]


# --- every array through every client, in both trees -------------------------------------------------


@pytest.mark.parametrize("client", list(CLIENTS))
@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("array_id", ARRAY_IDS)
def test_clients_read_every_array_exactly(
    zarr_gateway: Server, arrays: dict[str, ServedArray], array_id: str, tree: str, client: str
) -> None:
    check_array(zarr_gateway.url, arrays[array_id], tree, client)


@pytest.mark.parametrize("dataset", [WK_DATASET, ZP_DATASET])
@pytest.mark.parametrize("tree", list(TREES))
def test_webknossos_libs_reads_every_layer_and_mag(
    zarr_gateway: Server, arrays: dict[str, ServedArray], tree: str, dataset: str
) -> None:
    check_webknossos(zarr_gateway.url, tree, dataset, list(arrays.values()))


# --- axes ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [s for s in USABLE_SPECS if s.axes != "cxyz"], ids=lambda s: s.name)
def test_other_axis_orders_are_served_as_c_x_y_z(zarr_gateway: Server, zarr_root: Path, spec: ZarrSpec) -> None:
    """x,y,z arrays gain a channel axis of length 1; z,y,x and y,x,z are transposed. One voxel shows it."""
    source = zarr.open_array(str(zarr_root / ZARR_ORG / ZP_DATASET / spec.name / "1"), mode="r")
    x, y, z = 61, 45, 3
    voxel = source[tuple({"x": x, "y": y, "z": z}[a] for a in spec.axes)]
    for tree, version in TREES.items():
        path = f"/data/{tree}/{ZARR_ORG}/{ZP_DATASET}/{spec.name}/1"
        metadata = get(zarr_gateway, path + ("/.zarray" if version == 2 else "/zarr.json")).json()
        assert metadata["shape"] == [1, *EXTENT]
        if version == 3:
            assert metadata["dimension_names"] == list(SERVED_AXES)
        driver = "zarr" if version == 2 else "zarr3"
        served = ts.open({"driver": driver, "kvstore": {"driver": "http", "base_url": zarr_gateway.url + path + "/"}})
        assert served.result()[0, x, y, z].read().result() == voxel


def test_a_v2_tree_that_cannot_declare_the_source_order_re_chunks(zarr_gateway: Server) -> None:
    """y,x,z bytes and a crc32c codec have no v2 spelling: the v2 tree re-chunks (32^3, order F, the gateway's
    codec) while the v3 tree declares the source's own inner chunks and codecs."""
    for name in ("v3_yxz", "v3_crc_sharded"):
        spec = next(s for s in ZARR_SPECS if s.name == name)
        zarray = get(zarr_gateway, f"/data/zarr/{ZARR_ORG}/{ZP_DATASET}/{name}/1/.zarray").json()
        assert (zarray["chunks"], zarray["order"]) == ([1, 32, 32, 32], "F")
        v3 = get(zarr_gateway, f"/data/zarr3/{ZARR_ORG}/{ZP_DATASET}/{name}/1/zarr.json").json()
        inner = dict(zip(spec.axes, spec.chunks))
        assert v3["chunk_grid"]["configuration"]["chunk_shape"] == [inner.get(a, 1) for a in SERVED_AXES]
        names = [c["name"] for c in v3["codecs"]]
        assert ("crc32c" in names) == spec.crc32c, names
        assert ("transpose" in names) == (spec.axes == "yxz"), names


# --- unusable arrays ---------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", UNUSABLE_SPECS, ids=lambda s: s.name)
def test_unusable_arrays_make_their_layer_unusable_with_the_reason(zarr_gateway: Server, spec: ZarrSpec) -> None:
    for tree in TREES:
        base = f"/data/{tree}/{ZARR_ORG}/{ZP_DATASET}"
        for path in (f"{base}/{spec.name}/", f"{base}/{spec.name}/1/.zarray", f"{base}/{spec.name}/1/zarr.json"):
            response = get(zarr_gateway, path)
            assert response.status_code == 404, path
            assert response.headers["content-type"].startswith("application/json")
            assert spec.unusable in response.json()["error"], response.json()
        listing = get(zarr_gateway, base + "/")
        assert listing.status_code == 200
        line = next(line for line in listing.text.splitlines() if spec.name in line)
        assert "unavailable" in line and spec.unusable in line.replace("&#x27;", "'"), line
        assert f'href="{base}/{spec.name}/"' not in listing.text
        properties = get(zarr_gateway, f"{base}/datasource-properties.json").json()
        assert spec.name not in [layer["name"] for layer in properties["dataLayers"]]
        # the rest of the dataset serves
        assert get(zarr_gateway, f"{base}/{USABLE_SPECS[0].name}/1/").status_code == 200


# --- pass-through ------------------------------------------------------------------------------------


def _inner_chunk_from_shard(shard: bytes, position: int, count: int) -> bytes:
    """The bytes of inner chunk ``position`` (C order in the shard), found through the shard's own index."""
    index = np.frombuffer(shard[-(16 * count + 4) : -4], dtype="<u8").reshape(count, 2)
    offset, nbytes = (int(v) for v in index[position])
    assert offset != 2**64 - 1, "the inner chunk is not stored"
    return shard[offset : offset + nbytes]


# layer, mag, a served chunk that lies wholly inside the bounding box at that mag
WK_INSIDE_CHUNKS = [
    ("color3", (1, 1, 1), (0, 2, 2, 1)),
    ("rgb3", (1, 1, 1), (0, 3, 2, 1)),
    ("color3", (2, 2, 1), (0, 1, 1, 1)),
    ("color2", (1, 1, 1), (0, 2, 2, 1)),
]


@pytest.mark.parametrize(("layer", "mag", "chunk"), WK_INSIDE_CHUNKS)
def test_webknossos_chunk_inside_the_bbox_passes_through_unchanged(
    zarr_gateway: Server, arrays: dict[str, ServedArray], layer: str, mag: tuple[int, int, int], chunk: tuple
) -> None:
    """Served in both trees as the stored (inner) chunk: found via the shard index for zarr3, the file for zarr."""
    array = next(a for a in arrays.values() if a.dataset == WK_DATASET and a.layer == layer and a.mag == mag)
    if (array.directory / "zarr.json").exists():
        metadata = json.loads((array.directory / "zarr.json").read_text())
        sharding = metadata["codecs"][0]["configuration"]
        inner_shape, source_codecs = sharding["chunk_shape"], sharding["codecs"]
        shard_shape = metadata["chunk_grid"]["configuration"]["chunk_shape"]
        per_shard = [s // i for s, i in zip(shard_shape, inner_shape)]
        shard = (array.directory / "c" / "/".join(str(c // p) for c, p in zip(chunk, per_shard))).read_bytes()
        position = int(np.ravel_multi_index(tuple(c % p for c, p in zip(chunk, per_shard)), per_shard))
        stored = _inner_chunk_from_shard(shard, position, int(np.prod(per_shard)))
    else:
        metadata = json.loads((array.directory / ".zarray").read_text())
        inner_shape, source_codecs = metadata["chunks"], None
        stored = (array.directory / metadata["dimension_separator"].join(map(str, chunk))).read_bytes()
    lo = [c * s for c, s in zip(chunk[1:], inner_shape[1:])]
    assert all(a >= b and a + n <= e for a, n, b, e in zip(lo, inner_shape[1:], array.bbox_lo, array.bbox_hi))
    served_v3 = get(zarr_gateway, array.path("zarr3") + "/c/" + "/".join(map(str, chunk)))
    served_v2 = get(zarr_gateway, array.path("zarr") + "/" + ".".join(map(str, chunk)))
    assert served_v3.status_code == served_v2.status_code == 200
    assert served_v3.content == stored
    assert served_v2.content == stored
    served = get(zarr_gateway, array.path("zarr3") + "/zarr.json").json()
    assert served["chunk_grid"]["configuration"]["chunk_shape"] == inner_shape
    if source_codecs is not None:  # the source's own inner encoding: transpose, bytes, zstd
        assert [c["name"] for c in served["codecs"]] == [c["name"] for c in source_codecs]
        assert served["codecs"][0] == source_codecs[0]
        assert served["codecs"][2:] == source_codecs[2:]


def test_zarr_python_v2_blosc_chunk_is_the_stored_file(zarr_gateway: Server, zarr_root: Path) -> None:
    mag_dir = zarr_root / ZARR_ORG / ZP_DATASET / "v2_blosc_c" / "1"
    stored = (mag_dir / "0.1.0.1").read_bytes()
    source = json.loads((mag_dir / ".zarray").read_text())
    base = f"/data/zarr/{ZARR_ORG}/{ZP_DATASET}/v2_blosc_c/1"
    zarray = get(zarr_gateway, f"{base}/.zarray").json()
    assert zarray["compressor"] == source["compressor"]
    assert (zarray["order"], zarray["dtype"], zarray["chunks"]) == ("C", source["dtype"], source["chunks"])
    assert get(zarr_gateway, f"{base}/0.1.0.1").content == stored
    v3 = get(zarr_gateway, f"/data/zarr3/{ZARR_ORG}/{ZP_DATASET}/v2_blosc_c/1/c/0/1/0/1")
    assert v3.status_code == 200
    assert v3.content == stored


def test_a_source_chunk_absent_from_storage_answers_404(zarr_gateway: Server, zarr_root: Path) -> None:
    """zarr-python did not store a chunk that holds only the fill value: both trees answer 404 (read as fill)."""
    spec = next(s for s in ZARR_SPECS if s.hole is not None)
    mag_dir = zarr_root / ZARR_ORG / ZP_DATASET / spec.name / "1"
    assert not (mag_dir / "c" / "/".join(map(str, spec.hole))).exists()
    base = f"/data/{{}}/{ZARR_ORG}/{ZP_DATASET}/{spec.name}/1/"
    for tree, key in (("zarr3", "c/" + "/".join(map(str, spec.hole))), ("zarr", ".".join(map(str, spec.hole)))):
        response = get(zarr_gateway, base.format(tree) + key)
        assert response.status_code == 404, (tree, response.text)
        assert "fill value" in response.json()["error"]
        assert get(zarr_gateway, base.format(tree) + ("c/0/0/0/0" if tree == "zarr3" else "0.0.0.0")).ok


@pytest.mark.parametrize("name", ["v2_blosc_c", "v2_zstd_f", "v2_raw_f", "v3_zstd_f"])
def test_every_chunk_is_the_stored_chunk_in_both_trees(zarr_gateway: Server, zarr_root: Path, name: str) -> None:
    """The bounding box is the array's extent, so even the border chunks the gateway re-encodes (they straddle
    the box) come out as zarr-python stored them: re-encoded in the source's own encoding, typesize included."""
    mag_dir = zarr_root / ZARR_ORG / ZP_DATASET / name / "1"
    v2_source = (mag_dir / ".zarray").exists()
    chunks = [f for f in mag_dir.rglob("*") if f.is_file() and not f.name.startswith(".") and f.name != "zarr.json"]
    assert len(chunks) > 4
    for stored in chunks:
        relative = stored.relative_to(mag_dir).as_posix()
        index = relative.split(".") if v2_source else relative.split("/")[1:]
        for path in (
            f"zarr/{ZARR_ORG}/{ZP_DATASET}/{name}/1/{'.'.join(index)}",
            f"zarr3/{ZARR_ORG}/{ZP_DATASET}/{name}/1/c/{'/'.join(index)}",
        ):
            response = get(zarr_gateway, f"/data/{path}")
            assert response.status_code == 200, path
            assert response.content == stored.read_bytes(), path
