"""``/healthz`` polled beside a test's own requests: whether the event loop kept answering, and how fast."""

import threading
import time

import requests

from .servers import Server

POLL_SECONDS = 0.02


class HealthPoller:
    """Polls /healthz every ``interval`` seconds on its own connection (while the ``with`` block runs) and keeps
    each answer's latency and every failure."""

    def __init__(self, server: Server, interval: float = POLL_SECONDS) -> None:
        self.url = server.url + "/healthz"
        self.interval = interval
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with requests.Session() as session:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    answer = session.get(self.url, timeout=30)
                    if answer.status_code != 200:
                        self.failures.append(f"{answer.status_code} {answer.text[:200]}")
                except requests.RequestException as exc:
                    self.failures.append(repr(exc))
                self.latencies.append(time.perf_counter() - started)
                self._stop.wait(self.interval)

    def __enter__(self) -> "HealthPoller":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
