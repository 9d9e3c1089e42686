"""The Zarr v3 tree through real clients: tensorstore, zarr-python 3, webknossos-libs and Neuroglancer's pattern.

Every voxel read is compared with the ``wkw`` package's read of the same data
(``WrittenDataset.expected``); damaged datasets are made in a private copy of the
test data, never in the shared one.
"""

import json
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import crc32c
import numcodecs
import numpy as np
import pytest
import requests
import tensorstore as ts
import wkw
import zarr
from support.clients import read_tensorstore, read_zarr_python
from support.datasets import LAYERS, MAGS, ORG, TOKEN, mag_name
from support.datasets import WrittenDataset as Data
from support.servers import Server

from gateway_storage.geometry import vec3
from wkw_adapter import morton_encode

warnings.filterwarnings("ignore", message="Not all image readers could be imported")

DATASET = "wk_dataset"
HEADERS = {"X-Auth-Token": TOKEN}
# The v3 tree's readers, with the token (the plain layout's gateway requires one).
CLIENTS: dict[str, Callable[[str], np.ndarray]] = {
    "tensorstore": lambda url: read_tensorstore(url, 3, HEADERS),
    "zarr-python": lambda url: read_zarr_python(url, 3, HEADERS),
}
LAYER_NAMES = [layer[0] for layer in LAYERS]
CHANNELS = {layer[0]: layer[2] for layer in LAYERS}
FILE_LEN = 4  # blocks per file side in the test data
BLOCK_LEN = 32
EMPTY = 2**64 - 1

# Damage done to the private copy (see ``variant``): a missing data file, files rewritten so that only
# a few blocks hold data, and a file whose jump table decreases.
MISSING = ("color_u8", (1, 1, 1), (0, 1, 0))
SPARSE_RAW = ("color_u16", (1, 1, 1), (0, 0, 0))
SPARSE_LZ4 = ("rgb", (2, 2, 1), (0, 0, 0))
CORRUPT = ("segmentation", (1, 1, 1), (1, 0, 0))


def v3_url(server: Server, *parts: str, tree: str = "zarr3") -> str:
    return "/".join([server.url, "data", tree, ORG, DATASET, *parts])


def file_path(root: Path, layer: str, mag: tuple[int, int, int], cube: tuple[int, int, int]) -> Path:
    x, y, z = cube
    return root / ORG / DATASET / layer / mag_name(mag) / f"z{z}" / f"y{y}" / f"x{x}.wkw"


@pytest.fixture(scope="module")
def layouts(gateway: Server, sharded_gateway: Server) -> dict[str, Server]:
    """The plain layout (tokens required) and the sharded one (open)."""
    return {"plain": gateway, "sharded": sharded_gateway}


# --- every layer and mag through every client -----------------------------------------------------


@pytest.mark.parametrize("layout", ["plain", "sharded"])
@pytest.mark.parametrize("layer", LAYER_NAMES)
@pytest.mark.parametrize("client", CLIENTS)
def test_clients_read_every_mag_exactly(
    layouts: dict[str, Server], test_data: Data, layout: str, layer: str, client: str
) -> None:
    for mag in MAGS:
        data = CLIENTS[client](v3_url(layouts[layout], layer, mag_name(mag)))
        expected = test_data.expected(layer, mag)
        assert data.dtype == expected.dtype
        np.testing.assert_array_equal(data, expected, err_msg=f"{layout} {layer} mag {mag_name(mag)}")


