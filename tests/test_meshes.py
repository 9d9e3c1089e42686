"""Segment meshes and segment lists (Neuroglancer precomputed) of segmentation layers, through a real gateway.

The multi-resolution files are read back by a reader written here from Neuroglancer's format document
(``src/datasource/precomputed/meshes.md``): the manifest's binary layout, byte ranges of the data file,
Draco fragments (DracoPy's decoder) whose integer positions are dequantized by the document's formula.
Meshes are checked against the labels as the ``wkw`` package reads them: every vertex near a voxel of
its segment, the mesh's bounding box the segment's, the surface of an interior segment closed.
"""

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from html import unescape
from pathlib import Path
from typing import Literal
from urllib.parse import quote, unquote

import DracoPy
import numpy as np
import pytest
import requests
import wkw
import zarr
from scipy import ndimage
from support.datasets import ORG, WrittenDataset
from support.file_reads import FileReads
from support.processes import free_port, stop_process
from support.sample import VOLUME_HI, VOLUME_LO, sample_labels
from support.servers import Server

from gateway.meshes.downsample import mode_downsample
from gateway.sample import DATASET, ORGANIZATION, VOXEL_SIZE_NM
from gateway_storage.geometry import vec3

pytestmark = pytest.mark.slow  # meshing whole segments

MESH_TOKEN = "mesh-test-token"
VOXEL = np.asarray(VOXEL_SIZE_NM)


@pytest.fixture(scope="module")
def mesh_tokens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mesh-auth") / "tokens.json"
    path.write_text(json.dumps({"tokens": {MESH_TOKEN: [f"{ORGANIZATION}/*", "synthetic/*"]}}))
    return path


@pytest.fixture(scope="module")
def server(sample_root: Path, mesh_tokens: Path, server_factory: Callable[..., Server]) -> Server:
    return server_factory(sample_root, tokens_file=mesh_tokens)


@pytest.fixture(scope="module")
def labels(sample_root: Path) -> np.ndarray:
    return sample_labels(sample_root)


def get(server: Server, path: str, **headers: str) -> requests.Response:
    return requests.get(server.url + path, headers={"X-Auth-Token": MESH_TOKEN, **headers}, timeout=120)


def mesh_base(layer: str = "segmentation", kind: str = "multires", dataset: str = f"{ORGANIZATION}/{DATASET}") -> str:
    return f"/data/meshes/{dataset}/{layer}/{kind}/"


# --- an independent reader of the formats ------------------------------------------------------


@dataclass
class Fragment:
    lod: int
    position: tuple[int, int, int]
    vertices: np.ndarray  # nanometers
    faces: np.ndarray
    quantized: np.ndarray | None = None  # the stored integers (multi-resolution fragments)
    bits: int = 0


def z_order(position: tuple[int, int, int]) -> int:
    key = 0
    for bit in range(21):
        for axis in range(3):
            key |= ((position[axis] >> bit) & 1) << (3 * bit + axis)
    return key


