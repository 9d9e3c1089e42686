"""The segmentation layers meshes are made of: each one's grid, voxel size and data stamp, kept per dataset version.

The data stamp (:func:`gateway.meshes.index.data_stamp`) names the version of a layer's files: segment lists,
indexes, stored mesh sets and cached meshes are all keyed by it. Taking it walks every mag, so it is taken once per
layer at a time (every request that needs it waits for the one walk under way), in threads of its own (never the
threads that serve chunks), again only after ``STAMP_SECONDS`` (or ten times as long as the walk took), and a walk
that failed (a mag of more files than ``stamp_files``, a store that did not answer) is remembered for
``FAILURE_SECONDS`` before it is tried again. The HTTP edge awaits :meth:`LayerMeshes.ready` on its event loop
before it hands a request to a thread, so that thread finds the stamp taken.
"""

import asyncio
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from gateway_storage import OversizedListingError

from ..settings import STAMP_FILES
from ..sources.dataset import Dataset, Layer
from ..sources.units import meters_per_unit
from .cache import LayerKey
from .errors import MeshInputError, MeshNotFound, MeshTooLarge
from .geometry import MeshGrid
from .index import segment_dtype, take_stamp

STAMP_SECONDS = 5.0  # a stamp is taken again at most this often (a rewrite is seen this long after it settled)
STAMP_SHARE = 10  # ... and no sooner than this many times the walk took: stamps take at most a tenth of a thread
FAILURE_SECONDS = 10.0  # a failed stamp is answered as failed this long before the walk is tried again
UNSETTLED_SECONDS = 1.0  # a file changed this recently may change again unseen (timestamps move in clock ticks)
UNSETTLED_WALKS = 3  # walks that wait for such a change to settle before the stamp is this walk's only
STAMP_THREADS = 2  # threads that take stamps, for every layer: a slow walk holds these, never a chunk thread


class DataStampRefused(MeshTooLarge):
    """A mag holds more files than the stamp walks: meshes and segment lists of the layer are refused (a 413)."""