@pytest.mark.parametrize("layout", ["plain", "sharded"])
def test_webknossos_reads_every_layer_and_mag(layouts: dict[str, Server], test_data: Data, layout: str) -> None:
    import webknossos as wk
    from upath import UPath

    dataset = wk.Dataset.open(UPath(v3_url(layouts[layout]), headers=HEADERS))
    assert sorted(dataset.layers) == sorted(LAYER_NAMES)
    for name, layer in dataset.layers.items():
        assert layer.data_format == wk.DataFormat.Zarr3
        assert sorted(tuple(m.to_list()) for m in layer.mags) == sorted(MAGS)
        for mag_view in layer.mags.values():
            mag = vec3(mag_view.mag.to_list())
            box = layer.bounding_box.align_with_mag(mag_view.mag, ceil=True)
            data = mag_view.read(absolute_bounding_box=box)
            in_mag = box.in_mag(mag_view.mag)
            window = tuple(slice(t, t + s) for t, s in zip(in_mag.topleft, in_mag.size))
            expected = test_data.expected(name, mag)[(slice(None), *window)]
            np.testing.assert_array_equal(data.reshape(expected.shape), expected, err_msg=f"{name} {mag}")


# --- a damaged copy of the dataset --------------------------------------------------------------


def _rewrite_sparse(root: Path) -> None:
    """Rewrite two files with the ``wkw`` package so that only a few of their blocks hold data."""
    rng = np.random.default_rng(7)
    layer, mag, cube = SPARSE_RAW
    path = file_path(root, layer, mag, cube)
    path.unlink()
    with wkw.Dataset.open(str(path.parent.parent.parent)) as ds:  # raw files take unaligned writes
        ds.write((64, 32, 0), rng.integers(1, 60000, (1, 32, 32, 32), dtype=np.uint16))
        ds.write((40, 40, 40), rng.integers(1, 60000, (1, 10, 5, 7), dtype=np.uint16))
    layer, mag, cube = SPARSE_LZ4
    path = file_path(root, layer, mag, cube)
    edge = FILE_LEN * BLOCK_LEN
    data = np.zeros((3, edge, edge, edge), dtype=np.uint8)
    data[:, 32:64, 32:64, 32:64] = rng.integers(1, 255, (3, 32, 32, 32), dtype=np.uint8)
    data[:, 64:70, 0:32, 40:50] = 9
    path.unlink()
    with wkw.Dataset.open(str(path.parent.parent.parent)) as ds:  # compressed files are written whole
        ds.write((0, 0, 0), data)


def _corrupt_jump_table(path: Path) -> None:
    """Make the jump table decrease between two entries (the file stays as long as before)."""
    raw = bytearray(path.read_bytes())
    jumps = np.frombuffer(bytes(raw[16 : 16 + 8 * FILE_LEN**3]), dtype="<u8").copy()
    jumps[10], jumps[11] = jumps[11], jumps[10]
    assert jumps[11] < jumps[10]
    raw[16 : 16 + 8 * FILE_LEN**3] = jumps.tobytes()
    path.write_bytes(bytes(raw))


@pytest.fixture(scope="module")
def variant(test_data: Data, tmp_path_factory: pytest.TempPathFactory) -> Data:
    root = tmp_path_factory.mktemp("v3_variant")
    shutil.copytree(test_data.root / ORG / DATASET, root / ORG / DATASET)
    file_path(root, *MISSING).unlink()
    _rewrite_sparse(root)
    _corrupt_jump_table(file_path(root, *CORRUPT))
    return Data(root, DATASET)


@pytest.fixture(scope="module")
def variant_servers(variant: Data, server_factory: Callable[..., Server]) -> dict[str, Server]:
    return {
        "plain": server_factory(variant.root),
        "sharded": server_factory(variant.root, v3_layout="sharded"),
    }


def test_missing_file_is_a_missing_shard(variant_servers: dict[str, Server]) -> None:
    layer, mag, cube = MISSING
    base = v3_url(variant_servers["sharded"], layer, mag_name(mag))
    assert requests.get(f"{base}/c/0/{cube[0]}/{cube[1]}/{cube[2]}").status_code == 404
    assert requests.head(f"{base}/c/0/{cube[0]}/{cube[1]}/{cube[2]}").status_code == 404
    assert requests.get(f"{base}/c/0/0/0/0").status_code == 200


