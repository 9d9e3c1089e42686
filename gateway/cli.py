"""``zarr-gateway serve``, ``share``, ``make-sample``, ``index-segments`` and ``mesh-segments``.

Each command answers a user's mistake (a missing directory, a sample that exists, a missing extra) with one
line on standard error and exit status 1, as the settings errors do: :class:`CommandError` is that answer.
"""

import argparse
import asyncio
import logging
import math
import os
import posixpath
import re
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic.fields import FieldInfo

from .extras import BATCH, GRANIAN, MESHES, Extra, MissingExtraError
from .settings import ENV_PREFIX, Settings

APP_FACTORY = "gateway.http.app:create_app_from_env"
DESCRIPTION = (
    "Serve webKnossos WKW, Zarr v2/v3, N5 and Neuroglancer precomputed datasets as Zarr v2 and v3 over HTTP, "
    "without converting them. Run 'zarr-gateway COMMAND --help' for a command's options."
)
log = logging.getLogger("gateway")
# How index-segments runs unless told otherwise: in this process, blocks of the meshes' default size.
INDEX_RUN_DEFAULTS: dict[str, Any] = {"workers": None, "scheduler": None, "work_dir": None, "block_cubes": None}


class CommandError(Exception):
    """A mistake in what the user asked for: printed as one line, exit status ``status`` (see :func:`main`)."""

    status = 1


class NamesNothing(CommandError):
    """An argument that names nothing the data root holds: exit status 2, as argparse answers a bad argument, so
    a script tells "no such dataset" from a setting that is missing."""

    status = 2


def _settings_from(args: argparse.Namespace) -> Settings:
    """Command-line flags over environment variables over the settings file over the defaults."""
    from .startup import load_settings

    return load_settings({k: v for k, v in vars(args).items() if k in Settings.model_fields and v is not None})


def serve(args: argparse.Namespace) -> None:
    from .startup import prepare

    settings = _settings_from(args)
    server = SERVERS[settings.server]
    if server.extra is not None:  # before start-up says anything: the refusal is the only line
        try:
            server.extra.require(f"server={settings.server}")
        except MissingExtraError as exc:
            raise CommandError(str(exc)) from None
    cleanup = prepare(settings)
    try:
        server.run(settings)
    finally:
        cleanup()


def share(args: argparse.Namespace) -> None:
    """Print a share link of a dataset (signed with the serving settings' key), or revoke one by its id."""
    from .http.handlers.share import expiry_text, share_url
    from .http.share import ShareKey, ShareKeyError, revoke
    from .http.urls import TREE_ROUTES

    settings = _settings_from(args)
    if args.revoke is not None:
        if settings.share_revoked_file is None:
            raise CommandError("--revoke needs the share_revoked_file setting (ZARR_GATEWAY_SHARE_REVOKED_FILE)")
        try:
            added = revoke(settings.share_revoked_file, args.revoke)
        except (ValueError, OSError) as exc:
            raise CommandError(str(exc)) from None
        print(f"share link {args.revoke} {'revoked' if added else 'was revoked already'}", file=sys.stderr)
        return
    if args.dataset is None or args.expires is None:
        raise CommandError("share needs ORGANIZATION/DATASET and --expires SECONDS (or --revoke ID)")
    organization, slash, name = args.dataset.partition("/")
    if not slash or not organization or not name or "/" in name:
        raise CommandError(f"{args.dataset!r} is not ORGANIZATION/DATASET")
    if args.expires <= 0:
        raise CommandError("--expires is the link's lifetime in seconds, at least 1")
    if args.tree not in TREE_ROUTES:
        raise CommandError(f"unknown tree {args.tree!r}; there are {', '.join(TREE_ROUTES)}")
    if settings.share_key_file is None:
        raise CommandError("share needs the share_key_file setting (ZARR_GATEWAY_SHARE_KEY_FILE), as serve does")
    try:
        key = ShareKey.load(settings.share_key_file)
    except ShareKeyError as exc:
        raise CommandError(str(exc)) from None
    if name not in _dataset_names(settings, organization):  # a link to nothing would only ever answer 404
        raise NamesNothing(f"there is no dataset {args.dataset!r} under the data root {settings.root}")
    base = (args.base_url or settings.public_url or f"http://{settings.host}:{settings.port}").rstrip("/")
    claims, capability = key.issue(organization, name, args.expires)
    print(share_url(base, capability, args.tree, organization, name))
    print(f"id {claims.id}, expires {expiry_text(claims.expires)}", file=sys.stderr)


