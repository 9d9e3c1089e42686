"""The long runs on the reference server: peak RSS over a million requests, and tensorstore reading a whole mag."""

from __future__ import annotations

import json
import math
import shutil
import time
from typing import Any

import numpy as np

from gateway_storage import LocalStore
from gateway_storage.geometry import mag_name
from wkw_adapter import WkwFileCache, WkwMag

from .config import DATASET, ORG, READY, REFERENCE_SERVER, V2, V3, log
from .keys import Request, write_paths
from .load import run_wrk
from .processes import Server, running, start_gateway, status_kib
from .run import Run


def run_rss(run: Run, sequence: list[Request], files: int) -> None:
    """A long pass-through run over many small files; peak RSS per worker sampled along the way."""
    mode = run.mode
    paths = write_paths(run.paths("many"), sequence)
    server = start_gateway("main", REFERENCE_SERVER, run.root, run.workers, run.logs, None)
    info: dict[str, Any] = {"target_requests": mode.rss_requests, "files": files, "keys": len(sequence), "samples": []}
    try:
        with running(server, f"{V2}/many/1/.zarray", run.workers) as gw:
            info["start_rss_mb"] = gw.rss_mb()
            total = 0
            failed = 0
            started = time.monotonic()
            while total < mode.rss_requests and time.monotonic() - started < mode.rss_cap:
                stats = run_wrk(gw.url, paths, mode.rss_segment)
                total += stats["requests"]
                failed += stats["errors"]
                info["samples"].append(
                    {
                        "requests": total,
                        "seconds": round(time.monotonic() - started, 1),
                        "rss_mb": [round(v, 1) for v in gw.rss_mb()],
                    }
                )
                log(f"RSS run: {total:,} requests, worker RSS {info['samples'][-1]['rss_mb']} MB")
            info["requests"] = total
            info["failed"] = failed
            info["seconds"] = round(time.monotonic() - started, 1)
            info["peak_rss_mb"] = [round((status_kib(p, "VmHWM") or 0) / 1024, 1) for p in gw.workers()]
    except Exception as exc:
        info["error"] = str(exc)
        run.failures.append(f"RSS run: {exc}")
    if info.get("failed"):
        run.failures.append(f"RSS run: {info['failed']} failed requests")
    info["scaled_down"] = info.get("requests", 0) < 1_000_000 or files < 1000
    run.extras["rss"] = info


def tensorstore_read(run: Run) -> dict[str, Any]:
    """A whole mag read by tensorstore through the sharded tree (a fresh gateway), and from a local Zarr v3 copy."""
    info: dict[str, Any] = {"mag": mag_name(run.mode.ts_mag)}
    gw = start_gateway("main", REFERENCE_SERVER, run.root, run.workers, run.logs, None)
    try:
        gw.wait_ready(READY, run.workers)
        _tensorstore_read(run, gw, info)
        info["gateway_peak_rss_mb"] = gw.peak_rss_mb()
    except Exception as exc:
        info["error"] = f"{type(exc).__name__}: {exc}"
        run.failures.append(f"tensorstore read: {info['error']}")
        log(f"FAILED tensorstore read: {info['error']}")
    finally:
        gw.stop()
    return info


def _tensorstore_read(run: Run, gw: Server, info: dict[str, Any]) -> None:
    import tensorstore as ts

    mag = info["mag"]
    base_url = f"{gw.url}{V3}/color/{mag}/"
    meta = json.loads(gw.client.get_ok(f"{V3}/color/{mag}/zarr.json"))
    shape = meta["shape"]
    info["shape"] = shape
    info["bytes"] = math.prod(shape)
    truth = WkwMag(str(run.root / ORG / DATASET / "color" / mag), WkwFileCache(LocalStore())).read_region(
        (0, 0, 0), tuple(shape[1:])
    )
    requests_before = _http_requests(ts)

    def through_gateway() -> np.ndarray:
        spec = {"driver": "zarr3", "kvstore": {"driver": "http", "base_url": base_url}}
        return ts.open(spec, read=True, context=ts.Context()).result().read().result()

    local_path = run.work / "tensorstore-local"
    if local_path.exists():
        shutil.rmtree(local_path)
    local_meta = {k: v for k, v in meta.items() if k not in ("zarr_format", "node_type", "attributes")}
    local_spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(local_path) + "/"}}

    def from_disk() -> np.ndarray:
        return ts.open(local_spec, read=True, context=ts.Context()).result().read().result()

    timings: dict[str, list[float]] = {"gateway": [], "local": []}
    started = time.perf_counter()
    data = through_gateway()
    timings["gateway"].append(time.perf_counter() - started)
    if not np.array_equal(np.asarray(data)[0], truth[0]):
        raise RuntimeError("tensorstore read other voxels through the gateway than the WKW data holds")
    info["http_requests"] = _http_requests(ts) - requests_before
    created = ts.open({**local_spec, "metadata": local_meta}, create=True, delete_existing=True).result()
    created.write(truth[None] if truth.ndim == 3 else truth).result()
    info["local_disk_bytes"] = sum(p.stat().st_size for p in local_path.rglob("*") if p.is_file())
    for _ in range(2):
        started = time.perf_counter()
        local = from_disk()
        timings["local"].append(time.perf_counter() - started)
    if not np.array_equal(np.asarray(local), np.asarray(data)):
        raise RuntimeError("the local Zarr copy reads back other voxels")
    started = time.perf_counter()
    through_gateway()
    timings["gateway"].append(time.perf_counter() - started)
    info["gateway_s"] = round(min(timings["gateway"]), 3)
    info["local_s"] = round(min(timings["local"]), 3)
    info["runs"] = {k: [round(v, 3) for v in vs] for k, vs in timings.items()}
    info["ratio"] = info["gateway_s"] / info["local_s"]
    shutil.rmtree(local_path, ignore_errors=True)
    log(
        f"tensorstore full read of mag {mag} ({info['bytes'] / 2**20:.0f} MiB): gateway {info['gateway_s']} s "
        f"({info['http_requests']} requests), local {info['local_s']} s, ratio {info['ratio']:.2f}"
    )


def _http_requests(ts: Any) -> int:
    """HTTP requests tensorstore has made so far in this process (its own metrics)."""
    metrics = ts.experimental_collect_matching_metrics("/tensorstore/http/request_started")
    return sum(int(v.get("value", 0)) for m in metrics for v in m.get("values", []))
