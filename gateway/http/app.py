"""The Starlette application: one dispatcher over the v2 and v3 trees of every dataset."""

import json
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from wkw_adapter import ByteLRU, FileChangedError, StoreUnavailableError, WkwError, WkwFileCache

from ..logs import configure_logging
from ..metrics import count_storage_error
from ..settings import Settings
from ..sources.catalog import BrokenDataset, Catalog, Dataset
from ..storage import open_storage
from ..zarr.chunks import ChunkNotFound, ServedMag, ShardPlans, encoded_chunk, passthrough_chunk, plain_chunk
from ..zarr.keys import MalformedKey, parse_v2_key, parse_v3_key
from ..zarr.layout import array_zarr_json, zarray
from ..zarr.resource import JSON, Resource, bytes_resource
from ..zarr.tree import (
    DatasetView,
    ServeOptions,
    consolidated_v2,
    dataset_view,
    dataset_zarr_json,
    layer_attributes_v2,
    layer_zarr_json,
    rewritten_properties,
)
from .auth import Grant, Tokens
from .edge import Edge
from .listing import Entry, render_listing
from .ops import Ops
from .responses import Answer, HttpError, error_response, header, send_resource

log = logging.getLogger("gateway")
T = TypeVar("T")

TREES = {"zarr": 2, "zarr3": 3, "zarr3_experimental": 3}
PROPERTIES = "datasource-properties.json"
V2_NAMES = (".zarray", ".zgroup", ".zattrs", ".zmetadata")
V3_NAMES = ("zarr.json",)
HTML = "text/html; charset=utf-8"


def _json(document: dict) -> Resource:
    return bytes_resource(json.dumps(document).encode(), JSON)


