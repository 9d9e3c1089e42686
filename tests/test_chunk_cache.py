"""Encoded chunks are kept by the identities of the files they were read from: hits are counted, and a
rewritten file is never answered from the cache."""

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import conftest
import numcodecs
import numpy as np
import requests
from conftest import ORG, Server
from test_ops import delta, scrape

CHUNK = "/data/zarr/{org}/wk_dataset/color_u8/1/0.1.1.0"  # a 64^3 chunk: 8 blocks read and encoded


def decode(body: bytes) -> np.ndarray:
    return np.frombuffer(numcodecs.Blosc().decode(body), dtype=np.uint8).reshape((1, 64, 64, 64), order="F")


def test_a_chunk_is_encoded_once_and_read_again_when_its_file_changes(
    test_data: conftest.TestData, server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    shutil.copytree(test_data.root / ORG / "wk_dataset", tmp_path / ORG / "wk_dataset")
    data = conftest.TestData(tmp_path, "wk_dataset")
    server = server_factory(tmp_path, chunk_edge=64, settle_seconds=0)  # atomic replacement needs no settle time
    url = server.url + CHUNK.format(org=ORG)
    before = scrape(server)
    first = requests.get(url, timeout=10)
    again = requests.get(url, timeout=10)
    assert first.status_code == again.status_code == 200
    assert first.content == again.content and first.headers["ETag"] == again.headers["ETag"]
    time.sleep(1.5)  # cache lookups reach the metrics within a second
    after = scrape(server)
    assert delta(before, after, "zarr_gateway_cache_lookups_total", cache="chunks", result="hit") >= 1
    expected = data.expected("color_u8", (1, 1, 1))[:, 64:128, 64:128, 0:64]
    np.testing.assert_array_equal(decode(first.content), expected)

    # Rewrite the file holding the chunk with other voxels (as a writer would: a new file moved in place).
    import wkw

    mag_dir = data.mag_dir("color_u8", (1, 1, 1))
    fresh = tmp_path / "fresh"
    shutil.copytree(mag_dir, fresh)
    with wkw.Dataset.open(str(fresh)) as dataset:
        dataset.write((0, 0, 0), np.full((128, 128, 128), 7, dtype=np.uint8))  # the whole file cube
    for path in fresh.rglob("*.wkw"):
        if path.name != "header.wkw":
            (mag_dir / path.relative_to(fresh)).with_suffix(".tmp").write_bytes(path.read_bytes())
            (mag_dir / path.relative_to(fresh)).with_suffix(".tmp").replace(mag_dir / path.relative_to(fresh))
    changed = requests.get(url, timeout=10)
    assert changed.status_code == 200
    assert changed.headers["ETag"] != first.headers["ETag"]
    got = decode(changed.content)
    lo, hi = conftest.bbox_at_mag((1, 1, 1))
    inside = got[0, max(lo[0] - 64, 0) : hi[0] - 64, max(lo[1] - 64, 0) : hi[1] - 64, lo[2] : hi[2]]
    assert inside.size and np.all(inside == 7)
