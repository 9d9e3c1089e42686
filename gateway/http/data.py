"""The gateway's data routes: one pipeline from a parsed target to an answer.

target (parsed once, :mod:`gateway.http.urls`) -> token check -> dataset (catalog)
-> the tree's view of it -> a listing, a metadata document or a chunk -> validators,
ranges and conditional requests (:mod:`gateway.http.responses`). Exceptions are
not handled here: the edge maps them all in one place (:mod:`gateway.http.errors`).
"""

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import anyio

from gateway_storage import FileChangedError, FileUnsettledError, Store
from gateway_storage.cache import CacheCounts

from ..previews import Previews
from ..settings import Settings
from ..sources.catalog import BrokenDataset, Catalog, Dataset
from ..zarr.nodes import ArrayNode
from ..zarr.resource import JSON, Resource, bytes_resource
from ..zarr.shards import ShardPlans
from ..zarr.trees import TREES, DatasetView, NodeNotFound, ServeOptions, Tree
from .auth import Grant, Tokens
from .errors import HttpError
from .listing import Entry, build_dataset_page, public_base, render_dataset_page, render_listing
from .messages import Answer, Request
from .responses import Reader, send_resource
from .urls import DataTarget, Level

log = logging.getLogger("gateway")
T = TypeVar("T")
HTML = "text/html; charset=utf-8"
PREVIEW_PREFIX = "/preview/"
TOKEN_HEADER = b"x-auth-token"


