"""``/healthz`` during the 64³ load over small files: whether liveness stays prompt while every chunk is made of (and
kept from) 512 files, the issue's case of per-file work on the event loop.

A fresh gateway as deployed (answers kept); wrk walks the 64³ chunks of the small-file layer with its usual
connections, from the first (cold) request on, while a thread asks ``/healthz`` every ``HEALTHZ_INTERVAL`` seconds on a
keep-alive connection of its own and times each answer. A probe that falls behind starts the next one at once (it
never queues). The probe's p50, p99 and max go to results.json (``extras.healthz``) and a line under the table.
"""

from __future__ import annotations

import http.client
import threading
import time
from typing import Any

import numpy as np

from .config import HEALTHZ_INTERVAL, HEALTHZ_P99_MS, REFERENCE_SERVER, SMALL_CONFIG, SMALL_LAYER, V2, log
from .keys import Request, write_paths
from .load import run_wrk
from .processes import running, start_gateway
from .run import Run


class Probe:
    """``/healthz`` every ``interval`` seconds from a thread, on one connection; the latency of each answer."""

    def __init__(self, port: int, interval: float) -> None:
        self.port = port
        self.interval = interval
        self.latencies: list[float] = []  # seconds, of each 200
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="healthz-probe", daemon=True)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        next_at = time.perf_counter()
        try:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    connection.request("GET", "/healthz")
                    response = connection.getresponse()
                    response.read()
                    ok = response.status == 200
                except (OSError, http.client.HTTPException):
                    connection.close()
                    ok = False
                if ok:
                    self.latencies.append(time.perf_counter() - started)
                else:
                    self.failures += 1
                next_at = max(next_at + self.interval, time.perf_counter())
                self._stop.wait(next_at - time.perf_counter())
        finally:
            connection.close()


def run_healthz(run: Run, sequence: list[Request], files: int) -> None:
    """The load and the probe beside it (see the module's docstring); the figures in ``run.extras["healthz"]``."""
    paths = write_paths(run.paths("small"), sequence)
    seconds = max(3, run.mode.duration)
    info: dict[str, Any] = {"config": SMALL_CONFIG, "files": files, "keys": len(sequence), "seconds": seconds}
    info["interval_ms"] = HEALTHZ_INTERVAL * 1000
    server = start_gateway(SMALL_CONFIG, REFERENCE_SERVER, run.root, run.workers, run.logs, None)
    try:
        with (
            running(server, f"{V2}/{SMALL_LAYER}/1/.zarray", run.workers) as gateway,
            Probe(gateway.port, HEALTHZ_INTERVAL) as probe,
        ):
            stats = run_wrk(gateway.url, paths, seconds)
        info["load_req_s"] = round(stats["requests"] / (stats["duration_us"] / 1e6), 1)
        info["load_errors"] = stats["errors"]
        latencies = np.array(probe.latencies) * 1000
        info["probes"] = len(latencies)
        info["probe_failures"] = probe.failures
        if len(latencies):
            info.update(
                {f"{name}_ms": round(float(np.percentile(latencies, q)), 2) for name, q in (("p50", 50), ("p99", 99))}
            )
            info["max_ms"] = round(float(latencies.max()), 2)
            info["met"] = info["p99_ms"] < HEALTHZ_P99_MS and not probe.failures
        log(
            f"/healthz during the 64³ load over {files:,} small files ({info['load_req_s']} req/s): "
            f"p50 {info.get('p50_ms')} ms, p99 {info.get('p99_ms')} ms, max {info.get('max_ms')} ms, "
            f"{probe.failures} failed of {len(latencies) + probe.failures}"
        )
    except Exception as exc:
        info["error"] = f"{type(exc).__name__}: {exc}"
        log(f"FAILED /healthz probe: {info['error']}")
    if info.get("error") or info.get("probe_failures") or info.get("load_errors"):
        run.failures.append(f"/healthz probe: {info.get('error') or info}")
    run.extras["healthz"] = info
