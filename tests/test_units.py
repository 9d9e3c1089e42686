"""In-process tests of the gateway's pure parts, without a server.

The URL table, array layouts, virtual shard plans over a real WKW file (written by the ``wkw``
package, the truth), the shard index, chunk keys, Blosc framing checked by real decoders
(numcodecs and blosc2), the catalog's reasons for what it cannot serve, and the error map.
"""

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import blosc2
import lz4.block
import numcodecs
import numpy as np
import pytest
import wkw
from hypothesis import given
from hypothesis import strategies as st
from support.tree_names import BELONGS, LEVELS, METADATA

from gateway.http.errors import HttpError, error_answer, rule_for
from gateway.http.urls import LOGIN_PATHS, MAX_LABELLED, PLACES, TREE_ROUTES, Level, RouteLabels, parse_data_path
from gateway.logs import json_string
from gateway.shard_formats.sharding_indexed import (
    EMPTY,
    ShardIndexError,
    ShardLayout,
    chunk_extent,
    decode_shard_index,
    encode_shard_index,
    index_nbytes,
)
from gateway.sources.catalog import Catalog
from gateway.sources.dataset import BrokenDataset, Dataset
from gateway.sources.mag import ChunkNotFound
from gateway.sources.properties import BoundingBox
from gateway.sources.registry import SourceFormats
from gateway.sources.wkw_source import WkwMagSource
from gateway.zarr.blosc import lz4_chunk_prefix, memcpy_chunk_prefix
from gateway.zarr.chunks import served_mag
from gateway.zarr.codecs import Codec
from gateway.zarr.documents import ArrayZarrJson, ZArray
from gateway.zarr.keys import MalformedKey, parse_v2_key, parse_v3_key
from gateway.zarr.layout import AXES, array_zarr_json
from gateway.zarr.nodes import CoordinateArray, SourceArray
from gateway.zarr.shards import ShardPlans, plan_shard, read_shard
from gateway.zarr.trees import TREES, NodeNotFound, ServeOptions, _layout
from gateway_storage import ByteLRU, FileChangedError, LocalStore, StoreUnavailableError
from wkw_adapter import WkwError, WkwFileCache

BLOCK = 32
FILE_LEN = 2  # blocks per file side: 64-voxel files, 8 blocks per shard
# The bounding box of the unit-test layers, in mag-1 voxels. In file cube (0, 0, 0) it leaves x-block 0
# straddling the box (masked), x-block 1 inside (stored), and z-block 1 wholly outside (absent).
TOP_LEFT = (16, 0, 0)
SIZE = (100, 64, 32)
EXTENT = (128, 64, 64)  # what the wkw package writes: random voxels, also outside the box
DATASET = "units_dataset"
WKW_LAYERS = {  # name: (dtype, wkw block type)
    "lz4": (np.uint8, wkw.Header.BLOCK_TYPE_LZ4HC),
    "raw": (np.uint16, wkw.Header.BLOCK_TYPE_RAW),
}


# --- the URL table ----------------------------------------------------------------------------------

LEVEL_PATHS = {  # level name -> (URL segments below the tree, Level)
    "tree": ((), Level.TREE),
    "organization": (("org",), Level.ORGANIZATION),
    "dataset": (("org", "ds"), Level.DATASET),
    "group": (("org", "ds", "grp"), Level.GROUP),
    "array": (("org", "ds", "grp", "arr"), Level.ARRAY),
}


@pytest.mark.parametrize("tree", ["zarr", "zarr3", "xarray", "zarr3_experimental"])
@pytest.mark.parametrize("level", LEVELS)
def test_url_table_places_every_metadata_name(tree: str, level: str) -> None:
    segments, expected_level = LEVEL_PATHS[level]
    listing = parse_data_path("/data/" + "/".join((tree, *segments)) + "/")
    assert (listing.level, listing.names, listing.file, listing.key) == (expected_level, segments, None, None)
    assert listing.misplaced is None and listing.route == "listing"
    assert listing.tree is TREE_ROUTES[tree] and listing.tree_name == tree
    assert listing.base == "/data/" + "/".join((tree, *segments)) + "/"
    belongs = BELONGS[TREE_ROUTES[tree].name][level]
    for name in METADATA:
        target = parse_data_path("/data/" + "/".join((tree, *segments, name)))
        assert (target.level, target.names, target.key, target.route) == (expected_level, segments, None, "metadata")
        if name in belongs:
            assert (target.file, target.misplaced) == (name, None), f"{tree} {level} {name}"
        else:
            assert target.file is None, f"{tree} {level} {name}"
            assert target.misplaced and name in target.misplaced, f"{tree} {level} {name}"


