"""``zarr-gateway serve``: the gateway over HTTP, in the server the settings name."""

import argparse

from ..extras import MissingExtraError
from ..settings import Settings
from .errors import CommandError
from .flags import add_setting_flags, flag_name, settings_from
from .servers import SERVERS


def serve(args: argparse.Namespace) -> None:
    from ..startup import prepare

    settings = settings_from(args)
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


def add_command(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
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
