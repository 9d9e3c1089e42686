"""``zarr-gateway serve`` and ``zarr-gateway make-sample``."""

import argparse
import logging
import os
import sys
from pathlib import Path

from pydantic import ValidationError

from .settings import Settings


def _configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _settings_from(args: argparse.Namespace) -> Settings:
    """Environment variables first, command-line flags over them."""
    flags = {k: v for k, v in vars(args).items() if k in Settings.model_fields and v is not None}
    try:
        return Settings(**flags)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        sys.exit(f"zarr-gateway: invalid settings: {problems}")


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    from .http.auth import Tokens, TokensFileError

    _configure_logging()
    settings = _settings_from(args)
    if settings.tokens_file is not None:
        try:
            Tokens.load(settings.tokens_file)
        except TokensFileError as exc:
            sys.exit(f"zarr-gateway: {exc}")
    shown = settings.model_dump(mode="json")
    logging.getLogger("gateway").info("settings: %s", {k: v for k, v in shown.items()})
    # Workers are separate processes: hand them the validated settings through the environment.
    for name, value in shown.items():
        if value is not None:
            os.environ[f"ZARR_GATEWAY_{name.upper()}"] = str(value)
    uvicorn.run(
        "gateway.http.app:create_app_from_env",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        access_log=False,
        log_config=None,
    )


def make_sample(args: argparse.Namespace) -> None:
    from .sample import make_sample as write_sample

    path = write_sample(Path(args.directory))
    print(f"sample dataset written to {path}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="zarr-gateway", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("serve", help="serve a data root as Zarr v2 and v3 over HTTP")
    run.add_argument("--root", help="data root (ZARR_GATEWAY_ROOT)")
    run.add_argument("--host")
    run.add_argument("--port", type=int)
    run.add_argument("--tokens-file", dest="tokens_file")
    run.add_argument("--workers", type=int)
    run.add_argument("--codec")
    run.add_argument("--chunk-edge", dest="chunk_edge", type=int)
    run.add_argument("--v3-layout", dest="v3_layout")
    run.add_argument("--cache-bytes", dest="cache_bytes", type=int)
    run.add_argument("--cache-control", dest="cache_control")
    run.set_defaults(func=serve)
    sample = commands.add_parser("make-sample", help="write a small sample dataset into DIRECTORY")
    sample.add_argument("directory")
    sample.set_defaults(func=make_sample)
    args = parser.parse_args(argv)
    args.func(args)