def test_misplaced_names_say_why() -> None:
    assert "other Zarr version" in (parse_data_path("/data/zarr/o/d/l/1/zarr.json").misplaced or "")
    assert "other Zarr version" in (parse_data_path("/data/zarr3/o/d/.zgroup").misplaced or "")
    assert "dataset level" in (parse_data_path("/data/zarr/o/d/l/datasource-properties.json").misplaced or "")
    assert "array level" in (parse_data_path("/data/zarr/o/d/l/1/.zgroup").misplaced or "")
    # A metadata name with more below it names no node: a 404, not a chunk key or a deeper node.
    deeper = parse_data_path("/data/zarr/o/d/.zarray/x/y")
    assert deeper.level == Level.DATASET and deeper.misplaced and deeper.key is None


@pytest.mark.parametrize(
    ("path", "names", "key"),
    [
        ("/data/zarr/o/d/l/1/0.1.2.3", ("o", "d", "l", "1"), "0.1.2.3"),
        ("/data/zarr3/o/d/l/2-2-1/c/0/1/2/3", ("o", "d", "l", "2-2-1"), "c/0/1/2/3"),
        ("/data/xarray/o/d/1/color/c/4/5/6", ("o", "d", "1", "color"), "c/4/5/6"),
        ("/data/xarray/o/d/1/x/c/0", ("o", "d", "1", "x"), "c/0"),
    ],
)
def test_url_table_chunk_keys(path: str, names: tuple[str, ...], key: str) -> None:
    target = parse_data_path(path)
    assert (target.level, target.names, target.key, target.file, target.route) == (
        Level.ARRAY,
        names,
        key,
        None,
        "chunk",
    )


@pytest.mark.parametrize(
    "path",
    [
        "/data/zarr/../secret/",
        "/data/zarr/o/../d/.zgroup",
        "/data/zarr3/o/d/l/1/c/0/../../zarr.json",
        "/data/xarray/o/./d/",
        "/data/zarr/o/d\\x/",
        "/data/zarr/o/d\0/",
    ],
)
def test_dot_segments_are_400(path: str) -> None:
    with pytest.raises(HttpError) as raised:
        parse_data_path(path)
    assert raised.value.status == 400
    assert "not allowed" in raised.value.message


def test_unknown_tree_names_the_trees() -> None:
    with pytest.raises(NodeNotFound) as raised:
        parse_data_path("/data/zarr4/o/d/")
    message = str(raised.value)
    assert "'zarr4'" in message
    assert all(name in message for name in ("zarr", "zarr3", "xarray"))
    assert rule_for(raised.value).status == 404


# --- a real WKW layer written by the wkw package ----------------------------------------------------


def _properties(layers: dict[str, list[int]], copies: dict[str, str] | None = None) -> dict[str, Any]:
    """A datasource-properties.json with one WKW layer per entry (its mags as scalars); ``copies`` names
    the unit-test layer a differently named layer is a copy of."""
    copies = copies or {}
    return {
        "id": {"name": DATASET, "team": "org"},
        "scale": {"factor": [4.0, 4.0, 35.0], "unit": "nanometer"},
        "dataLayers": [
            {
                "name": name,
                "category": "color",
                "boundingBox": {"topLeft": list(TOP_LEFT), "width": SIZE[0], "height": SIZE[1], "depth": SIZE[2]},
                "elementClass": np.dtype(WKW_LAYERS[copies.get(name, name)][0]).name,
                "dataFormat": "wkw",
                "mags": [{"mag": [m, m, m]} for m in mags],
            }
            for name, mags in layers.items()
        ],
    }


@pytest.fixture(scope="module")
def wkw_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root with one dataset of an LZ4HC uint8 and a raw uint16 layer (mag 1), random voxels."""
    root = tmp_path_factory.mktemp("units_root")
    directory = root / "org" / DATASET
    rng = np.random.default_rng(3)
    for name, (dtype, block_type) in WKW_LAYERS.items():
        header = wkw.Header(dtype, block_len=BLOCK, file_len=FILE_LEN, block_type=block_type)
        data = rng.integers(1, 250, (1, *EXTENT)).astype(dtype)
        with wkw.Dataset.create(str(directory / name / "1"), header) as ds:
            ds.write((0, 0, 0), data)
    (directory / "datasource-properties.json").write_text(json.dumps(_properties({n: [1] for n in WKW_LAYERS})))
    return root


def _truth(root: Path, layer: str) -> np.ndarray:
    """The wkw package's read of the extent, zero outside the bounding box (what must be served)."""
    with wkw.Dataset.open(str(root / "org" / DATASET / layer / "1")) as ds:
        data: np.ndarray = ds.read((0, 0, 0), EXTENT)
    out = np.zeros_like(data)
    box = tuple(slice(t, t + s) for t, s in zip(TOP_LEFT, SIZE))
    out[(slice(None), *box)] = data[(slice(None), *box)]
    return out


