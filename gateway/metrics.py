"""Prometheus metrics: requests by route and status, latency, bytes sent, cache lookups, storage errors.

With several uvicorn workers every worker writes its samples into ``PROMETHEUS_MULTIPROC_DIR`` (set by
``zarr-gateway serve`` before the workers start) and ``/metrics``, whichever worker answers it, adds up
the files of all of them. With one worker the process's own registry is served.

Labels are bounded: ``route`` is a kind of resource (chunk, metadata, listing, ...), never a path, so
neither dataset names nor anything from a query string ever reach a label.
"""

import os
from collections.abc import Callable, Mapping
from typing import Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
METADATA_NAMES = frozenset({".zarray", ".zgroup", ".zattrs", ".zmetadata", "zarr.json", "datasource-properties.json"})
OPERATIONS = frozenset({"healthz", "readyz", "metrics", "auth"})

REQUESTS = Counter(
    "zarr_gateway_requests", "HTTP requests answered, by route kind, method and status", ["route", "method", "status"]
)
LATENCY = Histogram(
    "zarr_gateway_request_duration_seconds",
    "Time from request to the last body byte handed to the server, by route kind",
    ["route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
BYTES = Counter("zarr_gateway_response_body_bytes", "Response body bytes sent, by route kind", ["route"])
IN_FLIGHT = Gauge("zarr_gateway_requests_in_flight", "Requests being answered now", multiprocess_mode="livesum")
CACHE_LOOKUPS = Counter(
    "zarr_gateway_cache_lookups", "Lookups in the gateway's caches, by cache and result (hit/miss)", ["cache", "result"]
)
CACHE_BYTES = Gauge("zarr_gateway_cache_bytes", "Bytes held by each cache", ["cache"], multiprocess_mode="livesum")
STORAGE_ERRORS = Counter(
    "zarr_gateway_storage_errors",
    "Storage faults answered with a 5xx (kind: fault = unreadable/corrupt, changed = rewritten while read)",
    ["kind"],
)
for _kind in ("fault", "changed"):
    STORAGE_ERRORS.labels(_kind)


def count_storage_error(kind: str = "fault") -> None:
    """Called where the gateway answers a storage fault with a 5xx."""
    STORAGE_ERRORS.labels(kind).inc()


def route_of(path: str) -> str:
    """The kind of resource a path names: a bounded label value."""
    segments = [s for s in path.split("/") if s]
    if not segments:
        return "index"
    if len(segments) == 1 and segments[0] in OPERATIONS:
        return segments[0]
    if segments[0] != "data":
        return "other"
    rest = segments[2:]  # after /data/{tree}/: organization, dataset, layer, mag, key...
    if rest and rest[-1] in METADATA_NAMES:
        return "metadata"
    if len(rest) <= 4:
        return "listing"
    return "chunk"


class _Counted(Protocol):
    hits: int
    misses: int

    @property
    def size_bytes(self) -> int: ...


class CacheWatch:
    """Turns the caches' own hit/miss counts into counter increments of this process.

    Called at most once a second per request path (cheap enough) and always at scrape time.
    """

    def __init__(self, caches: Callable[[], Mapping[str, _Counted]]) -> None:
        self._caches = caches
        self._seen: dict[str, tuple[int, int]] = {}
        self._next = 0.0

    def sync_now_and_then(self, now: float) -> None:
        if now >= self._next:
            self._next = now + 1.0
            self.sync()

    def sync(self) -> None:
        for name, cache in self._caches().items():
            hits, misses = cache.hits, cache.misses
            seen_hits, seen_misses = self._seen.get(name, (0, 0))
            if hits > seen_hits:
                CACHE_LOOKUPS.labels(name, "hit").inc(hits - seen_hits)
            if misses > seen_misses:
                CACHE_LOOKUPS.labels(name, "miss").inc(misses - seen_misses)
            self._seen[name] = (hits, misses)
            CACHE_BYTES.labels(name).set(cache.size_bytes)


def record_request(route: str, method: str, status: int, seconds: float, sent: int) -> None:
    """Count one answered request."""
    REQUESTS.labels(route, method, str(status or 500)).inc()
    LATENCY.labels(route).observe(seconds)
    if sent:
        BYTES.labels(route).inc(sent)


def exposition() -> tuple[bytes, str]:
    """The text exposition of every process's metrics (all workers' in multiprocess mode)."""
    if os.environ.get(MULTIPROC_ENV):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


def process_exit() -> None:
    """Drop this process's live gauges from the multiprocess files when a worker stops."""
    if os.environ.get(MULTIPROC_ENV):
        multiprocess.mark_process_dead(os.getpid())
