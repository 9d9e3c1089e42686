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

from .. import extras
from ..meshes.service import MeshService
from ..precomputed.tree import PrecomputedTree, parse_precomputed_path
from ..previews import Previews
from ..settings import Settings
from ..sources.catalog import BrokenDataset, Catalog, Dataset, DatasetUnusable
from ..zarr.codecs import Codec
from ..zarr.nodes import ArrayNode
from ..zarr.resource import JSON, Resource, bytes_resource
from ..zarr.shards import ShardPlans
from ..zarr.trees import TREES, DatasetView, NodeNotFound, ServeOptions, Tree
from .auth import (
    TOKEN_HEADER,
    Access,
    Grant,
    Token,
    check_dataset,
    check_files,
    check_organization,
    granted_names,
    read_token,
)
from .budget import MemoryBudget
from .errors import HiddenRoots, HttpError
from .messages import Answer, Request
from .origin import PublicOrigin
from .pages.dataset import build_dataset_page, render_dataset_page
from .pages.landing import HOME_TREE, Landing, dataset_card, render_landing
from .pages.listing import Entry, render_listing
from .pages.markup import HTML
from .pages.viewer import mixed_content_note, viewer_url
from .responses import Reader, send_resource
from .urls import DataTarget, Level, parse_data_path, parse_mesh_path, parse_preview_path