def _source(root: Path, layer: str) -> WkwMagSource:
    storage = LocalStore(str(root))
    bbox = BoundingBox.model_validate({"topLeft": TOP_LEFT, "width": SIZE[0], "height": SIZE[1], "depth": SIZE[2]})
    return WkwMagSource((1, 1, 1), str(root / "org" / DATASET / layer / "1"), bbox, WkwFileCache(storage))


# --- layouts ------------------------------------------------------------------------------------


@pytest.mark.parametrize("layer", list(WKW_LAYERS))
def test_layout_of_wkw_mags(wkw_root: Path, layer: str) -> None:
    source = _source(wkw_root, layer)
    shape = (1, *(t + s for t, s in zip(TOP_LEFT, SIZE)))
    plain = _layout(source, 2, ServeOptions())
    assert (plain.shape, plain.chunk_shape, plain.shard_shape) == (shape, (1, 32, 32, 32), None)
    assert plain.dtype == WKW_LAYERS[layer][0] and plain.codec is Codec.BLOSC_LZ4 and plain.native is None
    # Sharding is a v3 layout: the v2 tree ignores the option.
    assert _layout(source, 2, ServeOptions(sharded=True)).shard_shape is None
    sharded = _layout(source, 3, ServeOptions(codec=Codec.GZIP, sharded=True))
    cube = BLOCK * FILE_LEN
    assert (sharded.shape, sharded.chunk_shape, sharded.shard_shape) == (shape, (1, 32, 32, 32), (1, cube, cube, cube))
    assert sharded.codec is Codec.BLOSC_LZ4  # inner chunks are stored blocks framed as Blosc
    assert sharded.grid_shape == (1, 2, 1, 1)
    wide = _layout(source, 3, ServeOptions(codec=Codec.ZSTD, chunk_edge=64))
    assert (wide.chunk_shape, wide.shard_shape, wide.codec) == ((1, 64, 64, 64), None, Codec.ZSTD)
    assert wide.grid_shape == (1, 2, 1, 1)
    assert plain.grid_shape == (1, 4, 2, 1)


def test_array_zarr_json_with_and_without_channel(wkw_root: Path) -> None:
    layout = _layout(_source(wkw_root, "raw"), 3, ServeOptions())
    with_channel = array_zarr_json(layout)
    assert with_channel["shape"] == [1, 116, 64, 32]
    assert with_channel["chunk_grid"]["configuration"]["chunk_shape"] == [1, 32, 32, 32]
    assert with_channel["dimension_names"] == list(AXES)
    assert with_channel["data_type"] == "uint16"
    assert with_channel["codecs"][0] == {"name": "transpose", "configuration": {"order": [3, 2, 1, 0]}}
    assert with_channel["codecs"][1] == {"name": "bytes", "configuration": {"endian": "little"}}
    assert with_channel["codecs"][2]["name"] == "blosc"
    without = array_zarr_json(layout, ("x", "y", "z"), {"units": "nm"})
    assert without["shape"] == [116, 64, 32]
    assert without["chunk_grid"]["configuration"]["chunk_shape"] == [32, 32, 32]
    assert without["dimension_names"] == ["x", "y", "z"]
    assert without["attributes"] == {"units": "nm"}
    assert without["codecs"][0] == {"name": "transpose", "configuration": {"order": [2, 1, 0]}}
    assert without["codecs"][1:] == with_channel["codecs"][1:]


def test_every_array_renders_complete_documents(wkw_root: Path) -> None:
    """A mag and a computed coordinate array render the same documents: every member the type names."""
    mag = SourceArray(served_mag(_source(wkw_root, "raw"), _layout(_source(wkw_root, "raw"), 3, ServeOptions())), AXES)
    coordinate = CoordinateArray("x", 5, 2.0, {"units": "nm"})
    for node in (mag, coordinate):
        assert set(node.zarray()) == set(ZArray.__annotations__)
        assert set(node.zarr_json()) == set(ArrayZarrJson.__annotations__)
        assert node.v2_attributes()["_ARRAY_DIMENSIONS"] == list(node.dimension_names)
    assert coordinate.zarray() == {
        "zarr_format": 2,
        "shape": [5],
        "chunks": [5],
        "dtype": "<f8",
        "compressor": None,
        "fill_value": 0.0,
        "order": "C",
        "filters": None,
        "dimension_separator": ".",
    }
    assert coordinate.zarr_json()["codecs"] == [{"name": "bytes", "configuration": {"endian": "little"}}]
    assert coordinate.zarr_json()["attributes"] == {"units": "nm"}


