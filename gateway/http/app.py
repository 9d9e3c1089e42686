"""The composition root, wired in one place and in named parts: :class:`Data` (the store, the source formats,
the catalog, the caches within their :class:`CacheShares` of the budget), :class:`Shared` (what the handlers share),
:func:`handlers_by_place` (a handler for each place of the URL table) and :func:`edge` (the Starlette app and its
middleware in front of them); :func:`create_app` joins them with the operations endpoints.
"""

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware

from gateway_storage import StorageError, Store, open_store, read_headers_file, store_kind
from gateway_storage.cache import CacheCounts

from .. import extras
from ..logs import configure_logging
from ..meshes.segments import index_place
from ..meshes.service import MeshService
from ..metrics import RequestStats
from ..precomputed.tree import TREES as PRECOMPUTED_TREES
from ..precomputed.tree import ListingRow, PrecomputedTree
from ..previews import Previews
from ..settings import Settings
from ..sources.catalog import Catalog
from ..sources.registry import SourceFormats
from ..sources.root_shape import misplaced_root
from ..sources.units import meters_per_unit
from ..zarr.codecs import Codec
from ..zarr.shards import ShardPlans
from ..zarr.trees import ServeOptions
from .answers import AnswerCache
from .auth import Access
from .budget import MemoryBudget
from .edge import ErrorAnswers, Handler, Methods, PathTokens, RequestLog, application, labels_of, routes_of
from .errors import HiddenRoots, HttpError
from .handlers.access import Authorizer
from .handlers.chunks import Chunks
from .handlers.datasets import Datasets
from .handlers.index import IndexHandler, Landings
from .handlers.listings import Listings
from .handlers.meshes import MeshHandler
from .handlers.pages import Pages
from .handlers.precomputed import PrecomputedHandler
from .handlers.previews import PreviewHandler
from .handlers.segments import LargestSegments
from .handlers.sender import Sender
from .handlers.share import ShareHandler
from .handlers.trees import (
    ArrayLevel,
    DatasetLevel,
    GroupLevel,
    LevelHandler,
    OrganizationListing,
    TreeHandler,
    TreeRoot,
)
from .kept import KeptAnswers
from .messages import Answer, Request
from .ops import Ops
from .origin import PublicOrigin
from .pages.icon import favicon
from .pages.listing import Entry, page_bytes
from .pages.viewer import NeuroglancerClient
from .share import Revocations, ShareKey, ShareLinks
from .urls import (
    DATA_PREFIX,
    FAVICON,
    INDEX,
    LOGIN_PATHS,
    MESH_PREFIX,
    PREVIEW_PREFIX,
    SHARE_ROUTE,
    TREE_ROUTES,
    VIEWER_PREFIX,
    Level,
)

if TYPE_CHECKING:
    from .oidc import SignIn


log = logging.getLogger("gateway")


