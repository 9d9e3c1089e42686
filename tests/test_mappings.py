"""Agglomerate mappings as segmentation layers (issue 43): every mapping beside a segmentation layer (an HDF5
agglomerate file, a Zarr v3 agglomerate group, a JSON mapping) is a layer ``<layer>__<mapping>`` that
zarr-python, tensorstore, webknossos-libs and CloudVolume read exactly as the source's labels with the mapping
applied (numpy's truth), with every mapping file's version in its chunks' ETags."""

import functools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import requests
import wkw
import zarr
from hypothesis import example, given, settings
from hypothesis import strategies as st
from support.clients import read_tensorstore, read_webknossos_mags, read_zarr_python
from support.cloudvolume_reads import read_box
from support.processes import wait_until
from support.servers import Server, assert_no_unexpected_errors, assert_reason
from upath import UPath

pytestmark = pytest.mark.slow  # whole mapped layers read by four clients

ORG = "map_org"
DATASET = "mapped"
LAYER = "segmentation"
SIZE = (96, 80, 40)  # mag-1 voxels, from the origin
MAGS = ((1, 1, 1), (2, 2, 1))
ENTRIES = 50_000  # segment_to_agglomerate's length; the labels reach past it (those ids stay as they are)
TOP_ID = 60_000
HDF5 = "agglomerate_view_5"
HDF5_CHUNKED = "agglomerate_view_chunked"
ZARR = "proofread__v2"  # a mapping name with the separator in it
JSON = "equivalences"
WK_ZARR = "agglomerate_view_wk"  # written by webknossos-libs: sharded


def mag_name(mag: tuple[int, int, int]) -> str:
    return str(mag[0]) if len(set(mag)) == 1 else "-".join(map(str, mag))


