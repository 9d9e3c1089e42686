"""The report: results.md (the table, notes, targets, profile), results.png and the README's bench block."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from .config import (
    CASES,
    CONNECTIONS,
    DECODING_PROFILED,
    EXTENT,
    HEALTHZ_P99_MS,
    HTTP_SERVERS,
    KEYSETS,
    MAPPED,
    MAPPED_CASES,
    MAPPED_KEYSETS,
    PEER_COMPARED,
    PEER_KINDS,
    REFERENCE_SERVER,
    REPO,
    SEGMENTATION,
    THREADS,
    WEBKNOSSOS_REFERENCE,
    ZIPF_CASES,
    ZIPF_KEYSETS,
    Result,
    _on,
    mapped_case_name,
    zipf_case_name,
)
from .load import wrk_binary
from .nginx import nginx_binary
from .run import Run

README_START, README_END = "<!-- bench:start -->", "<!-- bench:end -->"


def machine() -> dict[str, Any]:
    """The machine, tool versions and commit the figures belong to."""
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions = {}
    packages = ("uvicorn", "granian", "starlette", "uvloop", "httptools", "xpublish", "xpublish-zarr", "dask")
    for package in (*packages, "tensorstore"):
        with contextlib.suppress(Exception):
            from importlib.metadata import version

            versions[package] = version(package)
    for tool, flag in (("nginx", "-v"), ("wrk", "-v")):
        binary = nginx_binary() if tool == "nginx" else wrk_binary()
        if binary:
            done = subprocess.run([binary, flag], capture_output=True, text=True)
            text = (done.stdout + done.stderr).strip().splitlines()
            versions[tool] = text[0].split("/", 1)[1].split()[0] if text and "/" in text[0] else "?"
    commit = "unknown"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        if done.returncode == 0:
            commit = done.stdout.strip()
            dirty = subprocess.run(
                ["git", "-C", str(REPO), "status", "--porcelain", "--", "gateway", "gateway_storage", "wkw_adapter"],
                capture_output=True,
                text=True,
            ).stdout.strip()
            commit += " with uncommitted changes to gateway/, gateway_storage/ or wkw_adapter/" if dirty else ""
    return {
        "commit": commit,
        "arch": platform.machine(),
        "cores": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "versions": versions,
    }


def compute_ratios(run: Run) -> None:
    """Each row against nginx, the Starlette floor and the bare floor of its key set on the reference server."""
    for (_name, keyset), result in run.results.items():
        if result.error:
            continue
        result.x_nginx = _ratio(result, run.results.get(("nginx", keyset)))
        result.x_floor = _ratio(result, run.results.get(("floor", keyset)))
        result.x_bare = _ratio(result, run.results.get(("bare floor", keyset)))


def _ratio(a: Result | None, b: Result | None) -> float | None:
    if a is None or b is None or a.error or b.error or not b.req_s:
        return None
    return a.req_s / b.req_s


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


# (label, row, key set, baseline row, baseline key set, goal); "{on}" is each HTTP server's row suffix.
RATIO_TARGETS = [
    ("pass-through u8 LZ4HC ≥ 1.0 x floor", "gateway pass-through{on}", "u8-32", "floor", "u8-32", 1.0),
    (
        "pass-through, answers kept ≥ 0.7 x floor",
        "gateway pass-through, answers kept{on}",
        "u8-32",
        "floor",
        "u8-32",
        0.7,
    ),
    ("64³ chunks, answers kept ≥ 0.7 x floor", "gateway 64³ chunks, answers kept{on}", "u8-64", "floor", "u8-64", 0.7),
    ("pass-through u16 raw ≥ 1.0 x floor", "gateway pass-through raw{on}", "u16-32", "floor", "u16-32", 1.0),
    ("64³ chunks, made each time ≥ 0.35 x floor", "gateway 64³ chunks{on}", "u8-64", "floor", "u8-64", 0.35),
    ("128³ chunks, made each time ≥ 0.35 x floor", "gateway 128³ chunks{on}", "u8-128", "floor", "u8-128", 0.35),
    ("sharded ranges ≥ 0.6 x floor", "gateway sharded ranges{on}", "shard", "floor", "shard", 0.6),
    (
        "re-encode zstd ≥ 0.5 x pass-through",
        "gateway re-encode zstd{on}",
        "u8-32",
        "gateway pass-through{on}",
        "u8-32",
        0.5,
    ),
]


def targets(run: Run) -> list[tuple[str, str, bool | None]]:
    """(target, measured, met) for each target; the gateway's on every HTTP server, against the uvicorn floor."""
    r = run.results
    rows: list[tuple[str, str, bool | None]] = []
    for label, name, keyset, base, base_keyset, goal in RATIO_TARGETS:
        for http in HTTP_SERVERS:
            on = _on(http)
            value = _ratio(r.get((name.format(on=on), keyset)), r.get((base.format(on=on), base_keyset)))
            rows.append((f"{label} ({http})", _fmt(value, ".2f") + " x", None if value is None else value >= goal))
    proxy = _ratio(r.get(("gateway through the proxy", "u8-32")), r.get(("gateway with tokens", "u8-32")))
    met = None if proxy is None else proxy >= 0.8
    rows.append((f"through the proxy ≥ 0.8 x direct ({REFERENCE_SERVER})", _fmt(proxy, ".2f") + " x", met))
    rows += _zipf_and_peer_targets(run)
    for keyset, chunks in MAPPED_KEYSETS.items():
        for kept, goal in ((False, 0.5), (True, 0.9)):  # the issue's targets: half the throughput made, equal kept
            value = _mapped_ratio(run, keyset, kept)
            rows.append(
                (
                    f"{chunks.label}: agglomerates{', answers kept' if kept else ', made each time'} ≥ {goal} x labels",
                    _fmt(value, ".2f") + " x",
                    None if value is None else value >= goal,
                )
            )
    ts_info = run.extras.get("tensorstore", {})
    if "ratio" in ts_info:
        rows.append(
            ("tensorstore sharded full-mag read ≤ 2 x local", f"{ts_info['ratio']:.2f} x", ts_info["ratio"] <= 2)
        )
    else:
        rows.append(("tensorstore sharded full-mag read ≤ 2 x local", ts_info.get("error", "not run"), None))
    rss = run.extras.get("rss", {})
    if rss.get("peak_rss_mb"):
        peak = max(rss["peak_rss_mb"])
        scaled = " (scaled down)" if rss.get("scaled_down") else ""
        rows.append(
            (
                "peak RSS per worker < 300 MB after 10⁶ requests over thousands of files",
                f"{peak:.0f} MB after {rss['requests']:,} requests over {rss['files']:,} files{scaled}",
                peak < 300,
            )
        )
    else:
        rows.append(("peak RSS per worker < 300 MB", rss.get("error", "not run"), None))
    healthz = run.extras.get("healthz", {})
    label = f"/healthz p99 < {HEALTHZ_P99_MS:.0f} ms during the 64³ load over small files"
    if "p99_ms" in healthz:
        rows.append((label, f"{healthz['p99_ms']:.1f} ms", bool(healthz.get("met"))))
    else:
        rows.append((label, healthz.get("error", "not run"), None))
    return rows