def read_multires(server: Server, segment: int, base: str | None = None) -> list[Fragment]:
    """Every fragment of a segment as Neuroglancer would read it: manifest, then a byte range per fragment."""
    base = base or mesh_base()
    info = get(server, base + "info").json()
    assert info["@type"] == "neuroglancer_multilod_draco"
    bits = info["vertex_quantization_bits"]
    assert bits in (10, 16)
    transform = np.asarray(info["transform"], dtype=np.float64).reshape(3, 4)
    response = get(server, f"{base}{segment}.index")
    assert response.status_code == 200, response.text
    raw = response.content
    chunk_shape = np.asarray(struct.unpack_from("<3f", raw, 0))
    grid_origin = np.asarray(struct.unpack_from("<3f", raw, 12))
    (num_lods,) = struct.unpack_from("<I", raw, 24)
    offset = 28
    lod_scales = np.frombuffer(raw, "<f4", num_lods, offset)
    offset += 4 * num_lods
    vertex_offsets = np.frombuffer(raw, "<f4", 3 * num_lods, offset).reshape(num_lods, 3)
    offset += 12 * num_lods
    per_lod = np.frombuffer(raw, "<u4", num_lods, offset)
    offset += 4 * num_lods
    assert np.all(lod_scales > 0) and np.all(np.diff(lod_scales) >= 0)
    listed = []
    for lod in range(num_lods):
        count = int(per_lod[lod])
        positions = np.frombuffer(raw, "<u4", 3 * count, offset).reshape(3, count).T
        offset += 12 * count
        sizes = np.frombuffer(raw, "<u4", count, offset)
        offset += 4 * count
        keys = [z_order(vec3(int(v) for v in p)) for p in positions]
        assert keys == sorted(keys) and len(set(keys)) == len(keys), f"lod {lod} positions are not in Z-curve order"
        listed += [(lod, vec3(int(v) for v in p), int(s)) for p, s in zip(positions, sizes)]
    assert offset == len(raw), "the manifest has bytes after its last level"
    fragments = []
    start = 0
    limit = (1 << bits) - 1
    for lod, position, size in listed:
        if size == 0:
            start += size
            continue
        part = get(server, f"{base}{segment}", Range=f"bytes={start}-{start + size - 1}")
        assert part.status_code == 206 and len(part.content) == size, (part.status_code, len(part.content), size)
        start += size
        mesh = DracoPy.decode(part.content)
        quantized = np.asarray(mesh.points, dtype=np.float64).reshape(-1, 3)
        assert np.array_equal(quantized, np.round(quantized)), "positions are not integers"
        assert quantized.min() >= 0 and quantized.max() <= limit
        stored = grid_origin + vertex_offsets[lod] + chunk_shape * 2**lod * (np.asarray(position) + quantized / limit)
        model = stored @ transform[:, :3].T + transform[:, 3]
        faces = np.asarray(mesh.faces, dtype=np.int64).reshape(-1, 3)
        fragments.append(Fragment(lod, position, model, faces, quantized, bits))
    total = len(get(server, f"{base}{segment}").content)
    assert total == start, "the data file is not the concatenation of the listed fragments"
    return fragments


def read_legacy(server: Server, segment: int) -> list[Fragment]:
    base = mesh_base(kind="legacy")
    info = get(server, base + "info").json()
    assert info["@type"] == "neuroglancer_legacy_mesh"
    manifest = get(server, f"{base}{segment}:0")
    assert manifest.status_code == 200, manifest.text
    fragments = []
    for name in manifest.json()["fragments"]:
        body = get(server, base + quote(name)).content
        (count,) = struct.unpack_from("<I", body, 0)
        vertices = np.frombuffer(body, "<f4", 3 * count, 4).reshape(-1, 3).astype(np.float64)
        rest = body[4 + 12 * count :]
        assert len(rest) % 12 == 0
        faces = np.frombuffer(rest, "<u4").reshape(-1, 3).astype(np.int64)
        assert faces.size == 0 or faces.max() < count
        fragments.append(Fragment(0, (0, 0, 0), vertices, faces))
    return fragments


def merged(fragments: list[Fragment]) -> tuple[np.ndarray, np.ndarray]:
    """One mesh of several fragments, coincident vertices merged."""
    vertices = np.concatenate([f.vertices for f in fragments])
    offsets = np.cumsum([0] + [len(f.vertices) for f in fragments[:-1]])
    faces = np.concatenate([f.faces + o for f, o in zip(fragments, offsets)])
    unique, inverse = np.unique(np.round(vertices, 4), axis=0, return_inverse=True)
    return unique, inverse.reshape(-1)[faces]


def open_edges(faces: np.ndarray) -> int:
    """Edges not shared by exactly two triangles (0 for a closed surface)."""
    faces = faces[(faces[:, 0] != faces[:, 1]) & (faces[:, 1] != faces[:, 2]) & (faces[:, 0] != faces[:, 2])]
    edges = np.sort(np.concatenate([faces[:, [0, 1]], faces[:, [1, 2]], faces[:, [2, 0]]]), axis=1)
    _, counts = np.unique(edges, axis=0, return_counts=True)
    return int(np.count_nonzero(counts != 2))


def segment_box(labels: np.ndarray, segment: int) -> tuple[np.ndarray, np.ndarray]:
    where = np.argwhere(labels == segment)
    return where.min(axis=0), where.max(axis=0) + 1


def largest(labels: np.ndarray, count: int) -> list[int]:
    ids, voxels = np.unique(labels[labels > 0], return_counts=True)
    order = np.lexsort((ids, -voxels))
    return [int(i) for i in ids[order[:count]]]


