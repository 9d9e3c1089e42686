"""The precomputed tree (issue 27): CloudVolume reads every layer and mag exactly, meshes of the sample's
segments, and the tree answers validators, ranges, gzip, tokens, listings, bad keys and faults as the other
trees do."""

import gzip
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pytest
import requests
from cloudvolume.exceptions import EmptyVolumeException
from support import viewer
from support.browser import Browser
from support.cloudvolume_reads import assert_reads_exactly, open_volume, read_box
from support.datasets import LAYERS, MAGS, ORG, OTHER_TOKEN, TOKEN, WrittenDataset, bbox_at_mag, mag_name
from support.sample import VOLUME_HI, VOLUME_LO, sample_labels
from support.servers import Server, assert_no_unexpected_errors, assert_reason
from support.zarr_datasets import WK_DATASET, ZARR_ORG, served_arrays

from gateway.sample import DATASET as SAMPLE_DATASET
from gateway.sample import ORGANIZATION as SAMPLE_ORG
from gateway.sample import VOXEL_SIZE_NM

pytestmark = pytest.mark.slow  # CloudVolume and tensorstore reading whole layers

TREE = "/data/precomputed"
DATASET = f"{TREE}/{ORG}/wk_dataset"
IDENTITY = {"Accept-Encoding": "identity"}


@pytest.fixture(scope="module")
def open_gateway(test_data: WrittenDataset, server_factory: Callable[..., Server]) -> Server:
    return server_factory(test_data.root)


def cloudvolume_read(url: str, mip: int, lo: tuple[int, ...], hi: tuple[int, ...]) -> np.ndarray[Any, Any]:
    """``[lo, hi)`` at ``mip`` as CloudVolume reads it, as ``[c, x, y, z]``."""
    return np.moveaxis(read_box(url, mip, lo, hi), -1, 0)


@pytest.mark.parametrize("layer", [name for name, *_ in LAYERS])
def test_cloudvolume_reads_every_mag_exactly(open_gateway: Server, test_data: WrittenDataset, layer: str) -> None:
    url = f"{open_gateway.url}{DATASET}/{layer}"
    for mip, mag in enumerate(MAGS):
        lo, hi = bbox_at_mag(mag)
        assert_reads_exactly(url, mip, test_data.expected(layer, mag), lo, hi, layer)


def test_info_describes_each_mag(open_gateway: Server) -> None:
    info = requests.get(f"{open_gateway.url}{DATASET}/segmentation/info").json()
    assert (info["type"], info["data_type"], info["num_channels"]) == ("segmentation", "uint32", 1)
    assert [s["key"] for s in info["scales"]] == [mag_name(m) for m in MAGS]
    for scale, mag in zip(info["scales"], MAGS):
        lo, hi = bbox_at_mag(mag)
        assert scale["voxel_offset"] == list(lo) and scale["size"] == [h - low for low, h in zip(lo, hi)]
        assert scale["resolution"] == pytest.approx([11.24 * mag[0], 11.24 * mag[1], 28.0 * mag[2]])
        assert scale["encoding"] == "compressed_segmentation"
    assert info["mesh"] == "mesh" and info["segment_properties"] == "segment_properties"
    rgb = requests.get(f"{open_gateway.url}{DATASET}/rgb/info").json()
    assert (rgb["type"], rgb["num_channels"], rgb["scales"][0]["encoding"]) == ("image", 3, "raw")
    assert "mesh" not in rgb


def test_the_raw_tree_serves_segmentations_raw(open_gateway: Server, test_data: WrittenDataset) -> None:
    url = f"{open_gateway.url}/data/precomputed_raw/{ORG}/wk_dataset/segmentation"
    assert {s["encoding"] for s in requests.get(f"{url}/info").json()["scales"]} == {"raw"}
    lo, hi = bbox_at_mag(MAGS[1])
    assert_reads_exactly(url, 1, test_data.expected("segmentation", MAGS[1]), lo, hi, "segmentation raw")


def test_zarr_source_layers(zarr_root: Path, server_factory: Callable[..., Server]) -> None:
    server = server_factory(zarr_root)
    arrays = [a for a in served_arrays(zarr_root) if a.dataset == WK_DATASET]
    assert arrays
    mips: dict[str, int] = {}
    for array in arrays:
        mip = mips[array.layer] = mips.get(array.layer, -1) + 1
        url = f"{server.url}{TREE}/{ZARR_ORG}/{WK_DATASET}/{array.layer}"
        assert_reads_exactly(url, mip, array.expected(), array.bbox_lo, array.bbox_hi, array.id)


