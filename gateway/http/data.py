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

from ..meshes.service import MeshService
from ..precomputed.tree import PrecomputedTarget, PrecomputedTree
from ..previews import Previews
from ..settings import Settings
from ..sources.catalog import BrokenDataset, Catalog, Dataset, DatasetUnusable
from ..zarr.nodes import ArrayNode
from ..zarr.resource import JSON, Resource, bytes_resource
from ..zarr.shards import ShardPlans
from ..zarr.trees import TREES, DatasetView, NodeNotFound, ServeOptions, Tree
from .auth import TOKEN_HEADER, Access, Grant, Token, check_dataset, check_organization, granted_names, read_token
from .budget import MemoryBudget
from .errors import HttpError, hide_roots, relative_paths
from .listing import Entry, PublicOrigin, build_dataset_page, render_dataset_page, render_listing
from .messages import Answer, Request
from .responses import Reader, send_resource
from .urls import DataTarget, Level, parse_mesh_path, parse_preview_path

log = logging.getLogger("gateway")
T = TypeVar("T")
HTML = "text/html; charset=utf-8"


class Gateway:
    """Everything a data request needs; holds caches only, so replicas answer alike.

    Its parts are built by the composition root (:func:`gateway.http.app.create_app`).
    """

    def __init__(
        self,
        settings: Settings,
        storage: Store,
        catalog: Catalog,
        shards: ShardPlans,
        previews: Previews,
        meshes: MeshService,
        precomputed: PrecomputedTree,
    ) -> None:
        self.settings = settings
        hide_roots(settings.root, settings.extra_roots)
        self.storage = storage
        self.catalog = catalog
        self.access = Access(settings.tokens_file, settings.tokens_reload_seconds)
        self.origin = PublicOrigin(settings.public_url, settings.trusted_proxies)
        self.shards = shards
        self.previews = previews
        self.meshes = meshes
        self.precomputed_tree = precomputed
        self.limiter = anyio.CapacityLimiter(settings.threads)
        self.chunk_memory = MemoryBudget(settings.chunk_memory_bytes)
        self.options = ServeOptions(settings.codec, settings.chunk_edge, sharded=settings.v3_layout == "sharded")
        self.cache_control = settings.cache_control.encode("latin-1")
        self._views: dict[tuple[str, str, str], DatasetView] = {}

    # --- access -------------------------------------------------------------------------------

    @staticmethod
    def token(request: Request) -> Token | None:
        """The request's one token (400 for more): every route that reads a token reads it here."""
        return read_token(request.header_lines(TOKEN_HEADER), request.query_string, request.path_token)

    async def authorize(self, token: Token | None, names: tuple[str, ...]) -> Grant | None:
        """The grant of ``token`` for what ``names`` (organization, dataset: as far as a path names them)
        point at, or 401/403: the one decision, for the data routes, the previews and the proxy's ``/auth``.
        None when the gateway is open."""
        grant = self.access.grant(token)
        if len(names) >= 2:
            check_dataset(grant, names[0], names[1])
        elif names and grant is not None:
            check_organization(grant, names[0], await self._storage_call(self._dataset_names, names[0]))
        return grant

    def caches_by_name(self) -> dict[str, CacheCounts]:
        """The bounded caches, for the metrics: each source format's (WKW headers and jump tables, Zarr shard
        indexes), shard plans, previews, meshes."""
        return {
            **self.catalog.formats.caches,
            "shards": self.shards.lru,
            "previews": self.previews.cache,
            "meshes": self.meshes.cache,
        }

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
        token = self.token(request)
        grant = await self.authorize(token, target.names[:2])
        if target.level == Level.TREE:
            _check_placed(target)
            organizations = await self._storage_call(self._organizations, grant)
            return await self._listing(request, target.base, organizations)
        organization = target.organization
        if target.level == Level.ORGANIZATION:
            if organization not in await self._storage_call(self.catalog.organizations):
                raise HttpError(404, f"no organization {organization!r}")
            _check_placed(target)
            datasets = await self._storage_call(self._datasets, grant, organization)
            return await self._listing(request, target.base, datasets)
        dataset = await self._dataset(organization, target.dataset)
        view = self.view(dataset, target.tree)
        page_token = token.value if token is not None and token.in_url else None
        resource = await self._in_dataset(target, view, request, page_token)
        return await self._send(request, resource)

    async def _above_datasets(self, request: Request, names: tuple[str, ...], base: str, grant: Grant | None) -> Answer:
        """A precomputed tree's root (its organizations) or an organization (its datasets), as ``grant`` may
        see them."""
        if not names:
            return await self._listing(request, base, await self._storage_call(self._organizations, grant))
        if names[0] not in await self._storage_call(self.catalog.organizations):
            raise HttpError(404, f"no organization {names[0]!r}")
        return await self._listing(request, base, await self._storage_call(self._datasets, grant, names[0]))

    async def _dataset(self, organization: str, name: str) -> Dataset:
        dataset = await self._storage_call(self.catalog.dataset, organization, name)
        if dataset is None:
            raise HttpError(404, f"no dataset {organization}/{name}")
        if isinstance(dataset, BrokenDataset):
            raise DatasetUnusable(f"dataset {organization}/{name} cannot be served: {dataset.reason}")
        return dataset

    async def preview(self, request: Request) -> Answer:
        """``/preview/{organization}/{dataset}/{layer}.png``: a small image of a layer for its dataset page."""
        target = parse_preview_path(request.path)
        await self.authorize(self.token(request), (target.organization, target.dataset))
        dataset = await self._dataset(target.organization, target.dataset)
        layer_name = target.layer
        layer = dataset.layers.get(layer_name)
        if layer is None or not layer.mags:
            raise HttpError(404, f"no servable layer {layer_name!r}; there are {', '.join(dataset.layers)}")
        resource = await anyio.to_thread.run_sync(
            self.previews.preview, layer.mags, layer.properties.category, limiter=self.limiter
        )
        return await self._send(request, resource)

    async def mesh(self, request: Request) -> Answer:
        """``/data/meshes/{organization}/{dataset}/{layer}/{multires|legacy}/{file}``: a precomputed mesh
        source of a segmentation layer (:mod:`gateway.meshes`), made in a thread."""
        target = parse_mesh_path(request.path)
        await self.authorize(self.token(request), (target.organization, target.dataset))
        dataset = await self._dataset(target.organization, target.dataset)
        found = await anyio.to_thread.run_sync(
            self.meshes.file, dataset, target.layer, target.kind, target.file, limiter=self.limiter
        )
        return await self._send(request, bytes_resource(found.body, found.media_type))

    async def precomputed(self, target: PrecomputedTarget, request: Request) -> Answer:
        """``/data/precomputed/...``: the Neuroglancer precomputed tree (:mod:`gateway.precomputed`), made in a
        thread below the dataset level."""
        grant = await self.authorize(self.token(request), target.names[:2])
        if len(target.names) < 2:
            return await self._above_datasets(request, target.names, target.base, grant)
        dataset = await self._dataset(target.names[0], target.names[1])
        accept = request.headers.get(b"accept-encoding", b"").decode("latin-1")
        found = await anyio.to_thread.run_sync(
            self.precomputed_tree.answer, dataset, target, accept, limiter=self.limiter
        )
        answer = await self._send(request, found.resource)
        answer.headers += found.headers
        return answer

    async def _in_dataset(
        self, target: DataTarget, view: DatasetView, request: Request, page_token: str | None
    ) -> Resource:
        tree, file = target.tree, target.file
        if target.level == Level.DATASET:
            _check_placed(target)
            if file is not None:
                return view.document((file,), lambda: tree.dataset_document(view, file))
            entries = [Entry(f, False) for f in tree.dataset_files]
            entries += [Entry(name, True) for name in view.groups]
            entries += [Entry(name, True, relative_paths(reason)) for name, reason in view.unusable.items()]
            largest = await anyio.to_thread.run_sync(self._largest_segments, view.dataset, limiter=self.limiter)
            return self._dataset_page(target, view, request, entries, page_token, largest)
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
        return await self._chunk(tree, node, target.key, request)

    async def _chunk(self, tree: Tree, node: ArrayNode, key: str, request: Request) -> Resource:
        """A chunk or shard: cheap ones on the event loop, the rest in a thread. A file rewritten
        mid-read is tried once more the same way (then the error map answers 503)."""
        index = tree.parse_key(key, node.rank)
        for attempt in (1, 2):
            try:
                cheap = node.cheap_chunk(index)
                if cheap is not None:
                    return cheap
                if self.chunk_memory.would_wait(node.working_bytes) or self.limiter.available_tokens < 1:
                    # It will wait in line: if its client leaves meanwhile, it is skipped. (Watching costs
                    # about as much as a thread hand-off, so a chunk that starts at once is not watched.)
                    return await request.unless_client_leaves(lambda: self._costly_chunk(node, index))
                return await self._costly_chunk(node, index)
            except FileUnsettledError:
                raise  # trying again at once cannot help: the file must first be quiet for settle_seconds
            except FileChangedError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def _costly_chunk(self, node: ArrayNode, index: tuple[int, ...]) -> Resource:
        async with self.chunk_memory.hold(node.working_bytes):
            return await anyio.to_thread.run_sync(node.costly_chunk, index, limiter=self.limiter)

    async def _send(self, request: Request, resource: Resource) -> Answer:
        reader = Reader(resource, self.limiter, request.context)
        return await send_resource(request.headers, request.method, resource, self.cache_control, reader)

    # --- listings -----------------------------------------------------------------------------

    def _organizations(self, grant: Grant | None) -> list[Entry]:
        """The organizations where ``grant`` covers at least one dataset (every one when open)."""
        organizations = self.catalog.organizations()
        if grant is None:
            return [Entry(org, True) for org in organizations]
        return [Entry(org, True) for org in organizations if granted_names(grant, org, self._dataset_names(org))]

    def _dataset_names(self, organization: str) -> list[str]:
        return [dataset.name for dataset in self.catalog.datasets(organization)]

    def _datasets(self, grant: Grant | None, organization: str) -> list[Entry]:
        entries = []
        for dataset in self.catalog.datasets(organization):
            if grant is not None and not grant.allows(organization, dataset.name):
                continue
            note = relative_paths(dataset.reason) if isinstance(dataset, BrokenDataset) else None
            entries.append(Entry(dataset.name, True, note))
        return entries

    def _largest_segments(self, dataset: Dataset) -> dict[str, list[int]]:
        """A few of the largest segments of each segmentation layer, for the viewer link (from its index or a scan)."""
        return {
            name: self.meshes.largest_segments(dataset, name)
            for name, layer in dataset.layers.items()
            if layer.properties.category == "segmentation" and layer.mags
        }

    def _dataset_page(
        self,
        target: DataTarget,
        view: DatasetView,
        request: Request,
        entries: list[Entry],
        page_token: str | None,
        largest: dict[str, list[int]],
    ) -> Resource:
        """The dataset's listing with a card per layer (preview, facts, viewer link) and client snippets."""
        base, root_path = self.origin.of(request.headers, request.client)
        page = build_dataset_page(
            view.dataset,
            target.tree.name,
            base,
            page_token,
            self.settings.neuroglancer_url,
            not self.access.open,
            root_path,
            largest=largest,
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