def test_sharded_array_zarr_json_without_channel_drops_it_inside_the_shard_too(wkw_root: Path) -> None:
    """Without a channel axis the inner chunk shape and the inner transpose must lose it as well."""
    layout = _layout(_source(wkw_root, "lz4"), 3, ServeOptions(sharded=True))
    with_channel = array_zarr_json(layout)["codecs"][0]["configuration"]
    assert with_channel["chunk_shape"] == [1, 32, 32, 32]
    assert with_channel["codecs"][0]["configuration"]["order"] == [3, 2, 1, 0]
    document = array_zarr_json(layout, ("x", "y", "z"))
    assert document["shape"] == [116, 64, 32]
    assert document["chunk_grid"]["configuration"]["chunk_shape"] == [64, 64, 64]
    sharding = document["codecs"][0]["configuration"]
    assert sharding["chunk_shape"] == [32, 32, 32]
    assert sharding["codecs"][0] == {"name": "transpose", "configuration": {"order": [2, 1, 0]}}


# --- shard plans over a real WKW file ---------------------------------------------------------------


@pytest.mark.parametrize("layer", list(WKW_LAYERS))
def test_shard_plan_inner_chunks_decode_to_the_truth(wkw_root: Path, layer: str) -> None:
    source = _source(wkw_root, layer)
    truth = _truth(wkw_root, layer)
    dtype = WKW_LAYERS[layer][0]
    cube = (0, 0, 0)
    blocks = source.stored_blocks(cube)
    assert blocks is not None
    plan = plan_shard(source, blocks, cube)
    shard = read_shard(source, plan, 0, plan.size)
    assert len(shard) == plan.size
    chunks = FILE_LEN**3
    index = decode_shard_index(shard[-index_nbytes(chunks) :], chunks, True, "test shard")
    np.testing.assert_array_equal(
        index, decode_shard_index(plan.index, chunks, True, "plan")
    )  # the plan's index is the tail
    kinds = {"stored": 0, "masked": 0, "absent": 0}
    for x in range(FILE_LEN):
        for y in range(FILE_LEN):
            for z in range(FILE_LEN):
                offset, nbytes = (int(v) for v in index[(x * FILE_LEN + y) * FILE_LEN + z])
                lo = np.array((x, y, z)) * BLOCK
                hi = lo + BLOCK
                if np.any(hi <= TOP_LEFT) or np.any(lo >= np.add(TOP_LEFT, SIZE)):
                    assert (offset, nbytes) == (EMPTY, EMPTY), f"block {(x, y, z)} lies outside the box"
                    kinds["absent"] += 1
                    continue
                assert offset + nbytes <= plan.data_size
                chunk = shard[offset : offset + nbytes]
                decoded = np.frombuffer(numcodecs.Blosc().decode(chunk), dtype=dtype)
                assert bytes(blosc2.decompress(chunk)) == decoded.tobytes()
                expected = truth[0, lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]]
                np.testing.assert_array_equal(
                    decoded.reshape((BLOCK,) * 3, order="F"), expected, err_msg=str((x, y, z))
                )
                inside = np.all(lo >= TOP_LEFT) and np.all(hi <= np.add(TOP_LEFT, SIZE))
                kinds["stored" if inside else "masked"] += 1
                # A block that straddles the box holds data outside it in the file: the shard must not.
                if not inside:
                    assert np.any(expected == 0)
    assert kinds == {"stored": 2, "masked": 2, "absent": 4}
    # A range inside the shard is the same bytes as the whole shard's slice.
    middle = plan.data_size // 3
    assert read_shard(source, plan, middle, middle + 1000) == shard[middle : middle + 1000]


def test_shard_plan_of_a_cube_without_a_file(wkw_root: Path) -> None:
    assert _source(wkw_root, "lz4").stored_blocks((5, 0, 0)) is None


# --- the shard index ----------------------------------------------------------------------------