def _chunk_keys(info: dict[str, Any], scale_index: int = 0) -> list[str]:
    scale = info["scales"][scale_index]
    (cx, cy, cz) = scale["chunk_sizes"][0]
    lo, size = scale["voxel_offset"], scale["size"]
    hi = [a + s for a, s in zip(lo, size)]

    def spans(axis: int, step: int) -> list[str]:
        return [f"{a}-{min(a + step, hi[axis])}" for a in range(lo[axis], hi[axis], step)]

    return [f"{x}_{y}_{z}" for x in spans(0, cx) for y in spans(1, cy) for z in spans(2, cz)]


def test_compressed_segmentation_size_against_raw(sample_root: Path, server_factory: Callable[..., Server]) -> None:
    server = server_factory(sample_root)
    sizes = {}
    for tree in ("precomputed", "precomputed_raw"):
        base = f"{server.url}/data/{tree}/{SAMPLE_ORG}/{SAMPLE_DATASET}/segmentation"
        info = requests.get(f"{base}/info").json()
        keys = _chunk_keys(info)
        with requests.Session() as session:
            bodies = [session.get(f"{base}/1/{key}", headers=IDENTITY) for key in keys]
        assert all(r.status_code == 200 for r in bodies)
        sizes[tree] = sum(len(r.content) for r in bodies)
    print(
        f"\nsample segmentation, mag 1: compressed_segmentation {sizes['precomputed']} bytes, "
        f"raw {sizes['precomputed_raw']} bytes ({sizes['precomputed'] / sizes['precomputed_raw']:.1%})"
    )
    assert sizes["precomputed"] < sizes["precomputed_raw"]


def test_meshes_of_the_sample(sample_root: Path, server_factory: Callable[..., Server]) -> None:
    server = server_factory(sample_root)
    labels = sample_labels(sample_root)
    ids, counts = np.unique(labels[labels != 0], return_counts=True)
    largest = [int(i) for i in ids[np.argsort(-counts)][:2]]
    vol = open_volume(f"{server.url}{TREE}/{SAMPLE_ORG}/{SAMPLE_DATASET}/segmentation")
    meshes = vol.mesh.get(largest)
    resolution = np.asarray(vol.resolution)
    for segment in largest:
        mesh = meshes[segment]
        assert len(mesh.vertices) > 100 and len(mesh.faces) > 100
        where = np.argwhere(labels == segment)
        lo, hi = where.min(axis=0) * resolution, (where.max(axis=0) + 1) * resolution
        margin = 2 * resolution
        assert np.all(mesh.vertices >= lo - margin) and np.all(mesh.vertices <= hi + margin), segment
    properties = requests.get(
        f"{server.url}{TREE}/{SAMPLE_ORG}/{SAMPLE_DATASET}/segmentation/segment_properties/info"
    ).json()
    assert properties["@type"] == "neuroglancer_segment_properties"
    assert set(map(str, largest)) <= set(properties["inline"]["ids"])


def test_validators_gzip_and_ranges(open_gateway: Server) -> None:
    url = f"{open_gateway.url}{DATASET}/color_u16/1/37-69_21-53_5-37"
    plain = requests.get(url, headers=IDENTITY)
    assert plain.status_code == 200 and "content-encoding" not in plain.headers
    assert len(plain.content) == 32 * 32 * 32 * 2
    assert plain.headers["vary"] == "Accept-Encoding"
    again = requests.get(url, headers={**IDENTITY, "If-None-Match": plain.headers["etag"]})
    assert again.status_code == 304
    zipped = [requests.get(url, headers={"Accept-Encoding": "gzip"}, stream=True) for _ in range(2)]
    raw_bodies = [r.raw.read(decode_content=False) for r in zipped]
    assert all(r.headers["content-encoding"] == "gzip" for r in zipped)
    assert raw_bodies[0] == raw_bodies[1] and zipped[0].headers["etag"] == zipped[1].headers["etag"]
    assert zipped[0].headers["etag"] != plain.headers["etag"]
    assert gzip.decompress(raw_bodies[0]) == plain.content
    ranged = requests.get(url, headers={**IDENTITY, "Range": "bytes=100-199"})
    assert ranged.status_code == 206 and ranged.content == plain.content[100:200]


