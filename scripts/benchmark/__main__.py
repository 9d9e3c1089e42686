"""``python -m benchmark``: the whole run, from the dataset to the report."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from . import __doc__ as package_doc
from .config import CASES, FULL, MAPPED_CASES, MAPPED_KEYSETS, REPO, SHORT, ZIPF_CASES, Case, Mode, Result, log
from .dataset import build_dataset
from .healthz import run_healthz
from .keys import chunk_sequences, write_paths, zipf_sequences
from .load import h2load_binary, wrk_binary
from .long_runs import run_rss, tensorstore_read
from .measure import Target, launch_peers, run_groups
from .nginx import nginx_binary
from .prepare import prepare_key_sets, start_gateways
from .processes import Server, stop_all
from .profiling import resummarize
from .report import chart, compute_ratios, machine, markdown, update_readme
from .run import Run
from .viewer import viewer_times
from .zipf import run_zipf


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="scripts/bench", description=(package_doc or "").split("\n\n")[0])
    parser.add_argument(
        "--short", action="store_true", help="CI mode: a second per case, cases side by side, small workloads"
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench-out", help="results directory (default bench-out)")
    parser.add_argument("--work", type=Path, help="data and scratch directory (default OUT/work)")
    parser.add_argument("--workers", type=int, help="workers of every Python server (default: 1 short, 2 full)")
    parser.add_argument("--duration", type=int, help="seconds measured per case and round (default: 2 short, 6 full)")
    parser.add_argument("--profile", type=int, help="seconds of py-spy sampling of the gateway (0: off)")
    parser.add_argument("--rss-requests", type=int, help="requests of the long RSS run (default: 10⁶ in full mode)")
    parser.add_argument("--readme", type=Path, help="also put the table between bench markers in this file")
    parser.add_argument("--keep", action="store_true", help="keep static files and logs in the work directory")
    parser.add_argument(
        "--report-from",
        type=Path,
        metavar="RESULTS_JSON",
        help="measure nothing: write the report (and --readme) again from a run's results.json and raw profiles",
    )
    args = parser.parse_args(argv)
    if args.report_from:
        return report_again(args.report_from.resolve(), args.readme)

    mode = SHORT if args.short else FULL
    overrides = {}
    if args.duration:
        overrides["duration"] = args.duration
    if args.rss_requests:
        overrides["rss_requests"] = args.rss_requests
    if overrides:
        mode = Mode(**{**asdict(mode), **overrides})
    out = args.out.resolve()
    work = (args.work or out / "work").resolve()
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    workers = args.workers or mode.workers
    run = Run(mode, out, work, workers, mode.profile if args.profile is None else args.profile)
    run.logs.mkdir(parents=True, exist_ok=True)
    tools = (("wrk", wrk_binary()), ("nginx", nginx_binary()), ("h2load", h2load_binary()))
    missing = [tool for tool, found in tools if not found]
    if missing:
        print(f"bench: {' and '.join(missing)} not installed; run scripts/install-system-packages", file=sys.stderr)
        return 2
    info = machine()
    log(f"{mode.name} mode; {info['cores']} cores ({info['cpu']}); results in {out}")
    facts = build_dataset(run.root, mode)
    sequences = chunk_sequences(mode)
    for name, requests in sequences.items():
        write_paths(run.paths(name), requests)

    gateways: dict[tuple[str, str], Server] = {}
    peers: dict[Case, Target] = {}
    try:
        gateways = start_gateways(run)
        peers = launch_peers(run, sequences)
        prepare_key_sets(run, gateways, sequences)
    except Exception as exc:
        stop_all([*gateways.values(), *(target.server for target in peers.values())])
        gateways = {}
        for case in [*CASES, *MAPPED_CASES, *ZIPF_CASES]:
            run.fail(case, f"preparing the key sets failed: {type(exc).__name__}: {exc}")
    if gateways:
        try:
            run_groups(run, sequences, gateways, peers)
            run_groups(run, sequences, gateways, {}, MAPPED_CASES, MAPPED_KEYSETS)
        finally:
            stop_all(gateways.values())
        run_zipf(run, zipf_sequences(mode))
        run.extras["tensorstore"] = tensorstore_read(run)
        run.extras["viewer"] = viewer_row(run)
    run_healthz(run, sequences["small"], facts["small_files"])
    run_rss(run, sequences["many"], facts["many_files"])

    compute_ratios(run)
    table = markdown(run, info, facts)
    (out / "results.md").write_text(table)
    document = {
        "machine": info,
        "mode": asdict(mode),
        "workers": run.workers,
        "data": facts,
        "results": [asdict(r) for r in run.results.values()],
        "extras": run.extras,
        "failures": run.failures,
    }
    (out / "results.json").write_text(json.dumps(document, indent=2) + "\n")
    chart(run, out / "results.png", info)
    if args.readme:
        update_readme(args.readme, table)
    if not args.keep:
        shutil.rmtree(work / "static", ignore_errors=True)
        shutil.rmtree(run.logs, ignore_errors=True)
    print(table)
    log(f"wrote {out / 'results.md'}, {out / 'results.json'} and {out / 'results.png'}")
    if run.failures:
        print("bench: some cases failed:\n" + "\n".join(f"  {f}" for f in run.failures), file=sys.stderr)
        return 1
    return 0


def report_again(results: Path, readme: Path | None) -> int:
    """results.md, results.png (and the README's block) from a stored run, its profiles summarized again."""
    document = json.loads(results.read_text())
    out = results.parent
    run = Run(Mode(**document["mode"]), out, out / "work", document["workers"], document["mode"]["profile"])
    for stored in document["results"]:
        result = Result(**stored)
        run.results[(result.case, result.keyset)] = result
    run.extras = document["extras"]
    run.failures = document["failures"]
    profiles = run.extras.get("profile") or {}
    for name, profile in profiles.items():
        profiles[name] = resummarize(profile, out, run.workers)
    compute_ratios(run)
    table = markdown(run, document["machine"], document["data"])
    (out / "results.md").write_text(table)
    results.write_text(json.dumps({**document, "extras": run.extras}, indent=2) + "\n")
    chart(run, out / "results.png", document["machine"])
    if readme:
        update_readme(readme, table)
    log(f"wrote {out / 'results.md'} and {out / 'results.png'} again from {results}")
    return 0


def viewer_row(run: Run) -> dict[str, Any]:
    """Neuroglancer's time to a loaded view (benchmark.viewer); a failure is recorded, not raised."""
    try:
        return viewer_times(run)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        run.failures.append(f"viewer: {error}")
        log(f"FAILED viewer: {error}")
        return {"error": error}


if __name__ == "__main__":
    sys.exit(main())
