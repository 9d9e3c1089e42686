"""Faults while the bytes of a large virtual shard are read: one error map, before and after the first byte.

A shard larger than the streaming piece (4 MiB) is sent as it is read. A fault found before the first
byte gets the same JSON status as a plain chunk of the same file; a fault in a later piece ends the
response early (the client sees a short body, an error) and is logged and counted like any other.
"""

import os
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import requests
from support.metrics import delta, scrape
from support.servers import Server

ORG = "stream_org"
DATASET = "big_shards"
LAYER = "raw_u64"  # a segmentation: webKnossos allows uint64 there
EDGE = 128  # one file of 4 x 4 x 4 blocks of 32^3 uint64: a 16 MiB virtual shard
SHARD = f"/data/zarr3/{ORG}/{DATASET}/{LAYER}/1/c/0/0/0/0"
PLAIN_CHUNK = f"/data/zarr/{ORG}/{DATASET}/{LAYER}/1/0.3.3.3"  # its block lies in the second half of the file


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import webknossos as wk

    root = tmp_path_factory.mktemp("stream-template")
    dataset = wk.Dataset(root / ORG / DATASET, voxel_size=(10, 10, 10))
    layer = dataset.add_layer(LAYER, "segmentation", dtype="uint64", data_format="wkw", largest_segment_id=2**31)
    layer.bounding_box = wk.BoundingBox((0, 0, 0), (EDGE, EDGE, EDGE))
    mag = layer.add_mag(1, chunk_shape=32, shard_shape=EDGE, compress=False)
    data = np.random.default_rng(7).integers(0, 2**31, size=(EDGE, EDGE, EDGE), dtype=np.uint64)
    mag.write(data, absolute_offset=(0, 0, 0))
    return root


@pytest.fixture
def root(template: Path, tmp_path: Path) -> Path:
    shutil.copytree(template, tmp_path / "root")
    return tmp_path / "root"


def data_file(root: Path) -> Path:
    return root / ORG / DATASET / LAYER / "1" / "z0" / "y0" / "x0.wkw"


def stalled_get(server: Server, path: str) -> tuple[socket.socket, int, bytes]:
    """Send a GET, read only the head, and leave the body waiting (a small receive window stalls the server)."""
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.settimeout(30)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1024)
    head, _, body = head.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/1.1 200"), lines[0]
    length = next(int(line.split(":")[1]) for line in lines if line.lower().startswith("content-length:"))
    return sock, length, body


def read_rest(sock: socket.socket, body: bytes) -> bytes:
    with sock:
        while True:
            try:
                piece = sock.recv(1 << 16)
            except (ConnectionResetError, TimeoutError):
                break
            if not piece:
                break
            body += piece
    return body


def test_a_truncated_shard_file_is_the_same_5xx_as_a_plain_chunk(
    root: Path, server_factory: Callable[..., Server]
) -> None:
    path = data_file(root)
    os.truncate(path, path.stat().st_size // 2)
    server = server_factory(root, v3_layout="sharded", settle_seconds=0)  # the fault itself, not its freshness
    shard = requests.get(server.url + SHARD, timeout=30)
    plain = requests.get(server.url + PLAIN_CHUNK, timeout=30)
    assert shard.status_code == plain.status_code == 500
    assert shard.json()["status"] == 500 and "storage fault" in shard.json()["error"]
    assert "storage fault" in plain.json()["error"]


def test_a_shard_rewritten_in_place_while_it_streams_ends_short(
    root: Path, server_factory: Callable[..., Server]
) -> None:
    server = server_factory(root, v3_layout="sharded")
    whole = requests.get(server.url + SHARD, timeout=60)
    assert whole.status_code == 200 and len(whole.content) > 3 * (4 << 20)
    before = scrape(server)
    sock, length, body = stalled_get(server, SHARD)
    assert length == len(whole.content)
    time.sleep(1)  # the server has sent what the window takes and waits before reading the next piece
    path = data_file(root)
    with open(path, "r+b") as f:  # a writer rewrites the file in place: same size, other bytes
        f.seek(path.stat().st_size // 2)
        f.write(os.urandom(1 << 20))
    body = read_rest(sock, body)
    assert len(body) < length, "a response whose file changed mid-stream must not look complete"
    assert whole.content.startswith(body), "every byte sent belongs to the version the ETag names"
    after = scrape(server)
    assert delta(before, after, "zarr_gateway_storage_errors_total", kind="changed") >= 1
    assert "while streaming" in server.log()
    assert requests.get(server.url + "/healthz", timeout=10).status_code == 200  # the server lives on


def test_a_shard_replaced_atomically_while_it_streams_is_the_whole_old_version(
    root: Path, server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    server = server_factory(root, v3_layout="sharded", settle_seconds=0)  # atomic replacement needs no settle time
    whole = requests.get(server.url + SHARD, timeout=60)
    sock, length, body = stalled_get(server, SHARD)
    time.sleep(1)
    path = data_file(root)
    replacement = tmp_path / "replacement.wkw"
    shutil.copyfile(path, replacement)
    with open(replacement, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        f.write(os.urandom(1 << 20))
    os.replace(replacement, path)
    body = read_rest(sock, body)
    # What is sent is the version the plan and the ETag were made from (an open descriptor still reads it),
    # whole or cut short, never a mix of the two versions.
    assert len(body) <= length
    assert body == whole.content[: len(body)]
    again = requests.get(server.url + SHARD, timeout=60)
    assert again.status_code == 200 and again.headers["ETag"] != whole.headers["ETag"]
    assert again.content != whole.content