def _dataset_names(settings: Settings, organization: str) -> list[str]:
    """The datasets of ``organization`` as the served catalog lists them (a directory with a properties file)."""
    from gateway_storage import StorageError, open_store, read_headers_file

    from .sources.catalog import Catalog
    from .sources.registry import SourceFormats

    headers = read_headers_file(str(settings.store_headers_file)) if settings.store_headers_file else {}
    store = open_store(settings.root, settings.extra_roots, remote_roots=settings.remote_roots, headers=headers)
    try:
        return Catalog(store, SourceFormats(store, 0)).dataset_names(organization)
    except (OSError, StorageError) as exc:  # a storage fault: say it, never "no such dataset"
        raise CommandError(f"the data root {settings.root} cannot be listed: {exc}") from None


def _run_uvicorn(settings: Settings) -> None:
    import uvicorn

    uvicorn.run(
        APP_FACTORY,
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        access_log=False,  # the gateway writes its own access lines
        log_config=None,
        timeout_graceful_shutdown=math.ceil(settings.graceful_timeout),  # whole seconds, as Granian takes it
        http="gateway.serving:OneWriteHttpToolsProtocol",  # a killed replica never leaves half an answer
    )


def _run_granian(settings: Settings) -> None:
    """Granian: a supervisor process and ``workers`` worker processes, each running the app factory.

    On SIGTERM the supervisor closes its copy of the listening socket and sends SIGTERM to every
    worker; it kills a worker that has not finished ``drain_seconds + graceful_timeout`` later.
    """
    from granian.constants import HTTPModes, Interfaces
    from granian.http import HTTP1Settings
    from granian.server import Server

    server = Server(
        "gateway.cli:granian_worker_app",
        address=settings.host,
        port=settings.port,
        interface=Interfaces.ASGI,
        workers=settings.workers,
        http=HTTPModes.http1,
        # The limits on request heads, as uvicorn gets them from gateway.serving: a longer head is a 431,
        # a head not sent within header_timeout closes the connection.
        http1_settings=HTTP1Settings(
            header_read_timeout=max(1, round(settings.header_timeout * 1000)), max_buffer_size=settings.max_header_bytes
        ),
        websockets=False,
        factory=True,
        log_access=False,  # the gateway writes its own access lines
        # Granian's own lines go through the gateway's handler (JSON or text), as uvicorn's do.
        log_dictconfig={"loggers": {"_granian": {"propagate": True}, "granian.access": {"propagate": True}}},
        workers_kill_timeout=max(1, math.ceil(settings.drain_seconds + settings.graceful_timeout)),
    )
    _granian_supervisor.append(server)  # a forked worker finds it here: see granian_worker_app
    server.serve()


@dataclass(frozen=True, slots=True)
class HttpServer:
    run: Callable[[Settings], None]
    extra: Extra | None  # the pip extra it needs beyond the core


SERVERS = {"uvicorn": HttpServer(_run_uvicorn, None), "granian": HttpServer(_run_granian, GRANIAN)}
_granian_supervisor: list[Any] = []  # the supervisor's Server, as a forked worker inherits it
_early_sigterm: list[int] = []  # SIGTERMs a worker received before its event loop could act on them


