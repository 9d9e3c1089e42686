"""The composition root: the store, the source formats, the catalog, the caches, the handlers of each
resource and what they share, the operations endpoints, the routes and the edge in front of them, wired
in one place.

The cache budget (``cache_bytes``) is split here: half for the source formats' caches (shared
equally between the formats of :mod:`gateway.sources.registry`), half for virtual shard plans, and on
top a sixteenth for preview images and a quarter for segment meshes. Chunk answers have a budget of
their own (``answer_cache_bytes``).
"""

import hashlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from gateway_storage import StorageError, Store, open_store, read_headers_file, store_kind
from gateway_storage.cache import CacheCounts

from .. import extras
from ..logs import configure_logging
from ..meshes.segments import index_place
from ..meshes.service import MeshService
from ..precomputed.tree import TREES as PRECOMPUTED_TREES
from ..precomputed.tree import PrecomputedTree
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
from .edge import Edge, Endpoint, Handler, build_edge, endpoint_routes
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
from .pages.viewer import NeuroglancerClient
from .share import Revocations, ShareKey, ShareLinks
from .urls import (
    DATA_PREFIX,
    FAVICON,
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


def create_app(settings: Settings) -> Edge:
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
    store = open_store(
        settings.root,
        settings.extra_roots,
        settings.settle_seconds,
        settings.remote_roots,
        headers=headers,
        own_files=own,
    )
    catalog = Catalog(store, SourceFormats(store, settings.cache_bytes // 2))
    shards = ShardPlans(settings.cache_bytes // 2)
    mesh_limiter = anyio.CapacityLimiter(settings.mesh_threads)  # meshes and previews: never the chunks' threads
    previews = Previews(settings.cache_bytes // 16, mesh_limiter)
    index_dir = None if settings.segment_index_dir is None else str(settings.segment_index_dir)
    place = index_place(store, index_dir)
    meshes = MeshService(
        store,
        place,
        settings.cache_bytes // 4,
        mesh_limiter,
        settings.multires_voxels,
        settings.mesh_seconds,
        settings.stamp_files,
    )
    roots = HiddenRoots(settings.root, settings.extra_roots)  # no answer names where the data lives
    client = NeuroglancerClient.installed()
    if client is None and not settings.neuroglancer_url:
        log.warning(
            "the viewer extra is not installed: pages link to the public https Neuroglancer, which cannot read a "
            "gateway served over plain http (pip install 'zarr-gateway[viewer]' serves it at /neuroglancer/)"
        )
    precomputed = PrecomputedTree(meshes, meters_per_unit, settings.chunk_edge)
    chunk_threads = anyio.CapacityLimiter(settings.threads)
    options = ServeOptions(Codec(settings.codec), settings.chunk_edge, sharded=settings.v3_layout == "sharded")
    datasets = Datasets(catalog, options, shards, chunk_threads)
    listings = Listings(datasets, roots)
    origin = PublicOrigin(settings.public_url, settings.trusted_proxies)
    sign_in = _sign_in(settings, origin)
    links = share_links(settings)
    access = Authorizer(Access(settings.tokens_file, settings.tokens_reload_seconds, links, sign_in), datasets)
    if access.open:
        log.warning("no tokens file: the gateway is OPEN, every dataset is readable without a token")
    sender = Sender(chunk_threads, settings.cache_control.encode("latin-1"))
    note = root_note(store) if store_kind(settings.root) is None else None  # a store away must not delay start
    share_most = None if links is None else settings.share_max_seconds
    pages = Pages(origin, settings.neuroglancer_url, client is not None, not access.open, share_most, note)
    memory = MemoryBudget(settings.chunk_memory_bytes)  # what chunks, previews and meshes build; kept answers
    # where no change is reported, a look at a kept answer's files holds for the settle time (README, "Kept answers
    # and late data")
    answers = AnswerCache(settings.answer_cache_bytes, memory, settings.settle_seconds)
    chunks = Chunks(chunk_threads, memory, answers)
    largest = LargestSegments(meshes, chunk_threads)  # what the pages' viewer links select
    landings = Landings(listings, pages, largest)
    levels: dict[Level, LevelHandler] = {
        Level.TREE: TreeRoot(landings, sender),
        Level.ORGANIZATION: OrganizationListing(listings, pages, sender),
        Level.DATASET: DatasetLevel(datasets, sender, pages, largest, roots),
        Level.GROUP: GroupLevel(datasets, sender, pages),
        Level.ARRAY: ArrayLevel(datasets, sender, pages, chunks),
    }

    def caches_by_name() -> dict[str, CacheCounts]:
        """The bounded caches, for the metrics: each source format's (WKW headers and jump tables, Zarr shard
        indexes), shard plans, previews, meshes, chunk answers."""
        return {
            **catalog.formats.caches,
            "shards": shards.lru,
            "previews": previews.cache,
            "meshes": meshes.cache,
            "answers": answers,
        }

    ops = Ops(settings, store, roots, access, caches_by_name)  # /healthz, /readyz, /metrics, /auth; draining
    trees = Endpoint(TreeHandler(access, levels), None)  # the label (chunk, metadata, listing) is the target's
    mounts = {f"{DATA_PREFIX}{name}": trees for name in TREE_ROUTES}  # the chunk routes first: the most asked
    precomputed_trees = Endpoint(
        PrecomputedHandler(access, datasets, listings, precomputed, sender, chunk_threads, memory, pages), None
    )
    mounts |= {f"{DATA_PREFIX}{name}": precomputed_trees for name in PRECOMPUTED_TREES}
    mounts[MESH_PREFIX.rstrip("/")] = Endpoint(MeshHandler(access, meshes, sender, memory), "mesh")
    mounts[PREVIEW_PREFIX.rstrip("/")] = Endpoint(PreviewHandler(access, previews, sender, memory), "preview")
    mounts[DATA_PREFIX.rstrip("/")] = trees  # what no tree takes: the trees' parser names the ones there are
    mounts[VIEWER_PREFIX] = Endpoint(viewer_route(client, sender, ops), "viewer")
    key = None if links is None else links.key
    mounts[SHARE_ROUTE.rstrip("/")] = Endpoint(ShareHandler(access, key, settings.share_max_seconds, origin), "share")
    paths = {"/": Endpoint(IndexHandler(access, landings, sender), "index")}
    paths[FAVICON] = Endpoint(icon_route(sender), "favicon")
    paths |= {path: Endpoint(handler, path.strip("/")) for path, handler in ops.routes().items()}
    if sign_in is not None:
        handlers = (sign_in.login, sign_in.callback, sign_in.logout)
        paths |= {path: Endpoint(handler, "login") for path, handler in zip(LOGIN_PATHS, handlers, strict=True)}
    tree_prefixes = [f"{DATA_PREFIX}{name}/" for name in TREE_ROUTES]
    # With settle_seconds 0 every kept answer's files are looked at on every request: none is given before dispatch.
    trusting = answers.enabled and settings.settle_seconds > 0
    front = None if not trusting else lambda behind: KeptAnswers(behind, answers, access, sender)
    return build_edge(endpoint_routes(paths, mounts), ops, roots, trees, tree_prefixes, front, origin.root_path)


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
            raise HttpError(404, f"nothing at {request.exchange.logged_path}{missing}")
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


def create_app_from_env() -> Edge:
    """Factory for server workers: settings come from ZARR_GATEWAY_* variables."""
    settings = Settings()
    configure_logging(settings.log_format)  # a spawned worker does not inherit the parent's logging
    return create_app(settings)