log = logging.getLogger("gateway")
T = TypeVar("T")
# Threads that load and list datasets: a bound of their own, so that however long a load takes (a large
# properties file, a slow volume), chunk reads keep their threads and the event loop keeps answering.
CATALOG_THREADS = 2
# The trees ``/`` lists.
HOME_TREES = tuple(TREES)


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
        roots: HiddenRoots,
        precomputed: PrecomputedTree,
        own_viewer: bool = False,
    ) -> None:
        self.settings = settings
        self.roots = roots
        self.storage = storage
        self.catalog = catalog
        self.access = Access(settings.tokens_file, settings.tokens_reload_seconds)
        self.origin = PublicOrigin(settings.public_url, settings.trusted_proxies)
        self.shards = shards
        self.previews = previews
        self.meshes = meshes
        self.own_viewer = own_viewer  # the gateway serves Neuroglancer at /neuroglancer/ (the viewer extra)
        self.precomputed_tree = precomputed
        self.limiter = anyio.CapacityLimiter(settings.threads)
        self.catalog_limiter = anyio.CapacityLimiter(CATALOG_THREADS)
        self.chunk_memory = MemoryBudget(settings.chunk_memory_bytes)
        self.options = ServeOptions(Codec(settings.codec), settings.chunk_edge, sharded=settings.v3_layout == "sharded")
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
            if grant is not None:
                found = await self._catalog_dataset(names[0], names[1])
                check_files(grant, names[0], names[1], set() if found is None else found.owners)
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

    async def _view(self, dataset: Dataset, tree: Tree) -> DatasetView:
        """:meth:`view`; one not built yet is built in a catalog thread (a dataset of many layers takes long)."""
        view = self._views.get((dataset.organization, dataset.name, tree.name))
        if view is not None and view.dataset is dataset:
            return view
        return await self._storage_call(self.view, dataset, tree)

    async def _document(self, view: DatasetView, key: tuple[str, ...], make: Callable[[], Any]) -> Resource:
        """A dataset's metadata document; one not rendered yet is rendered in a catalog thread (the
        consolidated metadata of many layers takes long)."""
        found = view.documents.get(key)
        return found if found is not None else await self._storage_call(view.document, key, make)

    async def _storage_call(self, function: Callable[..., T], *args: Any) -> T:
        """Catalog work (loading, listing): in a thread of its own bound, never on the event loop."""
        return await anyio.to_thread.run_sync(function, *args, limiter=self.catalog_limiter)

    async def _catalog_dataset(self, organization: str, name: str) -> Dataset | BrokenDataset | None:
        """A dataset of the catalog: as loaded, when it was looked at less than a second ago; as loaded, after
        a stat in a chunk thread, when it still holds (so loads that fill the catalog threads hold up no
        other dataset); else from a catalog thread."""
        fresh = self.catalog.fresh(organization, name)
        if fresh is not None:
            return fresh
        held = await anyio.to_thread.run_sync(self.catalog.unchanged, organization, name, limiter=self.limiter)
        return held if held is not None else await self._storage_call(self.catalog.dataset, organization, name)

    # --- the pipeline -------------------------------------------------------------------------

    async def tree(self, request: Request) -> Answer:
        """``/data/{tree}/...``: a listing, a metadata document or a chunk of one of the trees."""
        target = parse_data_path(request.path)
        request.exchange.route = target.route
        return await self.handle(target, request)

    async def handle(self, target: DataTarget, request: Request) -> Answer:
        token = self.token(request)
        grant = await self.authorize(token, target.names[:2])
        if target.level == Level.TREE:
            _check_placed(target)
            readable = await self._readable_datasets(grant)
            entries = [Entry(organization, True) for organization in readable]
            page = self._landing(request, token, target.tree.name, readable)
            return await self._send(request, self._landing_page(target.base, entries, page, target.tree.name))
        organization = target.organization
        if target.level == Level.ORGANIZATION:
            if organization not in await self._storage_call(self.catalog.organizations):
                raise HttpError(404, f"no organization {organization!r}")
            _check_placed(target)
            datasets = await self._storage_call(self._datasets, grant, organization)
            return await self._send(request, self._page(target.base, datasets))
        dataset = await self._dataset(organization, target.dataset, grant)
        view = await self._view(dataset, target.tree)
        resource = await self._in_dataset(target, view, request, _page_token(token))
        return await self._send(request, resource)

    async def index(self, request: Request) -> Answer:
        """``/``: the trees, and the datasets the request's token may read (none without a token, when one is
        needed: the page itself is open)."""
        token = self.token(request)
        entries = [Entry(f"data/{name}", True) for name in HOME_TREES]
        if token is None and not self.access.open:
            note = "Open this page with a token (?token=... in its address) to see the datasets it may read."
            page = Landing({}, note=note)
        else:
            page = self._landing(
                request, token, HOME_TREE, await self._readable_datasets(await self.authorize(token, ()))
            )
        return await self._send(request, self._landing_page("/", entries, page, "zarr-gateway"))

    async def _above_datasets(self, request: Request, names: tuple[str, ...], base: str, grant: Grant | None) -> Answer:
        """A precomputed tree's root (its organizations) or an organization (its datasets), as ``grant`` may
        see them: the listings fsspec reads, as in the Zarr trees."""
        if not names:
            return await self._send(request, self._page(base, await self._storage_call(self._organizations, grant)))
        if names[0] not in await self._storage_call(self.catalog.organizations):
            raise HttpError(404, f"no organization {names[0]!r}")
        return await self._send(request, self._page(base, await self._storage_call(self._datasets, grant, names[0])))

    async def _dataset(self, organization: str, name: str, grant: Grant | None) -> Dataset:
        """The dataset to serve, 403 unless ``grant`` covers every dataset whose files it reads (checked on
        the very dataset served: one loaded again since :meth:`authorize` is checked again)."""
        dataset = await self._catalog_dataset(organization, name)
        if dataset is not None:
            check_files(grant, organization, name, dataset.owners)
        if dataset is None:
            raise HttpError(404, f"no dataset {organization}/{name}")
        if isinstance(dataset, BrokenDataset):
            raise DatasetUnusable(f"dataset {organization}/{name} cannot be served: {dataset.reason}")
        return dataset

    async def preview(self, request: Request) -> Answer:
        """``/preview/{organization}/{dataset}/{layer}.png``: a small image of a layer for its dataset page."""
        target = parse_preview_path(request.path)
        grant = await self.authorize(self.token(request), (target.organization, target.dataset))
        dataset = await self._dataset(target.organization, target.dataset, grant)
        layer_name = target.layer
        layer = dataset.layers.get(layer_name)
        if layer is None or not layer.mags:
            raise HttpError(404, f"no servable layer {layer_name!r}; there are {', '.join(dataset.layers)}")
        resource = await self.previews.answer(layer.mags, layer.properties.category)
        return await self._send(request, resource)

    async def mesh(self, request: Request) -> Answer:
        """``/data/meshes/{organization}/{dataset}/{layer}/{multires|legacy}/{file}``: a precomputed mesh
        source of a segmentation layer (:mod:`gateway.meshes`), made in a thread."""
        target = parse_mesh_path(request.path)
        grant = await self.authorize(self.token(request), (target.organization, target.dataset))
        dataset = await self._dataset(target.organization, target.dataset, grant)
        found = await self.meshes.answer(dataset, target.layer, target.kind, target.file)
        return await self._send(request, bytes_resource(found.body, found.media_type))

    async def precomputed(self, request: Request) -> Answer:
        """``/data/precomputed/...``: the Neuroglancer precomputed tree (:mod:`gateway.precomputed`), made in a
        thread below the dataset level."""
        target = parse_precomputed_path(request.path)
        request.exchange.route = target.route
        grant = await self.authorize(self.token(request), target.names[:2])
        if len(target.names) < 2:
            return await self._above_datasets(request, target.names, target.base, grant)
        dataset = await self._dataset(target.names[0], target.names[1], grant)
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
                return await self._document(view, (file,), lambda: tree.dataset_document(view, file))
            entries = [Entry(f, False) for f in tree.dataset_files]
            entries += [Entry(name, True) for name in view.groups]
            entries += [Entry(name, True, self.roots.relative(reason)) for name, reason in view.unusable.items()]
            largest = await anyio.to_thread.run_sync(self._largest_segments, view.dataset, limiter=self.limiter)
            return await self._storage_call(self._dataset_page, target, view, request, entries, page_token, largest)
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
        return await self.send(request, resource, self.cache_control)

    async def send(self, request: Request, resource: Resource, cache_control: bytes) -> Answer:
        """``resource`` with validators, conditional requests and ranges, cached as ``cache_control`` says."""
        reader = Reader(resource, self.limiter, request.context)
        return await send_resource(request.headers, request.method, resource, cache_control, reader)

    # --- listings -----------------------------------------------------------------------------

    async def _readable_datasets(self, grant: Grant | None) -> dict[str, list[Dataset | BrokenDataset]]:
        """The datasets ``grant`` may read by organization, each organization where it may read one (every one
        when open, empty ones too). Every dataset is loaded, so it runs in a thread, never on the event loop."""

        def readable() -> dict[str, list[Dataset | BrokenDataset]]:
            found = {}
            for organization in self.catalog.organizations():
                datasets = self.catalog.datasets(organization)
                names = granted_names(grant, organization, [dataset.name for dataset in datasets])
                if grant is None or names:
                    found[organization] = [dataset for dataset in datasets if dataset.name in names]
            return found

        return await self._storage_call(readable)

    def _landing(
        self, request: Request, token: Token | None, tree: str, readable: dict[str, list[Dataset | BrokenDataset]]
    ) -> Landing:
        base, root_path = self.origin.of(request.headers, request.client)
        page_token = _page_token(token)
        viewer = viewer_url(self.settings.neuroglancer_url, self.own_viewer, root_path, page_token)
        meshes = extras.MESHES.available
        groups = {
            organization: [dataset_card(d, tree, base, root_path, page_token, viewer, meshes) for d in datasets]
            for organization, datasets in readable.items()
        }
        return Landing(groups, page_token is not None, viewer_note=mixed_content_note(viewer, base))

    def _landing_page(self, base_path: str, entries: list[Entry], landing: Landing, title: str) -> Resource:
        return bytes_resource(render_landing(base_path, entries, landing, title), HTML)

    def _organizations(self, grant: Grant | None) -> list[Entry]:
        """The organizations where ``grant`` covers at least one dataset (every one when open), by names alone."""
        organizations = self.catalog.organizations()
        if grant is None:
            return [Entry(org, True) for org in organizations]
        return [Entry(org, True) for org in organizations if granted_names(grant, org, self._dataset_names(org))]

    def _dataset_names(self, organization: str) -> list[str]:
        return self.catalog.dataset_names(organization)  # no dataset is loaded to list or authorize names

    def _datasets(self, grant: Grant | None, organization: str) -> list[Entry]:
        entries = []
        for dataset in self.catalog.datasets(organization):
            if grant is not None and not grant.allows(organization, dataset.name):
                continue
            note = self.roots.relative(dataset.reason) if isinstance(dataset, BrokenDataset) else None
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
        viewer = viewer_url(self.settings.neuroglancer_url, self.own_viewer, root_path, page_token)
        page = build_dataset_page(
            view.dataset,
            target.tree.name,
            base,
            page_token,
            viewer,
            not self.access.open,
            root_path,
            largest=largest,
            with_meshes=extras.MESHES.available,
            viewer_note=mixed_content_note(viewer, base),
        )
        return bytes_resource(render_dataset_page(target.base, entries, page), HTML)

    def _page(self, base: str, entries: list[Entry]) -> Resource:
        return bytes_resource(render_listing(base, entries), HTML)


def _check_placed(target: DataTarget) -> None:
    """A misplaced metadata name is a 404, raised once the nodes above it are known to exist."""
    if target.misplaced is not None:
        raise NodeNotFound(target.misplaced)


def _page_token(token: Token | None) -> str | None:
    """The token a page was asked for with in its address: its links carry it on (a header token they cannot)."""
    return token.value if token is not None and token.in_url else None


__all__ = ["HTML", "JSON", "Gateway"]