def _healthz_markdown(run: Run) -> list[str]:
    """The line of the /healthz probe beside the load over small files (benchmark.healthz)."""
    healthz = run.extras.get("healthz", {})
    if "p99_ms" not in healthz:
        return [f"- /healthz probe failed: {healthz.get('error')}"] if healthz else []
    return [
        f"- /healthz, asked every {healthz['interval_ms']:.0f} ms on a connection of its own during "
        f"{healthz['seconds']} s of the 64³ load over {healthz['files']:,} small files (one 8³ block per file: "
        "512 files per chunk; "
        f"{healthz['keys']} chunks, a fresh gateway with answers kept, {healthz['load_req_s']:,.0f} requests/s): "
        f"p50 {healthz['p50_ms']:.1f} ms, p99 {healthz['p99_ms']:.1f} ms, max {healthz['max_ms']:.1f} ms "
        f"({healthz['probes']} probes)."
    ]


def _zipf_and_peer_targets(run: Run) -> list[tuple[str, str, bool | None]]:
    r = run.results
    cold, warm = zipf_case_name("cold", "gateway"), zipf_case_name("warm", "gateway")
    pairs = [
        (
            "Zipf 32³, warm, through the proxy ≥ 2.0 x the gateway direct, cold",
            r.get((zipf_case_name("warm", "proxy"), "zipf-32")),
            r.get((cold, "zipf-32")),
            2.0,
        ),
        (
            "Zipf 64³, warm, direct ≥ 0.8 x Zipf 32³, warm, direct",
            r.get((warm, "zipf-64")),
            r.get((warm, "zipf-32")),
            0.8,
        ),
    ]
    for keyset, name in PEER_COMPARED.items():
        pairs.append(
            (f"{name} ≥ 3 x Tiled ({KEYSETS[keyset].label})", r.get((name, keyset)), r.get(("Tiled", keyset)), 3.0)
        )
    rows: list[tuple[str, str, bool | None]] = []
    for label, row, base, goal in pairs:
        value = _ratio(row, base)
        rows.append((label, _fmt(value, ".2f") + " x", None if value is None else value >= goal))
    return rows