def test_tokens(gateway: Server, test_data: WrittenDataset) -> None:
    info = f"{DATASET}/color_u8/info"
    assert requests.get(gateway.url + info).status_code == 401
    assert requests.get(gateway.url + info, headers={"X-Auth-Token": OTHER_TOKEN}).status_code == 403
    assert requests.get(f"{gateway.url}{info}?token={TOKEN}").status_code == 200
    lo, hi = bbox_at_mag(MAGS[0])
    read = cloudvolume_read(f"{gateway.url}/t/{TOKEN}{DATASET}/color_u8", 0, lo, (lo[0] + 40, lo[1] + 40, hi[2]))
    truth = test_data.expected("color_u8", MAGS[0])
    np.testing.assert_array_equal(read, truth[:, lo[0] : lo[0] + 40, lo[1] : lo[1] + 40, lo[2] : hi[2]])
    for token, status in ((TOKEN, 204), (OTHER_TOKEN, 403)):  # a proxy's /auth decides on the same names
        uri = {"X-Original-URI": f"{DATASET}/color_u8/1/37-69_21-53_5-37", "X-Auth-Token": token}
        assert requests.get(f"{gateway.url}/auth", headers=uri).status_code == status
    listing = requests.get(f"{gateway.url}{TREE}/", headers={"X-Auth-Token": OTHER_TOKEN}).text
    assert "other_org" in listing and ORG not in listing


def test_listings(open_gateway: Server) -> None:
    root = requests.get(f"{open_gateway.url}{TREE}/").text
    assert ORG in root and "other_org" in root
    datasets = requests.get(f"{open_gateway.url}{TREE}/{ORG}/").text
    assert "wk_dataset" in datasets and "broken_dataset" in datasets
    layers = requests.get(f"{open_gateway.url}{DATASET}/")
    assert layers.status_code == 200 and all(f"{name}/" in layers.text for name, *_ in LAYERS)
    segmentation = requests.get(f"{open_gateway.url}{DATASET}/segmentation/").text
    for name in ("info", *(f"{mag_name(m)}/" for m in MAGS), "mesh/", "segment_properties/"):
        assert f'"{DATASET}/segmentation/{name}"' in segmentation, name
    assert requests.get(f"{open_gateway.url}{DATASET}/segmentation/1/").status_code == 200
    assert_reason(requests.get(f"{open_gateway.url}{DATASET}/nope/info"), 404, "no layer", "segmentation")
    assert_reason(requests.get(f"{open_gateway.url}{DATASET}/color_u8/3/info"), 404, "no scale", "2-2-1")


@pytest.mark.parametrize(
    ("key", "status", "words"),
    [
        ("38-70_21-53_5-37", 400, ("off the scale's grid", "37-69")),  # not from the voxel offset
        ("37-70_21-53_5-37", 400, ("off the scale's grid",)),  # a chunk longer than the grid's
        ("165-197_21-53_5-37", 400, ("off the scale's grid", "165-187", "end 187")),  # not clipped at the edge
        ("36-68_21-53_5-37", 404, ("outside the volume", "[37, 187)")),  # before the voxel offset
        ("187-219_21-53_5-37", 404, ("outside the volume", "[37, 187)")),
        ("0-32_21-53_5-37", 404, ("outside the volume",)),
        ("37-69_21-53", 400, ("x0-x1_y0-y1_z0-z1",)),
        ("a-b_c-d_e-f", 400, ("x0-x1_y0-y1_z0-z1",)),
        ("37-69_21-53_5-37/x", 400, ("not a chunk key",)),
    ],
)
def test_bad_keys(open_gateway: Server, key: str, status: int, words: tuple[str, ...]) -> None:
    base = f"{open_gateway.url}{DATASET}/color_u8/1"
    assert requests.get(f"{base}/165-187_21-53_5-37").status_code == 200  # the edge chunk, clipped, is served
    assert_reason(requests.get(f"{base}/{key}"), status, *words)
    assert_no_unexpected_errors(open_gateway)


