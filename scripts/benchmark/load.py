"""The load generator: wrk on loopback walking a request list (walk.lua), and what its runs sum to."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .config import CONNECTIONS, THREADS, Case, Result, log
from .processes import Server

WALK_SCRIPT = Path(__file__).resolve().parent / "walk.lua"
ERROR_KINDS = ("connect", "read", "write", "status", "timeout")


def wrk_binary() -> str | None:
    return shutil.which("wrk")


def run_wrk(url: str, paths: Path, seconds: int, token: str | None = None) -> dict[str, Any]:
    """One wrk run of ``seconds`` over the requests listed in ``paths``; wrk's summary as a dict."""
    binary = wrk_binary()
    if binary is None:
        raise RuntimeError("wrk is not installed (scripts/install-system-packages installs it)")
    args = [binary, f"-t{THREADS}", f"-c{CONNECTIONS}", f"-d{seconds}s", "--latency", "--timeout", "30s"]
    args += ["-s", str(WALK_SCRIPT), url, "--", str(paths), str(THREADS), token or ""]
    done = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 120)
    for line in done.stdout.splitlines():
        if line.startswith("BENCH_JSON "):
            stats: dict[str, Any] = json.loads(line.removeprefix("BENCH_JSON "))
            stats["errors"] = sum(stats[k] for k in ERROR_KINDS)
            return stats
    raise RuntimeError(f"wrk printed no summary (exit {done.returncode}): {done.stdout[-2000:]} {done.stderr[-2000:]}")


def h2load_binary() -> str | None:
    return shutil.which("h2load")


H2_CLIENTS = 2  # HTTP/2 connections, one per h2load process, like wrk's threads each on its own part of the list
H2_STREAMS = CONNECTIONS // H2_CLIENTS  # streams in flight per connection: as many requests at once as wrk has


def run_h2load(
    base: str, paths: Path, token: str | None, seconds: float = 0, once: bool = False, http1: bool = False
) -> dict[str, Any]:
    """Load from h2load (HTTP/2 over TLS unless ``http1``) over the requests of ``paths``, in wrk's summary form
    (latencies from h2load's request log).

    For ``seconds``: two processes of one connection and ``H2_STREAMS`` streams, each walking the list from
    its own starting point, as wrk's threads do. ``once``: one connection walks the list once, in order.
    """
    binary = h2load_binary()
    if binary is None:
        raise RuntimeError("h2load is not installed (nghttp2-client: scripts/install-system-packages installs it)")
    lines = [line.split("\t", 1)[0] for line in paths.read_text().splitlines()]
    started = []
    for client in range(1 if once else H2_CLIENTS):
        offset = client * len(lines) // H2_CLIENTS
        uris = paths.with_name(f"{paths.stem}-h2-{client}.txt")
        uris.write_text("\n".join(lines[offset:] + lines[:offset]) + "\n")
        log_file = uris.with_suffix(".log")
        args = [binary, "-B", base, "-i", str(uris), "-c", "1", "-t", "1", "-m", str(H2_STREAMS)]
        args += ["-n", str(len(lines))] if once else ["-D", f"{seconds}s"]
        args += ["--log-file", str(log_file), *(["-H", f"X-Auth-Token: {token}"] if token else [])]
        args += ["--h1"] if http1 else []
        started.append((subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), log_file))
    stats: dict[str, Any] = {"requests": 0, "bytes": 0, "duration_us": 0, **dict.fromkeys(ERROR_KINDS, 0)}
    latencies: list[int] = []
    for process, log_file in started:
        out, _ = process.communicate(timeout=seconds + 300)
        stats = _add_h2load(stats, out, process.returncode)
        latencies += [int(line.split("\t")[2]) for line in log_file.read_text().splitlines() if line.count("\t") == 2]
    percentiles = np.percentile(latencies, [50, 90, 99]) if latencies else [0, 0, 0]
    stats.update({f"p{q}_us": int(v) for q, v in zip((50, 90, 99), percentiles)}, max_us=max(latencies, default=0))
    stats["errors"] = sum(stats[k] for k in ERROR_KINDS)
    return stats


