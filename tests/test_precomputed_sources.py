"""The precomputed tree over every source format (issue 27): CloudVolume reads each layer and mag of N5 and
precomputed sources (unsharded and sharded), of the zarr-python arrays (other axis orders, F order, a fill value
with a hole) and of a WKW layer in S3 voxel for voxel against the format's reference reader, the whole volume and
cutouts across chunk and volume edges. Layers the tree cannot serve (data types Neuroglancer lacks, arrays no
tree can map) are listed with the reason; chunks where a Zarr source stores nothing answer its fill value; meshes
are read through ``/t/TOKEN/``.
"""

import html
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import zarr
from cloudvolume.exceptions import EmptyVolumeException
from support.cloudvolume_reads import assert_reads_exactly, open_volume, read_box
from support.datasets import (
    DATASET_NAME,
    LAYERS,
    MAGS,
    ORG,
    WrittenDataset,
    bbox_at_mag,
    cube_layer,
    write_layers_properties,
)
from support.n5_precomputed import DATASET as FORMATS_DATASET
from support.n5_precomputed import LAYERS as FORMATS_LAYERS
from support.n5_precomputed import MAGS as FORMATS_MAGS
from support.n5_precomputed import ORG as FORMATS_ORG
from support.n5_precomputed import Expected, box_at, source_array, write_dataset
from support.s3 import aws_environment, start_moto, upload_tree
from support.sample import sample_labels
from support.servers import Server, assert_no_unexpected_errors, assert_reason
from support.zarr_datasets import UNUSABLE_SPECS, ZARR_ORG, ZARR_SPECS, ZP_DATASET, ServedArray, ZarrSpec, served_arrays

from gateway.sample import DATASET as SAMPLE_DATASET
from gateway.sample import ORGANIZATION as SAMPLE_ORG
from gateway_storage.geometry import mag_name

pytestmark = pytest.mark.slow  # CloudVolume reading whole layers, some from moto's S3 server

TREE = "/data/precomputed"
IDENTITY = {"Accept-Encoding": "identity"}


def scale_keys(server: Server, layer_path: str) -> list[str]:
    """The layer's scale keys in the order of its ``info``: CloudVolume's mip is the index."""
    info = requests.get(f"{server.url}{TREE}/{layer_path}/info", timeout=30).json()
    return [scale["key"] for scale in info["scales"]]


def raw_chunk(server: Server, path: str, dtype: str, shape: tuple[int, int, int, int]) -> np.ndarray[Any, Any]:
    """A ``raw`` chunk of the tree as ``[x, y, z, c]``: x fastest, then y, z, channel, little-endian."""
    response = requests.get(f"{server.url}{TREE}/{path}", headers=IDENTITY, timeout=30)
    assert response.status_code == 200, (path, response.status_code, response.text[:300])
    return np.frombuffer(response.content, dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape, order="F")


# --- N5 and precomputed sources ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def formats_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("precomputed_formats")
    write_dataset(root / FORMATS_ORG / FORMATS_DATASET, FORMATS_LAYERS, 27)
    return root


@pytest.fixture(scope="module")
def formats_gateway(formats_root: Path, server_factory: Callable[..., Server]) -> Server:
    return server_factory(formats_root)


@pytest.fixture(scope="module")
def formats_truth(formats_root: Path) -> Expected:
    return {
        (spec.name, mag): source_array(formats_root, FORMATS_DATASET, spec, mag)
        for spec in FORMATS_LAYERS
        for mag in FORMATS_MAGS
    }


def test_the_precomputed_sources_are_unsharded_and_sharded(formats_root: Path) -> None:
    """What the reads below cover: both kinds of scale, as tensorstore wrote them."""
    sharded = {}
    for spec in FORMATS_LAYERS:
        if not spec.is_n5:
            info = json.loads((formats_root / FORMATS_ORG / FORMATS_DATASET / spec.name / "info").read_text())
            sharded.update({(spec.name, s["key"]): "sharding" in s for s in info["scales"]})
    assert sharded[("pc_raw", "1")] is False and sharded[("pc_segmentation", "1")] is False
    assert sharded[("pc_sharded", "1")] is True and sharded[("pc_segmentation", "2-2-1")] is True


