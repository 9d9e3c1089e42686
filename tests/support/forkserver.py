"""Test gateways forked from one process that has imported the gateway already.

Every ``python -m gateway serve`` spends about a CPU-second importing numpy, pydantic, starlette and the
gateway's own modules before it listens, and the suite starts hundreds of gateways on two cores. This
process (one per pytest process, started on first use) imports them once; each gateway is a fork of it
that runs the same entry point as ``python -m gateway`` (``runpy``) with its own arguments, environment,
working directory, log file, port and signals. What a test sees is a process of its own on a loopback port.

Only starts whose imports would differ take a fresh interpreter (:func:`forkable`): several workers or a
metrics directory (prometheus_client picks its multiprocess values when it is imported), a settings file
(which may ask for either), another HTTP server, or Python or prometheus variables unlike this process's.

Run as a script, it reads one JSON request a line on standard input and answers one JSON line:
``{"start": {"argv", "env", "cwd", "log"}}`` answers ``{"pid"}``; ``{"poll": pid}`` answers
``{"returncode"}`` (``None`` while it runs; a negative signal number if a signal ended it, as ``Popen``).
"""

import json
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

PREIMPORTED = (  # what ``gateway serve`` with uvicorn imports before it answers
    "gateway.cli",
    "gateway.startup",
    "gateway.serving",
    "gateway.http.app",
    "uvicorn.main",
    "uvicorn.server",
    "uvicorn.lifespan.on",
    "uvicorn.loops.uvloop",
    "uvicorn.protocols.http.httptools_impl",
)


# The fork server's environment: this pytest process's as it started, before a test changed it (monkeypatch)
STARTING_ENV = dict(os.environ)


def _inherited_by_import(env: Mapping[str, str]) -> dict[str, str]:
    """The variables that change what an import does, which a fork cannot take back."""
    return {k: v for k, v in env.items() if k.startswith(("PYTHON", "PROMETHEUS", "prometheus", "OPENBLAS"))}


def forkable(settings: Mapping[str, object], env: Mapping[str, str]) -> bool:
    """Whether a gateway with these command-line ``settings`` and ``env`` may be a fork of the fork server."""
    single = str(settings.get("workers", 1)) == "1" and settings.get("server", "uvicorn") == "uvicorn"
    imports_alike = _inherited_by_import(env) == _inherited_by_import(STARTING_ENV)
    return single and imports_alike and "settings_file" not in settings and "metrics_dir" not in settings


class ForkedProcess:
    """A gateway forked by the fork server, with the part of ``subprocess.Popen`` the tests use."""

    def __init__(self, server: "_ForkServer", pid: int) -> None:
        self._server = server
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.ask({"poll": self.pid})["returncode"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (returncode := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"gateway {self.pid}", timeout or 0)
            time.sleep(0.02)
        return returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never a signal to a pid that may be someone else's now
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _ForkServer:
    """The client's end: one fork server process, asked by one thread at a time."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=Path(__file__).parent,
            env=STARTING_ENV,
        )
        self._lock = threading.Lock()
        self.ask({"poll": 0})  # once its imports are done: a start's wait for its port counts only its own

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self._process.stdin is not None and self._process.stdout is not None
        with self._lock:
            self._process.stdin.write(json.dumps(request).encode() + b"\n")
            self._process.stdin.flush()
            line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"the gateways' fork server exited ({self._process.poll()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def start(self, argv: list[str], env: Mapping[str, str], log_path: Path) -> ForkedProcess:
        request = {"argv": argv, "env": dict(env), "cwd": os.getcwd(), "log": str(log_path)}
        return ForkedProcess(self, self.ask({"start": request})["pid"])


@cache
def fork_server() -> _ForkServer:
    """This pytest process's fork server, started on first use; it ends when this process closes its input."""
    return _ForkServer()


def _serve() -> dict[str, Any] | None:
    """Answer requests until the input ends (returns ``None``); in a forked child, return its start request."""
    exit_codes: dict[int, int | None] = {}
    answers = sys.stdout.buffer
    for line in sys.stdin.buffer:
        request = json.loads(line)
        if "start" in request:
            pid = os.fork()
            if pid == 0:
                start: dict[str, Any] = request["start"]
                return start
            exit_codes[pid] = None
            answer: dict[str, Any] = {"pid": pid}
        else:
            pid = request["poll"]
            if exit_codes.get(pid, 0) is None:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    exit_codes[pid] = os.waitstatus_to_exitcode(status)
            answer = {"returncode": exit_codes.get(pid)}
        answers.write(json.dumps(answer).encode() + b"\n")
        answers.flush()
    return None


def _become_gateway(start: dict[str, Any]) -> None:
    """In the forked child: the standard streams, directory and environment of the start, then the entry point."""
    log = os.open(start["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.chdir(start["cwd"])
    os.environ.clear()
    os.environ.update(start["env"])
    sys.argv = list(start["argv"])
    sys.path[0] = os.getcwd()  # as ``python -m`` has it
    runpy.run_module("gateway", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    import importlib

    for name in PREIMPORTED:
        importlib.import_module(name)
    child_start = _serve()
    if child_start is not None:
        _become_gateway(child_start)
