"""Real gateway servers on loopback ports, started as ``python -m gateway serve`` from the checkout."""

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from .forkserver import ForkedProcess, fork_server, forkable
from .processes import free_port, wait_until_answering

TEST_SERVER_ENV = "GATEWAY_TEST_SERVER"  # uvicorn (default) or granian: the HTTP server of every test gateway


@dataclass
class Server:
    url: str
    process: "subprocess.Popen[bytes] | ForkedProcess"
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text()

    def access_lines(self) -> list[dict[str, Any]]:
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


def start_server(root: Path, log_dir: Path, **settings: object) -> Server:
    """A gateway over ``root`` with ``settings`` as command-line flags, once it answers: a fork of the fork
    server where the imports of a fresh interpreter would not differ (:mod:`.forkserver`), else one."""
    port = free_port()
    args = ["serve", "--root", str(root), "--port", str(port)]
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
    process: subprocess.Popen[bytes] | ForkedProcess
    if forkable(settings, env):
        process = fork_server().start(["gateway", *args], env, log_path)
    else:
        with open(log_path, "wb") as log_file:  # the child keeps its own copy of the descriptor
            process = subprocess.Popen(
                [sys.executable, "-m", "gateway", *args], stdout=log_file, stderr=subprocess.STDOUT, env=env
            )
    url = f"http://127.0.0.1:{port}"
    # /healthz, not /: the landing page loads every dataset, which a test may want to see loaded first itself
    wait_until_answering(url + "/healthz", process, 30, lambda: f"gateway: {log_path.read_text()}", interval=0.1)
    return Server(url, process, log_path)


def assert_reason(response: requests.Response, status: int, *words: str) -> str:
    """A JSON error of ``status`` whose message names every word and is not the internal-error catch-all."""
    assert response.status_code == status, (response.url, response.status_code, response.text[:400])
    message: str = response.json()["error"]
    assert "internal error" not in message, message
    for word in words:
        assert word in message, (word, message)
    return message


def assert_no_unexpected_errors(server: Server) -> None:
    """Nothing fell through to the catch-all: no 'unexpected error' and no traceback in the log."""
    log = server.log()
    assert "unexpected error" not in log and "Traceback" not in log, log[-3000:]


def assert_healed(answers: dict[str, requests.Response], good: dict[str, requests.Response], when: str) -> None:
    """Every answer after a storage fault ended is a 200 with the bytes and ETag of the answer before it."""
    for name, response in answers.items():
        assert response.status_code == 200, f"{name} after {when}: {response.status_code} {response.text[:200]}"
        assert response.content == good[name].content, f"{name} after {when}"
        assert response.headers["etag"] == good[name].headers["etag"], f"{name} after {when}"