class Gateway:
    """Everything a data request needs; holds caches only, so replicas answer alike.

    Its parts are built by the composition root (:func:`gateway.http.app.create_app`).
    """

    def __init__(
        self, settings: Settings, storage: Store, catalog: Catalog, shards: ShardPlans, previews: Previews
    ) -> None:
        self.settings = settings
        self.storage = storage
        self.catalog = catalog
        self.tokens = Tokens.load(settings.tokens_file) if settings.tokens_file else None
        self.shards = shards
        self.previews = previews
        self.limiter = anyio.CapacityLimiter(settings.threads)
        self.options = ServeOptions(settings.codec, settings.chunk_edge, sharded=settings.v3_layout == "sharded")
        self.cache_control = settings.cache_control.encode("latin-1")
        self._views: dict[tuple[str, str, str], DatasetView] = {}

    # --- access -------------------------------------------------------------------------------

    def authenticate(self, request: Request) -> Grant | None:
        """The caller's grant; None when the gateway is open (no tokens file)."""
        if self.tokens is None:
            return None
        token = request.header(TOKEN_HEADER) or request.query("token")
        if not token:
            raise HttpError(401, "a token is required: send it as the X-Auth-Token header or the token query parameter")
        grant = self.tokens.grant(token)
        if grant is None:
            raise HttpError(401, "the token is not valid")
        return grant

    def caches_by_name(self) -> dict[str, CacheCounts]:
        """The bounded caches, for the metrics: each source format's (WKW headers and jump tables, Zarr shard
        indexes), shard plans, previews."""
        return {**self.catalog.formats.caches, "shards": self.shards.lru, "previews": self.previews.cache}

    def view(self, dataset: Dataset, tree: Tree) -> DatasetView:
        key = (dataset.organization, dataset.name, tree.name)
        view = self._views.get(key)
        if view is None or view.dataset is not dataset:
            view = self._views[key] = tree.build(dataset, self.options, self.shards)
        return view

    async def _storage_call(self, function: Callable[..., T], *args: Any) -> T:
        """Catalog work: inline for a local root (a stat, mostly cached), in a thread for object storage."""
        if self.storage.is_local:
            return function(*args)
        return await anyio.to_thread.run_sync(function, *args, limiter=self.limiter)

    # --- the pipeline -------------------------------------------------------------------------

    async def handle(self, target: DataTarget, request: Request) -> Answer:
        grant = self.authenticate(request)
        if target.level == Level.TREE:
            _check_placed(target)
            organizations = await self._storage_call(self._organizations, grant)
            return await self._listing(request, target.base, organizations)
        organization = target.organization
        if target.level == Level.ORGANIZATION:
            if grant is not None and not grant.allows_organization(organization):
                raise HttpError(403, f"the token does not grant access to organization {organization}")
            if organization not in await self._storage_call(self.catalog.organizations):
                raise HttpError(404, f"no organization {organization!r}")
            _check_placed(target)
            datasets = await self._storage_call(self._datasets, grant, organization)
            return await self._listing(request, target.base, datasets)
        dataset = await self._dataset(grant, organization, target.dataset)
        view = self.view(dataset, target.tree)
        resource = await self._in_dataset(target, view, request)
        return await self._send(request, resource)

    async def _dataset(self, grant: Grant | None, organization: str, name: str) -> Dataset:
        if grant is not None and not grant.allows(organization, name):
            raise HttpError(403, f"the token does not grant access to {organization}/{name}")
        dataset = await self._storage_call(self.catalog.dataset, organization, name)
        if dataset is None:
            raise HttpError(404, f"no dataset {organization}/{name}")
        if isinstance(dataset, BrokenDataset):
            raise HttpError(500, f"dataset {organization}/{name} cannot be served: {dataset.reason}")
        return dataset

    async def preview(self, request: Request) -> Answer:
        """``/preview/{organization}/{dataset}/{layer}.png``: a small image of a layer for its dataset page."""
        parts = request.path.removeprefix(PREVIEW_PREFIX).split("/")
        if len(parts) != 3 or not parts[2].endswith(".png") or not all(parts):
            raise HttpError(404, f"a preview is at {PREVIEW_PREFIX}{{organization}}/{{dataset}}/{{layer}}.png")
        organization, name, image = parts
        grant = self.authenticate(request)
        dataset = await self._dataset(grant, organization, name)
        layer_name = image.removesuffix(".png")
        layer = dataset.layers.get(layer_name)
        if layer is None or not layer.mags:
            raise HttpError(404, f"no servable layer {layer_name!r}; there are {', '.join(dataset.layers)}")
        resource = await anyio.to_thread.run_sync(
            self.previews.preview, layer.mags, layer.properties.category, limiter=self.limiter
        )
        return await self._send(request, resource)

    async def _in_dataset(self, target: DataTarget, view: DatasetView, request: Request) -> Resource:
        tree, file = target.tree, target.file
        if target.level == Level.DATASET:
            _check_placed(target)
            if file is not None:
                return view.document((file,), lambda: tree.dataset_document(view, file))
            entries = [Entry(f, False) for f in tree.dataset_files]
            entries += [Entry(name, True) for name in view.groups]
            entries += [Entry(name, True, reason) for name, reason in view.unusable.items()]
            return self._dataset_page(target, view, request, entries)
        group = view.group(target.names[2])
        if target.level == Level.GROUP:
            _check_placed(target)
            if file is not None:
                return view.document((group.name, file), lambda: tree.group_document(view, group, file))
            entries = [Entry(f, False) for f in tree.group_files] + [Entry(a, True) for a in group.arrays]
            return self._page(target.base, entries)
        array_name = target.names[3]
        node = view.array(group, array_name)
        _check_placed(target)
        if file is not None:
            return view.document((group.name, array_name, file), lambda: tree.array_document(node, file))
        if target.key is None:
            return self._page(target.base, [Entry(f, False) for f in tree.array_files])
        return await self._chunk(tree, node, target.key)

    async def _chunk(self, tree: Tree, node: ArrayNode, key: str) -> Resource:
        """A chunk or shard: cheap ones on the event loop, the rest in a thread. A file rewritten
        mid-read is tried once more the same way (then the error map answers 503)."""
        index = tree.parse_key(key, node.rank)
        for attempt in (1, 2):
            try:
                cheap = node.cheap_chunk(index)
                if cheap is not None:
                    return cheap
                return await anyio.to_thread.run_sync(node.costly_chunk, index, limiter=self.limiter)
            except FileUnsettledError:
                raise  # trying again at once cannot help: the file must first be quiet for settle_seconds
            except FileChangedError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def _send(self, request: Request, resource: Resource) -> Answer:
        reader = Reader(resource, self.limiter, request.context)
        return await send_resource(request.headers, request.method, resource, self.cache_control, reader)

    # --- listings -----------------------------------------------------------------------------

    def _organizations(self, grant: Grant | None) -> list[Entry]:
        return [
            Entry(org, True) for org in self.catalog.organizations() if grant is None or grant.allows_organization(org)
        ]

    def _datasets(self, grant: Grant | None, organization: str) -> list[Entry]:
        entries = []
        for dataset in self.catalog.datasets(organization):
            if grant is not None and not grant.allows(organization, dataset.name):
                continue
            note = dataset.reason if isinstance(dataset, BrokenDataset) else None
            entries.append(Entry(dataset.name, True, note))
        return entries

    def _dataset_page(self, target: DataTarget, view: DatasetView, request: Request, entries: list[Entry]) -> Resource:
        """The dataset's listing with a card per layer (preview, facts, viewer link) and client snippets."""
        page = build_dataset_page(
            view.dataset,
            target.tree.name,
            public_base(request.headers),
            request.query("token"),
            self.settings.neuroglancer_url,
            self.tokens is not None,
        )
        return bytes_resource(render_dataset_page(target.base, entries, page), HTML)

    def _page(self, base: str, entries: list[Entry]) -> Resource:
        return bytes_resource(render_listing(base, entries), HTML)

    async def _listing(self, request: Request, base: str, entries: list[Entry]) -> Answer:
        return await self._send(request, self._page(base, entries))


def _check_placed(target: DataTarget) -> None:
    """A misplaced metadata name is a 404, raised once the nodes above it are known to exist."""
    if target.misplaced is not None:
        raise NodeNotFound(target.misplaced)


def index_page() -> bytes:
    return render_listing("/", [Entry(f"data/{name}", True) for name in TREES if name != "zarr3_experimental"])


__all__ = ["HTML", "JSON", "Gateway", "index_page"]
