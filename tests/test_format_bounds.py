"""N5, Neuroglancer precomputed and meshes held to the bounds the Zarr source holds (``gateway/sources/bounds.py``).

Whoever can write a dataset can write its ``attributes.json`` or ``info``: a chunk that would decode to
gigabytes, NaN, fields of the wrong JSON type. Each makes its mag or layer unusable with the reason and
leaves its neighbours served; a stored chunk larger than any chunk can be is a storage fault, never read
into memory; what a read decodes is what the source says it decodes (event loop or thread, and the memory
budget, follow from it); and a mesh read decodes no more than its bound.
"""

import gzip
import itertools
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tensorstore as ts
import wkw
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.servers import Server, assert_no_unexpected_errors, assert_reason

ORG = "bounds"
DATASET = "formats"
SIZE = (64, 64, 64)
BLOCK = (32, 32, 32)


def layer_entry(name: str, data_format: str, category: str = "color", dtype: str = "uint8") -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "category": category,
        "boundingBox": {"topLeft": [0, 0, 0], "width": SIZE[0], "height": SIZE[1], "depth": SIZE[2]},
        "elementClass": dtype,
        "dataFormat": data_format,
        "mags": [{"mag": [1, 1, 1], "path": f"./{name}/1"}],
    }
    if category == "segmentation":
        entry["largestSegmentId"] = 255
    return entry


def write_properties(dataset: Path, layers: list[dict[str, Any]]) -> None:
    dataset.mkdir(parents=True, exist_ok=True)
    document = {"id": {"name": dataset.name, "team": ""}, "scale": {"factor": [1, 1, 1], "unit": "nanometer"}}
    (dataset / "datasource-properties.json").write_text(json.dumps({**document, "dataLayers": layers}))


def voxels(seed: int, dtype: str = "uint8") -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 200, SIZE).astype(dtype)


def write_n5(mag: Path, data: np.ndarray, block: tuple[int, ...] = BLOCK) -> None:
    metadata: dict[str, Any] = {"dimensions": list(data.shape), "blockSize": list(block), "dataType": str(data.dtype)}
    metadata["compression"] = {"type": "gzip"}
    spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(mag)}, "metadata": metadata}
    ts.open(spec, create=True).result()[...] = data


def pc_scale(chunk: tuple[int, ...] = BLOCK, offset: tuple[int, ...] = (0, 0, 0)) -> dict[str, Any]:
    return {
        "key": "1",
        "size": list(SIZE),
        "resolution": [1.0, 1.0, 1.0],
        "voxel_offset": list(offset),
        "chunk_sizes": [list(chunk)],
        "encoding": "raw",
    }


def write_precomputed(volume: Path, data: np.ndarray, chunk: tuple[int, ...] = BLOCK) -> None:
    scale = {key: value for key, value in pc_scale(chunk).items() if key != "chunk_sizes"}
    spec = {
        "driver": "neuroglancer_precomputed",
        "kvstore": {"driver": "file", "path": str(volume)},
        "multiscale_metadata": {"type": "image", "data_type": str(data.dtype), "num_channels": 1},
        "scale_metadata": {**scale, "chunk_size": list(chunk)},
    }
    ts.open(spec, create=True, open=True).result()[...] = data[..., None]
    (volume / "1").mkdir(exist_ok=True)


def with_constant(path: Path, field: Callable[[dict[str, Any]], dict[str, Any]], constant: str) -> None:
    """Set a field of a JSON file to a list that starts with ``constant`` (NaN, Infinity: not JSON, but what
    Python's json and many writers emit)."""
    patch_json(path, lambda document: field(document).update(resolution="__constant__"))
    path.write_text(path.read_text().replace('"__constant__"', f"[{constant}, 1, 1]"))
    assert constant in path.read_text()


def patch_json(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))


def get(server: Server, path: str) -> requests.Response:
    return requests.get(server.url + path, timeout=120)


