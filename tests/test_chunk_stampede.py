"""A new chunk that many requests ask for at once is made once for all of them (issue 41): a viewer's connections
ask for the same new chunks together, and each making it, in threads that contend for the interpreter, held a
chunk of 512 small files for seconds. Counted by the WKW file cache's lookups, which every making of a chunk
does once per file it reads."""

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import requests
import wkw
from support.metrics import Samples, delta, scrape
from support.servers import Server

ORG, DATASET, LAYER = "lab", "small_files", "small"
EXTENT = (128, 128, 64)  # four 64³ chunks, each of 512 files of one 8³ block
AT_ONCE = 16


def write_small_files(root: Path) -> np.ndarray:
    data = np.random.default_rng(41).integers(1, 255, size=EXTENT, dtype=np.uint8)
    header = wkw.Header(np.uint8, block_len=8, file_len=1, block_type=wkw.Header.BLOCK_TYPE_LZ4)
    with wkw.Dataset.create(str(root / ORG / DATASET / LAYER / "1"), header) as written:
        written.write((0, 0, 0), data)
    box = {"topLeft": [0, 0, 0], "width": EXTENT[0], "height": EXTENT[1], "depth": EXTENT[2]}
    mags = [{"mag": [1, 1, 1], "path": f"./{LAYER}/1"}]
    layer: dict[str, Any] = {
        "name": LAYER,
        "category": "color",
        "boundingBox": box,
        "elementClass": "uint8",
        "dataFormat": "wkw",
    }
    layer |= {"mags": mags}
    document = {"id": {"name": DATASET, "team": ""}, "scale": [1.0, 1.0, 1.0], "dataLayers": [layer]}
    (root / ORG / DATASET / "datasource-properties.json").write_text(json.dumps(document))
    return data


def chunk_url(server: Server, x: int, y: int) -> str:
    return f"{server.url}/data/zarr/{ORG}/{DATASET}/{LAYER}/1/0.{x}.{y}.0"


def file_lookups(before: Samples, after: Samples) -> float:
    name = "zarr_gateway_cache_lookups_total"
    return sum(delta(before, after, name, cache="files", result=result) for result in ("hit", "miss"))


def test_a_new_chunk_asked_for_at_once_is_made_once(tmp_path: Path, server_factory: Callable[..., Server]) -> None:
    write_small_files(tmp_path)
    server = server_factory(tmp_path, chunk_edge=64)
    assert requests.get(chunk_url(server, 1, 1), timeout=60).status_code == 200  # the dataset loaded
    before = scrape(server)
    alone = requests.get(chunk_url(server, 1, 0), timeout=60)
    assert alone.status_code == 200
    between = scrape(server)
    one_making = file_lookups(before, between)
    assert one_making >= 512  # every file of the chunk is looked up

    barrier = threading.Barrier(AT_ONCE)
    answers: list[requests.Response] = []

    def ask() -> None:
        barrier.wait()
        answers.append(requests.get(chunk_url(server, 0, 1), timeout=120))

    threads = [threading.Thread(target=ask) for _ in range(AT_ONCE)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    after = scrape(server)
    assert [answer.status_code for answer in answers] == [200] * AT_ONCE
    assert len({answer.content for answer in answers}) == 1 and len({answer.headers["ETag"] for answer in answers}) == 1
    # made once (by one request, the others waiting for it or finding it kept), not once per request
    assert file_lookups(between, after) == one_making