def interior_segment(labels: np.ndarray) -> int:
    """The largest segment that touches no face of the volume."""
    for segment in largest(labels, 100):
        lo, hi = segment_box(labels, segment)
        if np.all(lo > VOLUME_LO) and np.all(hi < VOLUME_HI):
            return segment
    raise AssertionError("the sample has no interior segment")


def assert_near_the_voxels(vertices: np.ndarray, labels: np.ndarray, segment: int, mag: np.ndarray) -> None:
    """Every vertex within one voxel diagonal (of the mag meshed) of the centre of a voxel of the segment."""
    distance = ndimage.distance_transform_edt(labels != segment, sampling=VOXEL)
    index = np.clip(np.floor(vertices / VOXEL).astype(int), 0, np.asarray(labels.shape) - 1)
    far = distance[index[:, 0], index[:, 1], index[:, 2]]
    assert far.max() <= np.linalg.norm(VOXEL * mag), f"a vertex is {far.max():.1f} nm from segment {segment}"


# --- the multi-resolution source ------------------------------------------------------------------


def test_info_says_the_format_and_the_physical_transform(server: Server) -> None:
    info = get(server, mesh_base() + "info").json()
    assert info["@type"] == "neuroglancer_multilod_draco"
    transform = np.asarray(info["transform"]).reshape(3, 4)
    np.testing.assert_allclose(np.diag(transform[:, :3]), VOXEL)
    legacy = get(server, mesh_base(kind="legacy") + "info").json()
    assert legacy["@type"] == "neuroglancer_legacy_mesh"
    assert info["segment_properties"] == legacy["segment_properties"] == "segment_properties"


def test_multires_mesh_lies_on_the_segment_and_spans_its_box(server: Server, labels: np.ndarray) -> None:
    for segment in largest(labels, 2):
        fragments = read_multires(server, segment)
        lods = sorted({f.lod for f in fragments})
        assert lods == [0, 1, 2], lods  # one level per mag of the sample: 1, 2-2-1, 4-4-2
        finest = np.concatenate([f.vertices for f in fragments if f.lod == 0])
        assert_near_the_voxels(finest, labels, segment, np.ones(3))
        lo, hi = segment_box(labels, segment)
        np.testing.assert_allclose(finest.min(axis=0), lo * VOXEL, atol=float(VOXEL.max()))
        np.testing.assert_allclose(finest.max(axis=0), hi * VOXEL, atol=float(VOXEL.max()))
        for lod, mag in ((1, np.array([2, 2, 1])), (2, np.array([4, 4, 2]))):
            coarse = np.concatenate([f.vertices for f in fragments if f.lod == lod])
            assert_near_the_voxels(coarse, labels, segment, mag)


def test_multires_fragments_keep_inside_their_octants(server: Server, labels: np.ndarray) -> None:
    """Fragments above level 0 are split 2x2x2: no triangle has corners on both sides of a middle plane of
    its cube, in the stored integers (a corner on the plane may belong to either side)."""
    middle = None
    checked = 0
    for fragment in read_multires(server, largest(labels, 1)[0]):
        if fragment.lod == 0:
            continue
        assert fragment.quantized is not None
        middle = 1 << (fragment.bits - 1)
        corners = fragment.quantized[fragment.faces]  # (triangles, 3 corners, 3 axes)
        below = (corners < middle).any(axis=1)
        above = (corners > middle).any(axis=1)
        assert not (below & above).any(), f"a triangle of lod {fragment.lod} {fragment.position} crosses an octant"
        checked += len(corners)
    assert middle is not None and checked > 0


def test_multires_mesh_of_an_interior_segment_is_closed(server: Server, labels: np.ndarray) -> None:
    segment = interior_segment(labels)
    fragments = [f for f in read_multires(server, segment) if f.lod == 0]
    assert len(fragments) > 1, "pick a segment that spans several cubes, so that seams are checked"
    _, faces = merged(fragments)
    assert open_edges(faces) == 0


