"""The proxy at full speed, and no failed read when a replica or the object store goes away.

Everything runs through deploy/nginx.conf rendered with the shipped (compose) defaults, in front of real
gateway processes on loopback (see test_deploy.py): bulk reads of thousands of chunks by the real
clients, a gateway killed in the middle of a read, a rolling restart under load, an object store that
stops answering and comes back, and a soak of mixed requests that watches the gateways' memory.
"""

import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from support.clients import read_tensorstore, read_zarr_python
from support.datasets import ORG, TOKEN, WrittenDataset, v2_chunk_paths
from support.processes import free_port, stop_process, wait_until
from support.proxy import Proxy, address, start_proxy, tool
from support.s3 import CountingProxy, Moto, aws_environment, start_moto, upload_tree
from support.servers import Server

pytestmark = pytest.mark.nginx  # every test runs deploy/nginx.conf in front of the gateways

DATASET = f"/data/zarr/{ORG}/wk_dataset"
HEADERS = {"X-Auth-Token": TOKEN}
BULK = "bulk"
BULK_LAYER = "color"
BULK_SHAPE = (1024, 1024, 128)  # 32 x 32 x 4 = 4,096 chunks of 32^3
BULK_ARRAY = f"/data/zarr/{ORG}/{BULK}/{BULK_LAYER}/1"
BULK_ARRAY_V3 = f"/data/zarr3/{ORG}/{BULK}/{BULK_LAYER}/1"
SOAK_SECONDS = 120
TIMEOUT = 60  # seconds any one request may take; a bound, not a measure


