"""Where a worker's time goes: py-spy samples of one worker under load, summed per category and function."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from .config import REPO
from .load import run_wrk
from .processes import Server

RATE = 250  # py-spy samples per second


def profile_server(server: Server, paths: Path, seconds: int, raw: Path) -> dict[str, Any]:
    """Sample one worker with py-spy under the usual load: where its time goes, per request.

    wrk runs for two seconds more than the sampling, which starts a second into the load; the
    requests of the sampled window are the run's rate times its length, split evenly over the workers.
    """
    info: dict[str, Any] = {"seconds": seconds}
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not os.access(py_spy, os.X_OK):
        info["error"] = "py-spy is not installed (it is in the bench extra)"
        return info
    workers = server.workers()
    stats: dict[str, Any] = {}
    load = threading.Thread(target=lambda: stats.update(run_wrk(server.url, paths, seconds + 2)))
    load.start()
    time.sleep(1)
    command = [py_spy, "record", "--pid", str(workers[0]), "--duration", str(seconds), "--rate", str(RATE)]
    command += ["--format", "raw", "--output", str(raw), "--nonblocking"]
    sampled = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60)
    load.join()
    if sampled.returncode != 0 or not raw.exists() or not stats:
        info["error"] = f"py-spy failed: {(sampled.stderr or '').strip()[-500:]}"
        return info
    req_s = stats["requests"] / (stats["duration_us"] / 1e6)
    info.update(summarize_profile(raw, RATE, req_s * seconds / len(workers)))
    info["req_s_while_sampled"] = round(req_s)
    info["workers"] = len(workers)
    info["raw"] = raw.name
    return info


def resummarize(profile: dict[str, Any], directory: Path, workers: int) -> dict[str, Any]:
    """A stored profile summarized again from its raw stacks (after the categories changed), or as it was."""
    raw = directory / profile.get("raw", "")
    if "raw" not in profile or not raw.is_file():
        return profile
    requests = profile["req_s_while_sampled"] * profile["seconds"] / profile.get("workers", workers)
    return {**profile, **summarize_profile(raw, RATE, requests)}


# Where a sample's time goes: the first frame, from the leaf up, that matches one of these.
PROFILE_CATEGORIES = [
    # The gateway's writes leave in _HeadWithBody.release (one writelines per answer, see gateway/serving.py).
    (
        "socket writes (uvicorn send -> transport.write; with waits for a CPU)",
        ("RequestResponseCycle.send (uvicorn/", "_HeadWithBody.release (gateway/serving.py)"),
    ),
    ("logging", ("logging/", "gateway/logs.py")),
    ("metrics", ("prometheus_client/", "gateway/metrics.py")),
    ("storage and WKW reads (stat, open, pread, LZ4)", ("gateway_storage/", "wkw_adapter/", "lz4", "cramjam")),
    ("encoding (blosc, zstd)", ("gateway/zarr/codecs.py", "blosc2/", "numcodecs/")),
    ("chunk and shard production", ("gateway/zarr/",)),
    ("dataset and source lookup", ("gateway/sources/",)),
    ("gateway HTTP layer (dispatch, auth, validators, ranges)", ("gateway/",)),
    ("thread-pool hand-off (anyio, threading)", ("anyio/", "threading.py", "concurrent/", "queue.py")),
    ("HTTP parsing (httptools)", ("HttpToolsProtocol.data_received", "HttpToolsProtocol.on_")),
    ("Granian's Python side (ASGI glue, task scheduling)", ("granian/",)),
]
FRAMEWORK = "server, starlette, asyncio, other"
# Frames every sample of a worker has in common: left out of the inclusive table.
_ENTRY_FRAMES = (
    *("multiprocessing/", "asyncio/runners.py", "uvicorn/_compat.py", "uvicorn/server.py"),
    *("uvicorn/_subprocess.py", "uvicorn/supervisors/", "<module>", "threading.py", "granian/server/"),
)


def summarize_profile(raw: Path, rate: int, requests: float) -> dict[str, Any]:
    """Inclusive and self time per function, and time per category, from py-spy's collapsed stacks."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    categories: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_frame_name(f) for f in stack.split(";")]
        total += count
        for name in set(frames):
            if not any(m in name for m in _ENTRY_FRAMES):
                inclusive[name] += count
        own[frames[-1]] += count
        for frame in reversed(frames):
            label = next((label for label, marks in PROFILE_CATEGORIES if any(m in frame for m in marks)), None)
            if label is not None:
                categories[label] += count
                break
        else:
            categories[FRAMEWORK] += count
    per_request_us = total / rate / max(requests, 1) * 1e6

    def table(counter: Counter[str], key: str, limit: int = 18) -> list[dict[str, Any]]:
        return [
            {key: name, "percent": round(100 * n / total, 1), "us_per_request": round(per_request_us * n / total)}
            for name, n in counter.most_common(limit)
        ]

    return {
        "samples": total,
        "cpu_us_per_request": round(per_request_us),
        "categories": table(categories, "category", 20),
        "inclusive": table(inclusive, "function"),
        "self": table(own, "function"),
    }


def _frame_name(frame: str) -> str:
    """``func (path/to/file.py:123)`` -> ``func (package/file.py)``."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", "/lib/python3", str(REPO) + "/"):
        if marker in where:
            where = where.split(marker, 1)[1]
    return f"{name} ({where})" if where else name