class Gateway:
    """Everything a request needs; holds caches only, so replicas answer alike."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.storage = open_storage(settings.root)
        self.files = WkwFileCache(self.storage, max_bytes=settings.cache_bytes // 4)
        self.catalog = Catalog(self.storage, self.files, ByteLRU(settings.cache_bytes // 4))
        self.tokens = Tokens.load(settings.tokens_file) if settings.tokens_file else None
        self.shards = ShardPlans(settings.cache_bytes // 2)
        self.limiter = anyio.CapacityLimiter(settings.threads)
        sharded = settings.v3_layout == "sharded"
        self.options = {
            2: ServeOptions(settings.codec, settings.chunk_edge, sharded=False),
            3: ServeOptions(settings.codec, settings.chunk_edge, sharded=sharded),
        }
        self._views: dict[tuple[str, str, int], DatasetView] = {}

    # --- access -------------------------------------------------------------------------------

    def authenticate(self, request: Request) -> Grant | None:
        """The caller's grant; None when the gateway is open (no tokens file)."""
        if self.tokens is None:
            return None
        token = header(request, b"x-auth-token") or request.query_params.get("token")
        if not token:
            raise HttpError(401, "a token is required: send it as the X-Auth-Token header or the token query parameter")
        grant = self.tokens.grant(token)
        if grant is None:
            raise HttpError(401, "the token is not valid")
        return grant

    def view(self, dataset: Dataset, version: int) -> DatasetView:
        key = (dataset.organization, dataset.name, version)
        view = self._views.get(key)
        if view is None or view.dataset is not dataset:
            view = dataset_view(dataset, version, self.options[version])
            self._views[key] = view
        return view

    # --- dispatch -----------------------------------------------------------------------------

    async def handle(self, request: Request) -> Answer:
        try:
            return await self._dispatch(request)
        except HttpError as exc:
            return error_response(exc.status, exc.message, exc.headers)
        except StoreUnavailableError as exc:  # e.g. while listing or loading a dataset: transient, not a bug
            log.error("store unavailable for %s %s: %s", request.method, request.url.path, exc)
            count_storage_error("unavailable")
            return error_response(503, f"the store did not answer: {exc}", {"Retry-After": "2"})
        except Exception:
            log.exception("unexpected error for %s %s", request.method, request.url.path)
            return error_response(500, "internal error; it has been logged")

    async def _dispatch(self, request: Request) -> Answer:
        tree = request.path_params["tree"]
        version = TREES.get(tree)
        if version is None:
            raise HttpError(404, f"unknown tree {tree!r}; there are {', '.join(TREES)}")
        segments = [s for s in request.path_params.get("rest", "").split("/") if s]
        for segment in segments:
            if segment in (".", "..") or "\\" in segment or "\0" in segment:
                raise HttpError(400, "path segments '.' and '..' are not allowed")
        base = f"{request.scope.get('root_path', '')}/data/{tree}/"
        grant = self.authenticate(request)
        if not segments:
            return await self._listing(request, base, await self._storage_call(self._organizations, grant))
        organization = segments[0]
        if len(segments) == 1:
            if grant is not None and not grant.allows_organization(organization):
                raise HttpError(403, f"the token does not grant access to organization {organization}")
            if organization not in await self._storage_call(self.catalog.organizations):
                raise HttpError(404, f"no organization {organization!r}")
            entries = await self._storage_call(self._datasets, grant, organization)
            return await self._listing(request, f"{base}{organization}/", entries)
        name = segments[1]
        if grant is not None and not grant.allows(organization, name):
            raise HttpError(403, f"the token does not grant access to {organization}/{name}")
        dataset = await self._storage_call(self.catalog.dataset, organization, name)
        if dataset is None:
            raise HttpError(404, f"no dataset {organization}/{name}")
        if isinstance(dataset, BrokenDataset):
            raise HttpError(500, f"dataset {organization}/{name} cannot be served: {dataset.reason}")
        view = self.view(dataset, version)
        resource = await self._in_dataset(request, view, f"{base}{organization}/{name}/", segments[2:])
        if isinstance(resource, Answer):
            return resource
        return await send_resource(request, resource, self.settings.cache_control, self.limiter)

    async def _storage_call(self, function: Callable[..., T], *args: Any) -> T:
        """Catalog work: inline for a local root (a stat, mostly cached), in a thread for object storage."""
        if self.storage.is_local:
            return function(*args)
        return await anyio.to_thread.run_sync(function, *args, limiter=self.limiter)

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

    async def _listing(self, request: Request, base: str, entries: list[Entry]) -> Answer:
        return await send_resource(
            request, bytes_resource(render_listing(base, entries), HTML), self.settings.cache_control, self.limiter
        )

    async def _in_dataset(self, request: Request, view: DatasetView, base: str, rest: list[str]) -> Resource | Answer:
        v2 = view.version == 2
        own_names, other_names = (V2_NAMES, V3_NAMES) if v2 else (V3_NAMES, V2_NAMES)
        if not rest:
            files = [PROPERTIES, ".zgroup", ".zattrs", ".zmetadata"] if v2 else [PROPERTIES, "zarr.json"]
            # A layer without a usable mag is listed with the reason instead of a link.
            problems = {name: "; ".join(layer.problems) for name, layer in view.dataset.layers.items()}
            layers = [
                Entry(name, True, None if layer.mags else problems.get(name) or "no usable mag")
                for name, layer in view.layers.items()
            ]
            return await self._listing(request, base, [Entry(f, False) for f in files] + layers)
        name = rest[0]
        if len(rest) == 1 and name == PROPERTIES:
            return _json(rewritten_properties(view))
        if len(rest) == 1 and name in own_names:
            return _json(self._dataset_document(view, name))
        if name in other_names:
            raise HttpError(404, f"{name} belongs to the other Zarr version's tree")
        layer = view.layers.get(name)
        problems = view.dataset.layers[name].problems if name in view.dataset.layers else []
        if layer is None or not layer.mags:
            detail = f": {'; '.join(problems)}" if problems else ""
            raise HttpError(
                404, f"no servable layer {name!r} in {view.dataset.organization}/{view.dataset.name}{detail}"
            )
        base += f"{name}/"
        if len(rest) == 1:
            files = [".zgroup", ".zattrs", ".zmetadata"] if v2 else ["zarr.json"]
            mags = [Entry(m, True) for m in layer.mags]
            return await self._listing(request, base, [Entry(f, False) for f in files] + mags)
        mag_name = rest[1]
        if len(rest) == 2 and mag_name in own_names:
            if mag_name == ".zgroup":
                return _json({"zarr_format": 2})
            if mag_name == ".zattrs":
                return _json(layer_attributes_v2(layer))
            if mag_name == ".zmetadata":
                return _json(consolidated_v2(view, name))
            return _json(layer_zarr_json(layer))
        if mag_name in other_names:
            raise HttpError(404, f"{mag_name} belongs to the other Zarr version's tree")
        served = view.mag(name, mag_name)
        if served is None:
            detail = f" ({'; '.join(problems)})" if problems else ""
            raise HttpError(404, f"no mag {mag_name!r} in layer {name!r}; there are {', '.join(layer.mags)}{detail}")
        if len(rest) == 2:
            files = [".zarray", ".zattrs"] if v2 else ["zarr.json"]
            return await self._listing(request, f"{base}{mag_name}/", [Entry(f, False) for f in files])
        key = rest[2:]
        if v2:
            return await self._v2_array_file(served, key)
        return await self._v3_array_file(served, key)

    def _dataset_document(self, view: DatasetView, name: str) -> dict:
        if name == ".zgroup":
            return {"zarr_format": 2}
        if name == ".zattrs":
            return {}
        if name == ".zmetadata":
            return consolidated_v2(view)
        return dataset_zarr_json(view)

    async def _v2_array_file(self, served: ServedMag, key: list[str]) -> Resource:
        if key == [".zarray"]:
            return _json(zarray(served.layout))
        if key == [".zattrs"]:
            return _json({})
        if key[0] in V2_NAMES or key[0] in V3_NAMES:
            raise HttpError(404, f"no {key[0]} at the array level")
        try:
            index = parse_v2_key("/".join(key))
        except MalformedKey as exc:
            raise HttpError(400, str(exc)) from None
        return await self._chunk(served, index, sharded=False)

    async def _v3_array_file(self, served: ServedMag, key: list[str]) -> Resource:
        if key == ["zarr.json"]:
            return _json(array_zarr_json(served.layout))
        if key[0] in V2_NAMES:
            raise HttpError(404, f"{key[0]} belongs to the Zarr v2 tree")
        try:
            index = parse_v3_key("/".join(key))
        except MalformedKey as exc:
            raise HttpError(400, str(exc)) from None
        return await self._chunk(served, index, sharded=served.layout.shard_shape is not None)

    async def _chunk(self, served: ServedMag, index: tuple[int, ...], sharded: bool) -> Resource:
        """Produce a chunk or shard; a file rewritten mid-read is retried once, then 503."""
        for attempt in range(2):
            try:
                if sharded:
                    return await anyio.to_thread.run_sync(self.shards.shard, served, index, limiter=self.limiter)
                # A pass-through chunk of a local file is one stat and one read: cheaper than a thread hop.
                if not served.source.reads_are_cheap:
                    return await anyio.to_thread.run_sync(plain_chunk, served, index, limiter=self.limiter)
                resource = passthrough_chunk(served, index)
                if resource is None:  # not one stored block: decode and encode off the event loop
                    resource = await anyio.to_thread.run_sync(encoded_chunk, served, index, limiter=self.limiter)
                return resource
            except ChunkNotFound as exc:
                raise HttpError(404, str(exc)) from None
            except FileChangedError:
                if attempt:
                    count_storage_error("changed")
                    raise HttpError(503, "the data file is being rewritten; retry", {"Retry-After": "1"}) from None
            except StoreUnavailableError as exc:
                log.error("store unavailable for %s chunk %s: %s", served.source.location, index, exc)
                count_storage_error("unavailable")
                raise HttpError(503, f"the store did not answer: {exc}", {"Retry-After": "2"}) from None
            except (WkwError, OSError) as exc:
                log.error("storage fault for %s chunk %s: %s", served.source.location, index, exc)
                count_storage_error()
                raise HttpError(500, f"storage fault: {exc}") from None
        raise AssertionError("unreachable")