def granian_worker_app() -> Any:
    """The app factory as a Granian worker calls it, with SIGTERM routed through the gateway's drain.

    A Granian worker stops serving as soon as its event loop sees SIGTERM or SIGINT (handlers added
    with ``loop.add_signal_handler`` just after this factory returns). The gateway's lifespan puts its
    drain (``/readyz`` fails, ``drain_seconds`` pass) in front of whatever Python handler SIGTERM has
    when the lifespan starts. So before the lifespan runs, SIGTERM is taken off the loop and given a
    plain handler that raises SIGINT, which the loop still answers with Granian's graceful stop: the
    drain comes first, then Granian stops accepting and finishes the requests in flight.

    A SIGTERM that comes while the worker starts would be lost: a forked worker inherits the
    supervisor's handler, which only marks the supervisor's (copied) state, and the worker would
    serve on after its siblings stopped. Such a SIGTERM, noted in that state or by this factory's
    own handler, ends the worker as soon as its loop runs, before Granian has made its server: it
    has accepted nothing, so there is nothing to drain. It exits at once rather than through
    Granian's graceful stop, which was seen to hang, under load, when asked this early.
    """
    from .http.app import create_app_from_env
    from .serving import StrictFraming

    signal.signal(signal.SIGTERM, lambda signum, frame: _early_sigterm.append(signum))
    _sigterm_when_the_supervisor_dies()
    app = StrictFraming(create_app_from_env())
    loop = asyncio.get_event_loop()
    loop.call_soon(_route_sigterm_through_sigint, loop)  # runs before the lifespan's first step
    return app