# --- the data root ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Root:
    server: Server
    root: Path

    def dataset(self, name: str = DATASET) -> Path:
        return self.root / ORG / name


# layer: (how it is broken, words of the reason its mag gives)
BROKEN = {
    "huge_pc": ("an info whose chunk is 2048^3", ("decodes to 8589934592 bytes", "more than 134217728")),
    "huge_n5": ("a blockSize of 4096^3", ("decodes to 68719476736 bytes", "more than 134217728")),
    "nan_n5": ("NaN in attributes.json", ("attributes.json is not usable", "NaN is not JSON")),
    "nan_pc": ("Infinity in the info", ("info is not usable", "Infinity is not JSON")),
    "deep_n5": ("attributes.json nested 100,000 deep", ("nests deeper than",)),
    "typed_n5": ("blockSize of strings", ("blockSize.0: Input should be a valid integer",)),
    "typed_pc": ("chunk_sizes[0] of floats", ("chunk_sizes.0.0: Input should be a valid integer",)),
    "minishards_pc": ("a sharding of 2^40 minishards", ("minishard_bits 40 is more than 18",)),
}
GOOD = ("good_n5", "good_pc", "big_chunk_file_pc")


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory, server_factory: Callable[..., Server]) -> Root:
    root = tmp_path_factory.mktemp("format-bounds")
    dataset = root / ORG / DATASET
    layers = []
    for seed, name in enumerate((*GOOD, *BROKEN)):
        kind = "n5" if name.endswith("_n5") else "neuroglancerPrecomputed"
        layers.append(layer_entry(name, kind))
        if kind == "n5":
            write_n5(dataset / name / "1", voxels(seed))
        else:
            write_precomputed(dataset / name, voxels(seed))
    write_properties(dataset, layers)

    def scale(name: str, change: Callable[[dict[str, Any]], None]) -> None:
        patch_json(dataset / name / "info", lambda info: change(info["scales"][0]))

    scale("huge_pc", lambda s: s.update(chunk_sizes=[[2048, 2048, 2048]]))
    patch_json(dataset / "huge_n5" / "1" / "attributes.json", lambda a: a.update(blockSize=[4096, 4096, 4096]))
    with_constant(dataset / "nan_n5" / "1" / "attributes.json", lambda attributes: attributes, "NaN")
    with_constant(dataset / "nan_pc" / "info", lambda info: info["scales"][0], "Infinity")
    (dataset / "deep_n5" / "1" / "attributes.json").write_text("[" * 100_000 + "]" * 100_000)
    patch_json(dataset / "typed_n5" / "1" / "attributes.json", lambda a: a.update(blockSize=["32", "32", "32"]))
    scale("typed_pc", lambda s: s.update(chunk_sizes=[[32.0, 32, 32]]))
    sharding = {"@type": "neuroglancer_uint64_sharded_v1", "preshift_bits": 0, "hash": "identity"}
    scale("minishards_pc", lambda s: s.update(sharding={**sharding, "minishard_bits": 40, "shard_bits": 0}))
    # a chunk file of 4 MiB where a raw 32^3 uint8 chunk is 32 KiB: no codec makes a chunk that large
    chunk = dataset / "big_chunk_file_pc" / "1" / "32-64_32-64_32-64"
    assert chunk.is_file()
    chunk.write_bytes(b"\0" * (4 << 20))
    return Root(server_factory(root), root)


@pytest.mark.parametrize("tree", ["zarr", "zarr3"])
@pytest.mark.parametrize("layer", list(BROKEN))
def test_metadata_past_the_bounds_makes_the_mag_unusable_with_the_reason(bounded: Root, layer: str, tree: str) -> None:
    metadata = ".zarray" if tree == "zarr" else "zarr.json"
    assert_reason(get(bounded.server, f"/data/{tree}/{ORG}/{DATASET}/{layer}/1/{metadata}"), 404, *BROKEN[layer][1])
    page = get(bounded.server, f"/data/zarr3/{ORG}/{DATASET}/")
    assert page.status_code == 200 and BROKEN[layer][1][0] in page.text.replace("&#x27;", "'")
    assert_no_unexpected_errors(bounded.server)


