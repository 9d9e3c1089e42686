"""N5 and Neuroglancer precomputed layers (issue 18, item 1), read by real clients through a real gateway.

The volumes are written by tensorstore (N5 raw, gzip and blosc; precomputed raw, jpeg, a 3-channel
volume, sharded scales with both hashes, and a ``compressed_segmentation`` segmentation), and the
``datasource-properties.json`` by webknossos-libs, which records each mag's path as it reads them: the
N5 dataset directory, and ``<volume>/<scale key>`` for precomputed. Every mag is read through
zarr-python, tensorstore and webknossos-libs over HTTP in the v2, v3, sharded v3 and xarray trees and
compared voxel for voxel with tensorstore reading the source directly. Then the hostile cases: broken
metadata, corrupt, cut-short, missing and symlinked chunks.
"""

import gzip
import json
import shutil
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pytest
import requests
import tensorstore as ts
import zarr
from support.n5_precomputed import (
    BY_NAME,
    DATASET,
    LAYERS,
    MAGS,
    N5_BLOCK,
    ORG,
    PC_CHUNK,
    Expected,
    LayerSpec,
    box_at,
    sharding_document,
    source_array,
    write_dataset,
)
from support.s3 import aws_environment, start_moto, upload_tree

from gateway.shard_formats.neuroglancer_sharded import compressed_morton_code
from gateway.sources.metadata import PrecomputedSharding
from gateway.sources.precomputed_source import sharding_of
from gateway_storage.geometry import mag_name

warnings.filterwarnings("ignore", message="Not all image readers could be imported")


class Server(Protocol):
    """A gateway of the ``server_factory`` fixture: all these tests need is where it answers."""

    url: str


HOSTILE = "hostile"


# --- fixtures ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("formats_root")
    write_dataset(base / ORG / DATASET, LAYERS, 18)
    return base


@pytest.fixture(scope="module")
def plain(root: Path, server_factory: Callable[..., Server]) -> Server:
    return server_factory(root)


@pytest.fixture(scope="module")
def sharded(root: Path, server_factory: Callable[..., Server]) -> Server:
    return server_factory(root, v3_layout="sharded")


@pytest.fixture(scope="module")
def expected(root: Path) -> Expected:
    return {(spec.name, mag): source_array(root, DATASET, spec, mag) for spec in LAYERS for mag in MAGS}


def _get(server: Server, path: str) -> requests.Response:
    return requests.get(server.url + path, timeout=60)


# --- every layer and mag through every client in every tree ---------------------------------------------

# (tree in the URL, Zarr version, gateway)
TREES = {"zarr": ("zarr", 2, "plain"), "zarr3": ("zarr3", 3, "plain"), "zarr3-sharded": ("zarr3", 3, "sharded")}


def _read(client: str, url: str, version: int) -> np.ndarray:
    if client == "zarr-python":
        return np.asarray(zarr.open_array(url, mode="r", zarr_format=2 if version == 2 else 3)[...])
    driver = "zarr" if version == 2 else "zarr3"
    return ts.open({"driver": driver, "kvstore": {"driver": "http", "base_url": url + "/"}}).result().read().result()


def test_the_properties_are_as_webknossos_libs_writes_them(root: Path) -> None:
    document = json.loads((root / ORG / DATASET / "datasource-properties.json").read_text())
    layers = {layer["name"]: layer for layer in document["dataLayers"]}
    assert layers["n5_raw"]["dataFormat"] == "n5"
    assert layers["pc_raw"]["dataFormat"] == "neuroglancerPrecomputed"
    assert [m["path"] for m in layers["pc_raw"]["mags"]] == ["./pc_raw/1", "./pc_raw/2-2-1"]


@pytest.mark.parametrize("client", ["zarr-python", "tensorstore"])
@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("layer", [spec.name for spec in LAYERS])
def test_clients_read_every_mag_exactly(
    plain: Server, sharded: Server, expected: Expected, layer: str, tree: str, client: str
) -> None:
    url_tree, version, which = TREES[tree]
    server = {"plain": plain, "sharded": sharded}[which]
    for mag in MAGS:
        data = _read(client, f"{server.url}/data/{url_tree}/{ORG}/{DATASET}/{layer}/{mag_name(mag)}", version)
        np.testing.assert_array_equal(data, expected[(layer, mag)], err_msg=f"{layer} {mag} {tree} {client}")


