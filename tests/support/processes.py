"""Child processes and loopback ports: what every real server of the tests (gateway, nginx, moto) needs."""

import os
import secrets
import signal
import socket
import subprocess
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

import requests

T = TypeVar("T")


class ChildProcess(Protocol):
    """What the tests do with a server's process: a ``subprocess.Popen`` or a forked gateway."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...


def _ephemeral_ports_start() -> int:
    """The first port of the kernel's range for outgoing connections (32768 unless configured otherwise)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# The ports free_port handed out lately in this process: a caller may take several before it binds any.
_RECENT_PORTS: deque[int] = deque(maxlen=256)
LOWEST_TEST_PORT = 10000


def _port_share(below: int) -> range:
    """This process's share of the test ports: pytest-xdist's workers draw from disjoint slices.

    Drawn from one range, two workers that each start a server at the same moment once chose the same
    port; the loser met "Address already in use" while the other's server answered its readiness probe.
    """
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 0):
        return range(LOWEST_TEST_PORT, below)
    size = (below - LOWEST_TEST_PORT) // int(count)
    start = LOWEST_TEST_PORT + int(worker[2:]) % int(count) * size
    return range(start, start + size)


def free_port() -> int:
    """A loopback TCP port nobody listens on right now, from below the range of outgoing connections.

    Port 0 would give one of that range, which any outgoing connection may take before the server meant to
    have it binds it: the load tests open thousands, and a replica once met "Address already in use".
    """
    share = _port_share(_ephemeral_ports_start())
    while True:  # a share too small to draw from (an unusual range, or very many workers): the kernel's choice
        port = share[secrets.randbelow(len(share))] if len(share) >= 1000 else 0
        if port in _RECENT_PORTS:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            chosen: int = s.getsockname()[1]
            _RECENT_PORTS.append(chosen)
            return chosen


def stop_process(process: ChildProcess, timeout: float = 10, stop_signal: int = signal.SIGTERM) -> None:
    """Ask a process to stop with ``stop_signal``; kill it if it has not stopped ``timeout`` seconds later."""
    if process.poll() is not None:
        return
    process.send_signal(stop_signal)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def wait_until(condition: Callable[[], T], timeout: float = 5, interval: float = 0.05) -> T:
    """Call ``condition`` until it returns something truthy, for at most ``timeout`` seconds.

    Returns that value, or the last (falsy) one once the time is up, so the caller asserts on what it
    saw. A bound on waiting, never a timed assertion: a slow machine only waits longer.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


class StartError(RuntimeError):
    """A server process that exited, or did not answer, while it was starting."""


def wait_until_answering(
    url: str,
    process: ChildProcess,
    timeout: float,
    describe: Callable[[], str],
    interval: float = 0.05,
) -> None:
    """Poll ``url`` until anything answers; raise :class:`StartError` (with ``describe()``, its log) if the
    process exits first or nothing answers within ``timeout`` seconds, in which case the process is killed."""

    def answering() -> bool:
        if process.poll() is not None:
            raise StartError(f"exited while starting: {describe()}")
        try:
            requests.get(url, timeout=1)
        except requests.ConnectionError:
            return False
        return True

    if not wait_until(answering, timeout, interval):
        process.kill()
        process.wait(10)
        raise StartError(f"did not answer {url} within {timeout} s: {describe()}")


def receive_until_closed(connection: socket.socket, tolerated: tuple[type[OSError], ...] = ()) -> bytes:
    """Everything the peer sends until it closes the connection (or one of ``tolerated`` ends the reading)."""
    received = b""
    try:
        while chunk := connection.recv(65536):
            received += chunk
    except tolerated:
        pass
    return received


def raw_exchange(url: str, raw: bytes, timeout: float = 10, tolerated: tuple[type[OSError], ...] = ()) -> bytes:
    """Send ``raw`` on a fresh connection to ``url``'s host and port; everything answered until it is closed."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as connection:
        connection.sendall(raw)
        return receive_until_closed(connection, tolerated)
