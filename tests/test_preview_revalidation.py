"""A preview is revalidated before any work, in any worker (issue 24, item 3: "revalidation before work").

A preview's ETag is made from the identities of the files its read covers, taken by a stat of each before
anything is read. So a gateway that never made the preview (another worker, a replica, one whose cache
evicted it) answers a matching ``If-None-Match`` with a 304 without reading a chunk file, which the kernel's
own record of file reads (inotify) shows; and the preview it makes is the other gateway's, byte for byte.
Layers of two formats (WKW and Zarr v2), written with ``wkw`` and numcodecs.
"""

import json
import os
from collections.abc import Callable
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import requests
import wkw
from support.datasets import cube_layer, write_layers_properties
from support.file_reads import FileReads
from support.metrics import delta, scrape
from support.servers import Server

from gateway.previews import Previews
from gateway.sources.catalog import Catalog
from gateway.sources.dataset import Dataset
from gateway.sources.registry import SourceFormats
from gateway_storage import FileChangedError, LocalStore

ORG = "revalidated"
DATASET = "pictures"
EDGE = 256  # 256 x 256 x 64 voxels per layer: 4 MiB decoded for one preview of the WKW layer
DEPTH = 64
ZARR_CHUNK = (1, 64, 64, 16)
LAYERS = ("wkw_color", "zarr_color")


def _zarr_layer(directory: Path, data: np.ndarray) -> None:
    """A Zarr v2 array ``(c, x, y, z)`` of zlib chunks, written file by file as numcodecs encodes them."""
    directory.mkdir(parents=True)
    zarray = {
        "zarr_format": 2,
        "shape": [1, *data.shape],
        "chunks": list(ZARR_CHUNK),
        "dtype": "|u1",
        "compressor": {"id": "zlib", "level": 1},
        "fill_value": 0,
        "order": "C",
        "filters": None,
    }
    (directory / ".zarray").write_text(json.dumps(zarray))
    _, cx, cy, cz = ZARR_CHUNK
    for x in range(data.shape[0] // cx):
        for y in range(data.shape[1] // cy):
            for z in range(data.shape[2] // cz):
                chunk = np.ascontiguousarray(data[x * cx : (x + 1) * cx, y * cy : (y + 1) * cy, z * cz : (z + 1) * cz])
                (directory / f"0.{x}.{y}.{z}").write_bytes(numcodecs.Zlib(1).encode(chunk))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("preview-revalidation")
    dataset = root / ORG / DATASET
    rng = np.random.default_rng(7)
    with wkw.Dataset.create(str(dataset / "wkw_color" / "1"), wkw.Header(np.uint8, block_len=32, file_len=4)) as ds:
        ds.write((0, 0, 0), rng.integers(0, 255, (EDGE, EDGE, DEPTH), dtype=np.uint8))
    _zarr_layer(dataset / "zarr_color" / "1", rng.integers(0, 255, (EDGE, EDGE, DEPTH), dtype=np.uint8))
    layers = [
        cube_layer("wkw_color", "wkw", EDGE, [{"mag": [1, 1, 1], "path": "wkw_color/1"}]),
        cube_layer("zarr_color", "zarr", EDGE, [{"mag": [1, 1, 1], "path": "zarr_color/1"}]),
    ]
    for layer in layers:
        layer["boundingBox"]["depth"] = DEPTH
    write_layers_properties(dataset, layers)
    return root


@pytest.fixture(scope="module")
def first(root: Path, server_factory: Callable[..., Server]) -> Server:
    """The gateway that makes each preview first."""
    return server_factory(root)


def _preview(server: Server, layer: str, **headers: str) -> requests.Response:
    return requests.get(f"{server.url}/preview/{ORG}/{DATASET}/{layer}.png", headers=headers, timeout=120)


@pytest.mark.parametrize("layer", LAYERS)
def test_a_fresh_gateway_revalidates_a_preview_without_reading_a_chunk_file(
    root: Path, first: Server, server_factory: Callable[..., Server], layer: str
) -> None:
    made = _preview(first, layer)
    assert made.status_code == 200 and made.content.startswith(b"\x89PNG"), made.text[:300]
    etag = made.headers["ETag"]
    fresh = server_factory(root)  # nothing cached: another worker, a replica, an eviction
    # its catalog loads the dataset (properties, mag headers, .zarray) before the watch begins
    assert requests.get(f"{fresh.url}/data/zarr/{ORG}/{DATASET}/{layer}/1/.zarray", timeout=30).status_code == 200
    before = scrape(fresh)
    with FileReads(root / ORG / DATASET / layer) as reads:
        again = _preview(fresh, layer, **{"If-None-Match": etag})
        read = reads.read_since()
        assert again.status_code == 304 and again.headers["ETag"] == etag and not again.content
        assert not read, f"the revalidation read {sorted(map(str, read))[:5]}"
        remade = _preview(fresh, layer)
        assert reads.read_since(), "the watch saw no read of the preview made: it would not see any"
    assert remade.status_code == 200 and remade.headers["ETag"] == etag and remade.content == made.content
    after = scrape(fresh)
    counts = {result: delta(before, after, "zarr_gateway_previews_total", result=result) for result in ("made", "kept")}
    assert (
        counts == {"made": 1, "kept": 0}
        and delta(before, after, "zarr_gateway_previews_total", result="revalidated") == 1
    )


def test_a_rewritten_file_changes_the_etag_in_every_gateway(root: Path, server_factory: Callable[..., Server]) -> None:
    one, other = server_factory(root), server_factory(root)
    etag = _preview(one, "wkw_color").headers["ETag"]
    assert _preview(other, "wkw_color", **{"If-None-Match": etag}).status_code == 304
    with wkw.Dataset.open(str(root / ORG / DATASET / "wkw_color" / "1")) as ds:
        ds.write((96, 96, DEPTH // 2 - 1), np.full((64, 64, 1), 255, dtype=np.uint8))
    for server in (other, one):
        changed = _preview(server, "wkw_color", **{"If-None-Match": etag})
        assert changed.status_code == 200 and changed.headers["ETag"] != etag, changed.text[:300]


def test_a_file_rewritten_between_the_stat_and_the_read_is_a_changed_file(tmp_path: Path) -> None:
    """The ETag names the versions stat'ed; a read that finds another version is not served under it."""
    dataset = tmp_path / ORG / DATASET
    data = np.random.default_rng(8).integers(0, 255, (EDGE, EDGE, DEPTH), dtype=np.uint8)
    _zarr_layer(dataset / "zarr_color" / "1", data)
    layer = cube_layer("zarr_color", "zarr", EDGE, [{"mag": [1, 1, 1], "path": "zarr_color/1"}])
    layer["boundingBox"]["depth"] = DEPTH
    write_layers_properties(dataset, [layer])
    store = LocalStore(str(tmp_path))
    loaded = Catalog(store, SourceFormats(store, 1 << 20)).dataset(ORG, DATASET)
    assert isinstance(loaded, Dataset)
    previews = Previews(1 << 24)
    planned = previews.plan(loaded.layers["zarr_color"].mags, "color")
    assert planned.etag is not None and planned.files
    chunk = Path(planned.files[0][0])
    copy = chunk.with_name("rewritten")
    copy.write_bytes(chunk.read_bytes())
    os.replace(copy, chunk)  # the same bytes, another version of the file
    with pytest.raises(FileChangedError, match="changed while its preview was read"):
        previews.make(planned)
    assert previews.preview(loaded.layers["zarr_color"].mags, "color").etag != planned.etag