def _sigterm_when_the_supervisor_dies() -> None:
    """Linux: a worker whose supervisor dies, even by SIGKILL, gets SIGTERM instead of serving on as an orphan.

    (A forked worker of a supervisor that is already gone is stopped by the same check as an early SIGTERM.)
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _route_sigterm_through_sigint(loop: asyncio.AbstractEventLoop) -> None:
    if not loop.remove_signal_handler(signal.SIGTERM):
        log.warning("granian worker: no SIGTERM handler on the event loop; SIGTERM stops the worker without a drain")
        return

    def stop_granian(signum: int, frame: Any) -> None:
        os.kill(os.getpid(), signal.SIGINT)

    signal.signal(signal.SIGTERM, stop_granian)
    orphaned = any(os.getppid() != getattr(server, "pid", None) for server in _granian_supervisor)
    interrupted = any(getattr(server, "interrupt_signal", False) for server in _granian_supervisor)
    if _early_sigterm or interrupted or orphaned:
        log.info("granian worker: SIGTERM while starting, or its supervisor is gone; exiting")
        logging.shutdown()
        os._exit(0)


def make_sample(args: argparse.Namespace) -> None:
    from .sample import DATASET, ORGANIZATION
    from .sample import make_sample as write_sample

    root = Path(args.directory)
    existing = root / ORGANIZATION / DATASET
    if existing.exists() and not args.overwrite:
        raise CommandError(f"make-sample: {existing} already exists; pass --overwrite to write it again")
    if root.exists() and not root.is_dir():
        raise CommandError(f"make-sample: {root} is not a directory")
    try:
        path = write_sample(root)
    except MissingExtraError as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"make-sample: cannot write into {root}: {exc.strerror or exc}") from None
    print(f"sample dataset written to {path}")
    if MESHES.missing() is not None:  # no meshes are served, so no index is needed for them
        print(f"no segment index written: meshes need the {MESHES.name!r} extra ({MESHES.install_hint()})")
        return
    # Its segment index, so that the dataset page opens Neuroglancer with the largest cells selected.
    index_segments(
        argparse.Namespace(
            root=args.directory,
            dataset=f"{path.parent.name}/{path.name}",
            layer="segmentation",
            segment_index_dir=None,
            **INDEX_RUN_DEFAULTS,
        )
    )


def index_segments(args: argparse.Namespace) -> None:
    """Build the segment index of one segmentation layer (see gateway/meshes/index.py), block by block in this
    process or on dask.distributed (gateway/batch); a run started again resumes from the blocks it finished."""
    command = "index-segments"
    _require_batch_extras(command, args)
    from .batch.segment_index import DatasetNotFound, SegmentIndexTask, SegmentLayer
    from .meshes.build import BLOCK_CUBES
    from .meshes.errors import MeshInputError, MeshNotFound, MeshTooLarge
    from .meshes.segments import index_place

    root = _batch_root(command, args)
    block_cubes = BLOCK_CUBES if args.block_cubes is None else args.block_cubes
    if block_cubes < 1:
        raise CommandError(f"{command}: --block-cubes {args.block_cubes}: at least one cube per edge")
    organization, _, name = args.dataset.partition("/")
    layer = SegmentLayer(root, organization, name, args.layer)
    try:
        storage, meshes = layer.open()
        place = index_place(storage, args.segment_index_dir or None)
        location = place.location(meshes.dataset, args.layer)
        selection = _selection(command, args)
        task = SegmentIndexTask(layer, storage, meshes, location, block_cubes, selection, place.store)
    except MeshTooLarge as exc:  # no fragment of it could be made either: an index would serve nothing
        raise CommandError(f"{command}: layer {args.layer!r} cannot be indexed: {exc}") from None
    except (MeshInputError, MeshNotFound, DatasetNotFound) as exc:
        raise CommandError(f"{command}: {exc}") from None
    summary = _run_blocks(command, args, task, posixpath.dirname(location))
    print(
        f"{task.segments} segments of {args.dataset}/{args.layer} indexed in {summary.seconds:.1f} s "
        f"({summary.voxels_per_second / 1e6:.1f} M voxels/s), written to {summary.result}"
    )
    for line in summary.lines():
        print(f"  {line}")


def mesh_segments(args: argparse.Namespace) -> None:
    """Make the stored multi-resolution mesh set of one segmentation layer (see gateway/meshes/stored.py), which
    the gateway serves for every segment, those too large to mesh on demand included."""
    command = "mesh-segments"
    _require_batch_extras(command, args)
    from .batch.mesh_sets import MeshSetTask
    from .batch.segment_index import DatasetNotFound
    from .meshes.errors import MeshInputError, MeshNotFound, SegmentIndexRequired
    from .meshes.stored import MeshSetBlockFailed

    root = _batch_root(command, args)
    selection = _selection(command, args)
    try:
        task = MeshSetTask.for_layer(root, args.dataset, args.layer, args.segment_index_dir or None, selection)
    except SegmentIndexRequired as exc:
        raise CommandError(f"{command}: --dust-threshold needs the layer's voxel counts: {exc}") from None
    except (MeshInputError, MeshNotFound, DatasetNotFound, MeshSetBlockFailed) as exc:
        raise CommandError(f"{command}: {exc}") from None
    summary = _run_blocks(command, args, task, posixpath.dirname(task.directory), keep_going=True)
    print(
        f"the meshes of {args.dataset}/{args.layer} made in {summary.seconds:.1f} s "
        f"({summary.voxels_per_second / 1e6:.1f} M voxels/s), written to {summary.result}"
    )
    for line in summary.lines():
        print(f"  {line}")
    left_out = [f"  block {f.key}: {f.reason}" for f in summary.failed] + [
        f"  segment {s.segment} at level {s.lod} {list(s.position)}: {s.reason}" for s in task.skipped
    ]
    if left_out:
        print(
            f"left out of the set ({len(summary.failed)} blocks, {len(task.skipped)} fragments):", *left_out, sep="\n"
        )
        if args.strict:
            raise CommandError(f"{command}: {len(left_out)} parts of the layer could not be meshed (--strict)")


def _require_batch_extras(command: str, args: argparse.Namespace) -> None:
    try:
        MESHES.require(f"zarr-gateway {command}")
        if args.workers is not None or args.scheduler is not None:
            BATCH.require(f"zarr-gateway {command} --workers/--scheduler")
    except MissingExtraError as exc:
        raise CommandError(str(exc)) from None


def _batch_root(command: str, args: argparse.Namespace) -> str:
    """The data root as every worker opens it (absolute: a worker of an existing cluster has a working directory
    of its own), once the command's flags are known to be usable."""
    from gateway_storage import store_kind

    if store_kind(args.root) is None and not Path(args.root.removeprefix("file://")).is_dir():
        raise CommandError(f"{command}: data root {args.root} not found (not a directory)")
    if args.workers is not None and args.workers < 1:
        raise CommandError(f"{command}: --workers {args.workers}: at least one worker process")
    return args.root if store_kind(args.root) is not None else str(Path(args.root.removeprefix("file://")).resolve())