class LayerMeshes:
    """One segmentation layer: its grid, its voxel size in nanometers, and the stamp of its data."""

    def __init__(self, dataset: Dataset, layer: Layer, stamps: ThreadPoolExecutor, stamp_files: int) -> None:
        self.dataset = dataset
        self.layer = layer
        self.name = layer.properties.name
        self.key = LayerKey(dataset.organization, dataset.name, dataset.version, self.name)
        self.grid = MeshGrid(layer.mags)
        scale = dataset.properties.scale
        nm = meters_per_unit(scale.unit) / 1e-9
        self.voxel_nm: tuple[float, float, float] = (scale.factor[0] * nm, scale.factor[1] * nm, scale.factor[2] * nm)
        self._stamps = stamps
        self._stamp_files = stamp_files
        self._taken: Future[str] | None = None  # the last walk, done: its stamp or its failure
        self._taken_until = 0.0  # (monotonic) when it is taken again
        self._walk: Future[str] | None = None  # the walk under way
        self._settles_at = float("inf")  # (monotonic) when the files the walk under way found changing settle
        self._lock = threading.RLock()

    @property
    def title(self) -> str:
        return f"{self.dataset.organization}/{self.dataset.name}/{self.name}"

    def stamp(self) -> str:
        """The data's current stamp; blocks while the walk runs (in a stamp thread). A failed walk raises its
        error again, :class:`DataStampRefused` for a mag of too many files."""
        try:
            return self._current().result()
        except Exception as exc:
            raise exc.with_traceback(None) from None  # the one remembered error, raised again for each caller

    def known_stamp(self) -> str | None:
        """The current stamp if it is taken already, else None (and a walk begins): never waits."""
        current = self._current()
        if not current.done() or current.exception() is not None:
            return None
        return current.result()

    async def ready(self) -> None:
        """Wait, on the event loop and holding no thread, until the current stamp is taken (or has failed: the
        request's thread then raises its error)."""
        try:
            await asyncio.shield(asyncio.wrap_future(self._current()))
        except Exception:  # raised again, with its answer, where the request needs the stamp
            return

    def _current(self) -> "Future[str]":
        """The remembered walk while it holds, else the walk under way, else a new one."""
        with self._lock:
            if self._taken is not None and time.monotonic() < self._taken_until:
                return self._taken
            if self._walk is None:
                started = time.monotonic()
                walk = self._walk = self._stamps.submit(self._take)
                # a walk already done runs the callback here, which clears ``_walk``: return the walk itself
                walk.add_done_callback(lambda done: self._remember(done, started))
                return walk
            return self._walk

    def _remember(self, walk: "Future[str]", started: float) -> None:
        now = time.monotonic()
        hold = FAILURE_SECONDS if walk.cancelled() or walk.exception() is not None else STAMP_SECONDS
        with self._lock:
            until = now + max(hold, STAMP_SHARE * (now - started))
            self._taken, self._taken_until = walk, min(until, max(self._settles_at, now + 0.1))
            self._walk, self._settles_at = None, float("inf")

    def _take(self) -> str:
        """The stamp; off a store that cannot list, the time slot of ``STAMP_SECONDS``, so caches expire instead.
        While a file changed less than ``UNSETTLED_SECONDS`` ago, a rewrite within the same clock tick could leave
        every identity as it is: the walk waits until the change has settled and is taken again (at most
        ``UNSETTLED_WALKS`` times; data written on and on gets a stamp of this walk only, which nothing outlives)."""
        digest = ""
        for _ in range(UNSETTLED_WALKS):
            started = time.time()
            try:
                taken = take_stamp(self.layer.mags, self._stamp_files)
            except OversizedListingError as exc:
                raise DataStampRefused(
                    f"layer {self.name!r} cannot be told apart from an older version of its data: {exc} "
                    f"(the `stamp_files` setting), so its meshes and segment lists are not served"
                ) from None
            if taken is None:
                return f"unlisted-{int(started // STAMP_SECONDS)}"
            unsettled = taken.newest_change + UNSETTLED_SECONDS - time.time()
            if unsettled <= 0:
                return taken.digest
            digest = taken.digest
            time.sleep(min(unsettled, UNSETTLED_SECONDS))
        with self._lock:  # taken again as soon as it may have settled
            self._settles_at = time.monotonic() + UNSETTLED_SECONDS
        return f"{digest}-unsettled-{time.time_ns():x}"


class MeshLayers:
    """The segmentation layers asked for so far, each made again when its dataset is reloaded."""

    def __init__(self, stamp_files: int = STAMP_FILES) -> None:
        self._layers: dict[tuple[str, str, str], LayerMeshes] = {}
        self._stamps = ThreadPoolExecutor(STAMP_THREADS, thread_name_prefix="data-stamp")
        self._stamp_files = stamp_files
        self._lock = threading.Lock()

    def layer(self, dataset: Dataset, name: str) -> LayerMeshes:
        """The layer's meshes; a 400 for a layer that has none by its nature, a 404 for no such layer."""
        layer = dataset.layers.get(name)
        if layer is None:
            raise MeshNotFound(f"no layer {name!r} in {dataset.organization}/{dataset.name}")
        if layer.properties.category != "segmentation":
            raise MeshInputError(
                f"layer {name!r} is a {layer.properties.category} layer: only segmentations have meshes"
            )
        if not layer.mags:
            raise MeshNotFound(f"layer {name!r} has no servable mag: {'; '.join(layer.problems)}")
        segment_dtype(next(iter(layer.mags.values())))
        key = (dataset.organization, dataset.name, name)
        with self._lock:  # one per layer version, so that its requests share one stamp
            meshes = self._layers.get(key)
            if meshes is None or meshes.dataset is not dataset:
                meshes = self._layers[key] = LayerMeshes(dataset, layer, self._stamps, self._stamp_files)
        return meshes
