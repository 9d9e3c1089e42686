"""The measured cases: per key set, every server up at once and the cases run in interleaved rounds."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from .config import (
    CASES,
    DATA_ORIGIN,
    DATASET,
    FLOOR_KINDS,
    KEYSET_EDGES,
    KEYSETS,
    ORG,
    PROFILED,
    SCRIPTS,
    Case,
    KeySet,
    log,
)
from .keys import Request, chunk_index, write_paths
from .load import load_round, run_wrk, summarize
from .nginx import start_nginx, start_proxy
from .prepare import GatewayKey, check_static, check_tiled, check_xpublish, token_headers
from .processes import Server, start_python_app, stop_all
from .profiling import profile_server
from .run import Run


class Target:
    """What a case sends its load to, which processes serve it, and the list of requests it walks.

    ``check`` waits until the server answers on all its workers and checks what it serves; the
    servers of a group are launched first and checked after, so that they start up side by side.
    """

    def __init__(
        self,
        server: Server,
        paths: Path,
        serving: list[Server],
        started: bool,
        check: Callable[[], None] = lambda: None,
    ) -> None:
        self.server = server
        self.paths = paths
        self.serving = serving  # whose CPU time counts: the proxy's case counts the gateway behind it too
        self.started = started  # started for this group (stopped after it), not a long-lived gateway
        self.check = check


def _launch(run: Run, case: Case, sequences: dict[str, list[Request]], gateways: dict[GatewayKey, Server]) -> Target:
    keyset = case.keyset
    paths = run.paths(case.paths or keyset)
    if case.kind == "gateway":
        gateway = gateways[(case.config, case.http)]
        return Target(gateway, paths, [gateway], started=False)
    first, span = sequences[keyset][0]
    ready = {"Range": "bytes=0-0"} if span else {}
    ready.update(token_headers(case.token) or {})
    sample = sequences[keyset][:: max(1, len(sequences[keyset]) // 5)]
    serving: list[Server] = []
    if case.kind == "nginx":
        server = start_nginx(run.static(keyset), run.work, run.logs)
    elif case.kind in FLOOR_KINDS:
        env = {"BENCH_FLOOR_ROOT": str(run.static(keyset))}
        server = start_python_app(case.kind, case.http, run.workers, run.logs, env)
    elif case.kind == "proxy":
        gateway = gateways[(case.config, case.http)]
        server = start_proxy(gateway.port, run.logs)
        serving.append(gateway)
    else:
        raise ValueError(case.kind)

    def check() -> None:
        server.wait_ready(first, run.workers if case.kind in FLOOR_KINDS else 1, ready or None)
        check_static(server, run.static(keyset), sample, case.token)

    return Target(server, paths, [server, *serving], started=True, check=check)


@dataclass(frozen=True)
class Peer:
    """How a peer names a chunk (its indices from the key box's corner), the path that says it is ready,
    and how its chunks are checked against the gateway's."""

    chunk_path: str  # with {x}, {y}, {z}
    ready: str
    check: Callable[[Run, Server, Path, list[Request], list[Request], int], None]


PEERS = {
    "xpublish": Peer("/zarr/color/c/0/{x}/{y}/{z}", "/zarr/zarr.json", check_xpublish),
    "tiled": Peer("/zarr/v2/color/0.{x}.{y}.{z}", "/zarr/v2/color/.zarray", check_tiled),
}


def _peer_python(kind: str) -> str:
    """The interpreter a peer runs on: Tiled's venv of its own (made on first use), or this one."""
    if kind != "tiled":
        return sys.executable
    made = subprocess.run([str(SCRIPTS / "tiled-venv")], capture_output=True, text=True)
    if made.returncode != 0:
        raise RuntimeError(f"scripts/tiled-venv failed: {made.stderr[-2000:]}")
    return made.stdout.strip()


def _launch_peer(run: Run, case: Case, sequence: list[Request]) -> Target:
    peer = PEERS[case.kind]
    edge = KEYSET_EDGES[case.keyset]
    base = [o // edge for o in DATA_ORIGIN]
    requests = []
    for path, _ in sequence:
        x, y, z = (v - b for v, b in zip(chunk_index(path), base))
        requests.append((peer.chunk_path.format(x=x, y=y, z=z), ""))
    paths = write_paths(run.paths(f"{case.kind}-{case.keyset}"), requests)
    env = {
        "BENCH_PEER_MAG": str(run.root / ORG / DATASET / "color" / "1"),
        "BENCH_PEER_ORIGIN": json.dumps(DATA_ORIGIN),
        "BENCH_PEER_SHAPE": json.dumps(run.mode.key_box),
        "BENCH_PEER_EDGE": str(edge),
    }
    server = start_python_app(case.kind, case.http, run.workers, run.logs, env, _peer_python(case.kind))

    def check() -> None:
        server.wait_ready(peer.ready, run.workers)
        peer.check(run, server, run.static(case.keyset), sequence, requests, edge)

    return Target(server, paths, [server], started=True, check=check)


def launch_peers(run: Run, sequences: dict[str, list[Request]]) -> dict[Case, Target]:
    """Every peer's servers, launched at the start of the run: they take long to start (Tiled most), and
    meanwhile the gateways are fetched from and the earlier groups measured. Checked in their groups."""
    launched: dict[Case, Target] = {}
    for case in (c for c in CASES if c.kind in PEERS):
        try:
            launched[case] = _launch_peer(run, case, sequences[case.keyset])
        except Exception as exc:
            run.fail(case, f"{type(exc).__name__}: {exc}")
    return launched


def _start_group(
    run: Run,
    keyset: str,
    sequences: dict[str, list[Request]],
    gateways: dict[GatewayKey, Server],
    early: dict[Case, Target],
    cases: list[Case],
) -> dict[Case, Target]:
    """The servers of one key set, launched together (those launched early are taken), then each checked;
    a case that fails is recorded."""
    launched: dict[Case, Target] = {}
    for case in (c for c in cases if c.keyset == keyset):
        if case.kind in PEERS:
            if case in early:
                launched[case] = early[case]
            continue
        try:
            launched[case] = _launch(run, case, sequences, gateways)
        except Exception as exc:
            run.fail(case, f"{type(exc).__name__}: {exc}")
    targets: dict[Case, Target] = {}
    for case, target in launched.items():
        try:
            target.check()
            targets[case] = target
        except Exception as exc:
            if target.started:
                target.server.stop()
            run.fail(case, f"{type(exc).__name__}: {exc}")
    return targets


def run_groups(
    run: Run,
    sequences: dict[str, list[Request]],
    gateways: dict[GatewayKey, Server],
    peers: dict[Case, Target],
    cases: list[Case] = CASES,
    keysets: dict[str, KeySet] = KEYSETS,
) -> None:
    """Per key set: its servers all up at once, the cases measured in interleaved rounds.

    Interleaving spreads the noise of a shared machine over every case alike, so the ratios within
    a group hold better than those of back-to-back runs would; each figure is a median over rounds.
    """
    for keyset in keysets:
        targets = _start_group(run, keyset, sequences, gateways, peers, cases)
        log(f"[{keyset}] {len(targets)} cases ready")
        rounds: dict[Case, list[dict[str, Any]]] = {case: [] for case in targets}
        broken: dict[Case, str] = {}
        try:
            for number in range(run.mode.rounds):
                measured = run.measure(
                    {
                        case: partial(_round, run, case, target, warm_up=number == 0)
                        for case, target in targets.items()
                        if case not in broken
                    },
                    slow=[case for case in targets if case.kind in PEERS],
                )
                for case, outcome in measured.items():
                    if isinstance(outcome, Exception):
                        broken[case] = f"{type(outcome).__name__}: {outcome}"
                    else:
                        rounds[case].append(outcome)
                log(f"[{keyset}] round {number + 1} of {run.mode.rounds} done")
            if run.profile:
                _profile(run, targets, broken)
        finally:
            for case, target in targets.items():
                if case in broken:
                    run.fail(case, broken[case])
                elif rounds[case]:
                    rss_of = None if case.kind in ("nginx", "proxy") else target.server
                    result = summarize(case, rounds[case], rss_of)
                    if result.error and target.started:  # its log goes with the server below: say why here
                        unusual = unusual_lines(target.server.log_tail(64_000))
                        result.error += f"; its log, but for 2xx answers, ends with {unusual}"
                    run.record(case, result)
            started = [target.server for target in targets.values() if target.started]
            stop_all(started)
            for server in started:
                server.log_path.unlink(missing_ok=True)


ANSWERED = re.compile(r'"status": 2\d\d,|gateway\.access: .* 2\d\d \d+B ')  # a gateway's 2xx access line


def unusual_lines(log_tail: str, most: int = 4) -> list[str]:
    """The last lines of the tail of a server's log that are not a 2xx access line (JSON or text): why answers
    failed. The first line is left out, as the tail may have cut it."""
    lines = log_tail.splitlines()[1:]
    return [line[:300] for line in lines if not ANSWERED.search(line)][-most:]


MIN_REQUESTS = 8  # a round that completes fewer is measured again, once, for longer
STRETCH = 16  # ... this many times the mode's duration


def _round(run: Run, case: Case, target: Target, warm_up: bool) -> dict[str, Any]:
    """One measured round of a case, after the mode's warm-up if it is the first."""
    if warm_up and run.mode.warmup:
        run_wrk(target.server.url, target.paths, run.mode.warmup, case.token)
    return _measured_round(run, case, target)


def _measured_round(run: Run, case: Case, target: Target) -> dict[str, Any]:
    """One round of a case; a server so slow that a round completes almost nothing (a peer's large chunks,
    32 at once, each seconds long) is given one longer round, so that its figure counts answers, not the
    cut-off. Before it, the server is let finish the answers the short round's client hung up on: a dask-backed
    peer computes them all the same, and a run of ever longer rounds, each behind the last one's backlog, once
    completed none in 31 seconds on a loaded machine."""
    stats = load_round(target.server, target.paths, run.mode.duration, case.token, target.serving)
    if stats["requests"] >= MIN_REQUESTS:
        return stats
    longer = STRETCH * run.mode.duration
    log(f"{case.name} [{case.keyset}]: {stats['requests']} requests in {run.mode.duration} s; again for {longer} s")
    if not target.server.wait_until_idle():
        log(f"{case.name} [{case.keyset}]: the server was still busy when the longer round began")
    return load_round(target.server, target.paths, longer, case.token, target.serving)


def _profile(run: Run, targets: dict[Case, Target], broken: dict[Case, str]) -> None:
    profiles = run.extras.setdefault("profile", {})
    for case, target in targets.items():
        if (case.name, case.keyset) in PROFILED and case not in broken:
            log(f"profiling {case.name} with py-spy for {run.profile} s")
            raw = run.out / f"profile-{case.name.replace(' ', '-')}.txt"
            profiles[case.name] = profile_server(target.server, target.paths, run.profile, raw)