def labels(rng: np.random.Generator) -> np.ndarray[Any, Any]:
    """Blocks of 4^3 voxels, each one id: zeros, ids below ENTRIES and ids past it."""
    blocks = rng.integers(0, TOP_ID, size=tuple(-(-s // 4) for s in SIZE), dtype=np.uint32)
    blocks[rng.random(blocks.shape) < 0.1] = 0
    full = np.repeat(np.repeat(np.repeat(blocks, 4, 0), 4, 1), 4, 2)
    return full[: SIZE[0], : SIZE[1], : SIZE[2]]


def segment_to_agglomerate(rng: np.random.Generator) -> np.ndarray[Any, Any]:
    table = rng.integers(1, 1 << 40, size=ENTRIES, dtype=np.uint64)  # agglomerate ids past uint32
    table[0] = 0
    table[7:200] = 77  # a run of segments joined into one agglomerate
    return table


def json_classes(rng: np.random.Generator) -> list[list[int]]:
    ids = rng.permutation(np.arange(1, TOP_ID))[:3000].tolist()
    classes = [ids[i : i + 30] for i in range(0, len(ids), 30)]
    return [*classes, [classes[0][3], *classes[1]], []]  # overlapping classes join; an empty one maps nothing


def apply_json(data: np.ndarray[Any, Any], classes: list[list[int]]) -> np.ndarray[Any, Any]:
    """webKnossos' reading of classes: in order, each to its smallest id, or to where an earlier class put it."""
    table: dict[int, int] = {}
    for members in classes:
        if members:
            target = table.get(min(members), min(members))
            table.update((member, target) for member in members)
    out = data.copy()
    for member, target in table.items():
        out[data == member] = target
    return out


def apply_table(data: np.ndarray[Any, Any], table: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    wide = data.astype(np.uint64)
    inside = wide < table.size
    out = wide.copy()
    out[inside] = table[wide[inside]]
    return out


class Written:
    def __init__(self, root: Path) -> None:
        rng = np.random.default_rng(43)
        self.root = root
        self.dataset = root / ORG / DATASET
        self.layer = self.dataset / LAYER
        self.source: dict[tuple[int, int, int], np.ndarray[Any, Any]] = {}
        full = labels(rng)
        for mag in MAGS:
            data = np.ascontiguousarray(full[:: mag[0], :: mag[1], :: mag[2]])
            header = wkw.Header(np.uint32, block_type=wkw.Header.BLOCK_TYPE_LZ4HC, file_len=1)
            padded = np.zeros(tuple(-(-s // 32) * 32 for s in data.shape), dtype=np.uint32)
            padded[: data.shape[0], : data.shape[1], : data.shape[2]] = data
            with wkw.Dataset.create(str(self.layer / mag_name(mag)), header) as ds:
                ds.write((0, 0, 0), padded)
            self.source[mag] = data
        properties = {
            "id": {"name": DATASET, "team": ""},
            "scale": {"factor": [8.0, 8.0, 16.0], "unit": "nanometer"},
            "dataLayers": [
                {
                    "name": LAYER,
                    "category": "segmentation",
                    "boundingBox": {"topLeft": [0, 0, 0], "width": SIZE[0], "height": SIZE[1], "depth": SIZE[2]},
                    "elementClass": "uint32",
                    "dataFormat": "wkw",
                    "largestSegmentId": TOP_ID,
                    "mags": [{"mag": list(mag), "path": f"./{LAYER}/{mag_name(mag)}"} for mag in MAGS],
                }
            ],
        }
        (self.dataset / "datasource-properties.json").write_text(json.dumps(properties))
        self.table = segment_to_agglomerate(rng)
        agglomerates = self.layer / "agglomerates"
        agglomerates.mkdir()
        with h5py.File(agglomerates / f"{HDF5}.hdf5", "w") as f:  # no offsets: the stored type holds its ids
            f.create_dataset("segment_to_agglomerate", data=self.table)
        self.chunked_table = np.arange(ENTRIES, dtype=np.uint64) // 50 + 1  # 50 segments per agglomerate
        self.chunked_table[0] = 0
        self.members = np.bincount(self.chunked_table.astype(np.int64))
        self.members[0] = 0
        with h5py.File(agglomerates / f"{HDF5_CHUNKED}.hdf5", "w") as f:
            f.create_dataset("segment_to_agglomerate", data=self.chunked_table, chunks=(4096,), compression="gzip")
            offsets = np.concatenate([[0], np.cumsum(self.members)]).astype(np.uint64)
            f.create_dataset("agglomerate_to_segments_offsets", data=offsets)
        self.zarr_table = self.table[::-1].copy()
        self.zarr_table[0] = 0
        group = zarr.open_group(str(agglomerates / ZARR), mode="w", zarr_format=3)
        group.create_array("segment_to_agglomerate", data=self.zarr_table, chunks=(4096,))
        self.wk_table = write_webknossos_group(agglomerates / WK_ZARR)
        self.classes = json_classes(rng)
        (self.layer / "mappings").mkdir()
        (self.layer / "mappings" / f"{JSON}.json").write_text(json.dumps({"name": JSON, "classes": self.classes}))

    def truth(self, mapping: str, mag: tuple[int, int, int]) -> np.ndarray[Any, Any]:
        source = self.source[mag]
        if mapping == HDF5:
            return apply_table(source, self.table)
        if mapping == HDF5_CHUNKED:
            return apply_table(source, self.chunked_table).astype(np.uint32)
        if mapping == ZARR:
            return apply_table(source, self.zarr_table)
        if mapping == WK_ZARR:
            return apply_table(source, self.wk_table).astype(np.uint32)
        return apply_json(source, self.classes)


MAPPINGS = (HDF5, HDF5_CHUNKED, ZARR, WK_ZARR, JSON)
# The narrowest type that holds the layer's ids (uint32) and the agglomerate ids each mapping declares: ids past
# uint32 where a file says nothing of its agglomerates (the stored uint64), the layer's own where the length of
# agglomerate_to_segments_offsets (HDF5, and the group webknossos-libs writes) says they fit, as for JSON.
DTYPES = {HDF5: "uint64", HDF5_CHUNKED: "uint32", ZARR: "uint64", WK_ZARR: "uint32", JSON: "uint32"}


def write_webknossos_group(path: Path) -> np.ndarray[Any, Any]:
    """An agglomerate group as webknossos-libs writes it (sharded Zarr v3 arrays), of 3,000 segments joined in
    runs of three; returns its segment_to_agglomerate as zarr-python reads it back."""
    from webknossos import AgglomerateAttachment, AgglomerateGraph
    from webknossos.geometry import Vec3Int

    graph = AgglomerateGraph()
    for segment in range(1, 3001):
        graph.add_segment(segment, position=Vec3Int(segment, 0, 0))
        if segment % 3:
            graph.add_affinity_edge(segment, segment + 1, affinity=1.0)
    AgglomerateAttachment.create(path, graph)
    table: np.ndarray[Any, Any] = np.asarray(zarr.open_array(str(path / "segment_to_agglomerate"), mode="r")[:])
    return table


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Written:
    return Written(tmp_path_factory.mktemp("mappings"))


@pytest.fixture(scope="module")
def gateway(written: Written, server_factory: Callable[..., Server]) -> Server:
    return server_factory(written.root)


@pytest.fixture(scope="module")
def sharded(written: Written, server_factory: Callable[..., Server]) -> Server:
    return server_factory(written.root, v3_layout="sharded")


def base(server: Server, tree: str) -> str:
    return f"{server.url}/data/{tree}/{ORG}/{DATASET}"


def test_each_mapping_is_a_segmentation_layer_in_the_properties(gateway: Server, written: Written) -> None:
    for tree in ("zarr", "zarr3"):
        document = requests.get(f"{base(gateway, tree)}/datasource-properties.json").json()
        layers = {layer["name"]: layer for layer in document["dataLayers"]}
        assert set(layers) == {LAYER, *(f"{LAYER}__{m}" for m in MAPPINGS)}, set(layers)
        for mapping in MAPPINGS:
            layer = layers[f"{LAYER}__{mapping}"]
            assert layer["category"] == "segmentation"
            assert layer["elementClass"] == DTYPES[mapping], layer
            assert "largestSegmentId" not in layer
            assert [m["path"] for m in layer["mags"]] == [f"./{LAYER}__{mapping}/{mag_name(m)}" for m in MAGS]


@pytest.mark.parametrize("mapping", MAPPINGS)
def test_zarr_python_reads_every_mag_mapped_exactly(gateway: Server, written: Written, mapping: str) -> None:
    for tree, version in (("zarr", 2), ("zarr3", 3)):
        for mag in MAGS:
            url = f"{base(gateway, tree)}/{LAYER}__{mapping}/{mag_name(mag)}"
            read = read_zarr_python(url, version)
            truth = written.truth(mapping, mag)
            assert read.dtype == truth.dtype, (tree, mag, read.dtype)
            np.testing.assert_array_equal(read[0], truth, err_msg=f"{tree} {mapping} {mag}")
    assert_no_unexpected_errors(gateway)


@pytest.mark.parametrize("mapping", [HDF5, HDF5_CHUNKED, ZARR])
def test_tensorstore_reads_the_sharded_and_v2_trees_exactly(
    gateway: Server, sharded: Server, written: Written, mapping: str
) -> None:
    for server, tree, version in ((sharded, "zarr3", 3), (gateway, "zarr", 2)):
        for mag in MAGS:
            read = read_tensorstore(f"{base(server, tree)}/{LAYER}__{mapping}/{mag_name(mag)}", version)
            np.testing.assert_array_equal(read[0], written.truth(mapping, mag), err_msg=f"{tree} {mag}")


@pytest.mark.parametrize("mapping", [HDF5, HDF5_CHUNKED])
def test_webknossos_libs_reads_the_mapped_layer_exactly(gateway: Server, written: Written, mapping: str) -> None:
    import webknossos as wk

    dataset = wk.Dataset.open(UPath(base(gateway, "zarr3")))
    layer = dataset.get_layer(f"{LAYER}__{mapping}")
    assert layer.category == "segmentation"
    assert layer.dtype == np.dtype(DTYPES[mapping])
    seen = []
    for mag, data, region in read_webknossos_mags(layer):
        truth = written.truth(mapping, mag)
        assert data.dtype == truth.dtype
        assert isinstance(region, tuple)
        np.testing.assert_array_equal(data[0], truth[region[1:]], err_msg=str(mag))
        seen.append(mag)
    assert sorted(seen) == sorted(MAGS)


@pytest.mark.parametrize("mapping", [HDF5, HDF5_CHUNKED, JSON])
def test_cloudvolume_reads_the_precomputed_tree_exactly(gateway: Server, written: Written, mapping: str) -> None:
    url = f"{base(gateway, 'precomputed')}/{LAYER}__{mapping}"
    info = requests.get(f"{url}/info").json()
    assert (info["type"], info["data_type"]) == ("segmentation", DTYPES[mapping])
    for mip, mag in enumerate(MAGS):
        hi = written.source[mag].shape
        read = read_box(url, mip, (0, 0, 0), hi)
        np.testing.assert_array_equal(read[..., 0], written.truth(mapping, mag), err_msg=str(mag))


def test_the_xarray_tree_holds_the_mapped_layer_beside_the_source(gateway: Server, written: Written) -> None:
    url = f"{base(gateway, 'xarray')}/1/{LAYER}__{ZARR}"
    np.testing.assert_array_equal(read_zarr_python(url, 3), written.truth(ZARR, (1, 1, 1)))


def test_the_dataset_page_lists_the_mapped_layers_and_the_viewer_link_opens_them(gateway: Server) -> None:
    import re
    from html import unescape
    from urllib.parse import unquote

    page = requests.get(f"{base(gateway, 'zarr3')}/").text
    for mapping in MAPPINGS:
        assert f"{LAYER}__{mapping}" in page, mapping
    links = [unquote(unescape(link)) for link in re.findall(r'class="open-neuroglancer" href = "([^"]*)"', page)]
    assert links, "the page links Neuroglancer"
    state = json.loads(links[0].partition("#!")[2])
    by_name = {layer["name"]: layer for layer in state["layers"]}
    mapped = by_name[f"{LAYER}__{HDF5}"]
    assert mapped["type"] == "segmentation"
    sources = mapped["source"] if isinstance(mapped["source"], list) else [mapped["source"]]
    assert any(f"/{LAYER}__{HDF5}/" in str(source) for source in sources), sources
    assert any("/data/meshes/" in str(source) for source in sources), sources


def test_mapped_chunks_name_the_mapping_in_their_etag_and_differ_from_the_source(gateway: Server) -> None:
    raw = requests.get(f"{base(gateway, 'zarr')}/{LAYER}/1/0.0.0.0")
    mapped = requests.get(f"{base(gateway, 'zarr')}/{LAYER}__{HDF5}/1/0.0.0.0")
    other = requests.get(f"{base(gateway, 'zarr')}/{LAYER}__{HDF5_CHUNKED}/1/0.0.0.0")
    assert raw.status_code == mapped.status_code == other.status_code == 200
    assert len({raw.headers["etag"], mapped.headers["etag"], other.headers["etag"]}) == 3
    again = requests.get(f"{base(gateway, 'zarr')}/{LAYER}__{HDF5}/1/0.0.0.0")
    assert again.headers["etag"] == mapped.headers["etag"] and again.content == mapped.content


def wait_settled(path: Path) -> None:
    """Past the settle time (the gateway's default) of the file just written."""
    time.sleep(max(0.0, os.stat(path).st_mtime + 1.2 - time.time()))


def test_a_rewritten_mapping_changes_chunks_and_etags(
    written: Written, server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    import shutil

    root = tmp_path / "root"
    shutil.copytree(written.root, root)
    server = server_factory(root)
    replica = server_factory(root)
    url = f"{base(server, 'zarr')}/{LAYER}__{HDF5}/1"
    properties_url = f"{base(server, 'precomputed')}/{LAYER}__{HDF5}/segment_properties/info"
    before = requests.get(f"{url}/0.0.0.0")
    assert before.status_code == 200
    assert requests.get(f"{base(replica, 'zarr')}/{LAYER}__{HDF5}/1/0.0.0.0").headers["etag"] == before.headers["etag"]
    np.testing.assert_array_equal(read_zarr_python(url, 2)[0], written.truth(HDF5, (1, 1, 1)))
    listed_before = requests.get(properties_url).json()["inline"]["ids"]
    assert str(AGGLOMERATE) in listed_before
    table = written.table.copy()
    table[1:] = 9  # proofreading joined every segment
    path = root / ORG / DATASET / LAYER / "agglomerates" / f"{HDF5}.hdf5"
    with h5py.File(path, "w") as f:
        f.create_dataset("segment_to_agglomerate", data=table)
    wait_settled(path)
    after = requests.get(f"{url}/0.0.0.0", headers={"If-None-Match": before.headers["etag"]})
    assert after.status_code == 200, after.status_code
    assert after.headers["etag"] != before.headers["etag"]
    np.testing.assert_array_equal(read_zarr_python(url, 2)[0], apply_table(written.source[(1, 1, 1)], table))
    again = requests.get(f"{base(replica, 'zarr')}/{LAYER}__{HDF5}/1/0.0.0.0")
    assert again.headers["etag"] == after.headers["etag"] and again.content == after.content  # replicas agree

    def relisted() -> list[str] | None:
        ids: list[str] = requests.get(properties_url).json()["inline"]["ids"]
        return ids if str(AGGLOMERATE) not in ids else None

    listed_after = wait_until(relisted, timeout=60, interval=1)  # the data stamp is taken again within seconds
    assert listed_after and "9" in listed_after, listed_after
    assert_no_unexpected_errors(server)


def test_the_raw_layer_reads_as_stored(gateway: Server, written: Written) -> None:
    read = read_zarr_python(f"{base(gateway, 'zarr')}/{LAYER}/1", 2)
    np.testing.assert_array_equal(read[0], written.source[(1, 1, 1)])


def test_a_missing_mapped_layer_names_the_mapping_layers(gateway: Server) -> None:
    assert_reason(requests.get(f"{base(gateway, 'zarr')}/{LAYER}__nothing/1/.zarray"), 404, f"{LAYER}__{HDF5}")


# --- bad input: mapping files that are not what they say -------------------------------------------------


def write_hostile(dataset: Path) -> dict[str, str]:
    """Bad mappings beside the written layer, each with a word its refusal must name."""
    agglomerates = dataset / LAYER / "agglomerates"
    (agglomerates / "not_hdf5.hdf5").write_bytes(b"PK\x03\x04 a zip file, not HDF5" * 10)
    with h5py.File(agglomerates / "truncated.hdf5", "w") as f:
        f.create_dataset("segment_to_agglomerate", data=np.arange(100_000, dtype=np.uint64))
    with open(agglomerates / "truncated.hdf5", "r+b") as handle:
        handle.truncate(200_000)
    with h5py.File(agglomerates / "wrong_shape.hdf5", "w") as f:
        f.create_dataset("segment_to_agglomerate", data=np.zeros((10, 10), dtype=np.uint64))
    with h5py.File(agglomerates / "wrong_type.hdf5", "w") as f:
        f.create_dataset("segment_to_agglomerate", data=np.zeros(10, dtype=np.float32))
    with h5py.File(agglomerates / "signed.hdf5", "w") as f:
        f.create_dataset("segment_to_agglomerate", data=np.full(10, -1, dtype=np.int64))
    with h5py.File(agglomerates / "no_array.hdf5", "w") as f:
        f.create_dataset("agglomerate_to_segments", data=np.zeros(10, dtype=np.uint64))
    with h5py.File(agglomerates / "sparse.hdf5", "w") as f:  # 2 GiB declared, nothing stored
        f.create_dataset("segment_to_agglomerate", shape=(1 << 28,), dtype=np.uint64)
    with h5py.File(agglomerates / "sparse_chunks.hdf5", "w") as f:
        sparse = f.create_dataset("segment_to_agglomerate", shape=(1 << 28,), dtype=np.uint64, chunks=(1 << 16,))
        sparse[:10] = 1
    with h5py.File(agglomerates / "elsewhere.hdf5", "w") as f:
        f["segment_to_agglomerate"] = h5py.ExternalLink("/etc/passwd.h5", "/segment_to_agglomerate")
    with h5py.File(agglomerates / "x<b>markup.hdf5", "w") as f:
        f.create_dataset("segment_to_agglomerate", data=np.zeros(10, dtype=np.uint64))
    zarr_group = zarr.open_group(str(agglomerates / "zarr_2d"), mode="w", zarr_format=3)
    zarr_group.create_array("segment_to_agglomerate", data=np.zeros((4, 4), dtype=np.uint64))
    outside = dataset.parent.parent.parent / "outside-the-root"
    outside.mkdir()
    with h5py.File(outside / "secret_name.hdf5", "w") as f:
        f.create_dataset("segment_to_agglomerate", data=np.zeros(10, dtype=np.uint64))
    properties = json.loads((dataset / "datasource-properties.json").read_text())
    properties["dataLayers"].append({**properties["dataLayers"][0], "name": "linked"})  # the same mags
    (dataset / "datasource-properties.json").write_text(json.dumps(properties))
    (dataset / "linked").mkdir()
    (dataset / "linked" / "agglomerates").symlink_to(outside)  # a layer's folder that leads out of the root
    (agglomerates / "linked_out.hdf5").symlink_to(outside / "secret_name.hdf5")
    mappings = dataset / LAYER / "mappings"
    (mappings / "too_large_ids.json").write_text(json.dumps({"classes": [[1, 1 << 33]]}))
    (mappings / "negative.json").write_text(json.dumps({"classes": [[-4, 2]]}))
    (mappings / "no_classes.json").write_text(json.dumps({"name": "x"}))
    (mappings / "not_json.json").write_text("{classes: nope")
    return {
        "not_hdf5": "not an HDF5 file",
        "truncated": "truncated",
        "wrong_shape": "not one dimension",
        "wrong_type": "unsigned integers",
        "signed": "unsigned integers",
        "no_array": "holds no dataset",
        "sparse": "truncated or sparse",
        "sparse_chunks": "stores 1 of its 4096 chunks",
        "elsewhere": "link to elsewhere",
        "zarr_2d": "not one dimension",
        "too_large_ids": "beyond uint32",
        "negative": "beyond uint32",
        "no_classes": "holds no 'classes'",
        "not_json": "not usable JSON",
        "linked_out": "outside the data root",
    }


@pytest.fixture(scope="module")
def hostile(written: Written, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    import shutil

    root = tmp_path_factory.mktemp("hostile-mappings") / "root"
    shutil.copytree(written.root, root)
    return root, write_hostile(root / ORG / DATASET)


def test_bad_mappings_are_listed_with_their_reason_and_the_rest_serves(
    hostile: tuple[Path, dict[str, str]], written: Written, server_factory: Callable[..., Server]
) -> None:
    root, reasons = hostile
    server = server_factory(root)
    page = requests.get(f"{base(server, 'zarr3')}/").text
    for name, words in reasons.items():
        layer = f"{LAYER}__{name}"
        response = requests.get(f"{base(server, 'zarr3')}/{layer}/zarr.json")
        message = assert_reason(response, 404, "no servable layer", words)
        assert name in message, message
        assert words.replace("'", "&#x27;") in page, (name, words)
    assert "markup" not in requests.get(f"{base(server, 'zarr')}/datasource-properties.json").text
    assert "&lt;b&gt;markup" in page and "<b>markup" not in page  # its refusal is listed, escaped
    assert "/etc/passwd" not in page and "secret_name" not in page
    raw = read_zarr_python(f"{base(server, 'zarr')}/{LAYER}/1", 2)
    np.testing.assert_array_equal(raw[0], written.source[(1, 1, 1)])
    mapped = read_zarr_python(f"{base(server, 'zarr3')}/{LAYER}__{HDF5}/1", 3)
    np.testing.assert_array_equal(mapped[0], written.truth(HDF5, (1, 1, 1)))
    assert_no_unexpected_errors(server)


# A deleted mapping is a removed layer (tests/test_mapping_files_follow.py): a fault only until the catalog looks.
@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_mapping_damaged_after_loading_is_a_storage_fault_never_absent(
    written: Written, server_factory: Callable[..., Server], tmp_path: Path, damage: str
) -> None:
    import shutil

    root = tmp_path / "root"
    shutil.copytree(written.root, root)
    server = server_factory(root, answer_cache_bytes=0)
    url = f"{base(server, 'zarr')}/{LAYER}__{HDF5}/1/0.0.0.0"
    assert requests.get(url).status_code == 200
    path = root / ORG / DATASET / LAYER / "agglomerates" / f"{HDF5}.hdf5"
    if damage == "garbage":
        path.write_bytes(b"\0" * 4096)
    else:
        with open(path, "r+b") as handle:
            handle.truncate(os.path.getsize(path) // 2)
    wait_settled(path)
    response = requests.get(url)
    assert response.status_code == 500, (damage, response.status_code, response.text)
    assert HDF5 in response.json()["error"], response.text
    raw = requests.get(f"{base(server, 'zarr')}/{LAYER}/1/0.0.0.0")
    assert raw.status_code == 200


# --- the data type follows the agglomerates a file's version declares ---------------------------------------


SMALL = "small"  # a dataset of uint8 labels whose agglomerate files are rewritten
SMALL_SIZE = (64, 64, 32)


def write_agglomerate_file(path: Path, table: np.ndarray[Any, Any], agglomerates: int) -> None:
    """As webKnossos writes one: ``agglomerate_to_segments_offsets`` has one entry per agglomerate and one more
    (its length less one is the largest agglomerate id), the members in CSR order after it."""
    members = np.bincount(table.astype(np.int64), minlength=agglomerates + 1)[: agglomerates + 1]
    with h5py.File(path, "w") as f:
        f.create_dataset("segment_to_agglomerate", data=table)
        f.create_dataset("agglomerate_to_segments_offsets", data=np.concatenate([[0], np.cumsum(members)]))
        f.create_dataset("agglomerate_to_segments", data=np.argsort(table, kind="stable").astype(np.uint64))


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray[Any, Any]]:
    root = tmp_path_factory.mktemp("small-mappings")
    dataset = root / ORG / SMALL
    blocks = np.random.default_rng(8).integers(0, 200, size=tuple(s // 4 for s in SMALL_SIZE), dtype=np.uint8)
    labels = np.repeat(np.repeat(np.repeat(blocks, 4, 0), 4, 1), 4, 2)
    header = wkw.Header(np.uint8, block_type=wkw.Header.BLOCK_TYPE_LZ4HC, file_len=1)
    with wkw.Dataset.create(str(dataset / LAYER / "1"), header) as ds:
        ds.write((0, 0, 0), labels)
    box = {"topLeft": [0, 0, 0], "width": SMALL_SIZE[0], "height": SMALL_SIZE[1], "depth": SMALL_SIZE[2]}
    layer = {"name": LAYER, "category": "segmentation", "boundingBox": box, "elementClass": "uint8"}
    properties = {
        "id": {"name": SMALL, "team": ""},
        "scale": {"factor": [8.0, 8.0, 8.0], "unit": "nanometer"},
        "dataLayers": [{**layer, "dataFormat": "wkw", "largestSegmentId": 199, "mags": [{"mag": [1, 1, 1]}]}],
    }
    (dataset / "datasource-properties.json").write_text(json.dumps(properties))
    (dataset / LAYER / "agglomerates").mkdir()
    return root, labels


def served_types(server: Server, layer: str) -> list[str]:
    """The layer's data type as each tree states it: properties, .zarray, zarr.json, precomputed info."""
    zarr2 = f"{server.url}/data/zarr/{ORG}/{SMALL}"
    properties = requests.get(f"{zarr2}/datasource-properties.json", timeout=30).json()["dataLayers"]
    return [
        next(entry["elementClass"] for entry in properties if entry["name"] == layer),
        np.dtype(requests.get(f"{zarr2}/{layer}/1/.zarray", timeout=30).json()["dtype"]).name,
        requests.get(f"{server.url}/data/zarr3/{ORG}/{SMALL}/{layer}/1/zarr.json", timeout=30).json()["data_type"],
        requests.get(f"{server.url}/data/precomputed/{ORG}/{SMALL}/{layer}/info", timeout=30).json()["data_type"],
    ]


def test_the_data_type_follows_the_agglomerates_each_version_declares(
    small: tuple[Path, np.ndarray[Any, Any]], server_factory: Callable[..., Server]
) -> None:
    """uint8 labels: a file of 100 agglomerates maps to uint8, rewritten with 60,000 to uint16 (the narrowest type
    that holds both), and back: every tree's metadata, the chunks and their ETags follow the version, and a
    gateway started after each rewrite serves the same bytes and ETags."""
    root, labels = small
    layer = f"{LAYER}__growing"
    path = root / ORG / SMALL / LAYER / "agglomerates" / "growing.hdf5"
    few = (np.arange(200, dtype=np.uint64) + 1) // 2  # 100 agglomerates
    many = np.arange(200, dtype=np.uint64) * 300 + 1  # up to 59,701: past uint8
    many[0] = 0
    write_agglomerate_file(path, few, 100)
    server = server_factory(root, answer_cache_bytes=0)
    url = f"{server.url}/data/zarr/{ORG}/{SMALL}/{layer}/1"

    def stated(dtype: str) -> bool:
        return served_types(server, layer) == [dtype] * 4

    etags: list[str] = []
    for table, agglomerates, dtype in ((few, 100, "uint8"), (many, 60_000, "uint16"), (few, 100, "uint8")):
        if etags:
            write_agglomerate_file(path, table, agglomerates)
        assert wait_until(functools.partial(stated, dtype), timeout=30, interval=0.2), served_types(server, layer)
        read = read_zarr_python(url, 2)[0]
        assert read.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(read, table[labels].astype(dtype))
        chunk = requests.get(f"{url}/0.0.0.0", timeout=30)
        assert chunk.status_code == 200
        etags.append(chunk.headers["etag"])
        replica = server_factory(root, answer_cache_bytes=0)
        assert served_types(replica, layer) == [dtype] * 4
        again = requests.get(f"{replica.url}/data/zarr/{ORG}/{SMALL}/{layer}/1/0.0.0.0", timeout=30)
        assert (again.headers["etag"], again.content) == (chunk.headers["etag"], chunk.content)
    assert len(set(etags)) == 3, etags
    assert_no_unexpected_errors(server)


def test_a_file_with_ids_past_the_agglomerates_it_declares_is_a_fault_of_its_chunks(
    small: tuple[Path, np.ndarray[Any, Any]], server_factory: Callable[..., Server]
) -> None:
    """Its offsets declare 10 agglomerates (uint8 holds them) while its entries reach 1,990: served as declared,
    a chunk with such an id is a 500 that names the file and the type, never a wrapped value; the labels serve."""
    root, _ = small
    path = root / ORG / SMALL / LAYER / "agglomerates" / "understated.hdf5"
    table = np.arange(200, dtype=np.uint64) * 10
    with h5py.File(path, "w") as f:
        f.create_dataset("segment_to_agglomerate", data=table)
        f.create_dataset("agglomerate_to_segments_offsets", data=np.arange(11, dtype=np.uint64))
    server = server_factory(root)
    assert served_types(server, f"{LAYER}__understated") == ["uint8"] * 4
    response = requests.get(f"{server.url}/data/zarr/{ORG}/{SMALL}/{LAYER}__understated/1/0.0.0.0", timeout=30)
    assert response.status_code == 500, (response.status_code, response.text[:300])
    assert "understated" in response.json()["error"] and "past uint8" in response.json()["error"], response.text
    labels = requests.get(f"{server.url}/data/zarr/{ORG}/{SMALL}/{LAYER}/1/0.0.0.0", timeout=30)
    assert labels.status_code == 200


def test_offsets_that_lie_elsewhere_are_never_followed(
    small: tuple[Path, np.ndarray[Any, Any]], server_factory: Callable[..., Server]
) -> None:
    """An agglomerate file whose ``agglomerate_to_segments_offsets`` is a link to another file (here one that
    would declare two agglomerates): the link is not followed, so the stored type holds the ids, the chunks map
    exactly and the segment list gives no member counts; nothing is read from the linked file."""
    root, labels = small
    agglomerates = root / ORG / SMALL / LAYER / "agglomerates"
    elsewhere = root / "elsewhere.hdf5"
    with h5py.File(elsewhere, "w") as f:
        f.create_dataset("offsets", data=np.arange(3, dtype=np.uint64))
    table = np.arange(200, dtype=np.uint16) * 300
    with h5py.File(agglomerates / "linked_offsets.hdf5", "w") as f:
        f.create_dataset("segment_to_agglomerate", data=table)
        f["agglomerate_to_segments_offsets"] = h5py.ExternalLink(str(elsewhere), "/offsets")
    server = server_factory(root)
    layer = f"{LAYER}__linked_offsets"
    assert served_types(server, layer) == ["uint16"] * 4
    read = read_zarr_python(f"{server.url}/data/zarr/{ORG}/{SMALL}/{layer}/1", 2)[0]
    np.testing.assert_array_equal(read, table[labels])
    url = f"{server.url}/data/precomputed/{ORG}/{SMALL}/{layer}/segment_properties/info"
    listed = {p["id"] for p in requests.get(url, timeout=30).json()["inline"]["properties"]}
    assert "voxels" in listed and "members" not in listed, listed
    assert_no_unexpected_errors(server)


# --- a rewritten Zarr agglomerate group is followed ---------------------------------------------------------


REGROUPED = "regrouped"  # a Zarr v3 group beside the uint8 labels that proofreading rewrites
ARRAY_NAME = "segment_to_agglomerate"


def write_zarr_version(group: Path, table: np.ndarray[Any, Any], chunks: int, shards: int | None = None) -> None:
    """The group written again from nothing by zarr-python, as a proofreading tool does."""
    written = zarr.open_group(str(group), mode="w", zarr_format=3)
    written.create_array(ARRAY_NAME, data=table, chunks=(chunks,), shards=None if shards is None else (shards,))


def write_webknossos_version(group: Path, segments: int, joined: int) -> np.ndarray[Any, Any]:
    """The group written again by webknossos-libs (sharded, with agglomerate_to_segments_offsets): segments 1 to
    ``segments`` joined in runs of ``joined``; its segment_to_agglomerate as zarr-python reads it back. It
    creates its arrays and refuses existing ones, so the old group is removed first."""
    import shutil

    from webknossos import AgglomerateAttachment, AgglomerateGraph
    from webknossos.geometry import Vec3Int

    shutil.rmtree(group)
    graph = AgglomerateGraph()
    for segment in range(1, segments + 1):
        graph.add_segment(segment, position=Vec3Int(segment, 0, 0))
        if segment % joined and segment < segments:
            graph.add_affinity_edge(segment, segment + 1, affinity=1.0)
    AgglomerateAttachment.create(group, graph)
    table: np.ndarray[Any, Any] = np.asarray(zarr.open_array(str(group / ARRAY_NAME), mode="r")[:])
    return table


def group_settled(group: Path) -> None:
    """Past the settle time of the group's newest file."""
    wait_settled(max((p for p in group.rglob("*") if p.is_file()), key=lambda p: p.stat().st_mtime))


def states(server: Server, layer: str, dtype: str) -> bool:
    return served_types(server, layer) == [dtype] * 4


def lists(url: str, ids: list[str]) -> bool:
    """Whether the segment list at ``url`` lists exactly ``ids`` (the data stamp is taken again within seconds)."""
    listed: list[str] = requests.get(url, timeout=30).json()["inline"]["ids"]
    return listed == ids


def follow_rewrites(
    small: tuple[Path, np.ndarray[Any, Any]],
    server_factory: Callable[..., Server],
    tmp_path: Path,
    versions: list[tuple[Callable[[Path], np.ndarray[Any, Any]], str]],
) -> None:
    """Each of ``versions`` (a writer of the group, returning its table, and the layer's data type it means)
    written over the last under two running gateways: once it has settled, both state the type in every tree
    (the dataset loaded again where it moved), zarr-python reads the new table exactly, the chunk's ETag is new,
    the replica gives the same bytes and ETag, and the segment list lists the new agglomerates."""
    import shutil

    root = tmp_path / "root"
    shutil.copytree(small[0], root)
    labels = small[1]
    group = root / ORG / SMALL / LAYER / "agglomerates" / REGROUPED
    layer = f"{LAYER}__{REGROUPED}"
    table = versions[0][0](group)
    server, replica = server_factory(root), server_factory(root)
    etags: list[str] = []
    for number, (write, dtype) in enumerate(versions):
        if number:
            table = write(group)
            group_settled(group)
        for gateway in (server, replica):
            stated = wait_until(functools.partial(states, gateway, layer, dtype), timeout=30, interval=0.2)
            assert stated, (number, served_types(gateway, layer), dtype)
        url = f"{server.url}/data/zarr/{ORG}/{SMALL}/{layer}/1"
        read = read_zarr_python(url, 2)[0]
        truth = apply_table(labels, table).astype(dtype)
        assert read.dtype == np.dtype(dtype), number
        np.testing.assert_array_equal(read, truth, err_msg=f"version {number}")
        chunk = requests.get(f"{url}/0.0.0.0", timeout=30)
        assert chunk.status_code == 200, (number, chunk.text[:300])
        assert chunk.headers["etag"] not in etags, (number, etags)
        etags.append(chunk.headers["etag"])
        again = requests.get(f"{replica.url}/data/zarr/{ORG}/{SMALL}/{layer}/1/0.0.0.0", timeout=30)
        assert (again.headers["etag"], again.content) == (chunk.headers["etag"], chunk.content), number
        present = [str(i) for i in np.unique(truth[truth != 0])]
        listing = f"{server.url}/data/precomputed/{ORG}/{SMALL}/{layer}/segment_properties/info"
        assert wait_until(functools.partial(lists, listing, present), timeout=60, interval=0.5), (number, present)
    assert_no_unexpected_errors(server)
    assert_no_unexpected_errors(replica)


def zarr_version(
    table: np.ndarray[Any, Any], chunks: int, shards: int | None = None
) -> Callable[[Path], np.ndarray[Any, Any]]:
    def write(group: Path) -> np.ndarray[Any, Any]:
        write_zarr_version(group, table, chunks, shards)
        return table

    return write


def numbered(length: int, dtype: type, step: int, shift: int = 0) -> np.ndarray[Any, Any]:
    table: np.ndarray[Any, Any] = (np.arange(length, dtype=np.uint64) * step + shift).astype(dtype)
    table[0] = 0
    return table


def test_a_rewritten_zarr_group_is_followed_whatever_its_length_chunks_type_or_sharding(
    small: tuple[Path, np.ndarray[Any, Any]], server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    """zarr-python writes the group again and again: another length and chunking (the same type: no reload, the
    lookups follow), another stored type (uint16 to uint32: the layer's type follows), sharded, and unsharded
    again. Labels reach 199; the shorter tables leave some ids as they are."""
    follow_rewrites(
        small,
        server_factory,
        tmp_path,
        [
            (zarr_version(numbered(256, np.uint16, 7, 3), 64), "uint16"),
            (zarr_version(numbered(150, np.uint16, 11, 5), 50), "uint16"),
            (zarr_version(numbered(200, np.uint32, 100_000), 64), "uint32"),
            (zarr_version(numbered(230, np.uint32, 13, 1000), 16, shards=64), "uint32"),
            (zarr_version(numbered(200, np.uint32, 70_001, 9), 100), "uint32"),
        ],
    )


def test_a_group_rewritten_by_webknossos_libs_moves_the_layer_s_type_with_its_agglomerates(
    small: tuple[Path, np.ndarray[Any, Any]], server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    """webknossos-libs writes the group over a zarr-python one, then over itself: 100 agglomerates (uint8 holds
    them, whatever the stored type), 300 (uint16), 100 again, as the HDF5 files' test does, and 50."""
    follow_rewrites(
        small,
        server_factory,
        tmp_path,
        [
            (zarr_version(numbered(256, np.uint16, 7, 3), 64), "uint16"),
            (lambda group: write_webknossos_version(group, 200, 2), "uint8"),
            (lambda group: write_webknossos_version(group, 300, 1), "uint16"),
            (lambda group: write_webknossos_version(group, 200, 2), "uint8"),
            (lambda group: write_webknossos_version(group, 200, 4), "uint8"),  # the same type: no reload
        ],
    )


def test_a_group_rewritten_into_garbage_is_a_storage_fault_until_it_is_good_again(
    small: tuple[Path, np.ndarray[Any, Any]], server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    """The array's zarr.json rewritten as something not JSON, then a good group, then one of its chunks cut
    short: each fault is a 500 naming the group (never a 404 that clients fill with zeros), the labels serve
    all the while, and a good rewrite serves again."""
    import shutil

    root = tmp_path / "root"
    shutil.copytree(small[0], root)
    labels = small[1]
    group = root / ORG / SMALL / LAYER / "agglomerates" / REGROUPED
    layer = f"{LAYER}__{REGROUPED}"
    good = numbered(256, np.uint16, 7, 3)
    write_zarr_version(group, good, 64)
    server = server_factory(root, answer_cache_bytes=0)
    url = f"{server.url}/data/zarr/{ORG}/{SMALL}/{layer}/1"
    raw = f"{server.url}/data/zarr/{ORG}/{SMALL}/{LAYER}/1/0.0.0.0"
    np.testing.assert_array_equal(read_zarr_python(url, 2)[0], good[labels])
    metadata = group / ARRAY_NAME / "zarr.json"
    metadata.write_text('{"zarr_format": 3, "node_type": "array", "shape": [25')  # cut short
    wait_settled(metadata)
    assert_reason(requests.get(f"{url}/0.0.0.0", timeout=30), 500, REGROUPED, "zarr.json")
    assert requests.get(raw, timeout=30).status_code == 200
    other = numbered(256, np.uint16, 5, 1)
    write_zarr_version(group, other, 64)
    group_settled(group)
    np.testing.assert_array_equal(read_zarr_python(url, 2)[0], other[labels])
    chunk_file = group / ARRAY_NAME / "c" / "1"
    chunk_file.write_bytes(chunk_file.read_bytes()[:7])
    wait_settled(chunk_file)
    assert_reason(requests.get(f"{url}/0.0.0.0", timeout=30), 500, REGROUPED)
    assert requests.get(raw, timeout=30).status_code == 200
    write_zarr_version(group, good, 64)
    group_settled(group)
    np.testing.assert_array_equal(read_zarr_python(url, 2)[0], good[labels])
    assert served_types(server, layer) == ["uint16"] * 4
    assert_no_unexpected_errors(server)


def decoded_chunk(array_url: str, body: bytes) -> np.ndarray[Any, Any]:
    """A v2 chunk's voxels (x, y, z) as its ``.zarray`` says they are stored."""
    import numcodecs

    meta = requests.get(f"{array_url}/.zarray", timeout=30).json()
    raw = numcodecs.get_codec(meta["compressor"]).decode(body) if meta["compressor"] else body
    voxels: np.ndarray[Any, Any] = np.frombuffer(raw, dtype=np.dtype(meta["dtype"]))
    shaped: np.ndarray[Any, Any] = voxels.reshape(meta["chunks"], order=meta["order"])[0]
    return shaped


def test_a_group_written_again_while_it_is_asked_never_answers_a_wrong_chunk(
    small: tuple[Path, np.ndarray[Any, Any]], server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    """zarr-python writes the group again six times (from nothing: for a moment there is no array, then metadata
    without chunks) while a client asks a mapped chunk all the while, under the default settle time: every
    answer is the chunk of one whole version, a 503 to retry, or a 500 that names the group; never a 404 or a
    chunk of entries read as missing."""
    import shutil
    import threading

    root = tmp_path / "root"
    shutil.copytree(small[0], root)
    labels = small[1]
    group = root / ORG / SMALL / LAYER / "agglomerates" / REGROUPED
    tables = [numbered(256, np.uint16, 7 + step, 3) for step in range(7)]
    write_zarr_version(group, tables[0], 64)
    group_settled(group)
    server = server_factory(root, answer_cache_bytes=0, settle_seconds=1)
    url = f"{server.url}/data/zarr/{ORG}/{SMALL}/{LAYER}__{REGROUPED}/1"
    assert requests.get(f"{url}/0.0.0.0", timeout=30).status_code == 200
    answers: list[tuple[int, bytes]] = []
    done = threading.Event()

    def ask() -> None:
        while not done.is_set():
            response = requests.get(f"{url}/0.0.0.0", timeout=30)
            answers.append((response.status_code, response.content))

    asking = threading.Thread(target=ask)
    asking.start()
    try:
        for step, table in enumerate(tables[1:]):
            write_zarr_version(group, table, 32 if step % 2 else 64, shards=128 if step % 2 else None)
        group_settled(group)
    finally:
        done.set()
        asking.join()
    statuses = {status for status, _ in answers}
    assert statuses <= {200, 500, 503}, statuses
    for status, body in answers:
        if status == 500:
            assert REGROUPED in json.loads(body)["error"], body[:300]
    final = requests.get(f"{url}/0.0.0.0", timeout=30)
    assert final.status_code == 200, final.text[:300]
    last = decoded_chunk(url, final.content)
    truths = [apply_table(labels, table).astype(np.uint16)[tuple(slice(0, n) for n in last.shape)] for table in tables]
    np.testing.assert_array_equal(last, truths[-1])
    for status, body in answers:
        if status == 200:
            chunk = decoded_chunk(url, body)
            assert any(np.array_equal(chunk, truth) for truth in truths), "a chunk of no version"
    assert_no_unexpected_errors(server)


# --- meshes and segment lists of agglomerates ----------------------------------------------------------


AGGLOMERATE = 77  # segments 7 to 199 joined (see segment_to_agglomerate)


def test_cloudvolume_meshes_an_agglomerate_of_the_mapped_layer(gateway: Server, written: Written) -> None:
    from support.cloudvolume_reads import open_volume

    url = f"{base(gateway, 'precomputed')}/{LAYER}__{HDF5}"
    info = requests.get(f"{url}/info").json()
    assert info["mesh"] and info["segment_properties"], info
    truth = written.truth(HDF5, (1, 1, 1))
    where = np.argwhere(truth == AGGLOMERATE)
    members = np.unique(written.source[(1, 1, 1)][truth == AGGLOMERATE])
    assert len(where) and len(members) > 3, "the agglomerate joins several segments of the labels"
    volume = open_volume(url)
    mesh = volume.mesh.get(AGGLOMERATE)[AGGLOMERATE]
    assert len(mesh.vertices) > 100 and len(mesh.faces) > 100
    resolution = np.asarray(volume.resolution)
    lo, hi = where.min(axis=0) * resolution, (where.max(axis=0) + 1) * resolution
    assert np.all(mesh.vertices >= lo - 2 * resolution) and np.all(mesh.vertices <= hi + 2 * resolution)
    assert mesh.vertices[:, 0].min() <= lo[0] + resolution[0] and mesh.vertices[:, 0].max() >= hi[0] - resolution[0]
    properties = requests.get(f"{url}/segment_properties/info").json()
    listed = dict(zip(properties["inline"]["ids"], properties["inline"]["properties"][0]["values"]))
    assert str(AGGLOMERATE) in listed, list(listed)[:10]
    member = int(members[0])
    assert str(member) not in listed or member == AGGLOMERATE  # a joined segment is listed as its agglomerate


def test_the_segment_list_names_each_agglomerate_s_members(gateway: Server, written: Written) -> None:
    for mapping in (HDF5_CHUNKED, WK_ZARR, JSON):
        url = f"{base(gateway, 'precomputed')}/{LAYER}__{mapping}/segment_properties/info"
        inline = requests.get(url).json()["inline"]
        properties = {p["id"]: p["values"] for p in inline["properties"]}
        ids = np.asarray([int(i) for i in inline["ids"]], dtype=np.uint64)
        truth = written.truth(mapping, (1, 1, 1))
        present, voxels = np.unique(truth[truth != 0], return_counts=True)
        np.testing.assert_array_equal(ids, present)
        assert properties["voxels"] == voxels.tolist()
        if mapping == WK_ZARR:
            expected = [3 if int(i) <= 1000 else 1 for i in ids]  # runs of three segments; ids past stay alone
        elif mapping == JSON:
            everything = np.unique(np.concatenate([np.asarray(c, dtype=np.uint32) for c in written.classes if c]))
            targets = apply_json(everything, written.classes)
            sizes = dict(zip(*np.unique(targets, return_counts=True)))
            expected = [int(sizes.get(int(i), 1)) for i in ids]
        else:
            expected = [int(written.members[int(i)]) if int(i) < len(written.members) else 1 for i in ids]
        assert properties["members"] == expected, mapping
        assert max(expected) > 1


def test_index_segments_and_mesh_segments_run_on_a_mapped_layer(
    written: Written, tmp_path: Path, server_factory: Callable[..., Server]
) -> None:
    import shutil

    from support.batch_runs import run_batch

    from gateway.meshes.index import SegmentIndex

    root = tmp_path / "root"
    shutil.copytree(written.root, root)
    layer = f"{LAYER}__{HDF5}"
    done = run_batch("index-segments", str(root), f"{ORG}/{DATASET}", layer)
    assert done.returncode == 0, done.stdout + done.stderr
    path = root / ORG / DATASET / f"{layer}.segment-index.npz"
    index = SegmentIndex.from_bytes(path.read_bytes(), str(path))
    truth = written.truth(HDF5, (1, 1, 1))
    ids, counts = np.unique(truth[truth != 0], return_counts=True)
    np.testing.assert_array_equal(index.ids, ids)
    np.testing.assert_array_equal(index.voxels, counts)
    meshed = run_batch("mesh-segments", str(root), f"{ORG}/{DATASET}", layer, "--segments", str(AGGLOMERATE))
    assert meshed.returncode == 0, meshed.stdout + meshed.stderr
    assert (root / ORG / DATASET / f"{layer}.meshes" / "stamp.json").is_file()
    from support.cloudvolume_reads import open_volume

    server = server_factory(root)
    volume = open_volume(f"{base(server, 'precomputed')}/{layer}")
    assert len(volume.mesh.get(AGGLOMERATE)[AGGLOMERATE].vertices) > 100  # from the stored set
    assert_no_unexpected_errors(server)


@given(
    st.sampled_from([np.uint8, np.uint16, np.uint32, np.uint64]),
    st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=300),
    st.integers(0, 2**64 - 1),
    st.integers(0, 70_000),
    st.booleans(),
)
@example(np.uint64, [0, 2, 7], 2**64 - 9, 10, False)  # ids near the top of uint64, close together
@example(np.uint64, [0, 2, 7], 2**63 + 3, 10, False)
@settings(max_examples=300, deadline=None)
def test_distinct_ids_and_their_translation_are_numpy_s(
    dtype: type, raw: list[int], base: int, spread: int, far: bool
) -> None:
    """A chunk's distinct ids are numpy's unique ones, and each key's value is found as a binary search would
    (by a table over the ids' span or by the search itself), for ids close together (near the top of the type
    too) and far apart alike."""
    from gateway.sources.mappings import _distinct, _translated

    top = int(np.iinfo(dtype).max)
    values = [min(top, base % (top + 1) + (v % (spread + 1))) for v in raw] + (raw[:3] if far else [])
    array: np.ndarray[Any, Any] = np.asarray([v % (top + 1) for v in values], dtype=dtype)
    ids = _distinct(array)
    want_ids = np.unique(array)
    assert ids.dtype == want_ids.dtype
    np.testing.assert_array_equal(ids, want_ids)
    looked_up = (np.arange(ids.size, dtype=np.uint64) * 7 + 3).astype(np.uint32)
    np.testing.assert_array_equal(_translated(array, ids, looked_up), looked_up[np.searchsorted(want_ids, array)])


def test_a_mapped_layer_has_a_preview_of_its_agglomerates(gateway: Server) -> None:
    mapped = requests.get(f"{gateway.url}/preview/{ORG}/{DATASET}/{LAYER}__{HDF5}.png")
    raw = requests.get(f"{gateway.url}/preview/{ORG}/{DATASET}/{LAYER}.png")
    assert mapped.status_code == raw.status_code == 200, (mapped.text[:200], raw.text[:200])
    assert mapped.content.startswith(b"\x89PNG") and mapped.content != raw.content
    again = requests.get(mapped.url, headers={"If-None-Match": mapped.headers["etag"]})
    assert again.status_code == 304
