"""Prometheus metrics: requests by route and status, latency, bytes sent, cache lookups, storage errors.

With several uvicorn workers every worker writes its samples into ``PROMETHEUS_MULTIPROC_DIR`` (set by
``zarr-gateway serve`` before the workers start) and ``/metrics``, whichever worker answers it, adds up
the files of all of them. With one worker the process's own registry is served.

Labels are bounded: ``route`` is a kind of resource (chunk, metadata, listing, ...), never a path, so
neither dataset names nor anything from a query string ever reach a label.

The event loop's own responsiveness is measured from inside (:class:`LoopLag`): a request that arrives
while the loop is held (by work on it, or by a thread that keeps the interpreter) waits as long as a timer
due then, whatever any client measures on a busy machine.
"""

import asyncio
import bisect
import os
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
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
PREVIEWS = Counter(
    "zarr_gateway_previews",
    "Preview requests by how they were answered: made (its slice read and decoded), kept (from the worker's "
    "cache, unchanged), revalidated (304 from a stat of its files, nothing read)",
    ["result"],
)
for _result in ("made", "kept", "revalidated"):
    PREVIEWS.labels(_result)
# Fine steps up to the 100 ms the event loop must answer within, coarse past it.
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
LOOP_LAG = Histogram(
    "zarr_gateway_event_loop_lag_seconds",
    "How late the event loop ran a timer that was due, sampled every LAG_INTERVAL_SECONDS: the wait of a "
    "request that arrived then, before the loop could start answering it",
    buckets=LAG_BUCKETS,
)
LOOP_LAG_MAX = Gauge(
    "zarr_gateway_event_loop_lag_max_seconds",
    "The longest event loop lag measured since the worker started (the most of any worker)",
    multiprocess_mode="livemax",
)
LAG_INTERVAL_SECONDS = 0.02  # a stall shows at most this much shorter than it was; 50 samples a second


def count_preview(result: str) -> None:
    """Called once per preview request, with how it was answered (made, kept, revalidated)."""
    PREVIEWS.labels(result).inc()


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


def exposition() -> tuple[bytes, str]:
    """The text exposition of every process's metrics (all workers' in multiprocess mode)."""
    if os.environ.get(MULTIPROC_ENV):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


class LoopLag:
    """How late the event loop runs a timer due every ``interval``: its lag, in :data:`LOOP_LAG`.

    A loop held for ``d`` seconds (a blocking call on it, or a thread that keeps the interpreter in one long
    C call) runs the timer late by between ``d - interval`` and ``d``, so the histogram is the wait that
    requests arriving at random times would see. A sample is a timer callback and a tally in plain Python,
    added to the histogram once a second and at every scrape (as :class:`RequestStats` does); the longest
    lag is set at once.
    """

    def __init__(self, interval: float = LAG_INTERVAL_SECONDS) -> None:
        self.interval = interval
        self.longest = 0.0
        self._bounds = list(LOOP_LAG._upper_bounds)
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._flushed = self._due = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._due = self._flushed = time.perf_counter() + self.interval
        self._timer = loop.call_later(self.interval, self._wake, loop)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.flush()

    def _wake(self, loop: asyncio.AbstractEventLoop) -> None:
        now = time.perf_counter()
        lag = max(0.0, now - self._due)
        self._counts[bisect.bisect_left(self._bounds, lag)] += 1
        self._sum += lag
        if lag > self.longest:
            self.longest = lag
            LOOP_LAG_MAX.set(lag)
        if now - self._flushed >= 1.0:
            self.flush()
        self._due = now + self.interval
        self._timer = loop.call_later(self.interval, self._wake, loop)

    def flush(self) -> None:
        counts, self._counts = self._counts, [0] * len(self._bounds)
        for index, count in enumerate(counts):
            if count:
                LOOP_LAG._buckets[index].inc(count)  # what observe() does, once per bucket
        LOOP_LAG._sum.inc(self._sum)
        self._sum, self._flushed = 0.0, time.perf_counter()


PROBE = LoopLag()  # this process's probe, like its metrics


@asynccontextmanager
async def loop_lag_probe() -> AsyncIterator[LoopLag]:
    """:data:`PROBE` running on the current loop while the block runs (a worker's lifespan)."""
    PROBE.start(asyncio.get_running_loop())
    try:
        yield PROBE
    finally:
        PROBE.stop()


def process_exit() -> None:
    """Drop this process's live gauges from the multiprocess files when a worker stops."""
    if os.environ.get(MULTIPROC_ENV):
        multiprocess.mark_process_dead(os.getpid())