@pytest.mark.parametrize("layer", ["good_n5", "good_pc"])
def test_neighbours_of_broken_mags_are_served_exactly(bounded: Root, layer: str) -> None:
    import zarr

    url = f"{bounded.server.url}/data/zarr/{ORG}/{DATASET}/{layer}/1"
    served = zarr.open_array(url, mode="r")[0]
    np.testing.assert_array_equal(served, voxels(GOOD.index(layer)))
    assert get(bounded.server, f"/data/zarr/{ORG}/{DATASET}/.zgroup").status_code == 200
    assert get(bounded.server, f"/data/zarr/{ORG}/").status_code == 200
    assert_no_unexpected_errors(bounded.server)


def test_a_chunk_file_larger_than_any_chunk_is_a_storage_fault_never_read(bounded: Root) -> None:
    base = f"/data/zarr/{ORG}/{DATASET}/big_chunk_file_pc/1"
    assert_reason(get(bounded.server, f"{base}/0.1.1.1"), 500, "32-64_32-64_32-64", "its format allows there")
    assert get(bounded.server, f"{base}/0.0.0.0").status_code == 200  # its other chunks are served
    assert_no_unexpected_errors(bounded.server)


# --- wrong JSON types in every field, through a running gateway ----------------------------------------

JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.lists(st.integers(-5, 5000), max_size=5),
    st.lists(st.text(max_size=3), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)
N5_FIELDS = ["dimensions", "blockSize", "dataType", "compression", "axes", "compressionType"]
INFO_FIELDS = ["data_type", "num_channels", "scales", "type"]
SCALE_FIELDS = ["key", "size", "voxel_offset", "chunk_sizes", "encoding", "resolution", "sharding"]
_examples = itertools.count()


def _check_answers(server: Server, dataset: str) -> None:
    for path in (
        f"/data/zarr/{ORG}/{dataset}/",
        f"/data/zarr/{ORG}/{dataset}/layer/.zattrs",
        f"/data/zarr/{ORG}/{dataset}/layer/1/.zarray",
        f"/data/zarr/{ORG}/{dataset}/layer/1/0.1.1.1",
        f"/data/zarr3/{ORG}/{dataset}/layer/1/zarr.json",
        f"/data/zarr3/{ORG}/{dataset}/layer/1/c/0/0/0/0",
        f"/data/xarray/{ORG}/{dataset}/zarr.json",
        f"/preview/{ORG}/{dataset}/layer.png",
    ):
        response = get(server, path)
        if path.startswith("/preview/") and response.status_code == 413:
            # a crafted block size can make one preview decode more than its bound: refused before the read
            assert "too large or too many to preview" in response.json()["error"], response.text[:300]
            continue
        assert response.status_code in (200, 404, 409), (path, response.status_code, response.text[:300])
        if response.status_code != 200:
            assert "internal error" not in response.json()["error"], (path, response.text[:300])
    assert get(server, f"/data/zarr/{ORG}/{DATASET}/good_n5/1/0.0.0.0").status_code == 200


@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(field=st.sampled_from(N5_FIELDS), value=JSON_VALUES)
def test_n5_attributes_of_every_json_type(bounded: Root, field: str, value: object) -> None:
    dataset = f"n{next(_examples)}"
    write_properties(bounded.dataset(dataset), [layer_entry("layer", "n5")])
    mag = bounded.dataset(dataset) / "layer" / "1"
    mag.mkdir(parents=True)
    good = {"dimensions": list(SIZE), "blockSize": list(BLOCK), "dataType": "uint8", "compression": {"type": "raw"}}
    (mag / "attributes.json").write_text(json.dumps({**good, field: value}))
    _check_answers(bounded.server, dataset)
    assert_no_unexpected_errors(bounded.server)


