"""Zarr layers (v2 and v3, written by webknossos-libs and by zarr-python) served through both trees.

Every array is read through tensorstore, zarr-python and webknossos-libs in the v2 and the v3 tree and
compared voxel for voxel with the source read directly by zarr-python (over ``[0, served shape)``, the
fill value outside the bounding box). Axis orders other than ``(c, x, y, z)`` are mapped; arrays that
cannot be mapped or decoded make their layer unusable with the reason; chunks the tree can declare in
the source's own encoding are passed through byte for byte.

The datasets are written by ``support.zarr_datasets.build_zarr_root``; ``test_object_storage`` serves the same ones
from S3.
"""

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import requests
import tensorstore as ts
import zarr
from support.servers import Server
from support.zarr_datasets import (
    ARRAY_IDS,
    CLIENTS,
    EXTENT,
    SERVED_AXES,
    TREES,
    UNUSABLE_SPECS,
    USABLE_SPECS,
    WK_DATASET,
    ZARR_ORG,
    ZARR_SPECS,
    ZP_DATASET,
    ServedArray,
    ZarrSpec,
    check_array,
    check_webknossos,
    served_arrays,
)

# --- fixtures ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def zarr_gateway(zarr_root: Path, server_factory: Callable[..., Server]) -> Server:
    return server_factory(zarr_root)


@pytest.fixture(scope="module")
def arrays(zarr_root: Path) -> dict[str, ServedArray]:
    return {a.id: a for a in served_arrays(zarr_root)}


def get(server: Server, path: str) -> requests.Response:
    return requests.get(server.url + path, timeout=30)


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
    zarr_gateway: Server,
    arrays: dict[str, ServedArray],
    layer: str,
    mag: tuple[int, int, int],
    chunk: tuple[int, int, int, int],
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
    assert spec.hole is not None
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
