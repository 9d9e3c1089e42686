"""The tests' gateways are forks of one process that imported the gateway (``support/forkserver.py``): a fork
must behave as ``python -m gateway serve`` in a fresh interpreter does, and starts whose imports would differ
must get a fresh interpreter."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from support.datasets import ORG, TOKEN, WrittenDataset
from support.forkserver import ForkedProcess, forkable
from support.processes import free_port, wait_until_answering
from support.servers import start_server

CHUNK = f"/data/zarr3/{ORG}/wk_dataset/color_u8/1/c/0/0/0/0"


def _settings_line(log: str) -> dict[str, object]:
    """The start-up line that lists the settings, without the port."""
    line = next(line for line in log.splitlines() if "settings: " in line)
    settings: dict[str, object] = json.loads(json.loads(line)["message"].removeprefix("settings: "))
    settings.pop("port")
    return settings


def test_a_forked_gateway_starts_serves_and_stops_as_a_fresh_interpreter_does(
    test_data: WrittenDataset, tokens_file: Path, tmp_path: Path
) -> None:
    forked = start_server(test_data.root, tmp_path, tokens_file=tokens_file, cache_bytes=12345)
    assert isinstance(forked.process, ForkedProcess)
    port = free_port()
    fresh_log = tmp_path / "fresh.log"
    command = ["-m", "gateway", "serve", "--root", str(test_data.root), "--port", str(port), "--workers", "1"]
    command += ["--tokens-file", str(tokens_file), "--cache-bytes", "12345", "--settle-seconds", "0"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZARR_GATEWAY_")}
    with open(fresh_log, "wb") as log:
        fresh = subprocess.Popen([sys.executable, *command], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until_answering(f"http://127.0.0.1:{port}/healthz", fresh, 30, fresh_log.read_text)
        assert _settings_line(forked.log()) == _settings_line(fresh_log.read_text())
        for path in (CHUNK, f"/data/zarr3/{ORG}/wk_dataset/color_u8/1/zarr.json", "/nope"):
            ours, theirs = (
                requests.get(url + path, headers={"X-Auth-Token": TOKEN}, timeout=30)
                for url in (forked.url, f"http://127.0.0.1:{port}")
            )
            assert (ours.status_code, ours.content) == (theirs.status_code, theirs.content), path
        assert requests.get(forked.url + CHUNK, timeout=30).status_code == 401  # its tokens file holds
    finally:
        for process in (forked.process, fresh):
            process.send_signal(signal.SIGTERM)
    assert forked.process.wait(15) == fresh.wait(15)
    assert forked.process.poll() == fresh.returncode  # and stays so
    assert "Traceback" not in forked.log()
    forked.process.kill()  # a stopped gateway is not signalled: its pid may be another process's by now


def test_a_forked_gateway_that_cannot_start_says_why_and_exits_with_the_status_of_a_fresh_one(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "no-such-root"
    with pytest.raises(Exception, match="exited while starting") as raised:
        start_server(missing, tmp_path)
    assert "no-such-root" in str(raised.value)
    fresh = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--root", str(missing), "--port", str(free_port())],
        capture_output=True,
        timeout=60,
    )
    forked_log = next(tmp_path.glob("gateway-*.log")).read_text()
    assert fresh.returncode != 0 and forked_log.strip().splitlines()[-1] in fresh.stderr.decode()


@pytest.mark.parametrize(
    "settings",
    [{"workers": 2}, {"server": "granian"}, {"metrics_dir": "/tmp/m"}, {"settings_file": "/tmp/s.toml"}],
    ids=["workers", "granian", "metrics_dir", "settings_file"],
)
def test_starts_whose_imports_would_differ_take_a_fresh_interpreter(settings: dict[str, object]) -> None:
    assert forkable({"workers": 1}, os.environ)
    assert not forkable({"workers": 1, **settings}, os.environ)
    assert not forkable({"workers": 1}, {**os.environ, "PROMETHEUS_MULTIPROC_DIR": "/tmp/m"})
    assert not forkable({"workers": 1}, {**os.environ, "PYTHONWARNINGS": "error"})


def test_a_variable_a_test_set_for_its_gateway_is_not_taken_for_the_fork_server_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A test that sets PYTHONPATH for its gateway (monkeypatch) gets a fresh interpreter that sees it."""
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    assert not forkable({"workers": 1}, os.environ)