@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(field=st.sampled_from(INFO_FIELDS + SCALE_FIELDS), value=JSON_VALUES)
def test_precomputed_info_of_every_json_type(bounded: Root, field: str, value: object) -> None:
    dataset = f"p{next(_examples)}"
    write_properties(bounded.dataset(dataset), [layer_entry("layer", "neuroglancerPrecomputed")])
    volume = bounded.dataset(dataset) / "layer"
    (volume / "1").mkdir(parents=True)
    scale = pc_scale()
    info = {"type": "image", "data_type": "uint8", "num_channels": 1, "scales": [scale]}
    (info if field in INFO_FIELDS else scale)[field] = value
    (volume / "info").write_text(json.dumps(info))
    _check_answers(bounded.server, dataset)
    assert_no_unexpected_errors(bounded.server)


# --- what a read decodes: whole blocks and chunks, on the grid the source stores ---------------------


def _open(root: Path, data_format: str, dtype: str = "uint64") -> object:
    from gateway.sources.properties import DataLayer
    from gateway.sources.registry import SourceFormats
    from gateway_storage import LocalStore

    layer = DataLayer.model_validate(layer_entry("layer", data_format, dtype=dtype))
    source_format = SourceFormats(LocalStore(str(root)), 1 << 20).for_data_format(data_format)
    assert source_format is not None
    return source_format.open_mag((1, 1, 1), str(root / "layer" / "1"), layer, None)


@pytest.mark.parametrize("data_format", ["n5", "neuroglancerPrecomputed"])
def test_bytes_decoded_decide_event_loop_or_thread(tmp_path: Path, data_format: str) -> None:
    """A 32^3 chunk of 64^3 uint64 blocks (2 MiB each) decodes whole blocks: it goes to a thread, not the loop,
    and holds what it decodes of the memory budget."""
    from gateway.zarr.chunks import served_mag
    from gateway.zarr.codecs import Codec
    from gateway.zarr.layout import ArrayLayout
    from gateway.zarr.nodes import SourceArray

    data = voxels(3, "uint64")
    if data_format == "n5":
        write_n5(tmp_path / "layer" / "1", data, (64, 64, 64))
    else:
        write_precomputed(tmp_path / "layer", data, (64, 64, 64))
    source = _open(tmp_path, data_format)
    assert source.decoded_bytes((32, 32, 32)) == 64**3 * 8  # type: ignore[attr-defined]
    layout = ArrayLayout((1, *SIZE), (1, 32, 32, 32), np.dtype("uint64"), Codec.BLOSC_LZ4)
    array = SourceArray(served_mag(source, layout), ("c", "x", "y", "z"))  # type: ignore[arg-type]
    assert array.cheap_chunk((0, 1, 0, 1)) is None  # 256 KiB served, 2 MiB decoded: not on the event loop
    assert array.working_bytes >= 64**3 * 8
    import numcodecs

    body = array.costly_chunk((0, 1, 0, 1)).body  # (c, x, y, z) with x fastest
    served = np.frombuffer(numcodecs.Blosc().decode(body), "uint64")
    np.testing.assert_array_equal(served, data[32:, :32, 32:].ravel(order="F"))