@pytest.mark.parametrize("client", ["zarr-python", "tensorstore"])
def test_the_xarray_tree_serves_every_layer_exactly(plain: Server, expected: Expected, client: str) -> None:
    for mag in MAGS:
        for spec in LAYERS:
            data = _read(client, f"{plain.url}/data/xarray/{ORG}/{DATASET}/{mag_name(mag)}/{spec.name}", 3)
            want = expected[(spec.name, mag)]
            np.testing.assert_array_equal(data, want if spec.channels > 1 else want[0], err_msg=f"{spec.name} {mag}")


@pytest.mark.parametrize("tree", ["zarr", "zarr3"])
def test_webknossos_libs_reads_every_layer_and_mag(plain: Server, expected: Expected, tree: str) -> None:
    import webknossos as wk
    from upath import UPath

    opened = wk.Dataset.open(UPath(f"{plain.url}/data/{tree}/{ORG}/{DATASET}"))
    assert sorted(opened.layers) == sorted(BY_NAME)
    for spec in LAYERS:
        layer = opened.get_layer(spec.name)
        assert layer.data_format.value == tree
        for mag in MAGS:
            mag_view = layer.get_mag(mag)
            box = layer.bounding_box.align_with_mag(mag_view.mag, ceil=True)
            data = mag_view.read(absolute_bounding_box=box)
            in_mag = box.in_mag(mag_view.mag)
            window = tuple(slice(t, t + s) for t, s in zip(in_mag.topleft, in_mag.size))
            want = expected[(spec.name, mag)][(slice(None), *window)]
            np.testing.assert_array_equal(data.reshape(want.shape), want, err_msg=f"{spec.name} {mag} {tree}")


# --- N5 blocks pass through; precomputed chunks are re-encoded -----------------------------------------


@pytest.mark.parametrize("layer", ["n5_raw", "n5_gzip", "n5_blosc", "n5_zlib", "n5_zstd"])
def test_a_full_n5_block_inside_the_box_is_its_stored_payload(root: Path, plain: Server, layer: str) -> None:
    """The block file without its header, in both trees (zlib: v2 only, v3 has no zlib codec), and metadata that
    says how to read it exactly."""
    block = (1, 1, 1)  # voxels [32, 64) x [32, 64) x [16, 32): inside the box and the array
    stored = (root / ORG / DATASET / layer / "1" / "1" / "1" / "1").read_bytes()
    assert int.from_bytes(stored[:2], "big") == 0 and int.from_bytes(stored[2:4], "big") == 3
    payload = stored[16:]
    base = f"/data/zarr/{ORG}/{DATASET}/{layer}/1"
    zarray = _get(plain, f"{base}/.zarray").json()
    assert zarray["chunks"] == [1, *N5_BLOCK]
    assert zarray["dtype"] == np.dtype(BY_NAME[layer].dtype).newbyteorder(">").str
    assert zarray["order"] == "F"
    assert _get(plain, f"{base}/0.{'.'.join(map(str, block))}").content == payload
    v3 = f"/data/zarr3/{ORG}/{DATASET}/{layer}/1"
    document = _get(plain, f"{v3}/zarr.json").json()
    if layer == "n5_zlib":
        assert zarray["compressor"]["id"] == "zlib"
        assert document["chunk_grid"]["configuration"]["chunk_shape"] == [1, 32, 32, 32]  # re-encoded in v3
        return
    assert {"name": "bytes", "configuration": {"endian": "big"}} in document["codecs"] or BY_NAME[
        layer
    ].dtype == "uint8"
    assert _get(plain, f"{v3}/c/0/{'/'.join(map(str, block))}").content == payload


