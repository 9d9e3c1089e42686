"""``zarr-gateway serve``, ``share``, ``make-sample``, ``index-segments`` and ``mesh-segments``: one module each
(the HTTP servers ``serve`` runs in :mod:`.servers`, what the two batch commands share in :mod:`.batch`).

Each command answers a user's mistake (a missing directory, a sample that exists, a missing extra) with one
line on standard error and exit status 1, as the settings errors do: :class:`~.errors.CommandError` is that answer.
"""

import argparse
import sys

from . import index_segments, make_sample, mesh_segments, serve, share
from .errors import CommandError

DESCRIPTION = (
    "Serve webKnossos WKW, Zarr v2/v3, N5 and Neuroglancer precomputed datasets as Zarr v2 and v3 over HTTP, "
    "without converting them. Run 'zarr-gateway COMMAND --help' for a command's options."
)


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
    for command in (serve, share, make_sample, index_segments, mesh_segments):
        command.add_command(commands)
    return parser
