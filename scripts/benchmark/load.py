"""The load generator: wrk on loopback walking a request list (walk.lua), and what its runs sum to."""

from __future__ import annotations

import json
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


def wrk_round(
    target: Server, paths: Path, seconds: int, token: str | None, serving: Sequence[Server]
) -> dict[str, Any]:
    """One measured wrk run against ``target``, with the CPU time of every process in ``serving`` over it."""
    cpu = sum(server.cpu_seconds() for server in serving)
    stats = run_wrk(target.url, paths, seconds, token)
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