def _index(request: Request) -> Answer:
    entries = [Entry("data/zarr", True), Entry("data/zarr3", True)]
    base = f"{request.scope.get('root_path', '')}/"
    return Answer(200, [], render_listing(base, entries), HTML)


def create_app(settings: Settings) -> Edge:
    """The gateway: data routes answered by the edge directly, everything else by a Starlette app."""
    gateway = Gateway(settings)
    if gateway.tokens is None:
        log.warning("no tokens file: the gateway is OPEN, every dataset is readable without a token")
    methods = ["GET", "HEAD"]
    ops = Ops(gateway)  # /healthz, /readyz, /metrics, /auth; draining on SIGTERM
    routes = [
        *ops.routes(),
        Route("/", _index, methods=methods),
        Route("/data/{tree}", gateway.handle, methods=methods),  # other methods: 405 from Starlette
        Route("/data/{tree}/{rest:path}", gateway.handle, methods=methods),
    ]
    others = Starlette(routes=routes, lifespan=ops.lifespan)
    others.state.gateway = gateway
    others.state.ops = ops
    return Edge(gateway, others, ops.watch)


def create_app_from_env() -> Edge:
    """Factory for uvicorn workers: settings come from ZARR_GATEWAY_* variables."""
    settings = Settings()  # type: ignore[call-arg]
    configure_logging(settings.log_format)  # a spawned worker does not inherit the parent's logging
    return create_app(settings)