def test_a_chunk_of_many_small_files_is_made_in_a_thread(tmp_path: Path) -> None:
    """A 64^3 chunk decodes 256 KiB either way, but of WKW cubes of one 8^3 block each it reads 512 files (a stat,
    an open and a containment check each): it goes to a thread, not the loop; of the same voxels in one file it
    stays on the loop. Both answer the same voxels."""
    from gateway.zarr.chunks import served_mag
    from gateway.zarr.codecs import Codec
    from gateway.zarr.layout import ArrayLayout
    from gateway.zarr.nodes import INLINE_FILES, SourceArray

    data = voxels(5)
    layout = ArrayLayout((1, *SIZE), (1, 64, 64, 64), np.dtype("uint8"), Codec.BLOSC_LZ4)
    arrays = {}
    for name, file_len in (("small", 1), ("one", 8)):
        header = wkw.Header(np.uint8, block_len=8, file_len=file_len, block_type=wkw.Header.BLOCK_TYPE_LZ4)
        with wkw.Dataset.create(str(tmp_path / name / "layer" / "1"), header) as written:
            written.write((0, 0, 0), data)
        source = _open(tmp_path / name, "wkw", "uint8")
        assert source.decoded_bytes((64, 64, 64)) == 64**3  # type: ignore[attr-defined]
        arrays[name] = SourceArray(served_mag(source, layout), ("c", "x", "y", "z"))  # type: ignore[arg-type]
    assert len(list((tmp_path / "small").rglob("x*.wkw"))) == 512 > INLINE_FILES
    assert arrays["small"].cheap_chunk((0, 0, 0, 0)) is None
    assert arrays["one"].cheap_chunk((0, 0, 0, 0)) is not None
    import numcodecs

    for array in arrays.values():
        body = array.costly_chunk((0, 0, 0, 0)).body
        assert body is not None
        np.testing.assert_array_equal(np.frombuffer(numcodecs.Blosc().decode(body), "uint8"), data.ravel(order="F"))


def test_a_precomputed_grid_off_the_served_grid_counts_the_chunks_it_straddles(tmp_path: Path) -> None:
    volume = tmp_path / "layer"
    write_precomputed(volume, voxels(4, "uint64"))
    patch_json(volume / "info", lambda info: info["scales"][0].update(voxel_offset=[5, 0, 0]))
    source = _open(tmp_path, "neuroglancerPrecomputed")
    assert source.decoded_bytes((32, 32, 32)) == 2 * 32**3 * 8  # type: ignore[attr-defined]


def test_a_gzip_chunk_of_a_shard_is_decompressed_only_up_to_what_a_chunk_holds() -> None:
    from gateway.sources.decoding import ChunkDecodeError
    from gateway.sources.precomputed_source import _gunzip

    bomb = gzip.compress(b"\0" * (64 << 20))  # 64 MiB in 64 KiB
    assert len(bomb) < 1 << 20
    with pytest.raises(ChunkDecodeError, match="decompresses to more than the 1048576 bytes"):
        _gunzip(bomb, 1 << 20, "a shard")
    assert _gunzip(gzip.compress(b"ab" * 10), 20, "a chunk") == b"ab" * 10
    with pytest.raises(ChunkDecodeError, match="cut short"):
        _gunzip(gzip.compress(b"ab" * 1000)[:-9], 1 << 20, "a chunk")


# --- meshes: each read is bounded by what it decodes -----------------------------------------------------