@pytest.mark.parametrize("layer", [spec.name for spec in FORMATS_LAYERS])
def test_cloudvolume_reads_n5_and_precomputed_sources_exactly(
    formats_gateway: Server, formats_truth: Expected, layer: str
) -> None:
    path = f"{FORMATS_ORG}/{FORMATS_DATASET}/{layer}"
    assert scale_keys(formats_gateway, path) == [mag_name(m) for m in FORMATS_MAGS]
    for mip, mag in enumerate(FORMATS_MAGS):
        lo, hi = box_at(mag)
        truth = formats_truth[(layer, mag)]
        assert_reads_exactly(f"{formats_gateway.url}{TREE}/{path}", mip, truth, lo, hi, layer)
    assert_no_unexpected_errors(formats_gateway)


# --- zarr-python arrays ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def zarr_gateway(zarr_root: Path, server_factory: Callable[..., Server]) -> Server:
    return server_factory(zarr_root)


@pytest.fixture(scope="module")
def zarr_python_arrays(zarr_root: Path) -> dict[str, ServedArray]:
    return {a.layer: a for a in served_arrays(zarr_root) if a.dataset == ZP_DATASET}


ZP_LAYERS = [spec.name for spec in ZARR_SPECS if not spec.unusable]


@pytest.mark.parametrize("layer", ZP_LAYERS)
def test_cloudvolume_reads_zarr_python_arrays_exactly(
    zarr_gateway: Server, zarr_python_arrays: dict[str, ServedArray], layer: str
) -> None:
    """Axis orders zyx, yxz and xyz, F order (v2) and a reversing transpose (v3), shards, crc32c, 3 channels."""
    array = zarr_python_arrays[layer]
    assert scale_keys(zarr_gateway, f"{ZARR_ORG}/{ZP_DATASET}/{layer}") == ["1"]
    url = f"{zarr_gateway.url}{TREE}/{ZARR_ORG}/{ZP_DATASET}/{layer}"
    assert_reads_exactly(url, 0, array.expected(), array.bbox_lo, array.bbox_hi, array.id)


def test_a_chunk_over_a_hole_answers_the_fill_value(
    zarr_gateway: Server, zarr_python_arrays: dict[str, ServedArray]
) -> None:
    """v3_zstd_f (fill value 7) never stored its chunk (0, 1, 0, 1): voxels x [32, 64), y [0, 32), z [16, 32).
    The tree's chunk over it answers 200 with 7 there (a precomputed client would fill a 404 with zeros)."""
    spec = next(s for s in ZARR_SPECS if s.name == "v3_zstd_f")
    array = zarr_python_arrays[spec.name]
    assert spec.hole == (0, 1, 0, 1) and spec.fill == 7
    assert not (array.directory / "c" / "0" / "1" / "0" / "1").exists()
    assert (array.directory / "c" / "0" / "0" / "0" / "1").is_file()
    chunk = raw_chunk(
        zarr_gateway, f"{ZARR_ORG}/{ZP_DATASET}/{spec.name}/1/32-64_0-32_0-32", spec.dtype, (32, 32, 32, 1)
    )
    assert (chunk[:, :, 16:32] == 7).all()
    truth = np.moveaxis(array.expected()[:, 32:64, 0:32, 0:32], 0, -1)
    np.testing.assert_array_equal(chunk, truth)
    assert not (chunk[:, :, 0:16] == 7).all()  # the stored half is the data


# --- a dataset of its own: whole chunks never stored, data types the format lacks --------------------------

HOLES = "holes"
EDGE = 64
HOLE = (slice(32, 64), slice(0, 32), slice(32, 64))  # one whole chunk of the source and of the tree
HOLE_KEY = "32-64_0-32_32-64"
UNSERVABLE = {"labels_int64": ("int64", "int64"), "image_float64": ("float64", "double")}  # dtype, elementClass


def _write_holes(directory: Path) -> dict[str, np.ndarray[Any, Any]]:
    """uint8 Zarr v3 layers of fill value 7 and 0 with the chunk at ``HOLE`` never stored, and layers of int64
    and float64, which the Zarr trees serve and Neuroglancer's precomputed format has no data type for."""
    rng = np.random.default_rng(27)
    layers: list[dict[str, Any]] = []
    written: dict[str, np.ndarray[Any, Any]] = {}
    arrays = {"fill7": ("uint8", 7), "fill0": ("uint8", 0)} | {
        name: (dtype, 0) for name, (dtype, _) in UNSERVABLE.items()
    }
    for name, (dtype, fill) in arrays.items():
        data = rng.integers(10, 200, size=(EDGE,) * 3).astype(dtype)
        if name.startswith("fill"):
            data[HOLE] = fill
        array = zarr.create_array(
            str(directory / name / "1"),
            zarr_format=3,
            shape=data.shape,
            chunks=(32, 32, 32),
            dtype=dtype,
            fill_value=fill,
            dimension_names=list("xyz"),
        )
        array[...] = data
        if name.startswith("fill"):  # never stored, whatever the writer does with a chunk of fill values
            (directory / name / "1" / "c" / "1" / "0" / "1").unlink(missing_ok=True)
        written[name] = data
        element_class = UNSERVABLE.get(name, (dtype, dtype))[1]
        mags = [{"mag": [1, 1, 1], "path": f"./{name}/1"}]
        layers.append({**cube_layer(name, "zarr3", EDGE, mags), "elementClass": element_class})
    write_layers_properties(directory, layers)
    return written


