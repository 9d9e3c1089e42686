"""The application factory: the gateway, its operations endpoints and the edge in front of them."""

import logging

from ..logs import configure_logging
from ..settings import Settings
from .data import Gateway
from .edge import Edge
from .ops import Ops

log = logging.getLogger("gateway")


def create_app(settings: Settings) -> Edge:
    gateway = Gateway(settings)
    if gateway.access.open:
        log.warning("no tokens file: the gateway is OPEN, every dataset is readable without a token")
    return Edge(gateway, Ops(gateway))  # Ops: /healthz, /readyz, /metrics, /auth; draining on SIGTERM


def create_app_from_env() -> Edge:
    """Factory for server workers: settings come from ZARR_GATEWAY_* variables."""
    settings = Settings()  # type: ignore[call-arg]
    configure_logging(settings.log_format)  # a spawned worker does not inherit the parent's logging
    return create_app(settings)
