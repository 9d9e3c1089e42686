"""The composition root: the store, the source formats, the catalog, the caches, the gateway, its
operations endpoints and the edge in front of them, wired in one place.

The cache budget (``cache_bytes``) is split here: half for the source formats' caches (shared
equally between the formats of :mod:`gateway.sources.registry`), half for virtual shard plans, and on
top a sixteenth for preview images and a quarter for segment meshes.
"""

import logging

from gateway_storage import open_store, read_headers_file

from ..logs import configure_logging
from ..meshes.service import MeshService
from ..precomputed.tree import ListingRow, PrecomputedTree
from ..previews import Previews
from ..settings import Settings
from ..sources.catalog import Catalog
from ..sources.registry import SourceFormats
from ..zarr.resource import Resource, bytes_resource
from ..zarr.shards import ShardPlans
from .data import HTML, Gateway
from .edge import Edge
from .listing import Entry, meters_per_unit, render_listing
from .ops import Ops

log = logging.getLogger("gateway")


def create_app(settings: Settings) -> Edge:
    headers = read_headers_file(str(settings.store_headers_file)) if settings.store_headers_file else {}
    store = open_store(
        settings.root, settings.extra_roots, settings.settle_seconds, settings.remote_roots, headers=headers
    )
    catalog = Catalog(store, SourceFormats(store, settings.cache_bytes // 2))
    shards = ShardPlans(settings.cache_bytes // 2)
    previews = Previews(settings.cache_bytes // 16)
    meshes = MeshService(store, settings.segment_index_dir, settings.cache_bytes // 4, meters_per_unit)
    precomputed = PrecomputedTree(meshes, meters_per_unit, settings.chunk_edge, _listing_page)
    gateway = Gateway(settings, store, catalog, shards, previews, meshes, precomputed)
    if gateway.access.open:
        log.warning("no tokens file: the gateway is OPEN, every dataset is readable without a token")
    return Edge(gateway, Ops(gateway))  # Ops: /healthz, /readyz, /metrics, /auth; draining on SIGTERM


def create_app_from_env() -> Edge:
    """Factory for server workers: settings come from ZARR_GATEWAY_* variables."""
    settings = Settings()
    configure_logging(settings.log_format)  # a spawned worker does not inherit the parent's logging
    return create_app(settings)


def _listing_page(base: str, rows: list[ListingRow]) -> Resource:
    """A listing page of the precomputed tree, rendered as every tree's listings are."""
    return bytes_resource(render_listing(base, [Entry(*row) for row in rows]), HTML)