def test_legacy_mesh_matches_the_labels_and_is_closed(server: Server, labels: np.ndarray) -> None:
    segment = interior_segment(labels)
    fragments = read_legacy(server, segment)
    assert len(fragments) > 1
    vertices, faces = merged(fragments)
    assert open_edges(faces) == 0
    assert_near_the_voxels(vertices, labels, segment, np.ones(3))
    lo, hi = segment_box(labels, segment)
    np.testing.assert_allclose(vertices.min(axis=0), lo * VOXEL, atol=float(VOXEL.max()))
    np.testing.assert_allclose(vertices.max(axis=0), hi * VOXEL, atol=float(VOXEL.max()))


def test_segment_properties_list_every_segment_with_its_voxels(server: Server, labels: np.ndarray) -> None:
    for kind in ("multires", "legacy"):
        document = get(server, mesh_base(kind=kind) + "segment_properties/info").json()
        assert document["@type"] == "neuroglancer_segment_properties"
        ids = [int(i) for i in document["inline"]["ids"]]
        (voxels,) = [p for p in document["inline"]["properties"] if p["id"] == "voxels"]
        assert voxels["type"] == "number"
        truth_ids, truth_counts = np.unique(labels[labels > 0], return_counts=True)
        assert ids == [int(i) for i in truth_ids]
        assert voxels["values"] == [int(c) for c in truth_counts]


# --- bad input ---------------------------------------------------------------------------------


def test_an_unknown_segment_has_no_mesh(server: Server, labels: np.ndarray) -> None:
    unknown = int(labels.max()) + 1000
    assert read_multires(server, unknown) == []
    response = get(server, f"{mesh_base(kind='legacy')}{unknown}:0")
    assert response.status_code == 200 and response.json() == {"fragments": []}


@pytest.mark.parametrize(
    "name", ["abc.index", "0.index", "-1.index", "18446744073709551616.index", "1.5", "abc:0", "1:0:x_y_z", "1:1"]
)
def test_a_malformed_id_is_a_400(server: Server, name: str) -> None:
    kind = "legacy" if ":" in name else "multires"
    response = get(server, mesh_base(kind=kind) + name)
    assert response.status_code == 400, (name, response.status_code, response.text)
    assert response.json()["error"]


def test_a_color_layer_has_no_meshes(server: Server) -> None:
    response = get(server, mesh_base(layer="color") + "info")
    assert response.status_code == 400 and "color" in response.json()["error"]


def test_unknown_layers_and_sources_are_404(server: Server) -> None:
    assert get(server, mesh_base(layer="nope") + "info").status_code == 404
    assert get(server, mesh_base(kind="draco") + "info").status_code == 404
    assert get(server, mesh_base(kind="legacy") + "1:0:900_0_0").status_code == 404


def test_meshes_need_the_token_like_the_data(server: Server, labels: np.ndarray) -> None:
    path = f"{mesh_base()}{largest(labels, 1)[0]}.index"
    assert requests.get(server.url + path, timeout=60).status_code == 401
    assert requests.get(server.url + path, headers={"X-Auth-Token": "wrong"}, timeout=60).status_code == 401
    assert requests.get(f"{server.url}{path}?token={MESH_TOKEN}", timeout=60).status_code == 200


# --- replicas, caching ----------------------------------------------------------------------


def test_replicas_answer_byte_identical_meshes_and_etags(
    server: Server, sample_root: Path, mesh_tokens: Path, server_factory: Callable[..., Server], labels: np.ndarray
) -> None:
    other = server_factory(sample_root, tokens_file=mesh_tokens)
    segment = largest(labels, 3)[2]
    for path in (
        f"{mesh_base()}{segment}.index",
        f"{mesh_base()}{segment}",
        f"{mesh_base(kind='legacy')}{segment}:0",
        mesh_base() + "segment_properties/info",
    ):
        first, second = get(server, path), get(other, path)
        assert first.status_code == second.status_code == 200
        assert first.content == second.content and first.headers["ETag"] == second.headers["ETag"]
        again = get(server, path, **{"If-None-Match": first.headers["ETag"]})
        assert again.status_code == 304


# --- synthetic layers: float labels, storage faults, the index ---------------------------------


