"""Prometheus metrics: requests by route and status, latency, bytes sent, cache lookups, storage errors.

With several uvicorn workers every worker writes its samples into ``PROMETHEUS_MULTIPROC_DIR`` (set by
``zarr-gateway serve`` before the workers start) and ``/metrics``, whichever worker answers it, adds up
the files of all of them. With one worker the process's own registry is served.

Labels are bounded: ``route`` is a kind of resource (chunk, metadata, listing, ...), never a path, so
neither dataset names nor anything from a query string ever reach a label.
"""

import bisect
import os
from collections import defaultdict
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


class _Counted(Protocol):
    hits: int
    misses: int

    @property
    def size_bytes(self) -> int: ...


class CacheWatch:
    """Turns the caches' own hit/miss counts into counter increments of this process.

    Called once a second while the worker runs and at every scrape.
    """

    def __init__(self, caches: Callable[[], Mapping[str, _Counted]]) -> None:
        self._caches = caches
        self._seen: dict[str, tuple[int, int]] = {}

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


class RequestStats:
    """Request counts, bytes and latencies tallied in plain Python and added to the metrics in bulk.

    A multiprocess Prometheus value costs microseconds per update (an mmap write and a pid check),
    which is a real share of a pass-through chunk. Requests are tallied here and flushed at most
    once a second while requests arrive, by a timer otherwise, and at every scrape.
    """

    def __init__(self) -> None:
        self.in_flight = 0
        self._counts: dict[tuple[str, str, int], int] = defaultdict(int)
        self._bytes: dict[str, int] = defaultdict(int)
        self._bounds = list(LATENCY._upper_bounds)
        self._latency: dict[str, list[int]] = {}
        self._latency_sum: dict[str, float] = defaultdict(float)
        self._next = 0.0

    def record(self, route: str, method: str, status: int, seconds: float, sent: int) -> None:
        self._counts[(route, method, status or 500)] += 1
        if sent:
            self._bytes[route] += sent
        buckets = self._latency.get(route)
        if buckets is None:
            buckets = self._latency[route] = [0] * len(self._bounds)
        buckets[bisect.bisect_left(self._bounds, seconds)] += 1
        self._latency_sum[route] += seconds

    def flush_now_and_then(self, now: float) -> None:
        if now >= self._next:
            self._next = now + 1.0
            self.flush()

    def flush(self) -> None:
        counts, self._counts = self._counts, defaultdict(int)
        for (route, method, status), count in counts.items():
            REQUESTS.labels(route, method, str(status)).inc(count)
        sent, self._bytes = self._bytes, defaultdict(int)
        for route, total in sent.items():
            BYTES.labels(route).inc(total)
        latency, self._latency = self._latency, {}
        sums, self._latency_sum = self._latency_sum, defaultdict(float)
        for route, buckets in latency.items():
            child = LATENCY.labels(route)
            for index, count in enumerate(buckets):
                if count:
                    child._buckets[index].inc(count)  # what observe() does, once per bucket
            child._sum.inc(sums[route])
        IN_FLIGHT.set(self.in_flight)


STATS = RequestStats()  # this process's tally, like the metrics themselves


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
