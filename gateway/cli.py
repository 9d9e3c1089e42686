"""``zarr-gateway serve`` and ``zarr-gateway make-sample``."""

import argparse
from pathlib import Path

from .settings import Settings


def _settings_from(args: argparse.Namespace) -> Settings:
    """Command-line flags over environment variables over the settings file over the defaults."""
    from .startup import load_settings

    return load_settings({k: v for k, v in vars(args).items() if k in Settings.model_fields and v is not None})


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    from .startup import prepare

    settings = _settings_from(args)
    cleanup = prepare(settings)
    try:
        uvicorn.run(
            "gateway.http.app:create_app_from_env",
            factory=True,
            host=settings.host,
            port=settings.port,
            workers=settings.workers,
            access_log=False,
            log_config=None,
            timeout_graceful_shutdown=settings.graceful_timeout,
            http="gateway.serving:OneWriteHttpToolsProtocol",  # a killed replica never leaves half an answer
        )
    finally:
        cleanup()


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
    run.add_argument("--threads", type=int)
    run.add_argument(
        "--settings-file", dest="settings_file", help="JSON or KEY=VALUE file (ZARR_GATEWAY_SETTINGS_FILE)"
    )
    run.add_argument("--log-format", dest="log_format", help="json or text")
    run.add_argument("--drain-seconds", dest="drain_seconds", type=float)
    run.add_argument("--graceful-timeout", dest="graceful_timeout", type=float)
    run.add_argument("--metrics-dir", dest="metrics_dir")
    run.add_argument("--tokens-reload-seconds", dest="tokens_reload_seconds", type=float)
    run.add_argument("--settle-seconds", dest="settle_seconds", type=float)
    run.add_argument("--extra-roots", dest="extra_roots", help="trusted directories besides the root, dir:dir")
    run.set_defaults(func=serve)
    sample = commands.add_parser("make-sample", help="write a small sample dataset into DIRECTORY")
    sample.add_argument("directory")
    sample.set_defaults(func=make_sample)
    args = parser.parse_args(argv)
    args.func(args)
