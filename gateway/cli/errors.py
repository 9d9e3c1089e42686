"""The answer to a user's mistake on the command line."""

from gateway_storage.faults import Invalid


class CommandError(Invalid):
    """A mistake in what the user asked for: printed as one line, exit status ``status`` (see
    :func:`gateway.cli.main`)."""

    status = 1


class NamesNothing(CommandError):
    """An argument that names nothing the data root holds: exit status 2, as argparse answers a bad argument, so
    a script tells "no such dataset" from a setting that is missing."""

    status = 2
