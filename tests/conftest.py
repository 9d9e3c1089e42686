"""Shared fixtures: the session's datasets and real gateway servers, and the modules' order (longest first).
Everything else lives in ``support``."""

import fcntl
import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests
from support.browser import INSTALL_HINT, Browser, chromium_path
from support.datasets import ORG, OTHER_TOKEN, TOKEN, WrittenDataset, write_test_root
from support.ordering import longest_first
from support.processes import free_port
from support.servers import Server, start_server
from support.zarr_datasets import build_zarr_root

from gateway.sample import make_sample


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest modules first, so that pytest-xdist does not start one of minutes last."""
    longest_first(items)


@pytest.fixture(scope="module", autouse=True)
def environment_as_found() -> Iterator[None]:
    """Each module leaves the process's environment as it found it. dask.distributed's nannies set
    OPENBLAS_NUM_THREADS and others in the process that starts them and never unset them; every later
    module's gateways then had imports unlike the fork server's, and were fresh interpreters again."""
    saved = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_")}
    yield
    for name in [name for name in os.environ if name not in saved and not name.startswith("PYTEST_")]:
        del os.environ[name]
    os.environ.update(saved)


@pytest.fixture(scope="session")
def test_data(tmp_path_factory: pytest.TempPathFactory) -> WrittenDataset:
    return write_test_root(tmp_path_factory.mktemp("root"))


@pytest.fixture(scope="session")
def pristine_sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample dataset written once per run (about 10 s of CPU), by whichever xdist worker asks first."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # workers' temps share a parent
    root, complete = shared / "pristine-sample", shared / "pristine-sample.complete"
    with open(shared / "pristine-sample.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other workers wait for the first one's sample
        if not complete.exists():
            shutil.rmtree(root, ignore_errors=True)
            make_sample(root, progress=False)
            complete.touch()
    return root


@pytest.fixture(scope="module")
def sample_root(pristine_sample: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample dataset that ``scripts/serve-sample`` serves: a copy for each module that asks, which it
    may change (indexes, rewritten files) without another module seeing it."""
    root = tmp_path_factory.mktemp("sample")
    shutil.copytree(pristine_sample, root, dirs_exist_ok=True)
    return root


@pytest.fixture(scope="session")
def zarr_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Zarr datasets written by webknossos-libs and zarr-python (read-only: served locally and from S3)."""
    root = tmp_path_factory.mktemp("zarr_root")
    build_zarr_root(root)
    return root


def _servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Server]]:
    """A factory of gateways, each stopped when the factory's scope ends."""
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


@pytest.fixture(scope="module")
def server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Server]]:
    """Gateways that a module starts, stopped when it ends: an idle gateway still wakes 60 times a second
    (its loop-lag probe, uvicorn's tick), and a run's hundreds of them, left until the session ended, took
    a whole core of the two."""
    yield from _servers(tmp_path_factory)


@pytest.fixture(scope="session")
def session_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Server]]:
    """The few gateways that many modules share (``gateway``, ``sharded_gateway``)."""
    yield from _servers(tmp_path_factory)


@pytest.fixture(scope="session")
def tokens_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("auth") / "tokens.json"
    path.write_text(json.dumps({"tokens": {TOKEN: [f"{ORG}/*"], OTHER_TOKEN: ["other_org/*"]}}))
    return path


@pytest.fixture(scope="session")
def gateway(test_data: WrittenDataset, tokens_file: Path, session_servers: Callable[..., Server]) -> Server:
    """The default server: tokens required, v3 plain layout."""
    return session_servers(test_data.root, tokens_file=tokens_file)


@pytest.fixture(scope="session")
def sharded_gateway(test_data: WrittenDataset, session_servers: Callable[..., Server]) -> Server:
    """An open server whose v3 tree is sharded."""
    return session_servers(test_data.root, v3_layout="sharded")


@pytest.fixture(scope="module")
def neuroglancer_url() -> Iterator[str]:
    """The Neuroglancer client, served by the package's own Python server on a loopback port."""
    import neuroglancer

    port = free_port()
    token = secrets.token_hex(8)
    neuroglancer.set_server_bind_address("127.0.0.1", port)
    viewer = neuroglancer.UnsynchronizedViewer(token=token)  # the server only holds a weak reference to it
    url = f"http://127.0.0.1:{port}/v/{token}/"
    assert requests.get(url, timeout=30).status_code == 200
    yield url
    del viewer
    neuroglancer.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    if chromium_path() is None:
        pytest.fail(f"these tests drive a real browser: {INSTALL_HINT}")
    instance = Browser(tmp_path_factory.mktemp("chromium") / "profile")
    yield instance
    instance.close()