def test_shard_index_round_trip_and_checksum() -> None:
    offsets = np.array([0, 100, 0, 250], dtype=np.uint64)
    sizes = np.array([100, 150, 0, 7], dtype=np.uint64)
    present = np.array([True, True, False, True])
    raw = encode_shard_index(offsets, sizes, present)
    assert len(raw) == index_nbytes(4) == 4 * 16 + 4
    table = decode_shard_index(raw, 4, True, "here")
    assert table.tolist() == [[0, 100], [100, 150], [EMPTY, EMPTY], [250, 7]]
    without_checksum = decode_shard_index(raw[:-4], 4, False, "here")
    assert without_checksum.tolist() == table.tolist()
    damaged = bytearray(raw)
    damaged[17] ^= 0x01
    with pytest.raises(ShardIndexError, match="checksum"):
        decode_shard_index(bytes(damaged), 4, True, "shard s")
    with pytest.raises(ShardIndexError, match="expected 68"):
        decode_shard_index(raw[:-1], 4, True, "shard s")
    assert rule_for(ShardIndexError("x")).status == 500  # a storage fault, never a 404


def test_a_shard_layout_places_entries_in_c_order_and_checks_them_against_the_shard() -> None:
    layout = ShardLayout((2, 3), index_at_end=False, index_checksum=False)
    assert [layout.position((x, y)) for x in range(2) for y in range(3)] == list(range(6))
    assert layout.position((3, 4)) == layout.position((1, 1))  # array coordinates: the shard's own
    coords = np.array([[1, 2], [0, 1]])
    raw = layout.encode(coords, np.array([40, 10]), np.array([5, 30]), np.array([True, True]))
    table = layout.decode(raw[:-4], "shard s")  # encode always adds the crc32c; this layout has none
    assert chunk_extent(table, layout.position((1, 2)), 45, "shard s") == (40, 5)
    assert chunk_extent(table, layout.position((0, 0)), 45, "shard s") is None
    with pytest.raises(ShardIndexError, match="points past the end"):
        chunk_extent(table, layout.position((1, 2)), 44, "shard s")
    assert layout.index_offset(200, "shard s") == 0
    assert ShardLayout((2, 3)).index_offset(200, "shard s") == 200 - (6 * 16 + 4)
    with pytest.raises(ShardIndexError, match="smaller than its index"):
        ShardLayout((2, 3)).index_offset(99, "shard s")


# --- chunk keys ---------------------------------------------------------------------------------


def test_keys_parse() -> None:
    assert parse_v2_key("0.1.22.333", 4) == (0, 1, 22, 333)
    assert parse_v3_key("c/0/1/22/333", 4) == (0, 1, 22, 333)
    assert parse_v3_key("c/7/8/9", 3) == (7, 8, 9)
    assert parse_v2_key("9" * 18 + ".0.0.0", 4)[0] == int("9" * 18)


@pytest.mark.parametrize(
    ("parse", "key", "rank", "why"),
    [
        (parse_v2_key, "0.0.0", 4, "has 3 indices"),
        (parse_v2_key, "0.0.0.0.0", 4, "has 5 indices"),
        (parse_v2_key, "0/0/0/0", 4, "has 1 indices"),
        (parse_v2_key, "0." + "1" * 19 + ".0.0", 4, "out of range"),
        (parse_v3_key, "0/0/0/0", 4, "must start with 'c/'"),
        (parse_v3_key, "c.0.0.0.0", 4, "must start with 'c/'"),
        (parse_v3_key, "c/0/0/0", 4, "has 3 indices"),
        (parse_v3_key, "c/0/0/0/0", 3, "has 4 indices"),
        (parse_v3_key, "c/0/0/0/" + "9" * 40, 4, "out of range"),
    ],
)
def test_malformed_keys(parse: Callable[[str, int], tuple[int, ...]], key: str, rank: int, why: str) -> None:
    with pytest.raises(MalformedKey, match=why):
        parse(key, rank)


# an Arabic-Indic digit among them: str.isdigit() would take it
NOT_AN_INDEX = ["a", "-1", "", "1e3", "\u0663", " 1", "+1"]


@pytest.mark.parametrize(
    ("parse", "template"), [(parse_v2_key, "0.{}.0.0"), (parse_v3_key, "c/0/{}/0/0")], ids=["v2", "v3"]
)
@pytest.mark.parametrize("index", NOT_AN_INDEX)
def test_an_index_that_is_not_a_non_negative_integer_is_malformed(
    parse: Callable[[str, int], tuple[int, ...]], template: str, index: str
) -> None:
    with pytest.raises(MalformedKey, match="not a non-negative integer"):
        parse(template.format(index), 4)