@pytest.mark.parametrize("layout", ["plain", "sharded"])
@pytest.mark.parametrize("damage", [MISSING, SPARSE_RAW, SPARSE_LZ4], ids=["missing", "sparse-raw", "sparse-lz4"])
def test_damaged_arrays_equal_the_wkw_read(
    variant: Data,
    variant_servers: dict[str, Server],
    layout: str,
    damage: tuple[str, tuple[int, int, int], tuple[int, int, int]],
) -> None:
    layer, mag, cube = damage
    expected = variant.expected(layer, mag)
    edge = FILE_LEN * BLOCK_LEN
    region = (slice(None), *(slice(c * edge, (c + 1) * edge) for c in cube))
    if damage is MISSING:
        assert not expected[region].any()
    else:
        assert 0 < np.count_nonzero(expected[region]) < expected[region].size // 8
    url = v3_url(variant_servers[layout], layer, mag_name(mag))
    for name, client in CLIENTS.items():
        np.testing.assert_array_equal(client(url), expected, err_msg=name)


# --- OME-NGFF, consolidated metadata, the rewritten properties, the alias ----------------------


@pytest.mark.parametrize("layer", LAYER_NAMES)
def test_ome_metadata_validates(gateway: Server, sharded_gateway: Server, layer: str) -> None:
    from ome_zarr_models.v04.image import Image as ImageV04
    from ome_zarr_models.v04.image import ImageAttrs as ImageAttrsV04
    from ome_zarr_models.v05.image import Image as ImageV05
    from ome_zarr_models.v05.image import ImageAttrs as ImageAttrsV05

    zattrs = requests.get(v3_url(gateway, layer, ".zattrs", tree="zarr"), headers=HEADERS).json()
    attrs = ImageAttrsV04.model_validate(zattrs)
    (multiscale,) = attrs.multiscales
    assert [a.name for a in multiscale.axes] == ["c", "x", "y", "z"]
    assert [d.path for d in multiscale.datasets] == [mag_name(m) for m in MAGS]
    group = zarr.open_group(
        v3_url(gateway, layer, tree="zarr"), mode="r", zarr_format=2, storage_options={"headers": HEADERS}
    )
    ImageV04.from_zarr(group)

    for server in (gateway, sharded_gateway):
        document = requests.get(v3_url(server, layer, "zarr.json"), headers=HEADERS).json()
        attrs5 = ImageAttrsV05.model_validate(document["attributes"]["ome"])
        assert attrs5.version == "0.5"
        assert [a.name for a in attrs5.multiscales[0].axes] == ["c", "x", "y", "z"]
        group = zarr.open_group(v3_url(server, layer), mode="r", zarr_format=3, storage_options={"headers": HEADERS})
        ImageV05.from_zarr(group)  # also checks each array's rank and dimension names against the axes


def test_scales_follow_the_mags(gateway: Server) -> None:
    voxel_size = json.loads(requests.get(v3_url(gateway, "datasource-properties.json"), headers=HEADERS).text)["scale"][
        "factor"
    ]
    document = requests.get(v3_url(gateway, "color_u8", "zarr.json"), headers=HEADERS).json()
    datasets = document["attributes"]["ome"]["multiscales"][0]["datasets"]
    for dataset, mag in zip(datasets, MAGS):
        (transform,) = dataset["coordinateTransformations"]
        assert transform["scale"] == pytest.approx([1.0, *(v * m for v, m in zip(voxel_size, mag))])