def write_layer_properties(dataset: Path, layers: dict[str, tuple[str, str, tuple[int, int, int]]]) -> None:
    """``layers``: name -> (category, elementClass, size); every layer at mag 1 from the origin, WKW unless
    its name starts with ``zarr``."""
    data_layers = [
        {
            "name": name,
            "category": category,
            "elementClass": element_class,
            "dataFormat": "zarr3" if name.startswith("zarr") else "wkw",
            "boundingBox": {"topLeft": [0, 0, 0], "width": size[0], "height": size[1], "depth": size[2]},
            "mags": [{"mag": [1, 1, 1], **({"path": f"./{name}/1"} if name.startswith("zarr") else {})}],
            **({"largestSegmentId": 10} if category == "segmentation" else {}),
        }
        for name, (category, element_class, size) in layers.items()
    ]
    document = {"id": {"name": dataset.name, "team": ""}, "scale": {"factor": [4, 4, 8]}, "dataLayers": data_layers}
    dataset.mkdir(parents=True, exist_ok=True)
    (dataset / "datasource-properties.json").write_text(json.dumps(document))


BALL_CENTRE = (70, 60, 40)


def ball(
    shape: tuple[int, int, int], radius: float, label: int, dtype: str, centre: tuple[int, int, int] = BALL_CENTRE
) -> np.ndarray:
    x, y, z = np.meshgrid(*(np.arange(n) for n in shape), indexing="ij")
    inside = (x - centre[0]) ** 2 + (y - centre[1]) ** 2 + (z - centre[2]) ** 2 < radius**2
    return np.where(inside, label, 0).astype(dtype)


@pytest.fixture(scope="module")
def synthetic_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mesh-synthetic")
    shape = (128, 128, 80)
    dataset = root / "synthetic" / "balls"
    write_layer_properties(
        dataset,
        {
            "labels": ("segmentation", "uint32", shape),
            "zarr_labels": ("segmentation", "uint32", shape),  # the same voxels as a Zarr v3 layer
            "float_labels": ("segmentation", "float", shape),
            "big": ("segmentation", "uint32", (2048, 2048, 24)),  # 96 Mi voxels, one file written
        },
    )
    for name, dtype in (("labels", "uint32"), ("float_labels", "float32")):
        write_file(dataset / name / "1", ball(FILE_SHAPE, 30, 7, dtype))
    write_file(dataset / "big" / "1", ball(FILE_SHAPE, 10, 3, "uint32", (70, 60, 12)))
    array = zarr.create_array(
        str(dataset / "zarr_labels" / "1"),
        zarr_format=3,
        shape=(1, *shape),
        chunks=(1, 32, 32, 32),
        dtype="uint32",
        fill_value=0,
        dimension_names=["c", "x", "y", "z"],
    )
    array[...] = ball(shape, 30, 7, "uint32")[None]
    return root


FILE_SHAPE = (128, 128, 128)  # one whole LZ4 file of 4^3 blocks: the wkw package writes compressed files whole


def write_file(mag_dir: Path, data: np.ndarray) -> None:
    with wkw.Dataset.open(str(mag_dir), wkw.Header(data.dtype, block_type=2, file_len=4)) as ds:
        ds.write((0, 0, 0), data)


@pytest.fixture()
def synthetic_copy(synthetic_root: Path, tmp_path: Path) -> Path:
    root = tmp_path / "root"
    shutil.copytree(synthetic_root, root)
    return root


def synthetic_base(layer: str = "labels", kind: str = "multires") -> str:
    return mesh_base(layer=layer, kind=kind, dataset="synthetic/balls")


def index_segments(root: Path, layer: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "index-segments", str(root), "synthetic/balls", layer, *extra],
        capture_output=True,
        text=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if not k.startswith("ZARR_GATEWAY_")},
    )


def test_a_zarr_layer_has_the_same_meshes_as_a_wkw_layer_of_the_same_voxels(
    synthetic_root: Path, mesh_tokens: Path, server_factory: Callable[..., Server]
) -> None:
    server = server_factory(synthetic_root, tokens_file=mesh_tokens)
    for name, kind in (("7.index", "multires"), ("7", "multires"), ("7:0", "legacy"), ("7:0:1_0_0", "legacy")):
        wkw_file = get(server, synthetic_base("labels", kind) + name)
        zarr_file = get(server, synthetic_base("zarr_labels", kind) + name)
        assert wkw_file.status_code == zarr_file.status_code == 200, (name, zarr_file.text[:200])
        assert len(wkw_file.content) > 40 and wkw_file.content == zarr_file.content, name
    ball_fragments = read_multires(server, 7, synthetic_base("zarr_labels"))
    vertices, faces = merged([f for f in ball_fragments if f.lod == 0])
    assert open_edges(faces) == 0
    radius_nm = np.linalg.norm((vertices - np.asarray(BALL_CENTRE) * [4, 4, 8] - [2, 2, 4]) / [4, 4, 8], axis=1)
    assert np.all(np.abs(radius_nm - 30) < 1.5), (radius_nm.min(), radius_nm.max())