# --- Blosc framing, checked by real decoders --------------------------------------------------------


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "float32"])
def test_lz4_block_framed_as_blosc_decodes(dtype: str) -> None:
    rng = np.random.default_rng(5)
    data = (rng.integers(0, 8, 32**3) * 3).astype(dtype)  # compressible, like image data
    raw = data.tobytes()
    block = lz4.block.compress(raw, mode="high_compression", store_size=False)
    assert len(block) < len(raw)
    chunk = lz4_chunk_prefix(len(block), len(raw)) + block
    assert bytes(numcodecs.Blosc().decode(chunk)) == raw
    assert bytes(blosc2.decompress(chunk)) == raw


@pytest.mark.parametrize("size", [1, 3 * 32**3, 2 * 32**3 + 5])
def test_memcpy_framing_decodes(size: int) -> None:
    raw = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    chunk = memcpy_chunk_prefix(size) + raw
    assert len(chunk) == size + 16
    assert bytes(numcodecs.Blosc().decode(chunk)) == raw
    assert bytes(blosc2.decompress(chunk)) == raw


# --- the catalog ------------------------------------------------------------------------------------


def _catalog(root: Path) -> Catalog:
    storage = LocalStore(str(root))
    return Catalog(storage, SourceFormats(storage, 2 << 20))


def test_catalog_broken_properties_say_why(tmp_path: Path) -> None:
    (tmp_path / "org" / "not_json").mkdir(parents=True)
    (tmp_path / "org" / "not_json" / "datasource-properties.json").write_text("{ not json")
    (tmp_path / "org" / "invalid").mkdir()
    (tmp_path / "org" / "invalid" / "datasource-properties.json").write_text(
        json.dumps({"id": {"name": "x"}, "scale": [1, 1, 1], "dataLayers": "nope"})
    )
    (tmp_path / "org" / "no_properties").mkdir()
    outside = tmp_path.parent / f"{tmp_path.name}-outside.json"  # a valid file, but outside the data root
    outside.write_text(json.dumps(_properties({"lz4": [1]})))
    (tmp_path / "org" / "escaped").mkdir()
    (tmp_path / "org" / "escaped" / "datasource-properties.json").symlink_to(outside)
    catalog = _catalog(tmp_path)
    escaped = catalog.dataset("org", "escaped")
    assert isinstance(escaped, BrokenDataset)
    assert "outside the data root" in escaped.reason
    not_json = catalog.dataset("org", "not_json")
    assert isinstance(not_json, BrokenDataset)
    assert "not readable JSON" in not_json.reason
    invalid = catalog.dataset("org", "invalid")
    assert isinstance(invalid, BrokenDataset)
    assert "is invalid" in invalid.reason and "dataLayers" in invalid.reason
    assert catalog.dataset("org", "no_properties") is None
    assert catalog.dataset("org", "..") is None
    assert sorted(d.name for d in catalog.datasets("org")) == ["escaped", "invalid", "not_json"]


def test_catalog_missing_mag_directory_is_a_layer_problem(wkw_root: Path, tmp_path: Path) -> None:
    directory = tmp_path / "org" / DATASET
    directory.mkdir(parents=True)
    for layer in WKW_LAYERS:  # a copy: a symlink out of the data root is (rightly) not followed
        shutil.copytree(wkw_root / "org" / DATASET / layer, directory / layer)
    (directory / "datasource-properties.json").write_text(json.dumps(_properties({"lz4": [1, 2], "raw": [2]})))
    dataset = _catalog(tmp_path).dataset("org", DATASET)
    assert isinstance(dataset, Dataset)
    lz4_layer, raw_layer = dataset.layers["lz4"], dataset.layers["raw"]
    assert list(lz4_layer.mags) == [(1, 1, 1)]
    assert lz4_layer.problems == ["mag 2: directory not found or outside the data root"]
    assert raw_layer.mags == {}
    assert raw_layer.problems == ["mag 2: directory not found or outside the data root"]
    # The tree lists the layer without mags as unusable, with that reason, and serves the other.
    view = TREES["zarr"].build(dataset, ServeOptions(), ShardPlans(1 << 20))
    assert list(view.groups) == ["lz4"]
    assert "mag 2: directory not found" in view.unusable["raw"]
    assert "mag 2" in view.problems["lz4"]
    with pytest.raises(NodeNotFound, match="mag 2: directory not found"):
        view.group("raw")
    with pytest.raises(NodeNotFound, match=r"there are 1 \(mag 2: directory not found"):
        view.array(view.groups["lz4"], "2")


