"""What ``index-segments`` and ``mesh-segments`` share: their arguments, and running a layer's blocks in this
process or on dask.distributed."""

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

from ..extras import BATCH, MESHES, MissingExtraError
from ..settings import ENV_PREFIX, Settings
from .errors import CommandError
from .flags import flag_name, plain


def require_batch_extras(command: str, args: argparse.Namespace) -> None:
    try:
        MESHES.require(f"zarr-gateway {command}")
        if args.workers is not None or args.scheduler is not None:
            BATCH.require(f"zarr-gateway {command} --workers/--scheduler")
    except MissingExtraError as exc:
        raise CommandError(str(exc)) from None


def batch_root(command: str, args: argparse.Namespace) -> str:
    """The data root as every worker opens it (absolute: a worker of an existing cluster has a working directory
    of its own), once the command's flags are known to be usable."""
    from gateway_storage import store_kind

    if store_kind(args.root) is None and not Path(args.root.removeprefix("file://")).is_dir():
        raise CommandError(f"{command}: data root {args.root} not found (not a directory)")
    if args.workers is not None and args.workers < 1:
        raise CommandError(f"{command}: --workers {args.workers}: at least one worker process")
    return args.root if store_kind(args.root) is not None else str(Path(args.root.removeprefix("file://")).resolve())


def run_blocks(command: str, args: argparse.Namespace, task: Any, beside: str, keep_going: bool = False) -> Any:
    """Run ``task``'s blocks where the flags say (this process, a LocalCluster, an existing scheduler), keeping
    their outputs in the work directory (default: ``LAYER.batch-work`` in ``beside``, a local directory or a
    prefix in the data root's object store) until it is finished; ``keep_going``: finished without the blocks
    that failed (the summary lists them)."""
    from gateway_storage import store_kind

    from ..batch.outputs import BlockOutputs
    from ..batch.runner import InProcess, LocalWorkers, RunFailed, Scheduler, run_task
    from ..meshes.build import DataChangedWhileIndexing
    from ..meshes.stored import MeshSetBlockFailed

    progress = sys.stderr.isatty()
    work_dir = args.work_dir or f"{beside}/{args.layer}.batch-work"
    if store_kind(work_dir) is None:
        work_dir = str(Path(work_dir.removeprefix("file://")).resolve())
    if args.scheduler is not None:
        executor: InProcess | LocalWorkers | Scheduler = Scheduler(args.scheduler, progress)
    elif args.workers is not None:
        executor = LocalWorkers(args.workers, progress, _cluster_ports(command, args))
    else:
        executor = InProcess(progress)
    try:
        return run_task(task, executor, BlockOutputs(work_dir, task.name, task.version()), keep_going=keep_going)
    except (RunFailed, DataChangedWhileIndexing, MeshSetBlockFailed) as exc:
        raise CommandError(f"{command}: {exc}") from None


MAX_SEGMENTS_FILE_BYTES = 256 << 20  # a file of ids larger than this is refused before it is read


def segment_selection(command: str, args: argparse.Namespace) -> Any:
    """The segments a run keeps, from ``--dust-threshold`` and ``--segments`` / ``--segments-file``."""
    from ..meshes.errors import MeshInputError
    from ..meshes.names import parse_segment_id
    from ..meshes.selection import SegmentSelection

    text: str | None = getattr(args, "segments", None)
    path: str | None = getattr(args, "segments_file", None)
    if path is not None:
        try:
            if os.path.getsize(path) > MAX_SEGMENTS_FILE_BYTES:
                raise CommandError(f"{command}: --segments-file {path}: more than {MAX_SEGMENTS_FILE_BYTES} bytes")
            with open(path) as handle:
                text = handle.read()
        except OSError as exc:
            raise CommandError(f"{command}: --segments-file {path}: {exc.strerror or exc}") from None
    try:
        ids = None if text is None else [parse_segment_id(part) for part in re.split(r"[\s,]+", text) if part]
        if ids is not None and not ids:
            raise CommandError(f"{command}: no segment ids given")
        return SegmentSelection.of(getattr(args, "dust_threshold", 0) or 0, ids)
    except (MeshInputError, ValueError) as exc:
        raise CommandError(f"{command}: {exc}") from None


def _cluster_ports(command: str, args: argparse.Namespace) -> Any:
    """Where a LocalCluster of ``--workers`` listens, from the ``dask_*`` flags (or settings)."""
    from ..batch.runner import ClusterPorts

    if not re.fullmatch(r"(\d{1,5}(:\d{1,5})?)?", args.dask_worker_ports):
        raise CommandError(f"{command}: --worker-ports {args.dask_worker_ports!r}: FIRST:LAST, one port, or empty")
    dashboard = args.dask_dashboard_address
    return ClusterPorts(
        None if dashboard.lower() in ("", "none") else dashboard, args.dask_scheduler_port, args.dask_worker_ports
    )


def add_batch_arguments(parser: argparse.ArgumentParser, result: str) -> None:
    """The arguments of a command that runs a layer's blocks in this process or on dask.distributed."""
    parser.add_argument("root", help="data root (a directory)")
    parser.add_argument("dataset", help="ORGANIZATION/DATASET")
    parser.add_argument("layer", help="the segmentation layer")
    parser.add_argument(
        "--segment-index-dir",
        dest="segment_index_dir",
        default=os.environ.get("ZARR_GATEWAY_SEGMENT_INDEX_DIR") or None,
        help="write into this directory instead of beside the layer (ZARR_GATEWAY_SEGMENT_INDEX_DIR)",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="run the blocks on a dask LocalCluster of N worker processes (default: one after the other in this "
        "process, which a layer of a few GiB needs no more than)",
    )
    where.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="run the blocks on an existing dask cluster, e.g. tcp://scheduler:8786; its workers must see the data "
        "root and the work directory at the same paths (see docs/distributed.md)",
    )
    parser.add_argument(
        "--dust-threshold",
        dest="dust_threshold",
        type=int,
        default=0,
        metavar="N",
        help="leave out segments of fewer than N voxels (at the finest mag), as igneous's dust_threshold; "
        "mesh-segments decides on the layer's segment index (default 0: every segment)",
    )
    subset = parser.add_mutually_exclusive_group()
    subset.add_argument(
        "--segments",
        metavar="ID,ID,...",
        help="only these segments, as igneous's object_ids (default: every segment)",
    )
    subset.add_argument(
        "--segments-file",
        dest="segments_file",
        metavar="PATH",
        help="only the segments whose ids this file lists (separated by commas, spaces or lines)",
    )
    for setting, metavar in (
        ("dask_dashboard_address", "HOST:PORT"),
        ("dask_scheduler_port", "PORT"),
        ("dask_worker_ports", "FIRST:LAST"),
    ):
        field = Settings.model_fields[setting]
        parser.add_argument(
            flag_name(setting.removeprefix("dask_")),
            dest=setting,
            type=str if field.annotation is str else int,
            default=os.environ.get(f"{ENV_PREFIX}{setting.upper()}") or field.default,
            metavar=metavar,
            help=f"with --workers: {plain(field.description or '')} ({ENV_PREFIX}{setting.upper()})",
        )
    parser.add_argument(
        "--work-dir",
        dest="work_dir",
        help=f"keep each block's output here until {result} is written, so that a run started again resumes "
        "(default: LAYER.batch-work beside it)",
    )
