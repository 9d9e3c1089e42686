"""Shared fixtures: datasets written by the format authors' packages, and real gateway servers."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import requests

warnings.filterwarnings("ignore", message="Not all image readers could be imported")

ORG = "test_org"
TOKEN = "secret-token-for-tests"
OTHER_TOKEN = "token-for-another-org"
TOP_LEFT = (37, 21, 5)
SIZE = (150, 120, 70)
MAGS = ((1, 1, 1), (2, 2, 1), (4, 4, 2))
# name, dtype, channels, compressed, category
LAYERS = [
    ("color_u8", "uint8", 1, True, "color"),
    ("color_u16", "uint16", 1, False, "color"),
    ("rgb", "uint8", 3, True, "color"),
    ("segmentation", "uint32", 1, True, "segmentation"),
    ("color_f32", "float32", 1, False, "color"),
]


def mag_name(mag: tuple[int, int, int]) -> str:
    return str(mag[0]) if len(set(mag)) == 1 else "-".join(map(str, mag))


def bbox_at_mag(mag: tuple[int, int, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    lo = tuple(t // m for t, m in zip(TOP_LEFT, mag))
    hi = tuple(-(-(t + s) // m) for t, s, m in zip(TOP_LEFT, SIZE, mag))
    return lo, hi


def _random(dtype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(1, min(info.max, 2**31), size=shape, dtype=dtype)


def _write_webknossos_dataset(path: Path) -> None:
    """The main test dataset, written by webknossos-libs in WKW format (files of 4^3 blocks of 32^3)."""
    import webknossos as wk

    rng = np.random.default_rng(42)
    dataset = wk.Dataset(path, voxel_size=(11.24, 11.24, 28.0))
    for name, dtype, channels, compressed, category in LAYERS:
        kwargs = {"largest_segment_id": 0} if category == "segmentation" else {}
        layer = dataset.add_layer(
            name, category, dtype_per_channel=dtype, num_channels=channels, data_format="wkw", **kwargs
        )
        layer.bounding_box = wk.BoundingBox(TOP_LEFT, SIZE)
        for mag in MAGS:
            view = layer.add_mag(mag, chunk_shape=32, shard_shape=128, compress=compressed)
            lo, hi = bbox_at_mag(mag)
            shape = tuple(h - low for low, h in zip(lo, hi))
            data = _random(dtype, (channels, *shape), rng)
            view.write(data if channels > 1 else data[0], absolute_offset=tuple(v * m for v, m in zip(lo, mag)))
        if category == "segmentation":
            layer.largest_segment_id = 2**31 - 1


@dataclass(frozen=True)
class TestData:
    root: Path
    dataset: str

    def mag_dir(self, layer: str, mag: tuple[int, int, int]) -> Path:
        return self.root / ORG / self.dataset / layer / mag_name(mag)

    def expected(self, layer: str, mag: tuple[int, int, int]) -> np.ndarray:
        """What the gateway must serve: the wkw package's read of [0, shape), zero outside the bbox."""
        import wkw

        lo, hi = bbox_at_mag(mag)
        with wkw.Dataset.open(str(self.mag_dir(layer, mag))) as ds:
            data = ds.read((0, 0, 0), hi)
        out = np.zeros_like(data)
        sel = (slice(None), *(slice(a, b) for a, b in zip(lo, hi)))
        out[sel] = data[sel]
        return out


@pytest.fixture(scope="session")
def test_data(tmp_path_factory: pytest.TempPathFactory) -> TestData:
    root = tmp_path_factory.mktemp("root")
    _write_webknossos_dataset(root / ORG / "wk_dataset")
    (root / "other_org").mkdir()
    shutil.copytree(root / ORG / "wk_dataset", root / "other_org" / "theirs")
    broken = root / ORG / "broken_dataset"
    broken.mkdir()
    (broken / "datasource-properties.json").write_text(json.dumps({"id": {"name": "x"}, "dataLayers": "nope"}))
    return TestData(root, "wk_dataset")


def stop_process(process: subprocess.Popen, timeout: float = 10, stop_signal: int = signal.SIGTERM) -> None:
    """Ask a process to stop with ``stop_signal``; kill it if it has not stopped ``timeout`` seconds later."""
    if process.poll() is not None:
        return
    process.send_signal(stop_signal)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text()

    def access_lines(self) -> list[dict]:
        """The gateway's access log records (one JSON object a line), in order."""
        lines = []
        for line in self.log().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("logger") == "gateway.access":
                lines.append(record)
        return lines

    def serving_pid(self) -> int:
        """The process that answers requests: uvicorn with one worker serves in its own, Granian in its worker."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
        return int(children[0]) if children else self.process.pid


TEST_SERVER_ENV = "GATEWAY_TEST_SERVER"  # uvicorn (default) or granian: the HTTP server of every test gateway


def start_server(root: Path, log_dir: Path, **settings: object) -> Server:
    port = free_port()
    args = [sys.executable, "-m", "gateway", "serve", "--root", str(root), "--port", str(port)]
    settings.setdefault("workers", 1)  # one process per test server keeps the suite light on 2 cores
    settings.setdefault("server", os.environ.get(TEST_SERVER_ENV) or "uvicorn")
    if "settings_file" not in settings:  # a flag would override the file's settle_seconds
        # Tests write data and read it at once; the settle rule itself is tested in test_data_safety.py,
        # whose gateways take their settings from a file and keep the default unless they say otherwise.
        settings.setdefault("settle_seconds", 0)
    for key, value in settings.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    log_path = log_dir / f"gateway-{port}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZARR_GATEWAY_")}
    with open(log_path, "wb") as log_file:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen(args, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"gateway exited: {log_path.read_text()}")
        try:
            requests.get(url + "/", timeout=1)
            return Server(url, process, log_path)
        except requests.ConnectionError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"gateway did not start: {log_path.read_text()}")


@pytest.fixture(scope="session")
def server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []
    log_dir = tmp_path_factory.mktemp("logs")

    def make(root: Path, **settings: object) -> Server:
        server = start_server(root, log_dir, **settings)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.process.terminate()
    for server in servers:
        try:
            server.process.wait(10)
        except subprocess.TimeoutExpired:
            server.process.kill()


@pytest.fixture(scope="session")
def tokens_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("auth") / "tokens.json"
    path.write_text(json.dumps({"tokens": {TOKEN: [f"{ORG}/*"], OTHER_TOKEN: ["other_org/*"]}}))
    return path


@pytest.fixture(scope="session")
def gateway(test_data: TestData, tokens_file: Path, server_factory: Callable[..., Server]) -> Server:
    """The default server: tokens required, v3 plain layout."""
    return server_factory(test_data.root, tokens_file=tokens_file)


@pytest.fixture(scope="session")
def sharded_gateway(test_data: TestData, server_factory: Callable[..., Server]) -> Server:
    """An open server whose v3 tree is sharded."""
    return server_factory(test_data.root, v3_layout="sharded")