def _run_blocks(command: str, args: argparse.Namespace, task: Any, beside: str, keep_going: bool = False) -> Any:
    """Run ``task``'s blocks where the flags say (this process, a LocalCluster, an existing scheduler), keeping
    their outputs in the work directory (default: ``LAYER.batch-work`` in ``beside``, a local directory or a
    prefix in the data root's object store) until it is finished; ``keep_going``: finished without the blocks
    that failed (the summary lists them)."""
    from gateway_storage import store_kind

    from .batch.outputs import BlockOutputs
    from .batch.runner import InProcess, LocalWorkers, RunFailed, Scheduler, run_task
    from .meshes.build import DataChangedWhileIndexing
    from .meshes.stored import MeshSetBlockFailed

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


def _selection(command: str, args: argparse.Namespace) -> Any:
    """The segments a run keeps, from ``--dust-threshold`` and ``--segments`` / ``--segments-file``."""
    from .meshes.errors import MeshInputError
    from .meshes.names import parse_segment_id
    from .meshes.selection import SegmentSelection

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
    from .batch.runner import ClusterPorts

    if not re.fullmatch(r"(\d{1,5}(:\d{1,5})?)?", args.dask_worker_ports):
        raise CommandError(f"{command}: --worker-ports {args.dask_worker_ports!r}: FIRST:LAST, one port, or empty")
    dashboard = args.dask_dashboard_address
    return ClusterPorts(
        None if dashboard.lower() in ("", "none") else dashboard, args.dask_scheduler_port, args.dask_worker_ports
    )


def plain(text: str) -> str:
    """Help text as a terminal shows it: without the double backticks docstrings mark code with."""
    return text.replace("``", "'")


def flag_name(setting: str) -> str:
    return "--" + setting.replace("_", "-")


def add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """A flag for every setting, made from the settings model: a new setting gets its flag with no second edit.

    A flag left out is ``None`` and leaves the setting to the environment, the settings file or its default.
    """
    for name, field in Settings.model_fields.items():
        given = not field.is_required() and field.default_factory is None and field.default not in (None, ())
        shown = f"; default {field.default}" if given else ""
        if field.is_required():  # a flag to argparse, as the variable or the settings file may give it instead
            shown = "; REQUIRED: this flag, the variable or the settings file"
        description = plain(field.description or name).replace("%", "%%")
        parser.add_argument(
            flag_name(name), dest=name, help=f"{description} ({ENV_PREFIX}{name.upper()}{shown})", **_flag_kind(field)
        )


