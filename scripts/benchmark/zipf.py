"""A viewer's workload: chunk keys drawn from a Zipf distribution, cold and warm, by three routes.

Per Zipf key set (32^3 and 64^3 chunks of the populated cube), one fresh gateway with tokens per
route: reached directly (wrk), through the compose proxy (wrk) and through the proxy's TLS listener
over HTTP/2 (h2load). Every gateway and proxy of a key set starts at once, each proxy with empty cache
directories. Cold: the first seconds of load after the start, every cache empty (the gateway's in its
workers, the proxy's on disk; the operating system's page cache is left as it is). Then one pass
over every key of the sequence, in order of first appearance, by the same route; warm: the same
load again. Whatever caches the gateway and the proxy have, the warm rows find them filled.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from .config import DATASET, ORG, READY, REFERENCE_SERVER, TEMPERATURES, ZIPF_CASES, ZIPF_EDGES, log
from .keys import Request, chunk_index, distinct, write_paths
from .load import load_round, run_h2load, summarize
from .nginx import start_proxy
from .prepare import decode_blosc, token_headers
from .processes import Server, free_port, start_gateway, stop_all
from .run import Run
from .viewer import make_certificate


@dataclass
class Route:
    """The servers of one route of one key set and how its load reaches them."""

    kind: str  # Case.kind: gateway | proxy | proxy-h2
    gateway: Server
    entry: Server  # what the load is sent to: the gateway or the proxy
    h2_base: str | None  # the TLS listener's URL for HTTP/2 load, else None (wrk)

    @property
    def serving(self) -> list[Server]:
        return [self.entry] if self.entry is self.gateway else [self.entry, self.gateway]


def _start_routes(run: Run, config: str, stack: ExitStack) -> dict[str, Route]:
    tls_dir = run.work / "tls"
    if not (tls_dir / "tls.crt").exists():
        make_certificate(tls_dir)
    routes = {}
    servers: list[Server] = []
    stack.callback(stop_all, servers)
    for kind in {c.kind: None for c in ZIPF_CASES}:
        gateway = start_gateway(config, REFERENCE_SERVER, run.root, run.workers, run.logs, run.tokens_file)
        servers.append(gateway)
        entry, h2_base = gateway, None
        if kind != "gateway":
            tls_port = free_port() if kind == "proxy-h2" else None
            entry = start_proxy(gateway.port, run.logs, tls=(tls_port, tls_dir) if tls_port else None)
            servers.append(entry)
            h2_base = f"https://127.0.0.1:{tls_port}" if tls_port else None
        routes[kind] = Route(kind, gateway, entry, h2_base)
    return routes


def _prime(run: Run, route: Route, keyset: str, keys: list[Request], token: str | None) -> None:
    """One pass over every key, by the route's own protocol (a cache's key may hold the scheme)."""
    paths = write_paths(run.paths(f"{keyset}-{route.kind}-distinct"), keys)  # a file per route: they may run at once
    base = route.h2_base or route.entry.url
    stats = run_h2load(base, paths, token, once=True, http1=route.h2_base is None)
    if stats["errors"] or stats["requests"] != len(keys):
        raise RuntimeError(f"the pass over {len(keys)} keys: {stats['requests']} answered, {stats['errors']} failed")


def _load(
    run: Run, route: Route, keyset: str, sequence: list[Request], paths: Path, token: str | None, warm: bool
) -> dict[str, Any]:
    """One row's load by its route: cold as the servers are, warm after one pass over every key."""
    if warm:
        _prime(run, route, keyset, distinct(sequence), token)
    return load_round(route.entry, paths, run.mode.duration, token, route.serving, route.h2_base)


def _check(run: Run, route: Route, keyset: str, keys: list[Request], token: str | None) -> None:
    """A sample of the chunks, as the route serves them, holds the voxels of the WKW data."""
    from gateway_storage import LocalStore
    from wkw_adapter import WkwFileCache, WkwMag

    edge = ZIPF_EDGES[keyset]
    mag = WkwMag(str(run.root / ORG / DATASET / "color" / "1"), WkwFileCache(LocalStore()))
    for path, _ in keys[:: max(1, len(keys) // 6)]:
        x, y, z = chunk_index(path)
        expected = mag.read_region((x * edge, y * edge, z * edge), (edge, edge, edge))
        body = route.entry.client.get_ok(path, token_headers(token))
        if not np.array_equal(decode_blosc(body, expected.dtype, edge), expected):
            raise RuntimeError(f"{route.kind}: the chunk {path} does not hold the voxels of the WKW data")


def run_zipf(run: Run, sequences: dict[str, list[Request]]) -> None:
    """Every Zipf row: per key set, its routes started together, then cold, one pass, warm, and a check."""
    for keyset, sequence in sequences.items():
        cases = {(c.kind, c.name.split(",")[0].split()[1]): c for c in ZIPF_CASES if c.keyset == keyset}
        paths = write_paths(run.paths(keyset), sequence)
        config = next(iter(cases.values())).config
        token = next(iter(cases.values())).token
        with ExitStack() as stack:
            try:
                routes = _start_routes(run, config, stack)
                for route in routes.values():
                    route.gateway.wait_ready(READY, run.workers, token_headers(token))
                    route.entry.wait_ready(READY, 1, token_headers(token))
            except Exception as exc:
                for case in cases.values():
                    run.fail(case, f"starting the servers failed: {type(exc).__name__}: {exc}")
                continue
            for temperature in TEMPERATURES:
                measured = run.measure(
                    {
                        kind: partial(_load, run, route, keyset, sequence, paths, token, temperature == "warm")
                        for kind, route in routes.items()
                    }
                )
                for kind, outcome in measured.items():
                    case = cases[(kind, temperature)]
                    if isinstance(outcome, Exception):
                        run.fail(case, f"{type(outcome).__name__}: {outcome}")
                    else:
                        run.record(case, summarize(case, [outcome], routes[kind].gateway))
                log(f"[{keyset}] {temperature} rows done")
            for kind, route in routes.items():
                try:
                    _check(run, route, keyset, sequence, token)
                except Exception as exc:
                    run.fail(cases[(kind, "warm")], f"{type(exc).__name__}: {exc}")