def _grouped_row(name: str, label: str, r: Result | None, ratio: float | None) -> str:
    """A row of a table of grouped cases (Zipf, mapped): its figures and its ratio to the group's reference."""
    if r is None or r.error:
        return f"| {name} | {label} | failed: {'not run' if r is None else r.error} | | | | | | |"
    return (
        f"| {name} | {label} | {r.req_s:,.0f} | {r.mb_s:,.1f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | "
        f"{_fmt(ratio, '.2f')} | {_fmt(r.cpu_us, '.0f')} | {_fmt(r.rss_mb, '.0f')} |"
    )


def _zipf_markdown(run: Run) -> list[str]:
    """The viewer's workload: each Zipf row, against the cold direct row of its key set."""
    lines = [
        "",
        "A viewer's workload: chunk keys drawn from a Zipf distribution over the populated cube's chunks "
        f"({run.mode.zipf_draws:,} draws per key set), cold (fresh servers, empty caches) and warm (after one pass "
        "over every key), by three routes; x cold direct compares with the first row of its key set.",
        "",
        "| case | chunks | req/s | MB/s | p50 ms | p99 ms | x cold direct | server CPU µs/req | peak RSS/worker MB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case in ZIPF_CASES:
        r = run.results.get((case.name, case.keyset))
        base = run.results.get((zipf_case_name("cold", "gateway"), case.keyset))
        lines.append(_grouped_row(case.name, ZIPF_KEYSETS[case.keyset].label, r, _ratio(r, base)))
    lines += ["", *(f"- {c.name} [{ZIPF_KEYSETS[c.keyset].label}]: {c.note}." for c in ZIPF_CASES if c.note)]
    return lines


def _mapped_ratio(run: Run, keyset: str, kept: bool) -> float | None:
    """The agglomerates' requests per second over the labels' on the same keys, in the same rounds."""
    return _ratio(
        run.results.get((mapped_case_name(MAPPED, kept), keyset)),
        run.results.get((mapped_case_name(SEGMENTATION, kept), keyset)),
    )


def _mapped_markdown(run: Run) -> list[str]:
    """The mapped rows: a segmentation and its agglomerate mapping on the same keys, interleaved in rounds."""
    lines = [
        "",
        f"A mapped layer: `{MAPPED}` (the labels with an agglomerate file of "
        f"{run.mode.seg_entries:,} entries applied) against the labels on the same keys, one group per chunk size, "
        "the rows of a group interleaved in rounds.",
        "",
        "| case | chunks | req/s | MB/s | p50 ms | p99 ms | x labels | server CPU µs/req | peak RSS/worker MB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case in MAPPED_CASES:
        kept = case.config.startswith("kept")
        ratio = _mapped_ratio(run, case.keyset, kept) if case.paths.startswith("map") else 1.0
        r = run.results.get((case.name, case.keyset))
        lines.append(_grouped_row(case.name, MAPPED_KEYSETS[case.keyset].label, r, ratio))
    lines += ["", *(f"- {c.name} [{MAPPED_KEYSETS[c.keyset].label}]: {c.note}." for c in MAPPED_CASES if c.note)]
    return lines


def _peer_markdown(run: Run) -> list[str]:
    """The gateway against each peer on the same keys, per key set."""
    names = {"xpublish": "xpublish", "tiled": "Tiled"}
    lines = [
        "",
        "The gateway and its peers on the same keys (requests per second, and the gateway's ratio to each):",
        "",
        "| chunks | gateway row | gateway | " + " | ".join(f"{names[k]} | x {names[k]}" for k in PEER_KINDS) + " |",
        "|---|---|---:|" + "---:|---:|" * len(PEER_KINDS),
    ]
    for keyset, name in PEER_COMPARED.items():
        gateway = run.results.get((name, keyset))
        cells = []
        for kind in PEER_KINDS:
            peer = run.results.get((names[kind], keyset))
            cells += ["—" if peer is None or peer.error else f"{peer.req_s:,.0f}", _fmt(_ratio(gateway, peer), ".1f")]
        served = "—" if gateway is None or gateway.error else f"{gateway.req_s:,.0f}"
        lines.append(f"| {KEYSETS[keyset].label} | {name} | {served} | " + " | ".join(cells) + " |")
    lines += ["", f"Reference, not measured here: {WEBKNOSSOS_REFERENCE}."]
    return lines


def markdown(run: Run, info: dict[str, Any], facts: dict[str, Any]) -> str:
    m = info
    lines = [
        f"Machine: {m['arch']}, {m['cores']} cores, {m['cpu']}, Python {m['python']}, {m['date']}; "
        f"mode: {run.mode.name}; gateway at {m['commit']}.",
        "",
        f"Load: wrk {m['versions'].get('wrk', '?')}, {THREADS} threads, {CONNECTIONS} connections, "
        f"{run.mode.duration} s per case after {run.mode.warmup} s of warm-up, on loopback; wrk and the servers "
        f"share the same {m['cores']} cores. Python servers: uvicorn {m['versions'].get('uvicorn', '?')} with "
        f"{run.workers} workers (uvloop, httptools), and the rows 'on granian' Granian "
        f"{m['versions'].get('granian', '?')} with {run.workers} workers (HTTP/1.1); nginx "
        f"{m['versions'].get('nginx', '?')}: 2 workers, sendfile, access log off."
        + (" The cases of each group ran side by side, sharing the cores: no figure compares." * run.mode.side_by_side),
        "",
        f"Data: layers of {EXTENT[0]}x{EXTENT[1]}x{EXTENT[2]} voxels at mag 1 (32 GiB of uint8 or 64 GiB of "
        f"uint16 each, virtual), {facts['disk_bytes'] / 2**20:.0f} MiB of WKW files; LZ4HC blocks of 32 KiB stored in "
        f"{facts['min_block_kib']:.1f}-{facts['max_block_kib']:.1f} KiB (mean {facts['mean_block_kib']:.1f}). "
        "Each group of rows requests the same shuffled sequence of chunk keys; nginx and the floors serve the "
        "bytes the gateway served for those keys. x floor and x bare compare with the Starlette and the bare "
        f"floor on {REFERENCE_SERVER}.",
        "",
        "| case | chunks | req/s | MB/s | p50 ms | p99 ms | x nginx | x floor | x bare | server CPU µs/req "
        "| peak RSS/worker MB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case in CASES:
        r = run.results.get((case.name, case.keyset))
        label = KEYSETS[case.keyset].label
        if r is None or r.error:
            reason = "not run" if r is None else r.error
            lines.append(f"| {case.name} | {label} | failed: {reason} | | | | | | | | |")
            continue
        lines.append(
            f"| {case.name} | {label} | {r.req_s:,.0f} | {r.mb_s:,.1f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | "
            f"{_fmt(r.x_nginx, '.2f')} | {_fmt(r.x_floor, '.2f')} | {_fmt(r.x_bare, '.2f')} | "
            f"{_fmt(r.cpu_us, '.0f')} | {_fmt(r.rss_mb, '.0f')} |"
        )
    lines += [
        "",
        "MB/s counts bytes on the wire (headers included). Figures are medians over the rounds; server CPU is the "
        "user + system time of all the server's processes over all rounds, per request (through the proxy: "
        "nginx's and the gateway's).",
        "",
        *(f"- {c.name} [{KEYSETS[c.keyset].label}]: {c.note}." for c in CASES if c.note),
    ]
    proxy = _ratio(
        run.results.get(("gateway through the proxy", "u8-32")), run.results.get(("gateway with tokens", "u8-32"))
    )
    if proxy is not None:
        lines.append(f"- Through the proxy: {proxy:.2f} x the requests per second of the gateway with tokens direct.")
    checked = _ratio(
        run.results.get(("gateway pass-through", "u8-32")),
        run.results.get(("gateway pass-through, no block check", "u8-32")),
    )
    if checked is not None:
        lines.append(f"- The block check: the pass-through runs at {checked:.2f} x the requests per second without it.")
    viewer = run.extras.get("viewer", {})
    if "error" in viewer:
        lines.append(f"- Neuroglancer's view: {viewer['error']}.")
    elif viewer and all("first" in v for v in viewer.values()):
        times = "; ".join(
            f"{name} {v['first']['seconds']:.2f} s first, {v['reload']['seconds']:.2f} s reload"
            for name, v in viewer.items()
        )
        chunks = max(v["first"]["chunks"] for v in viewer.values())
        lines.append(
            f"- Neuroglancer in headless Chromium, the three cross-sections of a fixed view ({chunks} chunks), "
            "time until every visible chunk has loaded; first load: fresh gateway and proxy (empty caches) and a "
            f"fresh browser context; reload: the same page loaded again (every cache warm): {times}."
        )
    ts_info = run.extras.get("tensorstore", {})
    if "ratio" in ts_info:
        lines.append(
            f"- tensorstore, whole mag {ts_info['mag']} ({'x'.join(map(str, ts_info['shape']))} uint8, "
            f"{ts_info['bytes'] / 2**20:.0f} MiB): through the gateway's sharded v3 tree {ts_info['gateway_s']:.2f} s "
            f"({ts_info['bytes'] / ts_info['gateway_s'] / 1e6:.0f} MB/s, {ts_info['http_requests']:,} HTTP "
            f"requests); from a local Zarr v3 sharded copy (same shard and chunk shape, blosc-lz4) "
            f"{ts_info['local_s']:.2f} s; ratio {ts_info['ratio']:.2f}. Best of 2 runs each. Peak RSS of a "
            f"gateway worker meanwhile: {_fmt(ts_info.get('gateway_peak_rss_mb'), '.0f')} MB."
        )
    elif ts_info:
        lines.append(f"- tensorstore read failed: {ts_info.get('error')}")
    rss = run.extras.get("rss", {})
    if rss.get("peak_rss_mb"):
        scale = f" Scaled down from 10⁶ requests ({run.mode.name} mode)." if rss.get("scaled_down") else ""
        lines.append(
            f"- Peak RSS per gateway worker (VmHWM) after {rss['requests']:,} pass-through requests over "
            f"{rss['keys']:,} chunks in {rss['files']:,} files ({rss['seconds']:.0f} s): "
            f"{', '.join(f'{v:.0f}' for v in rss['peak_rss_mb'])} MB; at start "
            f"{', '.join(f'{v:.0f}' for v in rss['start_rss_mb'])} MB.{scale}"
        )
    elif rss:
        lines.append(f"- RSS run failed: {rss.get('error')}")
    lines += _healthz_markdown(run)
    xp_codecs = run.extras.get("xpublish_codecs")
    if xp_codecs is not None:
        names = ", ".join(c["name"] for c in xp_codecs)
        lines.append(
            f"- xpublish serves the {'x'.join(map(str, run.mode.key_box))} voxels that the requests cover, with its "
            f"own codecs ({names}); its chunk keys are the same chunks shifted to its origin. Not the whole virtual "
            "extent: over a dask array of all 1,048,576 chunks of 32 GiB, xpublish spends minutes per worker building "
            "its metadata before it answers zarr.json, and xpublish-zarr answers 500 ('encoded chunk missing from "
            "scratch store') for a chunk that is all fill value, as most of a virtual extent is."
        )
    lines += _zipf_markdown(run)
    lines += _mapped_markdown(run)
    lines += _peer_markdown(run)
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    for label, measured, met in targets(run):
        lines.append(f"| {label} | {measured} | {'—' if met is None else ('yes' if met else 'no')} |")
    lines += _profile_markdown(run.extras.get("profile") or {})
    if run.failures:
        lines += ["", "Failures:", *(f"- {f}" for f in run.failures)]
    return "\n".join(lines) + "\n"


def _decoding_profiles(profiles: dict[str, Any], categories: list[str]) -> list[str]:
    """Where the time of the cases that decode or assemble chunks goes: the same categories, one column each."""
    sampled = [(name, profiles[name]) for name, _ in DECODING_PROFILED if "categories" in profiles.get(name, {})]
    if not sampled:
        return []
    by_case = [{e["category"]: e["us_per_request"] for e in p["categories"]} for _, p in sampled]
    names = categories + [c for per in by_case for c in per if c not in categories]
    lines = [
        "",
        "The cases that decode, encode or assemble chunks, sampled the same way (µs per request):",
        "",
        "| where | " + " | ".join(name.removeprefix("gateway ") for name, _ in sampled) + " |",
        "|---|" + "---:|" * len(sampled),
        "| all | " + " | ".join(str(p["cpu_us_per_request"]) for _, p in sampled) + " |",
    ]
    for category in dict.fromkeys(names):
        lines.append(f"| {category} | " + " | ".join(str(per.get(category, 0)) for per in by_case) + " |")
    return lines


def _profile_markdown(profiles: dict[str, Any]) -> list[str]:
    """The floor's and the gateway's profiles side by side (and on Granian), then the gateway's hottest functions."""
    gateway = profiles.get("gateway pass-through", {})
    floor = profiles.get("floor", {})
    granian = profiles.get("gateway pass-through on granian", {})
    lines: list[str] = []
    for name, profile in profiles.items():
        if "error" in profile:
            lines += ["", f"Profile of {name} failed: {profile['error']}"]
    if "categories" not in gateway:
        return lines
    floor_us = {e["category"]: e["us_per_request"] for e in floor.get("categories", [])}
    granian_us = {e["category"]: e["us_per_request"] for e in granian.get("categories", [])}
    lines += [
        "",
        f"Profile (py-spy, {gateway['seconds']} s of one worker under the same load as above): time the worker's "
        "Python threads were active (on a CPU or runnable), per request it answered. Floor: "
        f"{floor.get('cpu_us_per_request', '—')} µs at {floor.get('req_s_while_sampled', 0):,} req/s; gateway "
        f"pass-through: {gateway['cpu_us_per_request']} µs at {gateway['req_s_while_sampled']:,} req/s; on Granian: "
        f"{granian.get('cpu_us_per_request', '—')} µs at {granian.get('req_s_while_sampled', 0):,} req/s (its Rust "
        "threads, which parse and write, are not sampled). Raw stacks: "
        f"{', '.join(p['raw'] for p in profiles.values() if 'raw' in p)}.",
        "",
        "| where (first match from the leaf up) | floor µs/req | gateway µs/req | gateway % | on Granian µs/req |",
        "|---|---:|---:|---:|---:|",
    ]
    categories = [e["category"] for e in gateway["categories"]]
    categories += [c for c in granian_us if c not in categories]
    gateway_by = {e["category"]: e for e in gateway["categories"]}
    for category in categories:
        entry = gateway_by.get(category, {"us_per_request": 0, "percent": 0.0})
        lines.append(
            f"| {category} | {floor_us.get(category, 0)} | {entry['us_per_request']} | {entry['percent']} | "
            f"{granian_us.get(category, 0)} |"
        )
    lines += _decoding_profiles(profiles, categories)
    lines += ["", "| gateway function (inclusive) | % | µs/req |", "|---|---:|---:|"]
    lines += [f"| `{e['function']}` | {e['percent']} | {e['us_per_request']} |" for e in gateway["inclusive"]]
    lines += ["", "| gateway function (self) | % | µs/req |", "|---|---:|---:|"]
    lines += [f"| `{e['function']}` | {e['percent']} | {e['us_per_request']} |" for e in gateway["self"]]
    return lines


def chart(run: Run, path: Path, info: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {
        "nginx": "#4c72b0",
        "floor": "#8c8c8c",
        "bare": "#b5b5b5",
        "rsgi": "#d0d0d0",
        "xpublish": "#dd8452",
        "proxy": "#8172b3",
    }
    labels, values, fills, notes = [], [], [], []
    for case in CASES:
        r = run.results.get((case.name, case.keyset))
        labels.append(f"{case.name} — {KEYSETS[case.keyset].label}")
        fills.append(colors.get(case.kind, "#55a868" if case.http == REFERENCE_SERVER else "#2e7d4f"))
        if r is None or r.error:
            values.append(0.0)
            notes.append("failed")
        else:
            values.append(r.req_s)
            notes.append(f"{r.req_s:,.0f}" + (f"  ({r.x_floor:.2f}x floor)" if r.x_floor else ""))
    fig, ax = plt.subplots(figsize=(11, 0.42 * len(labels) + 1.6))
    y = np.arange(len(labels))[::-1]
    ax.barh(y, values, color=fills)
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xlabel("requests/s (higher is better)")
    top = max([*values, 1.0])
    for yi, v, note in zip(y, values, notes):
        ax.text(v + top * 0.01, yi, note, va="center", fontsize=7)
    ax.set_xlim(0, top * 1.3)
    ax.set_title(
        f"zarr-gateway benchmark ({run.mode.name} mode) — {info['cores']} cores, {info['cpu']}, {info['date']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def update_readme(readme: Path, table: str) -> None:
    start, end = README_START, README_END
    text = readme.read_text()
    if start not in text or end not in text:
        raise SystemExit(f"{readme} has no {start} ... {end} markers to put the table between")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(f"{head}{start}\n{table}{end}{tail}")
