"""The mesh sources of a data root: the one entry point the HTTP edge and ``index-segments`` use.

Per segmentation layer there are two sources (:mod:`gateway.meshes.formats`), served from a stored mesh set
where the layer has a fresh one (:mod:`gateway.meshes.stored`), else made on demand from the voxels and cached
(:mod:`gateway.meshes.cache`) by the stamp of the data, so replicas agree byte for byte. Meshing is
computation on voxels, bounded per request (:mod:`gateway.meshes.budget`), and runs in threads of its own
limiter (``mesh_threads``), shared with the previews, so that however many mesh requests wait, the threads
that serve chunks stay free.
"""

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import anyio

from gateway_storage import StorageError, Store
from wkw_adapter import WkwError

from ..resources import Resource
from ..settings import MESH_SECONDS, STAMP_FILES
from ..sources.dataset import Dataset
from .budget import MeshBudget
from .cache import MeshCache
from .errors import MeshInputError, MeshNotFound, MeshTooLarge, SegmentIndexRequired
from .formats import MESH_SOURCES, MULTIRES_VOXELS, MeshSource, MeshWork
from .layers import LayerMeshes, MeshLayers
from .segments import IndexPlace, Segments
from .stored import StoredMeshes

log = logging.getLogger("gateway.meshes")
Hold = Callable[[int], AbstractAsyncContextManager[None]]  # what a request holds of ``bytes`` while it is made


@asynccontextmanager
async def _hold_nothing(nbytes: int) -> AsyncIterator[None]:
    yield


LARGEST_ON_PAGE = 3


class MeshService:
    """Mesh files of every segmentation layer; holds caches only."""

    def __init__(
        self,
        storage: Store,
        place: IndexPlace,
        cache_bytes: int,
        limiter: anyio.CapacityLimiter,
        multires_voxels: int | None = None,
        mesh_seconds: float = MESH_SECONDS,
        stamp_files: int = STAMP_FILES,
    ) -> None:
        self.storage = storage
        self.place = place
        self.limiter = limiter
        self._running = anyio.CapacityLimiter(limiter.total_tokens)  # the threads of those holding ``limiter``
        self.multires_voxels = MULTIRES_VOXELS if multires_voxels is None else multires_voxels
        self.mesh_seconds = mesh_seconds
        self.cache = MeshCache(cache_bytes)
        self.layers = MeshLayers(stamp_files)
        self.segments = Segments(storage, place, self.cache)
        self.stored = StoredMeshes(place.store)

    def layer(self, dataset: Dataset, name: str) -> LayerMeshes:
        return self.layers.layer(dataset, name)

    def _work(self, dataset: Dataset, layer: str, kind: str, name: str) -> tuple[MeshSource, MeshWork]:
        source = MESH_SOURCES.get(kind)
        if source is None:
            raise MeshNotFound(f"no mesh source {kind!r}; there are {', '.join(MESH_SOURCES)}")
        meshes = self.layer(dataset, layer)
        budget = MeshBudget(f"{kind}/{name} of layer {layer!r}", self.mesh_seconds)
        return source, MeshWork(meshes, self.segments, self.cache, budget, self.stored, self.multires_voxels)

    def file(self, dataset: Dataset, layer: str, kind: str, name: str) -> Resource:
        """The file ``name`` of mesh source ``kind`` (``multires`` or ``legacy``) of a layer. Blocking."""
        source, work = self._work(dataset, layer, kind, name)
        return source.file(work, name)

    def file_bytes(self, dataset: Dataset, layer: str, kind: str, name: str) -> int:
        """What answering :meth:`file` holds at most (:meth:`MeshSource.file_bytes`: from sizes and metadata,
        what is stored where it meshes; a segment list from its index and labels files' sizes); 0 for what is
        answered as not found or not meshed. Blocking (stats), so in the request's thread."""
        try:
            source, work = self._work(dataset, layer, kind, name)
            return source.file_bytes(work, name)
        except (MeshInputError, MeshNotFound, SegmentIndexRequired, MeshTooLarge):
            return 0  # answered as such when the file is asked for

    def working_bytes(self, dataset: Dataset, layer: str, kind: str, name: str) -> int:
        """The most memory one request for file ``name`` of mesh source ``kind`` of ``layer`` may hold
        (:meth:`MeshSource.most_bytes`), from the metadata alone: the worst case, refused at once past the whole
        budget; 0 for a layer without meshes or an unknown source (answered as such in the request's thread)."""
        source = MESH_SOURCES.get(kind)
        try:
            return 0 if source is None else source.most_bytes(self.layer(dataset, layer).grid, name)
        except (MeshInputError, MeshNotFound):
            return 0

    async def answer(self, dataset: Dataset, layer: str, kind: str, name: str, hold: Hold = _hold_nothing) -> Resource:
        """:meth:`file`, in a thread of the mesh limiter, once the layer's data stamp is taken, holding
        ``hold(file_bytes)`` while it runs: sized and taken once the thread's turn has come, so that requests
        waiting for a mesh thread hold none of what it stands for (the worker's memory budget)."""
        await self.ready(dataset, layer)
        async with self.limiter:
            need = await anyio.to_thread.run_sync(self.file_bytes, dataset, layer, kind, name, limiter=self._running)
            async with hold(need):
                return await anyio.to_thread.run_sync(self.file, dataset, layer, kind, name, limiter=self._running)

    async def ready(self, dataset: Dataset, layer: str) -> None:
        """Wait, holding no thread, until the data stamp of ``layer`` (if it is a segmentation with meshes) is
        taken: what a thread that serves its meshes, segments or mesh-aware listings then finds at once."""
        try:
            meshes = self.layer(dataset, layer)
        except (MeshInputError, MeshNotFound):
            return  # answered as such in the request's thread
        await meshes.ready()

    async def ready_all(self, dataset: Dataset) -> None:
        """:meth:`ready` for every segmentation layer of ``dataset`` (its page lists their largest segments)."""
        for name, layer in dataset.layers.items():
            if layer.properties.category == "segmentation" and layer.mags:
                await self.ready(dataset, name)

    def largest_bytes(self, dataset: Dataset, layer: str, count: int = LARGEST_ON_PAGE) -> int:
        """What :meth:`largest_segments` holds at most, from sizes alone (:meth:`Segments.largest_bytes`); 0 where
        it reads nothing. Blocking (stats)."""
        try:
            meshes = self.layer(dataset, layer)
            return 0 if meshes.known_stamp() is None else self.segments.largest_bytes(meshes, count)
        except (SegmentIndexRequired, MeshInputError, MeshNotFound, MeshTooLarge, OSError, StorageError, WkwError):
            return 0  # answered as none

    def largest_segments(self, dataset: Dataset, layer: str, count: int = LARGEST_ON_PAGE) -> list[int]:
        """A few of the largest segments, for a viewer link: from a current index or a scan made already,
        never from a new scan (listings are read by every client that opens the dataset), else none
        (:meth:`Segments.largest`: once per version, bounded)."""
        try:
            meshes = self.layer(dataset, layer)
            if meshes.known_stamp() is None:
                return []  # never wait for a walk here (a chunk thread may be asking): the next view has them
            return self.segments.largest(meshes, count)
        except (SegmentIndexRequired, MeshInputError, MeshNotFound, MeshTooLarge):
            return []
        except (OSError, StorageError, WkwError) as exc:  # a page must not fail for a fault in one layer's data
            log.warning("segments of layer %s of %s/%s: %s", layer, dataset.organization, dataset.name, exc)
            return []
