"""The answer to a user's mistake on the command line."""

from gateway_storage.faults import Invalid


class CommandError(Invalid):
    """A mistake in what the user asked for: printed as one line, exit status 1 (see :func:`gateway.cli.main`)."""