def test_absent_chunks_are_404_and_a_storage_fault_is_a_server_error(
    test_data: WrittenDataset, tmp_path: Path, server_factory: Callable[..., Server]
) -> None:
    root = tmp_path / "root"
    corrupt = root / ORG / "corrupt"
    shutil.copytree(test_data.root / ORG / test_data.dataset, corrupt)
    with open(corrupt / "color_u8" / "1" / "z0" / "y0" / "x0.wkw", "r+b") as f:
        f.write(b"XKW")  # bad magic
    (corrupt / "color_u16" / "1" / "z0" / "y0" / "x0.wkw").unlink()  # absent: nothing stored there
    server = server_factory(root)
    absent = f"{server.url}{TREE}/{ORG}/corrupt/color_u16"
    assert_reason(requests.get(f"{absent}/1/37-69_21-53_5-37"), 404, "no stored data")
    with pytest.raises(EmptyVolumeException):
        open_volume(absent)[37:69, 21:53, 5:37]
    assert not open_volume(absent, fill_missing=True)[37:69, 21:53, 5:37].any()
    url = f"{server.url}{TREE}/{ORG}/corrupt/color_u8"
    response = requests.get(f"{url}/1/37-69_21-53_5-37")
    assert response.status_code >= 500, (response.status_code, response.text[:300])
    assert "storage fault" in response.json()["error"]
    lo, _ = bbox_at_mag(MAGS[0])
    with pytest.raises(Exception) as raised:  # CloudVolume never turns the fault into zeros
        open_volume(url, fill_missing=True)[lo[0] : lo[0] + 8, lo[1] : lo[1] + 8, lo[2] : lo[2] + 8]
    assert not isinstance(raised.value, EmptyVolumeException)


# --- Neuroglancer in headless Chromium: one precomputed:// source per layer ---------------------------------


def _open_view(browser: Browser, client: str, server: Server, view: dict[str, Any], shot: Path) -> tuple[Any, Any]:
    """The layers' load states, the data panel's pixels and the gateway's access lines of one view."""
    start = len(server.log())
    with browser.page() as page:
        page.navigate(client + "#!" + quote(json.dumps(view), safe=""))
        page.wait_for("typeof window.viewer === 'object'", timeout=60)
        layers = viewer.wait_until_drawn(page)["layers"]
        time.sleep(2)  # meshes and late chunks: give them a moment, then settle again
        viewer.wait_until_drawn(page)
        viewer.settled_screenshot(page, shot)
        left, top, right, bottom = page.evaluate(viewer.PANEL_RECT_JS)
    time.sleep(0.5)  # access lines are written once per event-loop turn
    panel = viewer.png_pixels(shot)[top:bottom, left:right]
    return (layers, viewer.access_lines(server, start)), panel


def _sample_view(layers: list[dict[str, Any]], **view: Any) -> dict[str, Any]:
    centre = [float(v) for v in (VOLUME_LO + VOLUME_HI) / 2]
    return {
        "dimensions": {axis: [size * 1e-9, "m"] for axis, size in zip("xyz", VOXEL_SIZE_NM)},
        "position": [centre[0], centre[1], centre[2] + 0.5],
        "showAxisLines": False,
        "showScaleBar": False,
        "showDefaultAnnotations": False,
        "layers": layers,
        **view,
    }


def _assert_loaded(layers: Any, access: list[viewer.AccessLine]) -> None:
    for layer in layers:
        for source in layer["sources"]:
            assert source["state"] == "loaded", (layer["name"], source)
    assert [line for line in access if line.path.startswith(TREE)], "nothing was read from the precomputed tree"
    assert not [line for line in access if line.status >= 400], [line for line in access if line.status >= 400]


CROSS_SECTION_SCALE = 0.45  # voxels per screen pixel: the whole volume fills the panel, drawn at mag 1
HALF = 180  # the pixels compared: a square of 2 * HALF about the panel's centre, inside the volume