@pytest.mark.parametrize("layout", ["plain", "sharded"])
def test_consolidated_metadata_covers_every_node(layouts: dict[str, Server], layout: str) -> None:
    server = layouts[layout]
    document = requests.get(v3_url(server, "zarr.json"), headers=HEADERS).json()
    assert document["node_type"] == "group"
    consolidated = document["consolidated_metadata"]
    assert consolidated["kind"] == "inline"
    expected_keys = {*LAYER_NAMES, *(f"{layer}/{mag_name(m)}" for layer in LAYER_NAMES for m in MAGS)}
    assert set(consolidated["metadata"]) == expected_keys
    for key, node in consolidated["metadata"].items():
        own = requests.get(v3_url(server, key, "zarr.json"), headers=HEADERS).json()
        if own["node_type"] == "group":  # as zarr-python writes it: the group's members are entries of their own
            assert node.pop("consolidated_metadata")["metadata"] == {}, key
            assert set(own.pop("consolidated_metadata")["metadata"]) == {mag_name(m) for m in MAGS}, key
        assert node == own, key

    group = zarr.open_group(
        v3_url(server), mode="r", zarr_format=3, use_consolidated=True, storage_options={"headers": HEADERS}
    )
    assert group.metadata.consolidated_metadata is not None
    members = dict(group.members(max_depth=None))
    assert set(members) == expected_keys
    array = members["rgb/1"]
    assert isinstance(array, zarr.Array)
    assert array.shape == (3, 187, 141, 75)
    assert np.asarray(array[:, 40:50, 30:33, 10:12]).shape == (3, 10, 3, 2)


def test_properties_say_zarr3(gateway: Server) -> None:
    document = requests.get(v3_url(gateway, "datasource-properties.json"), headers=HEADERS).json()
    assert [layer["name"] for layer in document["dataLayers"]] == LAYER_NAMES
    for layer in document["dataLayers"]:
        assert layer["dataFormat"] == "zarr3"
        assert "wkwResolutions" not in layer
        assert layer["numChannels"] == CHANNELS[layer["name"]]
        assert [m["path"] for m in layer["mags"]] == [f"./{layer['name']}/{mag_name(m)}" for m in MAGS]
    v2 = requests.get(v3_url(gateway, "datasource-properties.json", tree="zarr"), headers=HEADERS).json()
    assert {layer["dataFormat"] for layer in v2["dataLayers"]} == {"zarr"}


@pytest.mark.parametrize(
    "path",
    [
        "datasource-properties.json",
        "zarr.json",
        "rgb/zarr.json",
        "rgb/2-2-1/zarr.json",
        "rgb/1/c/0/1/1/0",
        "segmentation/1/c/0/1/0/0",
        "color_u8/4-4-2/c/0/0/0/0",
    ],
)
@pytest.mark.parametrize("layout", ["plain", "sharded"])
def test_experimental_alias_answers_alike(layouts: dict[str, Server], layout: str, path: str) -> None:
    server = layouts[layout]
    main = requests.get(v3_url(server, path), headers=HEADERS)
    alias = requests.get(v3_url(server, path, tree="zarr3_experimental"), headers=HEADERS)
    assert main.status_code == alias.status_code == 200
    assert main.content == alias.content
    assert main.headers["ETag"] == alias.headers["ETag"]


@pytest.mark.parametrize("layout", ["plain", "sharded"])
def test_trees_do_not_mix_metadata_names(layouts: dict[str, Server], layout: str) -> None:
    server = layouts[layout]
    for node in ["", "color_u8", "color_u8/1", "rgb/2-2-1"]:
        parts = [node] if node else []
        for name in (".zarray", ".zgroup", ".zattrs", ".zmetadata"):
            response = requests.get(v3_url(server, *parts, name), headers=HEADERS)
            assert response.status_code == 404, (node, name)
        assert requests.get(v3_url(server, *parts, "zarr.json"), headers=HEADERS).status_code == 200
        response = requests.get(v3_url(server, *parts, "zarr.json", tree="zarr"), headers=HEADERS)
        assert response.status_code == 404, node
        assert requests.head(v3_url(server, *parts, "zarr.json", tree="zarr"), headers=HEADERS).status_code == 404


# --- Neuroglancer: HEAD, then explicit ranges for the shard index and one inner chunk ------------