def test_catalog_element_class_that_the_data_does_not_hold_is_a_layer_problem(wkw_root: Path, tmp_path: Path) -> None:
    directory = tmp_path / "org" / DATASET
    directory.mkdir(parents=True)
    shutil.copytree(wkw_root / "org" / DATASET / "lz4", directory / "lz4")
    properties = _properties({"lz4": [1]}, copies={"lz4": "raw"})  # says uint16; the files hold uint8
    (directory / "datasource-properties.json").write_text(json.dumps(properties))
    dataset = _catalog(tmp_path).dataset("org", DATASET)
    assert isinstance(dataset, Dataset)
    layer = dataset.layers["lz4"]
    assert layer.mags == {}
    assert layer.problems == ["mag 1: the data holds 1 x uint8, but elementClass 'uint16' means 1 x uint16"]


def test_xarray_layer_named_like_a_coordinate_does_not_replace_it(wkw_root: Path, tmp_path: Path) -> None:
    """A layer named ``x`` cannot be the variable ``x``: that name is the coordinate every variable is indexed by."""
    directory = tmp_path / "org" / DATASET
    directory.mkdir(parents=True)
    for name in ("x", "lz4"):
        shutil.copytree(wkw_root / "org" / DATASET / "lz4", directory / name)
    properties = _properties({"x": [1], "lz4": [1]}, copies={"x": "lz4"})
    (directory / "datasource-properties.json").write_text(json.dumps(properties))
    dataset = _catalog(tmp_path).dataset("org", DATASET)
    assert isinstance(dataset, Dataset)
    view = TREES["xarray"].build(dataset, ServeOptions(), ShardPlans(1 << 20))
    group = view.group("1")
    for axis in ("x", "y", "z"):
        assert group.arrays[axis].dimension_names == (axis,), f"the coordinate {axis} was replaced"
    assert group.arrays["lz4"].dimension_names == ("x", "y", "z")
    assert "'x'" in view.problems.get("1", ""), "the layer left out is not reported"


# --- the error map ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "status", "retry_after", "message"),
    [
        (ChunkNotFound("outside"), 404, None, "outside"),
        (NodeNotFound("no layer 'q'"), 404, None, "no layer 'q'"),
        (MalformedKey("bad key"), 400, None, "bad key"),
        (FileChangedError("f.wkw changed"), 503, "1", "being rewritten; retry"),
        (StoreUnavailableError("timeout"), 503, "2", "the store did not answer: timeout"),
        (WkwError("bad header"), 500, None, "storage fault: bad header"),
        (OSError("EIO"), 500, None, "storage fault: EIO"),
        (RuntimeError("secret detail"), 500, None, "internal error; it has been logged"),
        (KeyError("k"), 500, None, "internal error; it has been logged"),
    ],
)
def test_error_map(exc: Exception, status: int, retry_after: str | None, message: str) -> None:
    rule = rule_for(exc)
    assert (rule.status, rule.retry_after) == (status, retry_after)
    answer = error_answer(exc, "GET /data/x")
    assert answer.status == status
    body = json.loads(answer.body)
    assert body["status"] == status
    assert message in body["error"]
    if status == 500 and "internal" in message:
        assert "secret detail" not in body["error"]  # unexpected errors do not leak their text
    headers = dict(answer.headers)
    assert headers.get(b"retry-after") == (retry_after.encode() if retry_after else None)


@pytest.mark.parametrize("separator", [5, ["/"], "", "-", ".."], ids=repr)
@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_crafted_chunk_key_separator_makes_the_array_unusable(
    tmp_path: Path, zarr_format: Literal[2, 3], separator: object
) -> None:
    """Only '.' and '/' separate chunk key parts; anything else is refused when the array is opened, with why."""
    import zarr

    from gateway.sources.mag import SourceError
    from gateway.sources.zarr_source import ZarrMagSource

    directory = tmp_path / "array"
    zarr.create_array(str(directory), shape=(1, 8, 8, 8), chunks=(1, 8, 8, 8), dtype="uint8", zarr_format=zarr_format)
    name = ".zarray" if zarr_format == 2 else "zarr.json"
    document = json.loads((directory / name).read_text())
    if zarr_format == 2:
        document["dimension_separator"] = separator
    else:
        document["chunk_key_encoding"] = {"name": "default", "configuration": {"separator": separator}}
    (directory / name).write_text(json.dumps(document))
    box = BoundingBox.model_validate({"topLeft": [0, 0, 0], "width": 8, "height": 8, "depth": 8})
    with pytest.raises(SourceError, match=r"separator"):
        ZarrMagSource((1, 1, 1), LocalStore(str(tmp_path)), str(directory), box, None, ByteLRU(1 << 20))


# --- settings --------------------------------------------------------------------------------------


