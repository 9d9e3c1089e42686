"""``zarr-gateway serve``, ``zarr-gateway make-sample`` and ``zarr-gateway index-segments``."""

import argparse
import asyncio
import logging
import math
import os
import signal
import sys
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic.fields import FieldInfo

from .extras import GRANIAN, MissingExtraError
from .settings import ENV_PREFIX, Settings

APP_FACTORY = "gateway.http.app:create_app_from_env"
log = logging.getLogger("gateway")


def _settings_from(args: argparse.Namespace) -> Settings:
    """Command-line flags over environment variables over the settings file over the defaults."""
    from .startup import load_settings

    return load_settings({k: v for k, v in vars(args).items() if k in Settings.model_fields and v is not None})


def serve(args: argparse.Namespace) -> None:
    from .startup import prepare

    settings = _settings_from(args)
    cleanup = prepare(settings)
    try:
        SERVERS[settings.server](settings)
    except MissingExtraError as exc:  # raised before a port is bound
        sys.exit(f"zarr-gateway: {exc}")
    finally:
        cleanup()


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
    GRANIAN.require("server=granian")
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


SERVERS: dict[str, Callable[[Settings], None]] = {"uvicorn": _run_uvicorn, "granian": _run_granian}
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

    signal.signal(signal.SIGTERM, lambda signum, frame: _early_sigterm.append(signum))
    _sigterm_when_the_supervisor_dies()
    app = create_app_from_env()
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
    from .sample import make_sample as write_sample

    try:
        path = write_sample(Path(args.directory))
    except MissingExtraError as exc:
        sys.exit(f"zarr-gateway: {exc}")
    print(f"sample dataset written to {path}")
    # Its segment index, so that the dataset page opens Neuroglancer with the largest cells selected.
    index_segments(
        argparse.Namespace(
            root=args.directory, dataset=f"{path.parent.name}/{path.name}", layer="segmentation", segment_index_dir=None
        )
    )


def index_segments(args: argparse.Namespace) -> None:
    """Build the segment index of one segmentation layer (see gateway/meshes/index.py)."""
    from gateway_storage import open_store

    from .meshes.build import DataChangedWhileIndexing, index_layer
    from .meshes.errors import MeshInputError, MeshNotFound
    from .meshes.service import MeshService
    from .sources.catalog import BrokenDataset, Catalog
    from .sources.registry import SourceFormats
    from .sources.units import meters_per_unit

    organization, _, name = args.dataset.partition("/")
    index_dir = Path(args.segment_index_dir) if args.segment_index_dir else None
    storage = open_store(args.root)
    catalog = Catalog(storage, SourceFormats(storage, 128 << 20))
    dataset = catalog.dataset(organization, name)
    if dataset is None or isinstance(dataset, BrokenDataset):
        sys.exit(f"no servable dataset {args.dataset!r} under {args.root}" + (f": {dataset.reason}" if dataset else ""))
    service = MeshService(storage, index_dir, 64 << 20, meters_per_unit)
    try:
        built = index_layer(service, dataset, args.layer, progress=sys.stderr.isatty())
    except (MeshInputError, MeshNotFound, DataChangedWhileIndexing) as exc:
        sys.exit(f"index-segments: {exc}")
    print(
        f"{len(built.index)} segments of {args.dataset}/{args.layer} indexed in {built.seconds:.1f} s "
        f"({built.voxels_per_second / 1e6:.1f} M voxels/s), written to {built.path}"
    )


def flag_name(setting: str) -> str:
    return "--" + setting.replace("_", "-")


def add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """A flag for every setting, made from the settings model: a new setting gets its flag with no second edit.

    A flag left out is ``None`` and leaves the setting to the environment, the settings file or its default.
    """
    for name, field in Settings.model_fields.items():
        given = not field.is_required() and field.default_factory is None and field.default not in (None, ())
        shown = f"; default {field.default}" if given else ""
        description = (field.description or name).replace("%", "%%")
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
    args.func(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zarr-gateway", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("serve", help="serve a data root as Zarr v2 and v3 over HTTP")
    add_setting_flags(run)
    run.set_defaults(func=serve)
    sample = commands.add_parser("make-sample", help="write a small sample dataset into DIRECTORY")
    sample.add_argument("directory")
    sample.set_defaults(func=make_sample)
    index = commands.add_parser(
        "index-segments", help="index which cubes hold each segment of a segmentation layer, for its meshes"
    )
    index.add_argument("root", help="data root (a directory)")
    index.add_argument("dataset", help="ORGANIZATION/DATASET")
    index.add_argument("layer", help="the segmentation layer")
    index.add_argument(
        "--segment-index-dir",
        dest="segment_index_dir",
        default=os.environ.get("ZARR_GATEWAY_SEGMENT_INDEX_DIR") or None,
        help="write into this directory instead of beside the layer (ZARR_GATEWAY_SEGMENT_INDEX_DIR)",
    )
    index.set_defaults(func=index_segments)
    return parser