@pytest.fixture(scope="module")
def holes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray[Any, Any]]]:
    root = tmp_path_factory.mktemp("precomputed_holes")
    return root, _write_holes(root / ORG / HOLES)


@pytest.fixture(scope="module")
def holes_gateway(holes: tuple[Path, Any], server_factory: Callable[..., Server]) -> Server:
    return server_factory(holes[0])


@pytest.mark.parametrize(("layer", "fill"), [("fill7", 7), ("fill0", 0)])
def test_a_chunk_a_zarr_source_never_stored_answers_its_fill_value(
    holes: tuple[Path, dict[str, np.ndarray[Any, Any]]], holes_gateway: Server, layer: str, fill: int
) -> None:
    """Not a 404 (a Zarr source's absent chunks are read, docs/architecture.md says why): a fill value need not
    be the zeros a precomputed client fills a 404 with. CloudVolume reads the layer without ``fill_missing``."""
    root, written = holes
    stored = root / ORG / HOLES / layer / "1" / "c"
    assert not (stored / "1" / "0" / "1").exists() and (stored / "0" / "0" / "0").is_file()
    chunk = raw_chunk(holes_gateway, f"{ORG}/{HOLES}/{layer}/1/{HOLE_KEY}", "uint8", (32, 32, 32, 1))
    assert (chunk == fill).all()
    url = f"{holes_gateway.url}{TREE}/{ORG}/{HOLES}/{layer}"
    assert_reads_exactly(url, 0, written[layer][np.newaxis], (0, 0, 0), (EDGE,) * 3, layer)


def _listing_line(server: Server, base: str, name: str) -> str:
    listing = requests.get(f"{server.url}{base}/", timeout=30)
    assert listing.status_code == 200
    assert f'href="{base}/{name}/"' not in listing.text
    return html.unescape(next(line for line in listing.text.splitlines() if f"<li>{name} " in line))


@pytest.mark.parametrize("layer", list(UNSERVABLE))
def test_a_data_type_neuroglancer_lacks_makes_the_layer_unusable_in_this_tree(
    holes_gateway: Server, layer: str
) -> None:
    dtype = UNSERVABLE[layer][0]
    base = f"{TREE}/{ORG}/{HOLES}"
    reason = f"its data type {dtype} is none of the precomputed format's"
    line = _listing_line(holes_gateway, base, layer)
    assert f"unavailable: {reason}" in line and "uint64" in line and "float32" in line, line
    for below in ("info", f"1/{HOLE_KEY}", ""):
        assert_reason(requests.get(f"{holes_gateway.url}{base}/{layer}/{below}", timeout=30), 404, reason)
    raw = requests.get(f"{holes_gateway.url}/data/precomputed_raw/{ORG}/{HOLES}/{layer}/info", timeout=30)
    assert_reason(raw, 404, reason)
    # the Zarr trees serve it: the reason is this tree's
    assert requests.get(f"{holes_gateway.url}/data/zarr3/{ORG}/{HOLES}/{layer}/1/zarr.json", timeout=30).ok
    assert requests.get(f"{holes_gateway.url}{base}/fill7/info", timeout=30).ok
    assert_no_unexpected_errors(holes_gateway)


@pytest.mark.parametrize("spec", UNUSABLE_SPECS, ids=lambda s: s.name)
def test_arrays_no_tree_can_map_are_listed_with_the_reason(zarr_gateway: Server, spec: ZarrSpec) -> None:
    base = f"{TREE}/{ZARR_ORG}/{ZP_DATASET}"
    line = _listing_line(zarr_gateway, base, spec.name)
    assert "unavailable: " in line and spec.unusable in line, line
    assert_reason(requests.get(f"{zarr_gateway.url}{base}/{spec.name}/info", timeout=30), 404, spec.unusable)


# --- a WKW layer in S3 -------------------------------------------------------------------------------------

BUCKET, PREFIX = "precomputed-data", "root"
SPARSE = "sparse"  # color_u16 of the main dataset, without its first file at mag 1
MISSING_FILE = ("color_u16", "1", "z0", "y0", "x0.wkw")  # mag-1 voxels [0, 128)^3