def _add_h2load(stats: dict[str, Any], out: str, code: int) -> dict[str, Any]:
    """One h2load run's summary (its standard output) added to ``stats``.

    Failures are answers other than 2xx, timeouts, and streams that broke off beyond those in flight when
    the duration ended (h2load resets those, and counts some of them as errored)."""
    finished = re.search(r"finished in ([\d.]+)(ms|s),", out)
    requests = re.search(
        r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, "
        r"(\d+) timeout",
        out,
    )
    traffic = re.search(r"traffic: \S+ \((\d+)\) total", out)
    statuses = re.search(r"status codes: \d+ 2xx, \d+ 3xx, (\d+) 4xx, (\d+) 5xx", out)
    if code != 0 or not (finished and requests and traffic and statuses):
        raise RuntimeError(f"h2load printed no summary (exit {code}): {out[-2000:]}")
    seconds = float(finished.group(1)) / (1000 if finished.group(2) == "ms" else 1)
    done, _succeeded, _failed, errored, timeout = (int(v) for v in requests.groups())
    stats["requests"] += done
    stats["bytes"] += int(traffic.group(1))
    stats["duration_us"] = max(stats["duration_us"], int(seconds * 1e6))
    stats["status"] += sum(int(v) for v in statuses.groups())
    stats["read"] += max(0, errored - H2_STREAMS)
    stats["timeout"] += timeout
    return stats


def load_round(
    target: Server, paths: Path, seconds: int, token: str | None, serving: Sequence[Server], base: str | None = None
) -> dict[str, Any]:
    """One measured run against ``target`` (wrk; h2load over HTTP/2 at ``base`` if given), with the CPU time of
    every process in ``serving`` over it."""
    cpu = sum(server.cpu_seconds() for server in serving)
    stats = run_wrk(target.url, paths, seconds, token) if base is None else run_h2load(base, paths, token, seconds)
    stats["cpu_s"] = sum(server.cpu_seconds() for server in serving) - cpu
    return stats


def summarize(case: Case, rounds: list[dict[str, Any]], rss_of: Server | None) -> Result:
    """Medians over the rounds of one case (throughput and latency), totals for CPU and errors."""
    result = Result(case.name, case.keyset, case.server, note=case.note)
    seconds = [r["duration_us"] / 1e6 for r in rounds]
    result.requests = sum(r["requests"] for r in rounds)
    result.seconds = round(sum(seconds), 2)
    result.req_s = float(np.median([r["requests"] / t for r, t in zip(rounds, seconds)]))
    result.mb_s = float(np.median([r["bytes"] / t / 1e6 for r, t in zip(rounds, seconds)]))
    result.p50_ms = float(np.median([r["p50_us"] for r in rounds])) / 1000
    result.p99_ms = float(np.median([r["p99_us"] for r in rounds])) / 1000
    result.rounds = [round(r["requests"] / t) for r, t in zip(rounds, seconds)]
    result.cpu_us = sum(r["cpu_s"] for r in rounds) / max(result.requests, 1) * 1e6
    if rss_of is not None:
        result.rss_mb = rss_of.peak_rss_mb()
    errors: Counter[str] = Counter()
    for r in rounds:
        errors.update({k: r[k] for k in ERROR_KINDS if r[k]})
    if errors:
        result.error = f"{sum(errors.values())} failed requests of {result.requests}: {dict(errors)}"
    log(
        f"{case.name} [{case.keyset}]: {result.req_s:,.0f} req/s (rounds {result.rounds}), {result.mb_s:,.1f} MB/s, "
        f"p50 {result.p50_ms:.2f} ms, p99 {result.p99_ms:.2f} ms, server CPU {result.cpu_us:.0f} µs/request"
        + (f", peak RSS/worker {result.rss_mb:.0f} MB" if result.rss_mb else "")
        + (f" -- {result.error}" if result.error else "")
    )
    return result