@pytest.fixture(scope="module")
def meshes(tmp_path_factory: pytest.TempPathFactory, server_factory: Callable[..., Server]) -> Root:
    """A WKW segmentation with a cube of label 7, and a Zarr segmentation whose one chunk is 512^3 voxels (128 MiB,
    within the chunk bound) and holds no data: a mesh box of 65^3 voxels would decode up to 8 of its chunks."""
    root = tmp_path_factory.mktemp("mesh-bounds")
    dataset = root / ORG / "segments"
    labels = np.zeros(SIZE, dtype="uint8")
    labels[10:40, 12:30, 20:50] = 7
    header = wkw.Header(np.uint8, block_len=32, file_len=2, block_type=wkw.Header.BLOCK_TYPE_LZ4)
    with wkw.Dataset.create(str(dataset / "labels" / "1"), header) as written:
        written.write((0, 0, 0), labels)
    big = dataset / "big_chunks" / "1"
    big.mkdir(parents=True)
    zarray = {"zarr_format": 2, "shape": [1, *SIZE], "chunks": [1, 512, 512, 512], "dtype": "|u1"}
    zarray.update(compressor={"id": "zstd", "level": 1}, fill_value=0, order="C", filters=None)
    (big / ".zarray").write_text(json.dumps(zarray))
    # a layer whose index beside it is a zip bomb: arrays of 1.1 GiB in a file of about a MiB
    (dataset / "bombed").mkdir()
    (dataset / "bombed" / "1").symlink_to(dataset / "labels" / "1")
    bomb = zipfile.ZipFile(dataset / "bombed.segment-index.npz", "w", zipfile.ZIP_DEFLATED, compresslevel=1)
    with bomb, bomb.open("ids.npy", "w", force_zip64=True) as member:
        for _ in range(18):
            member.write(bytes(64 << 20))
    # segment labels nested deeper than any parser's recursion
    (dataset / "labels.segment-labels.json").write_text("[" * 100_000 + "]" * 100_000)
    layers = [layer_entry(name, "wkw", "segmentation") for name in ("labels", "bombed")]
    write_properties(dataset, [*layers, layer_entry("big_chunks", "zarr", "segmentation")])
    return Root(server_factory(root), root)


def test_a_mesh_read_that_would_decode_past_its_bound_is_refused_with_the_reason(meshes: Root) -> None:
    from gateway.meshes.surfaces import MAX_READ_DECODED_BYTES

    base = f"/data/meshes/{ORG}/segments"
    for name in ("legacy/7:0", "legacy/7:0:0_0_0", "multires/7.index"):
        assert_reason(
            get(meshes.server, f"{base}/big_chunks/{name}"), 413, "too large to mesh", str(MAX_READ_DECODED_BYTES)
        )
    fragments = get(meshes.server, f"{base}/labels/legacy/7:0")
    assert fragments.status_code == 200 and fragments.json()["fragments"], fragments.text[:300]
    mesh = get(meshes.server, f"{base}/labels/legacy/{fragments.json()['fragments'][0]}")
    assert mesh.status_code == 200 and int.from_bytes(mesh.content[:4], "little") > 0  # vertices of the cube
    assert get(meshes.server, f"{base}/labels/multires/7.index").status_code == 200
    assert_no_unexpected_errors(meshes.server)


def test_index_segments_of_a_layer_too_large_to_mesh_says_why(meshes: Root) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "index-segments", str(meshes.root), f"{ORG}/segments", "big_chunks"],
        capture_output=True,
        text=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if not k.startswith("ZARR_GATEWAY_")},
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert "cannot be indexed" in done.stderr and "too large to mesh" in done.stderr, done.stderr


def test_a_segment_index_that_unpacks_past_its_bound_is_a_storage_fault(meshes: Root) -> None:
    from gateway.meshes.index import MAX_INDEX_BYTES

    assert (meshes.root / ORG / "segments" / "bombed.segment-index.npz").stat().st_size < MAX_INDEX_BYTES // 100
    answer = get(meshes.server, f"/data/meshes/{ORG}/segments/bombed/legacy/7:0")
    assert_reason(answer, 500, "segment index fault", f"unpacks to more than {MAX_INDEX_BYTES} bytes")
    assert get(meshes.server, f"/data/meshes/{ORG}/segments/labels/legacy/7:0").status_code == 200
    assert_no_unexpected_errors(meshes.server)


def test_segment_labels_nested_past_the_bound_are_ignored(meshes: Root) -> None:
    answer = get(meshes.server, f"/data/meshes/{ORG}/segments/labels/multires/segment_properties/info")
    assert answer.status_code == 200, answer.text[:300]
    properties = answer.json()["inline"]["properties"]
    assert not [p for p in properties if p["type"] == "label"], properties
    assert "nests deeper than" in meshes.server.log()
    assert_no_unexpected_errors(meshes.server)