def _flag_kind(field: FieldInfo) -> dict[str, Any]:
    """argparse's type, choices or action for a setting; anything else is passed as text, for the model to parse."""
    annotation = field.annotation
    if get_origin(annotation) in (Union, UnionType):  # an optional setting, X | None; wider unions as text
        kinds = [arg for arg in get_args(annotation) if arg is not type(None)]
        annotation = kinds[0] if len(kinds) == 1 else str
    if get_origin(annotation) is Literal:
        choices = list(get_args(annotation))
        return {"choices": choices, "type": type(choices[0])}
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return {"choices": [member.value for member in annotation]}
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction}
    if annotation in (int, float):
        return {"type": annotation}
    return {}


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except CommandError as exc:
        print(f"zarr-gateway: {exc}", file=sys.stderr)
        sys.exit(exc.status)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("zarr-gateway")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zarr-gateway", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"zarr-gateway {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    required = " ".join(
        f"{flag_name(name)} {name.upper()}" for name, f in Settings.model_fields.items() if f.is_required()
    )
    run = commands.add_parser(
        "serve",
        help="serve a data root as Zarr v2 and v3 over HTTP",
        description="Serve a data root over HTTP.",
        usage=f"zarr-gateway serve {required} [OPTIONS]",
    )
    add_setting_flags(run)
    run.set_defaults(func=serve)
    link = commands.add_parser(
        "share",
        help="print a read-only link to one dataset that expires (or revoke one), signed with share_key_file",
        description="Print a share link: read access to ORGANIZATION/DATASET for --expires seconds, for any client "
        "and viewer without a header. Takes the same settings as serve (the key from share_key_file). "
        "With --revoke ID, add a link's id to share_revoked_file instead.",
    )
    link.add_argument("dataset", nargs="?", metavar="ORGANIZATION/DATASET", help="the dataset the link reads")
    link.add_argument("--expires", type=int, metavar="SECONDS", help="how long the link is valid")
    link.add_argument(
        "--base-url",
        dest="base_url",
        metavar="URL",
        help="where clients reach the gateway (default: public_url, else http://HOST:PORT)",
    )
    link.add_argument(
        "--tree",
        default="zarr3",
        metavar="TREE",
        help="the tree whose dataset page the link opens (default zarr3; every tree of the dataset works below it)",
    )
    link.add_argument("--revoke", metavar="ID", help="revoke the link of this id (printed when it was made)")
    add_setting_flags(link)
    link.set_defaults(func=share)
    sample = commands.add_parser(
        "make-sample",
        help="write a small sample dataset (color and segmentation layers) into DIRECTORY",
        description="Write the sample dataset DIRECTORY/sample_org/sample_dataset and its segment index.",
    )
    sample.add_argument(
        "directory", metavar="DIRECTORY", help="the data root to write into (made if missing), e.g. sample-data"
    )
    sample.add_argument("--overwrite", action="store_true", help="write the sample again where one exists")
    sample.set_defaults(func=make_sample)
    index = commands.add_parser(
        "index-segments",
        help="index which cubes hold each segment of a segmentation layer, for its meshes",
        description="Index which cubes hold each segment of a segmentation layer, for its meshes.",
    )
    _add_batch_arguments(index, "the index")
    index.add_argument(
        "--block-cubes",
        dest="block_cubes",
        type=int,
        default=INDEX_RUN_DEFAULTS["block_cubes"],
        metavar="K",
        help="level-0 cubes (64 voxels) per edge of a block, one task each (default: blocks of a few hundred MiB "
        "at most; larger blocks make fewer tasks that each hold more memory)",
    )
    index.set_defaults(func=index_segments)
    meshes = commands.add_parser(
        "mesh-segments",
        help="make the multi-resolution meshes of every segment of a layer, for the gateway to serve as stored",
        description="Make the multi-resolution meshes of every segment of a segmentation layer (Neuroglancer's "
        "sharded format), for the gateway to serve as stored: segments too large to mesh on demand included.",
    )
    _add_batch_arguments(meshes, "the mesh set")
    meshes.add_argument(
        "--strict",
        action="store_true",
        help="exit non-zero when a block or a segment's fragment could not be meshed (by default the set is "
        "finished without them, and they are listed)",
    )
    meshes.set_defaults(func=mesh_segments)
    return parser


def _add_batch_arguments(parser: argparse.ArgumentParser, result: str) -> None:
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