def test_the_codec_setting_names_exactly_the_codecs_the_gateway_encodes(tmp_path: Path) -> None:
    """Settings name codecs without importing the encoders; each name is a Codec, and each Codec a name."""
    from typing import get_args

    from pydantic import ValidationError

    from gateway.settings import CodecName, Settings

    assert set(get_args(CodecName)) == {codec.value for codec in Codec}
    assert Codec(Settings(root=str(tmp_path)).codec) is Codec.BLOSC_LZ4
    assert Codec(Settings(root=str(tmp_path), codec="zstd").codec) is Codec.ZSTD
    with pytest.raises(ValidationError, match="blosc-zstd"):
        Settings.model_validate({"root": str(tmp_path), "codec": "lz4"})


@pytest.mark.parametrize(
    ("name", "text", "items"),
    [
        ("trusted_proxies", " 10.0.0.0/8 , 192.168.1.7,,", ("10.0.0.0/8", "192.168.1.7")),
        ("remote_roots", "https://host/data, s3://bucket/x ,", ("https://host/data", "s3://bucket/x")),
        ("extra_roots", "/mnt/a:/mnt/b c::", ("/mnt/a", "/mnt/b c")),
    ],
)
def test_list_settings_read_and_write_their_text_form(tmp_path: Path, name: str, text: str, items: tuple[str]) -> None:
    """A list setting from text or a JSON list; start-up hands it to the workers as text, which reads back the same."""
    from gateway.settings import Settings

    settings = Settings.model_validate({"root": str(tmp_path), name: text})
    assert getattr(settings, name) == items
    written = settings.model_dump(mode="json")[name]
    assert isinstance(written, str)
    assert getattr(Settings.model_validate({"root": str(tmp_path), name: written}), name) == items
    assert getattr(Settings.model_validate({"root": str(tmp_path), name: json.dumps(list(items))}), name) == items


# --- the access log's JSON strings ------------------------------------------------------------------------------


@given(st.text())
def test_the_access_logs_json_strings_are_json_dumps(text: str) -> None:
    """The shortcut for plain text writes exactly what ``json.dumps`` writes, for any text a path may hold."""
    assert json_string(text) == json.dumps(text)
    assert json.loads(json_string(text)) == text


# --- the metric labels of the URL table --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "label"),
    [
        ("GET", "/data/zarr/org/ds/color/1/0.1.2.3", "chunk"),
        ("HEAD", "/data/zarr3/org/ds/color/1/c/0/1/2/3", "chunk"),
        ("GET", "/data/zarr/org/ds/color/1/.zarray", "metadata"),
        ("GET", "/data/zarr/org/ds/", "listing"),
        ("GET", "/data/zarr", "listing"),
        ("GET", "/data/precomputed/org/ds/color/info", "metadata"),
        ("GET", "/data/nothing/org/ds/", "other"),  # no tree: a 404
        ("GET", "/data/zarr/org/../x", "other"),  # a 400
        ("GET", "/data/meshes/org/ds/seg/multires/info", "mesh"),
        ("GET", "/preview/org/ds/color.png", "preview"),
        ("GET", "/neuroglancer/index.html", "viewer"),
        ("POST", "/share/org/ds", "share"),
        ("GET", "/", "index"),
        ("GET", "/favicon.ico", "favicon"),
        ("GET", "/healthz", "healthz"),
        ("GET", "/metrics", "metrics"),
        ("GET", "/login", "other"),  # sign-in not served here: no route
        ("GET", "/healthz/", "other"),
        ("GET", "/elsewhere", "other"),
        ("OPTIONS", "/data/zarr/org/ds/color/1/0.1.2.3", "preflight"),
        ("POST", "/data/zarr/org/ds/color/1/0.1.2.3", "other"),  # a 405
        ("DELETE", "/share/org/ds", "other"),
    ],
)
def test_the_metric_label_is_the_url_tables(method: str, path: str, label: str) -> None:
    served = RouteLabels(place for place in PLACES if place.path not in LOGIN_PATHS)
    assert served.of(method, path) == label


def test_the_labels_remembered_are_bounded_whatever_paths_are_asked() -> None:
    """A read's label is remembered per path (a viewer asks again), but only of a short path, and only so many:
    a client asking for long or ever new paths cannot make a worker hold more than a few MiB of them."""
    served = RouteLabels(PLACES)
    long_path = "/data/zarr/org/ds/color/1/" + "0." * 400 + "0"
    assert served.of("GET", long_path) == served.of("GET", long_path)
    assert long_path not in served._reads
    for number in range(MAX_LABELLED + 10):
        served.of("GET", f"/data/zarr/org/ds/color/1/{number}")
    assert 0 < len(served._reads) <= MAX_LABELLED