@pytest.mark.parametrize("layer", LAYER_NAMES)
@pytest.mark.parametrize("cube", [(0, 0, 0), (1, 1, 0)])
def test_neuroglancer_reads_inner_chunks_by_range(
    sharded_gateway: Server, test_data: Data, layer: str, cube: tuple[int, int, int]
) -> None:
    channels = CHANNELS[layer]
    url = v3_url(sharded_gateway, layer, "1", "c", "0", *map(str, cube))
    origin = {"Origin": "https://neuroglancer.example.org"}
    expected = test_data.expected(layer, (1, 1, 1))
    dtype = expected.dtype
    session = requests.Session()

    head = session.head(url, headers=origin)
    assert head.status_code == 200
    _assert_cors(head)
    size = int(head.headers["Content-Length"])
    count = FILE_LEN**3
    index_size = 16 * count + 4
    response = session.get(url, headers={**origin, "Range": f"bytes={size - index_size}-{size - 1}"})
    assert response.status_code == 206
    _assert_cors(response)
    assert response.headers["Content-Range"] == f"bytes {size - index_size}-{size - 1}/{size}"
    raw = response.content
    assert len(raw) == index_size
    assert int.from_bytes(raw[-4:], "little") == crc32c.crc32c(raw[:-4])
    table = np.frombuffer(raw[:-4], dtype="<u8").reshape(FILE_LEN, FILE_LEN, FILE_LEN, 2)  # C order over (x, y, z)

    blosc = numcodecs.Blosc()
    decoded = 0
    for i, j, k in np.ndindex(FILE_LEN, FILE_LEN, FILE_LEN):
        offset, length = (int(v) for v in table[i, j, k])
        lo = [(c * FILE_LEN + b) * BLOCK_LEN for c, b in zip(cube, (i, j, k))]
        window = (slice(None), *(slice(v, v + BLOCK_LEN) for v in lo))
        want = np.zeros((channels, BLOCK_LEN, BLOCK_LEN, BLOCK_LEN), dtype=dtype)
        part = expected[window]
        want[tuple(slice(0, s) for s in part.shape)] = part
        if (offset, length) == (EMPTY, EMPTY):
            assert not want.any(), (i, j, k)
            continue
        response = session.get(url, headers={**origin, "Range": f"bytes={offset}-{offset + length - 1}"})
        assert response.status_code == 206
        assert response.headers["Content-Range"] == f"bytes {offset}-{offset + length - 1}/{size}"
        flat = np.frombuffer(blosc.decode(response.content), dtype=dtype)
        chunk = flat.reshape((channels, BLOCK_LEN, BLOCK_LEN, BLOCK_LEN), order="F")
        np.testing.assert_array_equal(chunk, want, err_msg=f"inner chunk {(i, j, k)}")
        decoded += 1
    assert decoded > 0
    if cube == (0, 0, 0):  # inner chunk (2, 1, 1) lies inside the bounding box: its stored block is passed through
        offset, length = (int(v) for v in table[2, 1, 1])
        body = session.get(url, headers={**origin, "Range": f"bytes={offset}-{offset + length - 1}"}).content
        stored = _stored_block(test_data, layer, cube, morton_encode(2, 1, 1))
        prefix = 24 if next(c for c in LAYERS if c[0] == layer)[3] else 16
        assert body[prefix:] == stored


def _stored_block(test_data: Data, layer: str, cube: tuple[int, int, int], index: int) -> bytes:
    """A block's bytes exactly as the WKW file stores them."""
    raw = file_path(test_data.root, layer, (1, 1, 1), cube).read_bytes()
    block_type, block_bytes = raw[5], BLOCK_LEN**3 * raw[7]
    if block_type == 1:
        return raw[16 + index * block_bytes : 16 + (index + 1) * block_bytes]
    jumps = np.frombuffer(raw[16 : 16 + 8 * FILE_LEN**3], dtype="<u8")
    start = 16 + 8 * FILE_LEN**3 if index == 0 else int(jumps[index - 1])
    return raw[start : int(jumps[index])]


def _assert_cors(response: requests.Response) -> None:
    assert response.headers["Access-Control-Allow-Origin"] in ("*", "https://neuroglancer.example.org")
    exposed = {h.strip().lower() for h in response.headers["Access-Control-Expose-Headers"].split(",")}
    assert {"content-range", "content-length", "etag"} <= exposed