@dataclass(frozen=True, slots=True)
class CacheShares:
    """How the cache budget (``cache_bytes``) is shared: half for the source formats' caches (shared equally between
    the formats of :mod:`gateway.sources.registry`), half for virtual shard plans, and on top a sixteenth for
    preview images and a quarter for segment meshes. Chunk answers have a budget of their own
    (``answer_cache_bytes``), and so has what requests build (``chunk_memory_bytes``)."""

    source_formats: int
    shard_plans: int
    previews: int
    meshes: int

    @classmethod
    def of(cls, cache_bytes: int) -> "CacheShares":
        return cls(cache_bytes // 2, cache_bytes // 2, cache_bytes // 16, cache_bytes // 4)


@dataclass(frozen=True, slots=True)
class Data:
    """What the data routes read: the store, the catalog of datasets over the source formats, virtual shard plans,
    previews and segment meshes, each cache within its share of the budget."""

    store: Store
    catalog: Catalog
    shards: ShardPlans
    previews: Previews
    meshes: MeshService

    @classmethod
    def open(cls, settings: Settings) -> "Data":
        shares = CacheShares.of(settings.cache_bytes)
        store = data_store(settings)
        mesh_limiter = anyio.CapacityLimiter(settings.mesh_threads)  # meshes and previews: never the chunks' threads
        index_dir = None if settings.segment_index_dir is None else str(settings.segment_index_dir)
        meshes = MeshService(
            store,
            index_place(store, index_dir),
            shares.meshes,
            mesh_limiter,
            settings.multires_voxels,
            settings.mesh_seconds,
            settings.stamp_files,
        )
        catalog = Catalog(store, SourceFormats(store, shares.source_formats))
        return cls(store, catalog, ShardPlans(shares.shard_plans), Previews(shares.previews, mesh_limiter), meshes)


def data_store(settings: Settings) -> Store:
    """The store of the data root (and the remote roots beside it), which never serves the gateway's own files."""
    headers = read_headers_file(str(settings.store_headers_file)) if settings.store_headers_file else {}
    own_files = (
        settings.tokens_file,
        settings.settings_file,
        settings.store_headers_file,
        settings.share_key_file,
        settings.share_revoked_file,
        settings.oidc_client_secret_file,
        settings.oidc_cookie_key_file,
    )
    own = [str(path) for path in own_files if path]
    return open_store(
        settings.root,
        settings.extra_roots,
        settings.settle_seconds,
        settings.remote_roots,
        headers=headers,
        own_files=own,
    )


@dataclass(frozen=True, slots=True)
class Shared:
    """What the handlers share: the data root's locations kept out of messages, the public origin, the chunk threads
    and the memory budget of what requests build, the kept answers, the sender, the datasets and their listings,
    access (tokens, share links, sign-in) and the pages."""

    roots: HiddenRoots
    origin: PublicOrigin
    chunk_threads: anyio.CapacityLimiter
    memory: MemoryBudget
    answers: AnswerCache
    sender: Sender
    datasets: Datasets
    listings: Listings
    access: Authorizer
    pages: Pages
    viewer: NeuroglancerClient | None
    sign_in: "SignIn | None"
    links: ShareLinks | None

    @classmethod
    def of(cls, settings: Settings, data: Data) -> "Shared":
        roots = HiddenRoots(settings.root, settings.extra_roots)  # no answer names where the data lives
        viewer = NeuroglancerClient.installed()
        if viewer is None and not settings.neuroglancer_url:
            log.warning(
                "the viewer extra is not installed: pages link to the public https Neuroglancer, which cannot read "
                "a gateway served over plain http (pip install 'zarr-gateway[viewer]' serves it at /neuroglancer/)"
            )
        chunk_threads = anyio.CapacityLimiter(settings.threads)
        options = ServeOptions(Codec(settings.codec), settings.chunk_edge, sharded=settings.v3_layout == "sharded")
        memory = MemoryBudget(settings.chunk_memory_bytes)  # what every request builds; kept answers count too
        datasets = Datasets(data.catalog, options, data.shards, chunk_threads, memory)
        origin = PublicOrigin(settings.public_url, settings.trusted_proxies)
        sign_in = _sign_in(settings, origin)
        links = share_links(settings)
        access = Authorizer(Access(settings.tokens_file, settings.tokens_reload_seconds, links, sign_in), datasets)
        if access.open:
            log.warning("no tokens file: the gateway is OPEN, every dataset is readable without a token")
        note = root_note(data.store) if store_kind(settings.root) is None else None  # a store away must not delay
        share_most = None if links is None else settings.share_max_seconds
        pages = Pages(origin, settings.neuroglancer_url, viewer is not None, not access.open, share_most, note)
        # Kept answers: where no change is reported, a look at a kept answer's files holds for the settle time
        # (README, "Kept answers and late data")
        answers = AnswerCache(settings.answer_cache_bytes, memory, settings.settle_seconds)
        sender = Sender(chunk_threads, settings.cache_control.encode("latin-1"))
        listings = Listings(datasets, roots, memory)
        return cls(
            roots,
            origin,
            chunk_threads,
            memory,
            answers,
            sender,
            datasets,
            listings,
            access,
            pages,
            viewer,
            sign_in,
            links,
        )


def create_app(settings: Settings) -> Starlette:
    """The application: the data it reads, what its handlers share, a handler for each place of the URL table it
    serves, and the edge in front of them."""
    data = Data.open(settings)
    shared = Shared.of(settings, data)

    def caches_by_name() -> dict[str, CacheCounts]:
        """The bounded caches, for the metrics: each source format's (WKW headers and jump tables, Zarr shard
        indexes), shard plans, previews, meshes, chunk answers."""
        return {
            **data.catalog.formats.caches,
            "shards": data.shards.lru,
            "previews": data.previews.cache,
            "meshes": data.meshes.cache,
            "answers": shared.answers,
        }

    stats = RequestStats()  # this app's tally of its requests, flushed into the metrics
    ops = Ops(settings, data.store, shared.roots, shared.access, caches_by_name, stats)  # /healthz ... ; draining
    app = edge(settings, shared, ops, handlers_by_place(settings, data, shared, ops))
    app.state.stats, app.state.ops = stats, ops  # what the app owns, for whoever holds it
    return app


def handlers_by_place(settings: Settings, data: Data, shared: Shared, ops: Ops) -> dict[str, Handler]:
    """The handler of each place of the URL table (:data:`gateway.http.urls.PLACES`) that this gateway serves."""
    access, sender, pages = shared.access, shared.sender, shared.pages
    datasets, listings = shared.datasets, shared.listings
    chunks = Chunks(shared.chunk_threads, shared.memory, shared.answers)
    largest = LargestSegments(data.meshes, shared.chunk_threads)  # what the pages' viewer links select
    landings = Landings(listings, pages, largest)
    levels: dict[Level, LevelHandler] = {
        Level.TREE: TreeRoot(landings, sender),
        Level.ORGANIZATION: OrganizationListing(listings, pages, sender),
        Level.DATASET: DatasetLevel(datasets, sender, pages, largest, shared.roots),
        Level.GROUP: GroupLevel(datasets, sender, pages),
        Level.ARRAY: ArrayLevel(datasets, sender, pages, chunks),
    }
    trees = TreeHandler(access, levels)
    precomputed = PrecomputedTree(data.meshes, meters_per_unit, settings.chunk_edge, _listing_bytes)
    precomputed_trees = PrecomputedHandler(
        access, datasets, listings, precomputed, sender, shared.chunk_threads, shared.memory, pages
    )
    handlers: dict[str, Handler] = {f"{DATA_PREFIX}{name}": trees for name in TREE_ROUTES}
    handlers |= {f"{DATA_PREFIX}{name}": precomputed_trees for name in PRECOMPUTED_TREES}
    handlers[MESH_PREFIX.rstrip("/")] = MeshHandler(access, data.meshes, sender, shared.memory)
    handlers[PREVIEW_PREFIX.rstrip("/")] = PreviewHandler(access, data.previews, sender, shared.memory)
    handlers[DATA_PREFIX.rstrip("/")] = trees  # what no tree takes: the trees' parser names the ones there are
    handlers[VIEWER_PREFIX] = viewer_route(shared.viewer, sender, ops)
    key = None if shared.links is None else shared.links.key
    handlers[SHARE_ROUTE.rstrip("/")] = ShareHandler(access, key, settings.share_max_seconds, shared.origin)
    handlers[INDEX] = IndexHandler(access, landings, sender)
    handlers[FAVICON] = icon_route(sender)
    handlers |= ops.routes()
    sign_in = shared.sign_in
    if sign_in is not None:
        handlers |= dict(zip(LOGIN_PATHS, (sign_in.login, sign_in.callback, sign_in.logout), strict=True))
    return handlers


def edge(settings: Settings, shared: Shared, ops: Ops, handlers: dict[str, Handler]) -> Starlette:
    """The Starlette app over ``handlers``' routes, with the edge's middleware in front (outermost first)."""
    errors = ErrorAnswers(shared.roots, shared.origin.root_path)
    middleware = [
        Middleware(RequestLog, stats=ops.stats, watch=ops.watch, labels=labels_of(handlers)),
        Middleware(PathTokens),
    ]
    # With settle_seconds 0 every kept answer's files are looked at on every request: none is given before dispatch.
    if shared.answers.enabled and settings.settle_seconds > 0:
        middleware.append(Middleware(KeptAnswers, answers=shared.answers, access=shared.access, sender=shared.sender))
    middleware.append(Middleware(Methods, root_path=shared.origin.root_path))
    return application(routes_of(handlers, errors), middleware, errors, lambda app: ops.lifespan())


def share_links(settings: Settings) -> ShareLinks | None:
    """The share links the gateway accepts and makes: none without a key."""
    if settings.share_key_file is None:
        return None
    revoked = settings.share_revoked_file
    reload = settings.tokens_reload_seconds
    return ShareLinks(ShareKey.load(settings.share_key_file), None if revoked is None else Revocations(revoked, reload))


def _sign_in(settings: Settings, origin: PublicOrigin) -> "SignIn | None":
    """Sign-in with OpenID Connect (:mod:`gateway.http.oidc`), when an issuer is configured."""
    if settings.oidc_issuer is None or settings.oidc_client_id is None:
        return None
    extras.OIDC.require("oidc_issuer")
    from .oidc import Issuer, SignIn, default_logout_dir

    secret = None if settings.oidc_client_secret_file is None else _secret(settings.oidc_client_secret_file)
    key_file = settings.oidc_cookie_key_file
    key = _secret(key_file) if key_file is not None else secret
    assert key is not None  # the settings refuse a public client without a cookie key
    cookie_key = hashlib.sha256(b"zarr-gateway login cookie\0" + key.encode()).digest()  # 32 bytes, for HS256
    logout_dir = settings.oidc_logout_dir or default_logout_dir(settings.oidc_issuer, settings.oidc_client_id)
    return SignIn(
        Issuer(settings.oidc_issuer, settings.oidc_jwks_refresh_seconds),
        settings.oidc_client_id,
        secret,
        settings.oidc_audience or settings.oidc_client_id,
        cookie_key,
        settings.oidc_login_seconds,
        logout_dir,
        origin,
        settings.oidc_scope,
    )


def _secret(path: Path) -> str:
    """A secret kept in a file, without the line end an editor adds."""
    return path.read_text().strip()


def viewer_route(client: NeuroglancerClient | None, sender: Sender, ops: Ops) -> Handler:
    """``/neuroglancer/...``: the client's files and event stream (:mod:`gateway.http.pages.viewer`)."""

    async def viewer(request: Request) -> Answer:
        reply = None
        if client is not None:
            reply = await client.reply(request.path, request.receive, lambda: ops.draining)
        if reply is None:
            missing = "" if client is not None else ": the viewer extra is not installed"
            raise HttpError(404, f"nothing at {request.logged_path}{missing}")
        if reply.answer is not None:
            return reply.answer
        assert reply.resource is not None
        return await sender.send(request, reply.resource, reply.cache_control)

    return viewer


def icon_route(sender: Sender) -> Handler:
    """``/favicon.ico``, which browsers ask for by themselves: open, like the start page, and cached a day."""

    async def icon(request: Request) -> Answer:
        return await sender.send(request, favicon(), b"public, max-age=86400")

    return icon


def root_note(store: Store) -> str | None:
    """What the start page says of a local data root pointed too deep (start-up logs it for every kind of root);
    nothing when it cannot be read now (start-up said so)."""
    try:
        hint = misplaced_root(store)
    except (OSError, StorageError):
        return None
    return None if hint is None else f"This gateway is set up wrong: {hint}."


def create_app_from_env() -> Starlette:
    """Factory for server workers: settings come from ZARR_GATEWAY_* variables."""
    settings = Settings()
    configure_logging(settings.log_format)  # a spawned worker does not inherit the parent's logging
    return create_app(settings)


def _listing_bytes(rows: list[ListingRow]) -> int:
    """What a listing page of the precomputed tree holds while it renders ``rows`` (in the request's credential
    form, :class:`~gateway.http.handlers.precomputed.PrecomputedHandler`)."""
    return page_bytes([Entry(*row) for row in rows])
