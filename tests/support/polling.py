"""Latencies of a URL polled from a process of its own, so that they are the server's and not the test's.

A thread in the test process shares its interpreter lock with the threads that send the test's load: its
samples would mix the test's own stalls with the server's. The poller runs as ``python polling.py URL
INTERVAL``, polls on one kept-alive connection until a line arrives on its standard input, then prints
each latency and failure as JSON. This file imports nothing of the tests, so it runs as a script.
"""

import json
import select
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import requests


class Poller:
    """Polls ``url`` every ``interval`` seconds from a child process while the block runs."""

    def __init__(self, url: str, interval: float) -> None:
        self.url = url
        self.interval = interval
        self.latencies: list[float] = []
        self.failures: list[str] = []

    def __enter__(self) -> "Poller":
        command = [sys.executable, str(Path(__file__)), self.url, str(self.interval)]
        self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self._process.stdout is not None
        started = self._process.stdout.readline()  # the poller's first answer arrived
        assert started.strip() == "polling", started
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        out, _ = self._process.communicate("stop\n", timeout=60)
        result = json.loads(out)
        self.latencies, self.failures = result["latencies"], result["failures"]


def main(url: str, interval: float) -> None:
    latencies: list[float] = []
    failures: list[str] = []
    with requests.Session() as session:
        session.get(url, timeout=30)  # connected, and the server answering, before the load begins
        print("polling", flush=True)
        while not select.select([sys.stdin], [], [], interval)[0]:
            started = time.perf_counter()
            try:
                answer = session.get(url, timeout=30)
                if answer.status_code != 200:
                    failures.append(f"{answer.status_code} {answer.text[:200]}")
            except requests.RequestException as exc:
                failures.append(repr(exc))
            latencies.append(time.perf_counter() - started)
    print(json.dumps({"latencies": latencies, "failures": failures}))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