def test_cors_preflight_allows_range(sharded_gateway: Server) -> None:
    response = requests.options(
        v3_url(sharded_gateway, "color_u8", "1", "c", "0", "0", "0", "0"),
        headers={
            "Origin": "https://neuroglancer.example.org",
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "range",
        },
    )
    assert response.status_code in (200, 204)
    assert "range" in response.headers["Access-Control-Allow-Headers"].lower()
    assert "GET" in response.headers["Access-Control-Allow-Methods"]


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["plain", "sharded"])
@pytest.mark.parametrize(
    "key",
    ["c/0/1/2", "c/0/1/2/3/4", "c/0/-1/0/0", "c/0/a/0/0", "c/0/1.0/0/0", "c/0/ 1/0/0", "0/0/0/0", "d/0/0/0/0", "c"],
)
def test_malformed_keys_are_400(layouts: dict[str, Server], layout: str, key: str) -> None:
    response = requests.get(v3_url(layouts[layout], "color_u8", "1", key), headers=HEADERS)
    assert response.status_code == 400, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    assert response.json()["error"]


@pytest.mark.parametrize(
    ("layout", "key"),
    [
        ("plain", "c/0/6/0/0"),  # 187 voxels make 6 chunks of 32
        ("plain", "c/0/0/5/0"),
        ("plain", "c/0/0/0/3"),
        ("plain", "c/1/0/0/0"),  # one channel
        ("plain", "c/0/999999999999/0/0"),
        ("sharded", "c/0/2/0/0"),  # 187 voxels make 2 shards of 128
        ("sharded", "c/0/0/0/1"),
        ("sharded", "c/1/0/0/0"),
    ],
)
def test_keys_past_the_grid_are_404(layouts: dict[str, Server], layout: str, key: str) -> None:
    response = requests.get(v3_url(layouts[layout], "color_u8", "1", key), headers=HEADERS)
    assert response.status_code == 404, response.text


def test_chunks_outside_the_bounding_box_are_404(layouts: dict[str, Server]) -> None:
    # mag 1 data starts at x = 37: chunk 0 along x (voxels 0..31) holds none of it
    response = requests.get(v3_url(layouts["plain"], "color_u8", "1", "c/0/0/0/0"), headers=HEADERS)
    assert response.status_code == 404


@pytest.mark.parametrize("layout", ["plain", "sharded"])
def test_corrupt_jump_table_is_a_storage_fault(variant: Data, variant_servers: dict[str, Server], layout: str) -> None:
    layer, mag, cube = CORRUPT
    server = variant_servers[layout]
    base = v3_url(server, layer, mag_name(mag))
    edge = FILE_LEN if layout == "plain" else 1  # chunk index of the file's first chunk
    key = "c/0/" + "/".join(str(c * edge) for c in cube)
    for method, headers in [("GET", {}), ("HEAD", {}), ("GET", {"Range": f"bytes=-{16 * FILE_LEN**3 + 4}"})]:
        response = requests.request(method, f"{base}/{key}", headers=headers)
        assert 500 <= response.status_code < 600, (method, headers, response.status_code)
        if method == "GET":
            assert response.headers["Content-Type"].startswith("application/json")
            assert "jump table" in response.json()["error"]
    v2 = requests.get(f"{v3_url(server, layer, mag_name(mag), tree='zarr')}/0.{cube[0] * 4 + 1}.1.1")
    assert 500 <= v2.status_code < 600
    assert "jump table" in server.log()

    # the other files of the layer still read, and exactly
    retries = {"http_request_retries": {"max_retries": 2, "initial_delay": "10ms", "max_delay": "50ms"}}
    spec = {"driver": "zarr3", "kvstore": {"driver": "http", "base_url": base + "/"}, "context": retries}
    array = ts.open(spec, read=True).result()
    expected = variant.expected(layer, mag)
    np.testing.assert_array_equal(array[:, 0:128, 0:141, :].read().result(), expected[:, 0:128, :, :])
    with pytest.raises(ValueError):
        array[:, 128:187, 0:128, :].read().result()