@dataclass(frozen=True)
class Bulk:
    root: Path
    voxels: np.ndarray  # (c, x, y, z) as written

    @property
    def chunks(self) -> int:
        return int(np.prod([-(-n // 32) for n in BULK_SHAPE]))


@pytest.fixture(scope="module")
def bulk(tmp_path_factory: pytest.TempPathFactory) -> Bulk:
    """One raw uint8 layer of 4,096 chunks, written by webknossos-libs in WKW format (LZ4 takes minutes to write)."""
    import webknossos as wk

    root = tmp_path_factory.mktemp("bulk_root")
    voxels = np.random.default_rng(7).integers(0, 4, size=(1, *BULK_SHAPE), dtype=np.uint8)
    dataset = wk.Dataset(root / ORG / BULK, voxel_size=(11.24, 11.24, 28.0))
    layer = dataset.add_layer(BULK_LAYER, "color", dtype="uint8", data_format="wkw")
    layer.bounding_box = wk.BoundingBox((0, 0, 0), BULK_SHAPE)
    layer.add_mag(1, chunk_shape=32, shard_shape=256, compress=False).write(voxels[0], absolute_offset=(0, 0, 0))
    return Bulk(root, voxels)


@pytest.fixture(scope="module")
def bulk_pair(bulk: Bulk, tokens_file: Path, server_factory: Callable[..., Server]) -> list[Server]:
    return [server_factory(bulk.root, tokens_file=tokens_file) for _ in range(2)]


@pytest.fixture(scope="module")
def bulk_proxy(bulk_pair: list[Server], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    started = start_proxy(tmp_path_factory.mktemp("nginx"), [address(s) for s in bulk_pair])  # shipped defaults
    yield started
    started.stop()


# --- reading with the real clients -------------------------------------------------------------------


def _read_zarr_python(base: str, path: str, region: tuple[slice, ...]) -> np.ndarray:
    return read_zarr_python(base + path, headers=HEADERS, region=region)


def _read_tensorstore(base: str, path: str, region: tuple[slice, ...]) -> np.ndarray:
    zarr_format = 3 if path.startswith("/data/zarr3/") else 2
    return read_tensorstore(base + path, zarr_format, headers=HEADERS, region=region)


def read_webknossos(base: str, path: str, region: tuple[slice, ...]) -> np.ndarray:
    import webknossos as wk
    from upath import UPath

    dataset = wk.Dataset.open(UPath(f"{base}/data/zarr/{ORG}/{BULK}", headers=HEADERS))
    corner = tuple(r.start for r in region[1:])
    size = tuple(r.stop - r.start for r in region[1:])
    data = dataset.get_layer(BULK_LAYER).get_mag(1).read(absolute_offset=corner, size=size)
    return data if data.ndim == 4 else data[np.newaxis]


READERS: dict[str, Callable[[str, str, tuple[slice, ...]], np.ndarray]] = {
    "zarr-python": _read_zarr_python,
    "tensorstore": _read_tensorstore,
    "webknossos-libs": read_webknossos,
}
WHOLE = (slice(0, 1), *(slice(0, n) for n in BULK_SHAPE))


def chunk_lines(proxy: Proxy, since: int) -> list[dict[str, Any]]:
    return [line for line in proxy.access_log()[since:] if line["path"].startswith(BULK_ARRAY + "/0.")]


@pytest.mark.parametrize("client", list(READERS))
def test_a_bulk_read_at_full_speed_passes_the_shipped_limits(bulk: Bulk, bulk_proxy: Proxy, client: str) -> None:
    """4,096 chunks as fast as the client asks for them, through the proxy as docker-compose.yml sets it up."""
    before = len(bulk_proxy.access_log())
    data = READERS[client](bulk_proxy.url, BULK_ARRAY, WHOLE)
    assert np.array_equal(data, bulk.voxels)
    statuses = Counter(line["status"] for line in bulk_proxy.access_log()[before:])
    assert "429" not in statuses and set(statuses) <= {"200", "206", "404"}, statuses  # 404: metadata probes
    assert len(chunk_lines(bulk_proxy, before)) >= bulk.chunks == 4096


# --- a gateway killed in the middle of a read ----------------------------------------------------------


def _kill_when(victim: Server, served: int) -> threading.Thread:
    """SIGKILL ``victim`` once it has answered ``served`` data requests (its access log says when)."""

    def watch() -> None:
        def answered_enough() -> bool:
            return sum(str(line["path"]).startswith("/data/") for line in victim.access_lines()) >= served

        if wait_until(answered_enough, timeout=120, interval=0.01):
            victim.process.kill()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _read_with_requests(proxy: Proxy, paths: list[str]) -> dict[str, tuple[int, bytes]]:
    local = threading.local()

    def fetch(path: str) -> tuple[str, tuple[int, bytes]]:
        session = getattr(local, "session", None) or requests.Session()
        local.session = session
        response = session.get(proxy.url + path, headers=HEADERS, timeout=TIMEOUT)
        return path, (response.status_code, response.content)

    with ThreadPoolExecutor(8) as pool:
        return dict(pool.map(fetch, paths))


@pytest.mark.parametrize("client", ["requests", "zarr-python", "tensorstore"])
def test_killing_a_gateway_mid_run_loses_no_request(
    bulk: Bulk, tokens_file: Path, server_factory: Callable[..., Server], tmp_path: Path, client: str
) -> None:
    survivor, victim = (server_factory(bulk.root, tokens_file=tokens_file) for _ in range(2))
    proxy = start_proxy(tmp_path, [address(survivor), address(victim)])
    try:
        killer = _kill_when(victim, served=100)
        if client == "requests":
            # 400 reads, about 200 for each gateway: the victim reaches its 100 before it is killed, however
            # nginx spreads them (256, 8 x 8 x 4, once left it under 100 on a loaded machine, and alive)
            paths = [f"{BULK_ARRAY}/0.{x}.{y}.{z}" for x in range(16) for y in range(8) for z in range(4)][:400]
            with requests.Session() as session:
                expected = {p: session.get(survivor.url + p, headers=HEADERS, timeout=TIMEOUT).content for p in paths}
            results = _read_with_requests(proxy, paths)
            for path in paths:
                assert results[path] == (200, expected[path]), path
            requested = len(paths)
        else:
            region = (slice(0, 1), slice(0, 1024), slice(0, 512), slice(0, 128))  # 2,048 chunks
            data = READERS[client](proxy.url, BULK_ARRAY, region)
            assert np.array_equal(data, bulk.voxels[region])
            requested = 2048
        killer.join(10)
        assert victim.process.poll() is not None, "the gateway was killed during the read"
        served = [line for line in victim.access_lines() if line["path"].startswith("/data/")]
        assert 100 <= len(served) < requested // 2 + 100, "killed mid-run, not at the end"
        statuses = Counter(line["status"] for line in chunk_lines(proxy, 0))
        assert set(statuses) == {"200"}, statuses
        retried = [line for line in proxy.access_log() if "," in line["upstream_addr"]]
        assert retried, "some request met the dead gateway and went to the other one"
    finally:
        proxy.stop()


# --- a rolling restart under load ----------------------------------------------------------------------


def _start_gateway_on(port: int, root: Path, log_path: Path, **settings: object) -> subprocess.Popen[bytes]:
    """A gateway on a given port (a replica that comes back where it was); start_server picks a new one."""
    args = [sys.executable, "-m", "gateway", "serve", "--root", str(root), "--port", str(port), "--workers", "1"]
    for key, value in settings.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZARR_GATEWAY_")}
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(args, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    if not wait_until(lambda: _answers(f"http://127.0.0.1:{port}/readyz"), timeout=30):
        stop_process(process)  # not left running for a later test to trip over
        pytest.fail(f"replica on port {port} not ready: {log_path.read_text()[-2000:]}")
    return process


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=1).status_code == 200
    except requests.ConnectionError:
        return False


@dataclass
class Load:
    """Threads reading ``paths`` through the proxy in a loop until stopped; every answer is recorded."""

    url: str
    expected: dict[str, bytes]
    statuses: Counter[int] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    retry_after_missing: int = 0

    def run(self, threads: int, limit: int = 200_000) -> list[threading.Thread]:
        paths = list(self.expected)

        def loop(offset: int) -> None:
            with requests.Session() as session:
                for n in range(limit):
                    if self.stop.is_set():
                        return
                    path = paths[(offset + n) % len(paths)]
                    try:
                        response = session.get(self.url + path, headers=HEADERS, timeout=TIMEOUT)
                    except requests.RequestException as exc:
                        with self.lock:
                            self.problems.append(f"{path}: {exc!r}")
                        continue
                    with self.lock:
                        self.statuses[response.status_code] += 1
                        if response.status_code == 200 and response.content != self.expected[path]:
                            self.problems.append(f"{path}: other bytes than expected")
                        if response.status_code == 503 and "Retry-After" not in response.headers:
                            self.retry_after_missing += 1

        workers = [threading.Thread(target=loop, args=(i * 7,), daemon=True) for i in range(threads)]
        for worker in workers:
            worker.start()
        return workers

    def total(self) -> int:
        with self.lock:
            return sum(self.statuses.values()) + len(self.problems)

    def finish(self, workers: list[threading.Thread]) -> None:
        self.stop.set()
        for worker in workers:
            worker.join(TIMEOUT + 10)


def _progress(load: Load, answers: int = 200) -> None:
    done = load.total()
    assert wait_until(lambda: load.total() >= done + answers, timeout=TIMEOUT), "the readers make progress"


def _expected_answers(server_url: str, paths: list[str]) -> dict[str, bytes]:
    with requests.Session() as session:
        answers = {p: session.get(server_url + p, headers=HEADERS, timeout=TIMEOUT) for p in paths}
    assert all(a.status_code == 200 for a in answers.values())
    return {p: a.content for p, a in answers.items()}


MIXED_PATHS = [
    *v2_chunk_paths(DATASET, ("color_u8", "segmentation")),
    f"{DATASET}/color_u8/1/.zarray",
    f"{DATASET}/datasource-properties.json",
    f"/data/zarr3/{ORG}/wk_dataset/color_u16/2-2-1/zarr.json",
]


def test_a_rolling_restart_fails_no_request(
    test_data: WrittenDataset, tokens_file: Path, gateway: Server, tmp_path: Path
) -> None:
    """SIGTERM to each replica in turn, each back (ready) before the next, while readers keep reading."""
    ports = [free_port() for _ in range(3)]
    logs = [tmp_path / f"replica-{i}.log" for i in range(3)]
    replicas: list[subprocess.Popen[bytes]] = []
    try:
        for port, log in zip(ports, logs):
            replicas.append(_start_gateway_on(port, test_data.root, log, tokens_file=tokens_file))
        proxy = start_proxy(tmp_path / "nginx", [f"127.0.0.1:{p}" for p in ports])
        load = Load(proxy.url, _expected_answers(gateway.url, MIXED_PATHS))
        workers = load.run(threads=6)
        try:
            for i, port in enumerate(ports):
                _progress(load)
                replicas[i].send_signal(signal.SIGTERM)
                # uvicorn re-raises the signal once its graceful shutdown is done
                assert replicas[i].wait(TIMEOUT) in (0, -signal.SIGTERM), logs[i].read_text()[-2000:]
                replicas[i] = _start_gateway_on(port, test_data.root, logs[i], tokens_file=tokens_file)
            _progress(load)
        finally:
            load.finish(workers)
            proxy.stop()
    finally:
        for replica in replicas:
            stop_process(replica, 30)
    print(f"rolling restart: {dict(load.statuses)} answers, {len(load.problems)} problems")
    assert not load.problems, load.problems[:10]
    assert set(load.statuses) == {200}, load.statuses
    assert sum(load.statuses.values()) >= 800
    restarted = [line for line in proxy.access_log() if "," in line["upstream_addr"] or ":" in line["upstream_status"]]
    assert restarted, "some request met a replica going down and was answered by another"


# --- the object store goes away and comes back ---------------------------------------------------------

S3_BUCKET = "failover-data"


@pytest.fixture(scope="module")
def moto_store(tmp_path_factory: pytest.TempPathFactory, test_data: WrittenDataset) -> Iterator[Moto]:
    server = start_moto(tmp_path_factory.mktemp("moto") / "moto.log")
    client = server.client()
    client.create_bucket(Bucket=S3_BUCKET)
    upload_tree(client, test_data.root / ORG / "wk_dataset", S3_BUCKET, f"root/{ORG}/wk_dataset")
    yield server
    server.stop()


def test_an_object_store_that_goes_away_is_a_503_then_heals(
    moto_store: Moto,
    tokens_file: Path,
    gateway: Server,
    server_factory: Callable[..., Server],
    tmp_path: Path,
) -> None:
    store = CountingProxy(moto_store.endpoint)  # stopped and started again on the same port: the store's address
    store.start()
    with aws_environment(store.endpoint):
        replicas = [server_factory(f"s3://{S3_BUCKET}/root", tokens_file=tokens_file) for _ in range(2)]
    proxy = start_proxy(tmp_path, [address(s) for s in replicas])
    chunks = [p for p in MIXED_PATHS if "/0." in p]
    load = Load(proxy.url, _expected_answers(gateway.url, chunks))
    workers = load.run(threads=4)
    try:
        assert wait_until(lambda: load.statuses[200] >= 100, timeout=TIMEOUT)
        store.stop()
        assert wait_until(lambda: load.statuses[503] >= 20, timeout=TIMEOUT), load.statuses
        served_while_away = load.statuses[200]
        store.start()
        assert wait_until(lambda: load.statuses[200] >= served_while_away + 200, timeout=30), "normal answers again"
    finally:
        load.finish(workers)
        store.stop()
        proxy.stop()
    print(f"object store away and back: {dict(load.statuses)} answers")
    assert not load.problems, load.problems[:10]
    assert set(load.statuses) == {200, 503}, load.statuses
    assert load.retry_after_missing == 0, "every 503 says when to come back"


# --- a soak of mixed requests over several gateways -----------------------------------------------------


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _shard_ranges(gateway_url: str, array: str, shards: list[str]) -> list[tuple[str, str]]:
    """(path, Range) pairs as a sharded read sends them: each shard's index (a suffix range), then its inner chunks."""
    metadata = requests.get(f"{gateway_url}{array}/zarr.json", headers=HEADERS, timeout=TIMEOUT).json()
    sharding = metadata["codecs"][0]
    assert sharding["name"] == "sharding_indexed"
    inner = sharding["configuration"]["chunk_shape"]
    per_shard = int(np.prod([s // i for s, i in zip(metadata["chunk_grid"]["configuration"]["chunk_shape"], inner)]))
    index_bytes = 16 * per_shard + 4  # (offset, length) per inner chunk, and a crc32c
    ranges = []
    for shard in shards:
        path = f"{array}/c/{shard}"
        headers = {**HEADERS, "Range": f"bytes=-{index_bytes}"}
        index = requests.get(gateway_url + path, headers=headers, timeout=TIMEOUT)
        assert index.status_code == 206
        ranges.append((path, f"bytes=-{index_bytes}"))
        pairs = np.frombuffer(index.content[:-4], dtype="<u8").reshape(-1, 2)
        ranges += [(path, f"bytes={o}-{o + n - 1}") for o, n in pairs if o != 2**64 - 1][:16]
    return ranges


def _wrk_script(requests_: list[tuple[str, str | None]]) -> str:
    """A wrk script that cycles through ``requests_`` (path, Range or None), each with the token."""
    entries = ",\n".join(f"  {{{json.dumps(p)}, {json.dumps(r) if r else 'nil'}}}" for p, r in requests_)
    return (
        "local requests = {\n" + entries + "\n}\n"
        "local n = 0\n"
        "function request()\n"
        "  n = n % #requests + 1\n"
        f'  local headers = {{["X-Auth-Token"] = "{TOKEN}"}}\n'
        '  if requests[n][2] then headers["Range"] = requests[n][2] end\n'
        '  return wrk.format("GET", requests[n][1], headers)\n'
        "end\n"
    )


@pytest.mark.soak
def test_a_soak_of_mixed_requests_keeps_memory_flat(
    test_data: WrittenDataset, tokens_file: Path, server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    gateways = [server_factory(test_data.root, tokens_file=tokens_file, v3_layout="sharded") for _ in range(3)]
    proxy = start_proxy(tmp_path / "nginx", [address(s) for s in gateways])
    v3 = f"/data/zarr3/{ORG}/wk_dataset"
    mixed: list[tuple[str, str | None]] = [(p, None) for p in MIXED_PATHS]
    mixed += _shard_ranges(gateways[0].url, f"{v3}/color_u8/1", ["0/0/0/0", "0/1/0/0", "0/1/1/0"])
    mixed += _shard_ranges(gateways[0].url, f"{v3}/segmentation/2-2-1", ["0/0/0/0"])
    mixed += [(f"{v3}/zarr.json", None), (f"{v3}/color_u8/zarr.json", None), (f"{v3}/color_u8/1/zarr.json", None)]
    script = tmp_path / "mixed.lua"
    script.write_text(_wrk_script(mixed))
    samples: list[list[int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(SOAK_SECONDS / 12):
            samples.append([_rss_bytes(g.process.pid) for g in gateways])

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        samples.append([_rss_bytes(g.process.pid) for g in gateways])
        sampler.start()
        command = [tool("wrk"), "-t2", "-c8", f"-d{SOAK_SECONDS}s", "-s", str(script), proxy.url]
        result = subprocess.run(command, capture_output=True, text=True, timeout=SOAK_SECONDS + 60)
        stop.set()
        sampler.join(30)
        samples.append([_rss_bytes(g.process.pid) for g in gateways])
    finally:
        stop.set()
        proxy.stop()
    assert result.returncode == 0, result.stderr
    print(result.stdout)
    mib = [[round(b / 2**20, 1) for b in row] for row in samples]
    print("RSS per gateway worker (MiB), every", SOAK_SECONDS // 12, "s:", mib)
    assert "Non-2xx" not in result.stdout and "Socket errors" not in result.stdout, result.stdout
    statuses = Counter(line["status"] for line in proxy.access_log())
    print("soak answers by status:", dict(statuses))
    assert set(statuses) <= {"200", "206"}, statuses
    assert statuses["206"] > 0 and statuses["200"] > 0
    # flat: after the first quarter (caches filled), no worker grows by more than 10 % + 8 MiB
    warm = samples[len(samples) // 4]
    for before, after in zip(warm, samples[-1]):
        assert after <= before * 1.10 + 8 * 2**20, mib