def test_without_the_meshes_extra_a_mesh_is_a_501_that_names_it(synthetic_root: Path, tmp_path: Path) -> None:
    """A gateway installed without ``zarr-gateway[meshes]`` (zmesh and DracoPy unimportable) serves its data
    and answers mesh files with a message that says what to install."""
    port = free_port()
    blocked = "import sys; sys.modules['zmesh'] = None; sys.modules['DracoPy'] = None; from gateway.cli import main; "
    flags = ["serve", "--root", str(synthetic_root), "--port", str(port), "--workers", "1", "--settle-seconds", "0"]
    command = f"{blocked}main({flags!r})"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZARR_GATEWAY_")}
    with open(tmp_path / "gateway.log", "wb") as log:
        process = subprocess.Popen([sys.executable, "-c", command], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                requests.get(url + "/", timeout=1)
                break
            except requests.ConnectionError:
                time.sleep(0.1)
        assert requests.get(f"{url}/data/zarr3/synthetic/balls/labels/1/zarr.json", timeout=30).status_code == 200
        for name, kind in (("7.index", "multires"), ("7:0:1_0_0", "legacy")):
            response = requests.get(url + synthetic_base(kind=kind) + name, timeout=60)
            assert response.status_code == 501, response.text
            assert "zarr-gateway[meshes]" in response.json()["error"]
    finally:
        stop_process(process)


def test_a_float_segmentation_is_a_400(
    synthetic_root: Path, mesh_tokens: Path, server_factory: Callable[..., Server]
) -> None:
    server = server_factory(synthetic_root, tokens_file=mesh_tokens)
    for name in ("info", "7.index", "7:0"):
        kind = "legacy" if ":" in name else "multires"
        response = get(server, synthetic_base("float_labels", kind) + name)
        assert response.status_code == 400 and "float32" in response.json()["error"], response.text


@pytest.mark.parametrize("damage", ["corrupt", "truncate"])
def test_a_damaged_data_file_is_a_5xx_never_an_empty_mesh(
    synthetic_copy: Path, mesh_tokens: Path, server_factory: Callable[..., Server], damage: str
) -> None:
    """Cached meshes of the intact file may still be answered until the data's stamp is taken again (a few
    seconds); after that every file of the segment is a 5xx, and no answer is ever an empty mesh."""
    assert index_segments(synthetic_copy, "labels").returncode == 0
    server = server_factory(synthetic_copy, tokens_file=mesh_tokens)
    assert len(read_multires(server, 7, synthetic_base())) > 0
    files = (("7.index", "multires"), ("7", "multires"), ("7:0", "legacy"), ("7:0:1_0_0", "legacy"))
    intact = {name: get(server, synthetic_base(kind=kind) + name).content for name, kind in files}
    data_file = synthetic_copy / "synthetic" / "balls" / "labels" / "1" / "z0" / "y0" / "x0.wkw"
    size = data_file.stat().st_size
    blocks_start = 16 + 8 * 4**3  # the header and the jump table of 4^3 blocks
    with open(data_file, "r+b") as f:
        if damage == "truncate":
            f.truncate(blocks_start + 100)
        else:
            f.seek(blocks_start)
            f.write(b"\xff" * (size - blocks_start))
    failing: set[str] = set()
    for _ in range(60):
        for name, kind in files:
            response = get(server, synthetic_base(kind=kind) + name)
            if response.status_code >= 500:
                assert response.json()["error"]
                failing.add(name)
            else:
                assert response.status_code == 200 and response.content == intact[name], (name, response.status_code)
        if len(failing) == len(files):
            break
        time.sleep(0.5)
    assert failing == {name for name, _ in files}


def test_an_index_older_than_the_data_is_not_used(
    synthetic_copy: Path, mesh_tokens: Path, server_factory: Callable[..., Server]
) -> None:
    built = index_segments(synthetic_copy, "labels")
    assert built.returncode == 0, built.stderr
    assert "1 segments" in built.stdout
    truth = ball(FILE_SHAPE, 30, 7, "uint32")[:128, :128, :80]
    with np.load(synthetic_copy / "synthetic" / "balls" / "labels.segment-index.npz") as index:
        assert index["ids"].tolist() == [7]
        assert index["voxels"].tolist() == [int(np.count_nonzero(truth == 7))]
        lo, hi = segment_box(truth, 7)
        assert index["bboxes"].tolist() == [[*lo.tolist(), *hi.tolist()]]
        cubes = {tuple(c) for c in index["cubes"].tolist()}
        assert cubes == {(x, y, z) for x in (0, 1) for y in (0, 1) for z in (0, 1)}  # the ball crosses 64 on all axes
    server = server_factory(synthetic_copy, tokens_file=mesh_tokens)
    before = get(server, synthetic_base() + "segment_properties/info").json()
    assert before["inline"]["ids"] == ["7"]
    # New data: the ball is relabelled 9. The index still says 7; the gateway must not believe it.
    write_file(synthetic_copy / "synthetic" / "balls" / "labels" / "1", ball(FILE_SHAPE, 30, 9, "uint32"))
    os.utime(synthetic_copy / "synthetic" / "balls" / "labels" / "1" / "z0" / "y0" / "x0.wkw", ns=(1, 2 * 10**18))
    deadline_ids = None
    for _ in range(40):  # the data's stamp is taken again within a few seconds
        deadline_ids = get(server, synthetic_base() + "segment_properties/info").json()["inline"]["ids"]
        if deadline_ids == ["9"]:
            break
        time.sleep(0.5)
    assert deadline_ids == ["9"]
    assert read_multires(server, 7, synthetic_base()) == []
    assert len(read_multires(server, 9, synthetic_base())) > 0
    rebuilt = index_segments(synthetic_copy, "labels")  # and a rerun makes it current again
    assert rebuilt.returncode == 0 and "1 segments" in rebuilt.stdout


def test_a_large_layer_without_an_index_says_so_then_works_with_one(
    synthetic_copy: Path, mesh_tokens: Path, server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    index_dir = tmp_path / "indexes"
    server = server_factory(synthetic_copy, tokens_file=mesh_tokens, segment_index_dir=index_dir)
    response = get(server, synthetic_base("big") + "3.index")
    assert response.status_code == 409, response.text
    assert "index-segments" in response.json()["error"]
    assert "segment_properties" not in get(server, synthetic_base("big") + "info").json()
    (synthetic_copy / "synthetic" / "balls").chmod(0o555)  # a read-only data root: the index goes elsewhere
    try:
        built = index_segments(synthetic_copy, "big", "--segment-index-dir", str(index_dir))
    finally:
        (synthetic_copy / "synthetic" / "balls").chmod(0o755)
    assert built.returncode == 0, built.stderr
    assert (index_dir / "synthetic" / "balls" / "big.segment-index.npz").exists()
    fragments = read_multires(server, 3, synthetic_base("big"))
    vertices = np.concatenate([f.vertices for f in fragments if f.lod == 0])
    np.testing.assert_allclose(vertices.min(axis=0), np.array([61, 51, 3]) * [4, 4, 8], atol=8)
    assert get(server, synthetic_base("big") + "segment_properties/info").json()["inline"]["ids"] == ["3"]
    # The data changes: the index no longer describes it, and the layer is too large to scan.
    os.utime(synthetic_copy / "synthetic" / "balls" / "big" / "1" / "z0" / "y0" / "x0.wkw", ns=(1, 3 * 10**18))
    for _ in range(40):
        response = get(server, synthetic_base("big") + "3.index")
        if response.status_code != 200:
            break
        time.sleep(0.5)
    assert response.status_code == 409 and "older than its data" in response.json()["error"], response.text


def test_index_segments_says_what_is_wrong(synthetic_root: Path) -> None:
    for layer, message in (("float_labels", "float32"), ("nope", "no layer 'nope'")):
        done = index_segments(synthetic_root, layer)
        assert done.returncode != 0 and message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_segment_labels_where_the_dataset_has_them(
    synthetic_copy: Path, mesh_tokens: Path, server_factory: Callable[..., Server]
) -> None:
    (synthetic_copy / "synthetic" / "balls" / "labels.segment-labels.json").write_text(json.dumps({"7": "the ball"}))
    server = server_factory(synthetic_copy, tokens_file=mesh_tokens)
    document = get(server, synthetic_base() + "segment_properties/info").json()
    (label,) = [p for p in document["inline"]["properties"] if p["type"] == "label"]
    assert label["values"] == ["the ball"]


def test_a_segment_list_is_made_once_though_its_index_outgrows_the_cache(
    test_data: WrittenDataset, server_factory: Callable[..., Server]
) -> None:
    """The test data's segmentation is noise: scanned, its index (each segment's cubes) takes about 100 MB,
    more than the meshes' cache (a quarter of ``cache_bytes``), while the list itself (1.3 MB) fits. Asked
    again, the list is the cached one: no second scan of the layer, 3 s of CPU each."""
    server = server_factory(test_data.root, cache_bytes=16 << 20)
    path = f"/data/meshes/{ORG}/wk_dataset/segmentation/multires/segment_properties/info"
    with FileReads(test_data.root / ORG / "wk_dataset" / "segmentation") as reads:
        first = requests.get(server.url + path, timeout=120)
        assert first.status_code == 200 and reads.read_since(), "the first list scans the layer"
        for _ in range(2):
            again = requests.get(server.url + path, timeout=120)
            assert (again.status_code, again.content) == (200, first.content)
            assert again.headers["ETag"] == first.headers["ETag"]
            read = reads.read_since()
            assert not read, f"asked again, the list read {sorted(map(str, read))[:5]}"


# --- the dataset page ------------------------------------------------------------------------------


def test_the_neuroglancer_link_opens_image_and_segmentation_with_meshes(server: Server, labels: np.ndarray) -> None:
    """The largest segments come from the index or a scan done already (a listing never starts a scan)."""
    assert get(server, mesh_base() + "segment_properties/info").status_code == 200  # scans the sample
    # the token in the query alone, as a browser opens the page: a header as well would be two tokens (400)
    page = requests.get(f"{server.url}/data/zarr3/{ORGANIZATION}/{DATASET}/?token={MESH_TOKEN}", timeout=60).text
    links = [unquote(unescape(link)) for link in re.findall(r'class="open-neuroglancer" href = "([^"]+)"', page)]
    assert links
    state = json.loads(unescape(links[0]).split("#!", 1)[1])
    layers = {layer["name"]: layer for layer in state["layers"]}
    assert layers["color"]["type"] == "image" and layers["segmentation"]["type"] == "segmentation"
    sources = layers["segmentation"]["source"]
    assert sources[0].startswith("zarr3://")
    # the token in the path, the one form every Neuroglancer keeps on each request
    assert sources[1] == f"{server.url}/t/{MESH_TOKEN}{mesh_base()}|neuroglancer-precomputed:"
    assert [int(s) for s in layers["segmentation"]["segments"]] == largest(labels, 3)


@pytest.mark.parametrize("order", ["C", "F"])
def test_labels_made_coarser_by_mode_take_each_blocks_most_frequent_nonzero_label(order: Literal["C", "F"]) -> None:
    """Each 2x2x2 block's most frequent non-zero label (checked where it is the only most frequent one), whatever
    the memory order of the labels; a block of background alone stays background."""
    labels = np.random.default_rng(5).integers(0, 4, (16, 12, 8)).astype(np.uint64)
    labels[:2, :2, :2] = 0
    coarse = mode_downsample(np.asarray(labels, order=order), (2, 2, 2))
    assert coarse.shape == (8, 6, 4) and coarse[0, 0, 0] == 0
    checked = 0
    for index in np.ndindex(*coarse.shape):
        block = labels[tuple(slice(2 * i, 2 * i + 2) for i in index)].ravel()
        values, counts = np.unique(block[block != 0], return_counts=True)
        if len(values) and (counts == counts.max()).sum() == 1:
            assert coarse[index] == values[counts.argmax()], index
            checked += 1
    assert checked > 100, checked