@pytest.fixture(scope="module")
def s3_gateway(
    test_data: WrittenDataset, server_factory: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """The main WKW dataset and a sparse copy of one layer, uploaded file by file to moto's S3 server."""
    moto = start_moto(tmp_path_factory.mktemp("precomputed_moto") / "moto.log")
    staging = tmp_path_factory.mktemp("sparse") / SPARSE
    dataset = test_data.root / ORG / DATASET_NAME
    shutil.copytree(dataset / "color_u16", staging / "color_u16")
    shutil.copy(dataset / "datasource-properties.json", staging)
    staging.joinpath(*MISSING_FILE).unlink()
    try:
        with aws_environment(moto.endpoint):
            client = moto.client()
            client.create_bucket(Bucket=BUCKET)
            assert upload_tree(client, dataset, BUCKET, f"{PREFIX}/{ORG}/{DATASET_NAME}") > 20
            upload_tree(client, staging, BUCKET, f"{PREFIX}/{ORG}/{SPARSE}")
            yield server_factory(f"s3://{BUCKET}/{PREFIX}")
    finally:
        moto.stop()


@pytest.mark.parametrize("layer", [name for name, *_ in LAYERS])
def test_cloudvolume_reads_a_wkw_layer_in_s3_exactly(s3_gateway: Server, test_data: WrittenDataset, layer: str) -> None:
    url = f"{s3_gateway.url}{TREE}/{ORG}/{DATASET_NAME}/{layer}"
    assert scale_keys(s3_gateway, f"{ORG}/{DATASET_NAME}/{layer}") == [mag_name(m) for m in MAGS]
    for mip, mag in enumerate(MAGS):
        lo, hi = bbox_at_mag(mag)
        assert_reads_exactly(url, mip, test_data.expected(layer, mag), lo, hi, f"s3 {layer}")


def test_a_wkw_file_absent_in_s3_is_a_404_that_cloudvolume_fills(s3_gateway: Server, test_data: WrittenDataset) -> None:
    path = f"{ORG}/{SPARSE}/color_u16"
    assert_reason(requests.get(f"{s3_gateway.url}{TREE}/{path}/1/37-69_21-53_5-37", timeout=30), 404, "no stored data")
    lo, hi = bbox_at_mag(MAGS[0])
    url = f"{s3_gateway.url}{TREE}/{path}"
    with pytest.raises(EmptyVolumeException):
        read_box(url, 0, lo, hi)
    truth = test_data.expected("color_u16", MAGS[0]).copy()
    truth[:, :128, :128, :128] = 0
    read = read_box(url, 0, lo, hi, fill_missing=True)
    np.testing.assert_array_equal(read, np.moveaxis(truth[:, lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]], 0, -1))


# --- meshes through a token path ---------------------------------------------------------------------------

MESH_TOKEN = "precomputed-mesh-token"


@pytest.fixture(scope="module")
def sample_token_gateway(
    sample_root: Path, server_factory: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory
) -> Server:
    tokens = tmp_path_factory.mktemp("precomputed_tokens") / "tokens.json"
    tokens.write_text(json.dumps({"tokens": {MESH_TOKEN: [f"{SAMPLE_ORG}/*"]}}))
    return server_factory(sample_root, tokens_file=tokens)


def test_cloudvolume_reads_meshes_through_a_token_path(sample_token_gateway: Server, sample_root: Path) -> None:
    server = sample_token_gateway
    labels = sample_labels(sample_root)
    ids, counts = np.unique(labels[labels != 0], return_counts=True)
    segment = int(ids[np.argmax(counts)])
    layer = f"{TREE}/{SAMPLE_ORG}/{SAMPLE_DATASET}/segmentation"
    with pytest.raises(requests.HTTPError, match="401"):  # without the token, the info itself is refused
        open_volume(f"{server.url}{layer}")
    start = len(server.access_lines())
    mesh = open_volume(f"{server.url}/t/{MESH_TOKEN}{layer}").mesh.get([segment])[segment]
    assert len(mesh.vertices) > 100 and len(mesh.faces) > 100
    lines = server.access_lines()[start:]
    mesh_lines = [line for line in lines if "/segmentation/mesh/" in line["path"]]
    assert any(line["path"].endswith(f"/mesh/{segment}.index") for line in mesh_lines), lines
    assert all(line["status"] in (200, 206) for line in mesh_lines), mesh_lines
    assert MESH_TOKEN not in server.log()