def test_an_n5_compression_zarr_cannot_name_is_decoded_and_re_encoded(plain: Server) -> None:
    zarray = _get(plain, f"/data/zarr/{ORG}/{DATASET}/n5_bzip2/1/.zarray").json()
    assert zarray["chunks"] == [1, 32, 32, 32] and zarray["dtype"] == "<u2"


@pytest.mark.parametrize("layer", ["pc_raw", "pc_segmentation", "pc_sharded"])
def test_precomputed_chunks_are_re_encoded_in_the_gateways_own_layout(plain: Server, layer: str) -> None:
    """A Zarr chunk cannot declare raw (edge chunks cut short), jpeg or compressed_segmentation chunks."""
    zarray = _get(plain, f"/data/zarr/{ORG}/{DATASET}/{layer}/1/.zarray").json()
    assert zarray["chunks"] == [1, 32, 32, 32]  # the gateway's chunk_edge, not the source's 32 x 32 x 16
    assert zarray["dtype"] == np.dtype(BY_NAME[layer].dtype).newbyteorder("<").str.replace("<u1", "|u1")


# --- sharding facts against tensorstore's own writer -----------------------------------------------------


def test_the_shard_of_every_chunk_is_where_tensorstore_put_it(root: Path) -> None:
    """Each chunk's shard file, from the compressed Morton code and the hash, is one tensorstore wrote."""
    volume = root / ORG / DATASET / "pc_sharded"
    info = json.loads((volume / "info").read_text())
    for scale in info["scales"]:
        sharding = sharding_of(PrecomputedSharding.model_validate(scale["sharding"]))
        grid = tuple(-(-s // c) for s, c in zip(scale["size"], scale["chunk_sizes"][0]))
        names = {
            sharding.shard_name(sharding.locate(compressed_morton_code((x, y, z), grid))[0])
            for x in range(grid[0])
            for y in range(grid[1])
            for z in range(grid[2])
        }
        assert names == {p.name for p in (volume / scale["key"]).iterdir()}, scale["sharding"]["hash"]


# --- hostile input -------------------------------------------------------------------------------------

HOSTILE_LAYERS = [
    LayerSpec("good_n5", "n5", "uint8", compression={"type": "raw"}),
    LayerSpec("good_pc", "neuroglancerPrecomputed", "uint8"),
    LayerSpec("bad_n5_types", "n5", "uint8", compression={"type": "raw"}),
    LayerSpec("bad_n5_compression", "n5", "uint8", compression={"type": "raw"}),
    LayerSpec("bad_pc_key", "neuroglancerPrecomputed", "uint8"),
    LayerSpec("bad_pc_types", "neuroglancerPrecomputed", "uint8"),
    LayerSpec("corrupt_n5_raw", "n5", "uint16", compression={"type": "raw"}),
    LayerSpec("corrupt_n5_gzip", "n5", "uint8", compression={"type": "gzip"}),
    LayerSpec(
        "corrupt_n5_blosc", "n5", "uint8", compression={"type": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1}
    ),
    LayerSpec("corrupt_pc", "neuroglancerPrecomputed", "uint8"),
    LayerSpec("corrupt_pc_sharded", "neuroglancerPrecomputed", "uint8", sharding=("identity", "identity")),
    LayerSpec("linked_n5", "n5", "uint8", compression={"type": "raw"}),
    LayerSpec("linked_pc", "neuroglancerPrecomputed", "uint8"),
    LayerSpec("linked_pc_info", "neuroglancerPrecomputed", "uint8"),
    LayerSpec("missing_n5", "n5", "uint8", compression={"type": "gzip"}),
    LayerSpec("short_edge_n5", "n5", "uint16", compression={"type": "raw"}),
    LayerSpec("legacy_n5", "n5", "uint8", compression={"type": "gzip"}),
]
INSIDE_BLOCK = (1, 1, 1)  # an N5 block wholly inside the box: passed through
STRADDLING_BLOCK = (0, 0, 0)  # an N5 block across the box's low faces: read and encoded


@dataclass
class Hostile:
    root: Path
    outside: Path

    def layer(self, name: str) -> Path:
        return self.root / ORG / HOSTILE / name


def _pc_chunk_file(layer_dir: Path, position: tuple[int, int, int]) -> Path:
    lo, hi = box_at((1, 1, 1))
    starts = [o + p * c for o, p, c in zip(lo, position, PC_CHUNK)]
    ends = [min(s + c, h) for s, c, h in zip(starts, PC_CHUNK, hi)]
    return layer_dir / "1" / "_".join(f"{s}-{e}" for s, e in zip(starts, ends))


def _cut_to_the_array(block: Path, shape: tuple[int, int, int], dtype: np.dtype) -> None:
    """Rewrite a raw N5 block as its first ``shape`` voxels, with a header that says so."""
    data = block.read_bytes()
    voxels = np.frombuffer(data[16:], dtype=dtype).reshape(N5_BLOCK, order="F")
    header = (0).to_bytes(2, "big") + (3).to_bytes(2, "big") + b"".join(n.to_bytes(4, "big") for n in shape)
    block.write_bytes(header + voxels[: shape[0], : shape[1], : shape[2]].tobytes(order="F"))


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Hostile:
    base = tmp_path_factory.mktemp("formats_hostile")
    where = Hostile(base / "root", base / "outside")
    write_dataset(where.root / ORG / HOSTILE, HOSTILE_LAYERS, 7)
    where.outside.mkdir()
    # Broken metadata: wrong JSON types, a compression without a type, an info without the mag's scale key.
    attributes = where.layer("bad_n5_types") / "1" / "attributes.json"
    attributes.write_text(json.dumps({**json.loads(attributes.read_text()), "dimensions": "huge"}))
    attributes = where.layer("bad_n5_compression") / "1" / "attributes.json"
    attributes.write_text(json.dumps({**json.loads(attributes.read_text()), "compression": ["gzip"]}))
    info_path = where.layer("bad_pc_key") / "info"
    info = json.loads(info_path.read_text())
    info["scales"] = [s for s in info["scales"] if s["key"] != "1"]
    info_path.write_text(json.dumps(info))
    info_path = where.layer("bad_pc_types") / "info"
    info = json.loads(info_path.read_text())
    info["scales"][0]["size"] = "100,70,40"
    info["num_channels"] = "one"
    info_path.write_text(json.dumps(info))
    # Corrupt chunks: a raw block cut short, gzip and blosc blocks whose payload is garbage or cut short.
    block = where.layer("corrupt_n5_raw") / "1" / "1" / "1" / "1"
    block.write_bytes(block.read_bytes()[:-100])
    for layer in ("corrupt_n5_gzip", "corrupt_n5_blosc"):
        for coords in (INSIDE_BLOCK, STRADDLING_BLOCK):
            block = where.layer(layer) / "1" / "/".join(map(str, coords))
            data = block.read_bytes()
            block.write_bytes(data[:16] + data[16 : len(data) // 2])
    chunk = _pc_chunk_file(where.layer("corrupt_pc"), (1, 1, 1))
    chunk.write_bytes(chunk.read_bytes()[:-7])
    for shard in (where.layer("corrupt_pc_sharded") / "1").iterdir():  # every minishard index points past the end
        shard_bytes = bytearray(shard.read_bytes())
        shard_bytes[0:64] = ((0).to_bytes(8, "little") + (2**40).to_bytes(8, "little")) * 4
        shard.write_bytes(bytes(shard_bytes))
    # Symlinks out of the root: an N5 block, a precomputed chunk, a precomputed info.
    secret = where.outside / "secret"
    secret.write_bytes(b"\xab" * 70000)
    for link in (where.layer("linked_n5") / "1" / "1" / "1" / "1", _pc_chunk_file(where.layer("linked_pc"), (1, 1, 1))):
        link.unlink()
        link.symlink_to(secret)
    info_path = where.layer("linked_pc_info") / "info"
    shutil.copy(info_path, where.outside / "info")
    info_path.unlink()
    info_path.symlink_to(where.outside / "info")
    # A block at the array's edge cut short to the array, as N5's own (Java) writers store it.
    _cut_to_the_array(where.layer("short_edge_n5") / "1" / "3" / "1" / "1", (8, 32, 16), np.dtype(">u2"))
    # N5 before version 2 named the compression by its type alone.
    for mag in MAGS:
        attributes = where.layer("legacy_n5") / mag_name(mag) / "attributes.json"
        legacy = json.loads(attributes.read_text())
        legacy["compressionType"] = legacy.pop("compression")["type"]
        attributes.write_text(json.dumps(legacy))
    # A missing block inside the box reads as the fill value, as in Zarr.
    (where.layer("missing_n5") / "1" / "1" / "1" / "1").unlink()
    return where


@pytest.fixture(scope="module")
def hostile_gateway(hostile: Hostile, server_factory: Callable[..., Server]) -> Server:
    return server_factory(hostile.root)


# layer: (what is broken, the reason given); an N5 dataset is one mag, a precomputed info is every mag's
BROKEN_MAG_1 = {
    "bad_n5_types": "attributes.json is invalid: dimensions: Input should be a valid tuple",
    "bad_n5_compression": "compression: Input should be a valid dictionary",
    "bad_pc_key": "no scale with key '1'",
}
BROKEN_LAYERS = {
    "bad_pc_types": "num_channels: Input should be a valid integer",
    "linked_pc_info": "directory not found or outside the data root",
}


@pytest.mark.parametrize("tree", ["zarr", "zarr3"])
def test_broken_metadata_makes_only_its_mags_unusable_with_the_reason(hostile_gateway: Server, tree: str) -> None:
    metadata = ".zarray" if tree == "zarr" else "zarr.json"
    base = f"/data/{tree}/{ORG}/{HOSTILE}"
    assert _get(hostile_gateway, f"{base}/{'.zgroup' if tree == 'zarr' else 'zarr.json'}").status_code == 200
    for layer, reason in BROKEN_MAG_1.items():
        broken = _get(hostile_gateway, f"{base}/{layer}/1/{metadata}")
        assert broken.status_code == 404 and reason in broken.json()["error"], (layer, broken.content[:300])
        assert _get(hostile_gateway, f"{base}/{layer}/2-2-1/{metadata}").status_code == 200, layer
    for layer, reason in BROKEN_LAYERS.items():
        broken = _get(hostile_gateway, f"{base}/{layer}/{metadata.replace('array', 'group')}")
        assert broken.status_code == 404 and reason in broken.json()["error"], (layer, broken.content[:300])
    for name in ("good_n5", "good_pc"):
        for mag in MAGS:
            served = _read(
                "zarr-python", f"{hostile_gateway.url}{base}/{name}/{mag_name(mag)}", 2 if tree == "zarr" else 3
            )
            assert served.any() and served.shape == (1, *box_at(mag)[1])


@pytest.mark.parametrize("layer", ["corrupt_n5_raw", "corrupt_n5_gzip", "corrupt_n5_blosc"])
@pytest.mark.parametrize("tree", ["zarr", "zarr3"])
def test_a_corrupt_n5_block_is_a_storage_fault(hostile_gateway: Server, layer: str, tree: str) -> None:
    key = ".".join(map(str, (0, *INSIDE_BLOCK))) if tree == "zarr" else "c/0/" + "/".join(map(str, INSIDE_BLOCK))
    answer = _get(hostile_gateway, f"/data/{tree}/{ORG}/{HOSTILE}/{layer}/1/{key}")
    assert answer.status_code == 500, (answer.status_code, answer.content[:200])
    assert "storage fault" in answer.json()["error"]


@pytest.mark.parametrize("layer", ["corrupt_n5_gzip", "corrupt_n5_blosc"])
def test_a_corrupt_n5_block_read_as_voxels_is_a_storage_fault(hostile_gateway: Server, layer: str) -> None:
    answer = _get(hostile_gateway, f"/data/zarr/{ORG}/{HOSTILE}/{layer}/1/0.0.0.0")  # straddles the box
    assert answer.status_code == 500, (answer.status_code, answer.content[:200])


@pytest.mark.parametrize("layer", ["corrupt_pc", "corrupt_pc_sharded"])
@pytest.mark.parametrize("tree", ["zarr", "zarr3"])
def test_a_corrupt_precomputed_chunk_or_shard_is_a_storage_fault(
    hostile_gateway: Server, layer: str, tree: str
) -> None:
    edge = 32  # the gateway's chunks: the one at (1, 1, 1) covers the corrupt chunk
    key = "0.1.1.1" if tree == "zarr" else "c/0/1/1/1"
    answer = _get(hostile_gateway, f"/data/{tree}/{ORG}/{HOSTILE}/{layer}/1/{key}")
    assert answer.status_code == 500, (edge, answer.status_code, answer.content[:200])
    assert "storage fault" in answer.json()["error"]


@pytest.mark.parametrize("layer", ["linked_n5", "linked_pc"])
@pytest.mark.parametrize("tree", ["zarr", "zarr3", "xarray"])
def test_a_chunk_linked_out_of_the_root_is_refused(
    hostile: Hostile, hostile_gateway: Server, layer: str, tree: str
) -> None:
    where = {"zarr": f"{layer}/1/0.1.1.1", "zarr3": f"{layer}/1/c/0/1/1/1", "xarray": f"1/{layer}/c/1/1/1"}[tree]
    answer = _get(hostile_gateway, f"/data/{tree}/{ORG}/{HOSTILE}/{where}")
    assert answer.status_code == 500, (answer.status_code, answer.content[:200])
    message = answer.json()["error"]
    assert "resolves outside the data root" in message and f"{ORG}/{HOSTILE}/{layer}/" in message, message
    assert str(hostile.root) not in message and str(hostile.outside) not in message
    assert b"\xab" * 16 not in answer.content


def test_a_missing_n5_block_inside_the_box_reads_as_the_fill_value(hostile: Hostile, hostile_gateway: Server) -> None:
    base = f"{hostile_gateway.url}/data/zarr/{ORG}/{HOSTILE}/missing_n5/1"
    assert requests.get(f"{base}/0.1.1.1", timeout=30).status_code == 404
    served = _read("zarr-python", base, 2)
    want = source_array(hostile.root, HOSTILE, BY_NAME_HOSTILE["missing_n5"], (1, 1, 1))
    np.testing.assert_array_equal(served, want)
    assert not served[0, 32:64, 32:64, 16:32].any() and served.any()


BY_NAME_HOSTILE = {spec.name: spec for spec in HOSTILE_LAYERS}


def test_a_gzip_minishard_index_is_read_as_written(root: Path) -> None:
    """The fixture's sharded scales really compress their minishard indexes (the path the reader must take)."""
    shard = next((root / ORG / DATASET / "pc_sharded" / "1").iterdir()).read_bytes()
    entries = np.frombuffer(shard[: 16 * 4], dtype="<u8").reshape(-1, 2)
    start, end = next((int(a), int(b)) for a, b in entries if b > a)
    assert gzip.decompress(shard[64 + start : 64 + end])


@pytest.mark.parametrize("tree", ["zarr", "zarr3"])
def test_an_n5_block_cut_short_at_the_array_s_edge_reads_as_tensorstore_reads_it(
    hostile: Hostile, hostile_gateway: Server, tree: str
) -> None:
    want = source_array(hostile.root, HOSTILE, BY_NAME_HOSTILE["short_edge_n5"], (1, 1, 1))
    assert want[0, 96:104, 32:64, 16:32].any()
    served = _read(
        "zarr-python", f"{hostile_gateway.url}/data/{tree}/{ORG}/{HOSTILE}/short_edge_n5/1", 2 if tree == "zarr" else 3
    )
    np.testing.assert_array_equal(served, want)


# --- from object storage ---------------------------------------------------------------------------------

BUCKET, PREFIX = "formats-data", "root"


@pytest.fixture(scope="module")
def s3_gateway(
    root: Path, server_factory: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """The same dataset uploaded file by file to moto's real S3 server, served from ``s3://formats-data/root``."""
    moto = start_moto(tmp_path_factory.mktemp("formats_moto") / "moto.log")
    try:
        with aws_environment(moto.endpoint):
            client = moto.client()
            client.create_bucket(Bucket=BUCKET)
            upload_tree(client, root, BUCKET, PREFIX)
            yield server_factory(f"s3://{BUCKET}/{PREFIX}")  # the gateway takes the environment as it starts
    finally:
        moto.stop()


@pytest.mark.slow  # moto's S3 server, every layer read whole
@pytest.mark.parametrize("tree", ["zarr", "zarr3"])
def test_every_layer_reads_exactly_from_s3(s3_gateway: Server, expected: Expected, tree: str) -> None:
    for spec in LAYERS:
        for mag in MAGS:
            url = f"{s3_gateway.url}/data/{tree}/{ORG}/{DATASET}/{spec.name}/{mag_name(mag)}"
            data = _read("zarr-python", url, 2 if tree == "zarr" else 3)
            np.testing.assert_array_equal(data, expected[(spec.name, mag)], err_msg=f"{spec.name} {mag} {tree}")


@pytest.mark.parametrize("layer", [spec.name for spec in LAYERS])
def test_every_layer_has_a_preview(plain: Server, layer: str) -> None:
    answer = _get(plain, f"/preview/{ORG}/{DATASET}/{layer}.png")
    assert answer.status_code == 200 and answer.content.startswith(b"\x89PNG"), answer.content[:200]


def test_an_n5_dataset_of_the_first_version_is_served(
    hostile: Hostile, hostile_gateway: Server, tmp_path: Path
) -> None:
    """``compressionType`` instead of a ``compression`` object: served as the modern form it means."""
    base = f"{hostile_gateway.url}/data/zarr/{ORG}/{HOSTILE}/legacy_n5/1"
    assert requests.get(f"{base}/.zarray", timeout=30).json()["compressor"]["id"] == "gzip"
    modern = tmp_path / ORG / HOSTILE / "legacy_n5" / "1"
    shutil.copytree(hostile.layer("legacy_n5") / "1", modern)
    attributes = json.loads((modern / "attributes.json").read_text())
    attributes["compression"] = {"type": attributes.pop("compressionType")}
    (modern / "attributes.json").write_text(json.dumps(attributes))
    want = source_array(tmp_path, HOSTILE, BY_NAME_HOSTILE["legacy_n5"], (1, 1, 1))
    np.testing.assert_array_equal(_read("zarr-python", base, 2), want)
    assert want.any()


# --- every malformed field is a reason, never a crash -------------------------------------------------------

_N5_GOOD = {"dimensions": [64, 64, 32], "blockSize": [32, 32, 16], "dataType": "uint8", "compression": {"type": "raw"}}
N5_BROKEN: dict[str, tuple[bytes | dict[str, Any], str]] = {
    "not JSON": (b"{dimensions", "attributes.json is not usable: it is not JSON"),
    "a list": (b"[1, 2, 3]", "must be a JSON object, not an array"),
    "dimensions of strings": (
        {**_N5_GOOD, "dimensions": ["64", "64", "32"]},
        "dimensions.0: Input should be a valid integer",
    ),
    "a short blockSize": ({**_N5_GOOD, "blockSize": [32, 32]}, "blockSize has 2 dimensions, dimensions 3"),
    "a zero blockSize": (
        {**_N5_GOOD, "blockSize": [32, 0, 16]},
        "blockSize.1: Input should be greater than or equal to 1",
    ),
    "an unknown dataType": ({**_N5_GOOD, "dataType": "complex64"}, "dataType: Input should be 'uint8'"),
    "no compression": ({k: v for k, v in _N5_GOOD.items() if k != "compression"}, "compression: Field required"),
    "a malformed blosc": ({**_N5_GOOD, "compression": {"type": "blosc", "cname": 3}}, "blosc compression"),
    "an unknown compression": ({**_N5_GOOD, "compression": {"type": "snappy"}}, "tensorstore cannot open"),
    "too many axes": ({**_N5_GOOD, "dimensions": [4, 4, 4, 4, 4], "blockSize": [4] * 5}, "cannot be mapped"),
}
_SCALE: dict[str, Any] = {
    "key": "1",
    "size": [64, 64, 32],
    "voxel_offset": [0, 0, 0],
    "chunk_sizes": [[32, 32, 16]],
    "encoding": "raw",
}
_INFO: dict[str, Any] = {
    "type": "image",
    "data_type": "uint8",
    "num_channels": 1,
    "scales": [{**_SCALE, "resolution": [1, 1, 1]}],
}
PRECOMPUTED_BROKEN: dict[str, tuple[bytes | dict[str, Any], str]] = {
    "not JSON": (b"\x89PNG", "info is not usable"),
    "scales not a list": ({**_INFO, "scales": {"1": _SCALE}}, "scales: Input should be a valid tuple"),
    "no scale of the key": ({**_INFO, "scales": [{**_SCALE, "key": "2"}]}, "no scale with key '1'"),
    "an unknown data_type": ({**_INFO, "data_type": "uint128"}, "data_type: Input should be 'uint8'"),
    "a size of floats": (
        {**_INFO, "scales": [{**_SCALE, "size": [64.0, 64, 32]}]},
        "info scale '1' is invalid: size.0: Input should be a valid integer",
    ),
    "a boolean voxel_offset": (
        {**_INFO, "scales": [{**_SCALE, "voxel_offset": [True, 0, 0]}]},
        "voxel_offset.0: Input should be a valid integer",
    ),
    "no chunk_sizes": (
        {**_INFO, "scales": [{**_SCALE, "chunk_sizes": []}]},
        "chunk_sizes: Tuple should have at least 1 item",
    ),
    "a foreign sharding": (
        {**_INFO, "scales": [{**_SCALE, "sharding": {"@type": "zarr"}}]},
        "sharding.@type: Input should be 'neuroglancer_uint64_sharded_v1'",
    ),
    "an unknown hash": (
        {**_INFO, "scales": [{**_SCALE, "sharding": {**sharding_document("identity"), "hash": "md5"}}]},
        "sharding.hash: Input should be 'identity' or 'murmurhash3_x86_128'",
    ),
    "an unknown encoding": ({**_INFO, "scales": [{**_SCALE, "encoding": "webp"}]}, "tensorstore cannot open"),
}


def _open_broken(tmp_path: Path, name: str, document: bytes | dict[str, Any], data_format: str) -> str:
    from gateway.sources.mag import SourceError
    from gateway.sources.properties import DataLayer
    from gateway.sources.registry import SourceFormats
    from gateway_storage import LocalStore

    mag_dir = tmp_path / "layer" / "1"
    mag_dir.mkdir(parents=True)
    body = document if isinstance(document, bytes) else json.dumps(document).encode()
    (mag_dir / "attributes.json" if data_format == "n5" else mag_dir.parent / "info").write_bytes(body)
    store = LocalStore(str(tmp_path))
    source_format = SourceFormats(store, 1 << 20).for_data_format(data_format)
    assert source_format is not None and source_format.holds_mag(str(mag_dir))
    layer = DataLayer.model_validate(
        {
            "name": "layer",
            "category": "color",
            "boundingBox": {"topLeft": [0, 0, 0], "width": 64, "height": 64, "depth": 32},
            "elementClass": "uint8",
            "dataFormat": data_format,
            "mags": [{"mag": [1, 1, 1]}],
        }
    )
    with pytest.raises((SourceError, OSError)) as raised:  # what the catalog lists as the mag's reason
        source_format.open_mag((1, 1, 1), str(mag_dir), layer, None)
    return str(raised.value)


@pytest.mark.parametrize("case", list(N5_BROKEN))
def test_malformed_n5_attributes_are_a_reason(tmp_path: Path, case: str) -> None:
    document, reason = N5_BROKEN[case]
    assert reason in _open_broken(tmp_path, case, document, "n5")


@pytest.mark.parametrize("case", list(PRECOMPUTED_BROKEN))
def test_a_malformed_precomputed_info_is_a_reason(tmp_path: Path, case: str) -> None:
    document, reason = PRECOMPUTED_BROKEN[case]
    assert reason in _open_broken(tmp_path, case, document, "neuroglancerPrecomputed")
