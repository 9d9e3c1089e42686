"""The composition root: the store, the source formats, the catalog, the caches, the gateway, its
operations endpoints and the edge in front of them, wired in one place.

The cache budget (``cache_bytes``) is split here: half for the source formats' caches (shared
equally between the formats of :mod:`gateway.sources.registry`), half for virtual shard plans, and on
top a sixteenth for preview images and a quarter for segment meshes.
"""

import logging

import anyio

from gateway_storage import open_store, read_headers_file

from ..logs import configure_logging
from ..meshes.segments import index_place
from ..meshes.service import MeshService
from ..previews import Previews
from ..settings import Settings
from ..sources.catalog import Catalog
from ..sources.registry import SourceFormats
from ..zarr.shards import ShardPlans
from .data import Gateway
from .edge import Edge
from .ops import Ops

log = logging.getLogger("gateway")


def create_app(settings: Settings) -> Edge:
    headers = read_headers_file(str(settings.store_headers_file)) if settings.store_headers_file else {}
    store = open_store(
        settings.root, settings.extra_roots, settings.settle_seconds, settings.remote_roots, headers=headers
    )
    catalog = Catalog(store, SourceFormats(store, settings.cache_bytes // 2))
    shards = ShardPlans(settings.cache_bytes // 2)
    mesh_limiter = anyio.CapacityLimiter(settings.mesh_threads)  # meshes and previews: never the chunks' threads
    previews = Previews(settings.cache_bytes // 16, store, mesh_limiter)
    index_dir = None if settings.segment_index_dir is None else str(settings.segment_index_dir)
    meshes = MeshService(store, index_place(store, index_dir), settings.cache_bytes // 4, mesh_limiter)
    gateway = Gateway(settings, store, catalog, shards, previews, meshes)
    if gateway.access.open:
        log.warning("no tokens file: the gateway is OPEN, every dataset is readable without a token")
    return Edge(gateway, Ops(gateway))  # Ops: /healthz, /readyz, /metrics, /auth; draining on SIGTERM


def create_app_from_env() -> Edge:
    """Factory for server workers: settings come from ZARR_GATEWAY_* variables."""
    settings = Settings()
    configure_logging(settings.log_format)  # a spawned worker does not inherit the parent's logging
    return create_app(settings)
