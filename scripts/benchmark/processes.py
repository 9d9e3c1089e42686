"""The servers the benchmark starts (each in its own process group) and a keep-alive client for checks."""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from .config import GATEWAYS, REPO, SCRIPTS, UNCHECKED, WITH_TOKENS, log


class Client:
    """Keep-alive HTTP/1.1 GETs to one loopback server, one connection per thread."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.local = threading.local()
        self.lock = threading.Lock()
        self.connections: set[http.client.HTTPConnection] = set()  # every thread's, so that close() reaches them

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
        for attempt in range(2):
            connection = getattr(self.local, "connection", None)
            if connection is None:
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
                self.local.connection = connection
                with self.lock:
                    self.connections.add(connection)
            try:
                connection.request("GET", path, headers=headers or {})
                response = connection.getresponse()
                body = response.read()
                return response.status, body, {k.lower(): v for k, v in response.getheaders()}
            except (OSError, http.client.HTTPException):
                connection.close()
                self.local.connection = None
                with self.lock:
                    self.connections.discard(connection)
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close the connections of every thread (those of finished threads stay open until garbage collection,
        and a server stopping gracefully waits for its idle keep-alive connections: Granian up to its timeout)."""
        with self.lock:
            for connection in self.connections:
                connection.close()
            self.connections.clear()

    def get_ok(self, path: str, headers: dict[str, str] | None = None) -> bytes:
        status, body, _ = self.get(path, headers)
        if status not in (200, 206):
            raise RuntimeError(f"GET {path} {headers or ''}: HTTP {status}: {body[:300]!r}")
        return body


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"resource_tracker" not in cmdline:
            found.append(int(entry))
    return sorted(found)


def status_kib(pid: int, name: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class Server:
    """A server we started, in a process group of its own (what is left of the group when it stops is killed)."""

    def __init__(
        self, name: str, args: list[str], port: int, log_path: Path, env: dict[str, str], scratch: Path | None = None
    ) -> None:
        self.name = name
        self.port = port
        self.log_path = log_path
        self.scratch = scratch  # a directory of the server's own, removed when it stops
        self.log_file = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            args, stdout=self.log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.client = Client(port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, size: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-size:].decode(errors="replace")
        except OSError:
            return ""

    def wait_ready(self, path: str, workers: int, headers: dict[str, str] | None = None, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not answer {path} within {timeout:.0f} s:\n{self.log_tail()}")
            try:
                status, _, _ = self.client.get(path, headers)
                if status in (200, 206) and (workers <= 1 or len(self.workers()) >= workers):
                    break
            except OSError:
                pass
            time.sleep(0.1)
        for _ in range(8 * workers):  # every worker answers (connections land on workers in turn)
            fresh = Client(self.port)
            fresh.get(path, headers)
            fresh.close()

    def workers(self) -> list[int]:
        return _children(self.process.pid) or [self.process.pid]

    def cpu_seconds(self) -> float:
        """User + system CPU time so far of the server and its worker processes."""
        total = 0
        for pid in {self.process.pid, *_children(self.process.pid)}:
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")

    def wait_until_idle(self, timeout: float = 120.0, interval: float = 0.5) -> bool:
        """Wait until the server spends under a tenth of ``interval`` on CPU in one ``interval`` (False: not
        within ``timeout``): a server that goes on computing answers whose client hung up (a dask-backed peer
        does) would otherwise meet the next load with a backlog."""
        deadline = time.monotonic() + timeout
        before = self.cpu_seconds()
        while time.monotonic() < deadline:
            time.sleep(interval)
            now = self.cpu_seconds()
            if now - before < interval / 10:
                return True
            before = now
        return False

    def peak_rss_mb(self) -> float | None:
        """The largest VmHWM (peak resident set) among the worker processes."""
        values = [v for v in (status_kib(pid, "VmHWM") for pid in self.workers()) if v is not None]
        return max(values) / 1024 if values else None

    def rss_mb(self) -> list[float]:
        values = [status_kib(pid, "VmRSS") for pid in self.workers()]
        return [v / 1024 for v in values if v is not None]

    def terminate(self) -> None:
        """Ask the server to stop (SIGTERM to the process we started, which stops its workers, as a container
        runtime does), without waiting, once our connections to it are closed. SIGTERM to the whole group
        reaches a Granian worker twice (from us and from its supervisor), and its stop then hung, now and
        then, until the supervisor's kill timeout."""
        self.client.close()
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        with contextlib.suppress(ProcessLookupError):  # whatever of the group is left
            os.killpg(self.process.pid, signal.SIGKILL)
        self.log_file.close()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


def stop_all(servers: Iterable[Server]) -> None:
    """Stop servers side by side: each is asked first, then each is waited for."""
    servers = list(servers)
    started = time.monotonic()
    for server in servers:
        server.terminate()
    for server in servers:
        server.stop()
        if time.monotonic() - started > 5:
            log(f"stopping {server.name} took until {time.monotonic() - started:.1f} s")


@contextlib.contextmanager
def running(server: Server, ready_path: str, workers: int, headers: dict[str, str] | None = None) -> Iterator[Server]:
    try:
        server.wait_ready(ready_path, workers, headers)
        yield server
    except BaseException:
        server.stop()
        raise
    server.stop()
    server.log_path.unlink(missing_ok=True)


def clean_env() -> dict[str, str]:
    """The environment of a server: none of the gateway's settings or the benchmark's own variables."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("ZARR_GATEWAY_", "BENCH_"))}


def start_gateway(config: str, http: str, root: Path, workers: int, logs: Path, tokens_file: Path | None) -> Server:
    """The gateway in configuration ``config`` (GATEWAYS) on the HTTP server ``http``."""
    port = free_port()
    module = "benchmark.unchecked" if config in UNCHECKED else "gateway"
    args = [sys.executable, "-m", module, "serve", "--root", str(root), "--port", str(port)]
    args += ["--workers", str(workers), "--server", http, *GATEWAYS[config]]
    if config in WITH_TOKENS:
        if tokens_file is None:
            raise ValueError(f"the gateway configuration {config!r} needs a tokens file")
        args += ["--tokens-file", str(tokens_file)]
    env = clean_env()
    if config in UNCHECKED:  # benchmark.unchecked is found on the benchmark's own path
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SCRIPTS), os.environ.get("PYTHONPATH")]))
    return Server(f"gateway {config} on {http}", args, port, logs / f"gateway-{config}-{http}-{port}.log", env)


def start_python_app(
    kind: str, http: str, workers: int, logs: Path, env: dict[str, str], python: str = sys.executable
) -> Server:
    """One of the benchmark's own apps (see :mod:`benchmark.apps`) on the HTTP server ``http``, run by ``python``."""
    port = free_port()
    args = [python, "-m", "benchmark.apps", kind, "--server", http, "--port", str(port)]
    args += ["--workers", str(workers)]
    pythonpath = os.pathsep.join(filter(None, [str(SCRIPTS), str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**clean_env(), **env, "PYTHONPATH": pythonpath}
    return Server(f"{kind} on {http}", args, port, logs / f"{kind}-{http}-{port}.log", env)
