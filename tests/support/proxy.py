"""deploy/nginx.conf run by a real nginx in front of test gateways: what test_deploy and test_failover share."""

import functools
import json
import re
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from deploy.render import compose_defaults, write_proxy_config

from .processes import free_port, stop_process, wait_until_answering
from .servers import Server

# Where the compose file keeps cached token checks: a tmpfs. The tests use a fresh directory there per proxy.
TMPFS = Path("/dev/shm")


def tool(name: str) -> str:
    """The path of a system tool the tests run for real (nginx, docker-compose); fails the test if missing."""
    path = shutil.which(name) or (f"/usr/sbin/{name}" if Path(f"/usr/sbin/{name}").exists() else None)
    if path is None:
        pytest.fail(f"{name} is missing: run scripts/install-system-packages (scripts/test does)")
    return path


@functools.cache
def nginx_version() -> tuple[int, ...]:
    """(major, minor) of the nginx the tests run: before 1.23 it reads only the first of repeated header lines."""
    banner = subprocess.run([tool("nginx"), "-v"], capture_output=True, text=True).stderr
    version = re.search(r"nginx/(\d+)\.(\d+)", banner)
    assert version, banner
    return tuple(map(int, version.groups()))


@dataclass
class Proxy:
    url: str
    process: "subprocess.Popen[bytes]"
    directory: Path
    auth_cache: Path

    def access_log(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (self.directory / "stdout.log").read_text().splitlines() if line]

    def logs(self) -> str:
        return "".join(p.read_text() for p in self.directory.glob("*.log"))

    def stop(self) -> None:
        stop_process(self.process, stop_signal=signal.SIGQUIT)  # nginx's graceful stop
        shutil.rmtree(self.auth_cache, ignore_errors=True)


def start_proxy(directory: Path, upstreams: list[str], **overrides: str) -> Proxy:
    """nginx with the template rendered from the compose defaults, but for ``overrides``."""
    port = free_port()
    values = compose_defaults()
    values.pop("NGINX_ENVSUBST_FILTER")
    values.pop("NGINX_ENTRYPOINT_QUIET_LOGS")
    auth_cache = Path(tempfile.mkdtemp(prefix="zarr-gateway-auth-", dir=TMPFS))
    values.update(
        PROXY_LISTEN=f"127.0.0.1:{port}",
        PROXY_UPSTREAM_SERVERS=" ".join(f"server {address};" for address in upstreams),
        PROXY_AUTH_CACHE_DIR=str(auth_cache),
        PROXY_ANSWER_CACHE_DIR=str(directory / "answer-cache"),
        **overrides,
    )
    unset = write_proxy_config(directory, values)
    assert not unset, f"{unset}: names of the templates that docker-compose.yml does not set"
    command = [tool("nginx"), "-c", str(directory / "nginx.conf"), "-p", str(directory)]
    check = subprocess.run([*command, "-t"], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    with open(directory / "stdout.log", "wb") as stdout, open(directory / "stderr.log", "wb") as stderr:
        process = subprocess.Popen(command, stdout=stdout, stderr=stderr)
    proxy = Proxy(f"http://127.0.0.1:{port}", process, directory, auth_cache)
    try:
        wait_until_answering(proxy.url + "/healthz", process, 15, lambda: f"nginx: {proxy.logs()}")
    except BaseException:
        shutil.rmtree(auth_cache, ignore_errors=True)
        raise
    return proxy


def address(server: Server) -> str:
    """``host:port`` of a gateway, as an nginx upstream names it."""
    return server.url.removeprefix("http://")