def _voxels_under(panel: np.ndarray[Any, Any], labels: np.ndarray[Any, Any], z: int) -> np.ndarray[Any, Any]:
    """The voxels of slice ``z`` under the middle square of the panel (rows y, columns x), by the view's
    geometry: the panel's centre shows the view's position, each pixel ``CROSS_SECTION_SCALE`` voxels."""
    centre = (VOLUME_LO + VOLUME_HI) / 2
    rows, columns = panel.shape[:2]
    offsets = np.arange(-HALF, HALF) + 0.5
    xs = np.floor(centre[0] + (offsets + columns // 2 - columns / 2) * CROSS_SECTION_SCALE).astype(int)
    ys = np.floor(centre[1] + (offsets + rows // 2 - rows / 2) * CROSS_SECTION_SCALE).astype(int)
    return labels[np.ix_(xs, ys, [z])][:, :, 0].T


def _middle(panel: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    y, x = panel.shape[0] // 2, panel.shape[1] // 2
    return panel[y - HALF : y + HALF, x - HALF : x + HALF].astype(int)


def _label_agreement(panel: np.ndarray[Any, Any], labels: np.ndarray[Any, Any]) -> float:
    """The share of pixels drawn in the colour most pixels of their segment have (1.0: the panel's colours
    are a function of ``labels``)."""
    agree = 0
    for segment in np.unique(labels):
        colours = panel[labels == segment].reshape(-1, 3)
        values, counts = np.unique(colours, axis=0, return_counts=True)
        agree += int((np.abs(colours - values[np.argmax(counts)]).max(axis=-1) <= 8).sum())
    return agree / labels.size


def _sample_volume(sample_root: Path, layer: str) -> np.ndarray[Any, Any]:
    import wkw

    with wkw.Dataset.open(str(sample_root / SAMPLE_ORG / SAMPLE_DATASET / layer / "1")) as ds:
        data: np.ndarray[Any, Any] = ds.read((0, 0, 0), tuple(int(v) for v in VOLUME_HI))[0]
    return data


@pytest.mark.browser
@pytest.mark.parametrize("layer", ["color", "segmentation"])
def test_neuroglancer_draws_each_layer_from_its_precomputed_source(
    sample_root: Path,
    server_factory: Callable[..., Server],
    browser: Browser,
    neuroglancer_url: str,
    tmp_path: Path,
    layer: str,
) -> None:
    """The panel shows the slice the view is at, pixel by pixel: the image's grey values follow the voxels (and
    not those of the neighbouring slices), the segmentation's colours follow the labels."""
    server = server_factory(sample_root)
    if layer == "color":  # a fixed contrast range: the pixels then depend on the voxels alone
        shown: dict[str, Any] = {"type": "image", "shaderControls": {"normalized": {"range": [0, 255]}}}
    else:
        shown = {"type": "segmentation", "selectedAlpha": 1}
    source = f"precomputed://{server.url}{TREE}/{SAMPLE_ORG}/{SAMPLE_DATASET}/{layer}"
    view = _sample_view(
        [{**shown, "name": layer, "source": source}], crossSectionScale=CROSS_SECTION_SCALE, layout="xy"
    )
    (states, access), panel = _open_view(browser, neuroglancer_url, server, view, tmp_path / f"{layer}.png")
    _assert_loaded(states, access)
    assert any(line.path.endswith(f"/{layer}/info") for line in access)
    middle = _middle(panel)
    assert (middle.max(axis=-1) == 0).mean() < 0.005, "chunks left black"
    voxels = _sample_volume(sample_root, layer)
    z = int((VOLUME_LO[2] + VOLUME_HI[2]) // 2)  # the view's position is half a voxel into this slice
    if layer == "color":
        grey = middle.mean(axis=-1).ravel()
        fits = {k: float(np.corrcoef(grey, _voxels_under(panel, voxels, k).ravel())[0, 1]) for k in (z - 1, z, z + 1)}
        print(f"{layer}: correlation of the panel with slices {fits}")
        assert fits[z] > 0.98 and fits[z] > max(fits[z - 1], fits[z + 1]), fits
    else:
        fits = {k: _label_agreement(middle, _voxels_under(panel, voxels, k)) for k in (z - 1, z, z + 1)}
        print(f"{layer}: pixels coloured as their segment, by slice {fits}")
        assert fits[z] > 0.97 and fits[z] > max(fits[z - 1], fits[z + 1]), fits


@pytest.mark.browser
def test_neuroglancer_draws_meshes_from_the_segmentation_source(
    sample_root: Path, server_factory: Callable[..., Server], browser: Browser, neuroglancer_url: str, tmp_path: Path
) -> None:
    server = server_factory(sample_root)
    labels = sample_labels(sample_root)
    ids, counts = np.unique(labels[labels != 0], return_counts=True)
    segment = int(ids[np.argmax(counts)])
    source = f"precomputed://{server.url}{TREE}/{SAMPLE_ORG}/{SAMPLE_DATASET}/segmentation"
    layer = {
        "type": "segmentation",
        "name": "segmentation",
        "source": source,
        "segments": [str(segment)],
        "segmentColors": {str(segment): "#ffffff"},
        "objectAlpha": 1,
    }
    view = _sample_view(
        [layer], projectionScale=400, layout={"type": "3d", "orthographicProjection": True}, showSlices=False
    )
    (states, access), panel = _open_view(browser, neuroglancer_url, server, view, tmp_path / "meshes.png")
    _assert_loaded(states, access)
    mesh = f"/segmentation/mesh/{segment}"
    assert any(line.path.endswith(f"{mesh}.index") and line.status == 200 for line in access), access
    assert any(line.path.endswith(mesh) and line.status == 206 for line in access), access
    drawn = (panel.astype(int).sum(axis=-1) > 60).mean()
    where = np.argwhere(labels == segment)
    print(f"segment {segment}: {len(where)} voxels, {drawn:.1%} of the 3-D panel drawn")
    assert drawn > 0.01
