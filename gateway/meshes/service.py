"""The mesh sources of a data root: every file of both precomputed formats, made on demand and cached.

Per segmentation layer there are two sources, each a directory of files:

- ``multires/``: ``info``, ``{id}.index`` (manifest), ``{id}`` (the fragments, read by byte range),
  ``segment_properties/info``;
- ``legacy/``: ``info``, ``{id}:0`` (a JSON list of fragments), ``{id}:0:{x}_{y}_{z}`` (one level-0
  cube), ``segment_properties/info``.

Everything here is computation on voxels: callers run it in a thread. A segment's multi-resolution
files need all its fragments (the manifest holds their sizes), so they are made together, once, and
cached; a legacy fragment is one cube. Work per request is bounded (``MULTIRES_VOXELS``), and bodies
depend only on the voxels, so replicas agree byte for byte.
"""

import logging
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from gateway_storage import ByteLRU, StorageError, Store
from gateway_storage.geometry import Vec3
from wkw_adapter import WkwError

from ..sources.catalog import Dataset, Layer
from ..sources.documents import load_json
from .encoding import (
    LevelFragments,
    draco_fragment,
    empty_manifest,
    json_bytes,
    legacy_fragment,
    legacy_info,
    multires_info,
    multires_manifest,
    segment_properties,
)
from .errors import MeshInputError, MeshNotFound, MeshTooLarge, SegmentIndexRequired
from .geometry import MeshGrid, morton_key
from .index import (
    MAX_INDEX_BYTES,
    SCAN_VOXELS,
    SegmentIndex,
    SegmentIndexCorrupt,
    build_index,
    data_stamp,
    segment_dtype,
)
from .surfaces import Surface, segment_surface, window_of

log = logging.getLogger("gateway.meshes")
T = TypeVar("T")

PROPERTIES_DIRECTORY = "segment_properties"
PROPERTIES_INFO = f"{PROPERTIES_DIRECTORY}/info"
INDEX_SUFFIX = ".segment-index.npz"
LABELS_SUFFIX = ".segment-labels.json"
# Voxels read to make one segment's multi-resolution mesh (every level): beyond it a manifest is a 413
# that points to the legacy source, whose fragments are made one cube per request.
MULTIRES_VOXELS = 128 << 20
STAMP_SECONDS = 5.0  # the data's stamp (a walk of its mag directories) is taken again at most this often
MAX_LABELS_BYTES = 64 << 20  # a segment labels file larger than this is ignored (and said so in the log)
MAX_LISTED_SEGMENTS = 100_000  # segment properties list at most this many segments, the largest
LARGEST_ON_PAGE = 3
_ID = re.compile(r"[0-9]{1,20}")
_CUBE = re.compile(r"([0-9]{1,7})_([0-9]{1,7})_([0-9]{1,7})")
OCTET_STREAM = "application/octet-stream"
JSON = "application/json"


@dataclass(frozen=True, slots=True)
class MeshFile:
    body: bytes
    media_type: str


def parse_segment_id(text: str) -> int:
    """A segment id as Neuroglancer writes it: base 10, 1 to 2**64 - 1."""
    if not _ID.fullmatch(text) or not 0 < int(text) < 1 << 64:
        raise MeshInputError(f"{text!r} is not a segment id: ids are base-10 integers from 1 to 2**64-1")
    return int(text)


class LayerMeshes:
    """One segmentation layer: its grid, where its index lives, and the stamp of its data."""

    def __init__(self, dataset: Dataset, layer: Layer, voxel_nm: tuple[float, float, float]) -> None:
        self.dataset = dataset
        self.layer = layer
        self.name = layer.properties.name
        self.key = (dataset.organization, dataset.name, dataset.version, self.name)
        self.grid = MeshGrid(layer.mags)
        self.voxel_nm = voxel_nm
        self._stamp: tuple[str | None, float] | None = None
        self._lock = threading.Lock()

    def stamp(self, local: bool) -> str:
        """The data's current stamp, taken again once ``STAMP_SECONDS`` have passed. Off a local file system
        the data cannot be walked cheaply: the stamp is then the time slot, so caches expire instead."""
        now = time.monotonic()
        with self._lock:
            if self._stamp is not None and now < self._stamp[1]:
                cached = self._stamp[0]
                return cached if cached is not None else f"unchecked-{int(now // STAMP_SECONDS)}"
        stamp = data_stamp(self.layer.mags, local)
        with self._lock:
            self._stamp = (stamp, now + STAMP_SECONDS)
        return stamp if stamp is not None else f"unchecked-{int(now // STAMP_SECONDS)}"


class MeshService:
    """Mesh files of every segmentation layer; holds caches only."""

    def __init__(
        self,
        storage: Store,
        index_dir: Path | None,
        cache_bytes: int,
        meters_per_unit: Callable[[str], float],
    ) -> None:
        self.storage = storage
        self.index_dir = index_dir
        self.meters_per_unit = meters_per_unit
        self.cache: ByteLRU[Any] = ByteLRU(cache_bytes)
        self._layers: dict[tuple[str, str, str], LayerMeshes] = {}
        self._pending: dict[Hashable, threading.Lock] = {}
        self._lock = threading.Lock()

    # --- layers and their indexes --------------------------------------------------------------

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
        meshes = self._layers.get(key)
        if meshes is None or meshes.dataset is not dataset:
            scale = dataset.properties.scale
            nm = self.meters_per_unit(scale.unit) / 1e-9
            voxel_nm = (scale.factor[0] * nm, scale.factor[1] * nm, scale.factor[2] * nm)
            meshes = self._layers[key] = LayerMeshes(dataset, layer, voxel_nm)
        return meshes

    def index_location(self, dataset: Dataset, layer: str) -> str:
        """Where ``index-segments`` writes the layer's index and the gateway reads it."""
        if self.index_dir is not None:
            return str(self.index_dir / dataset.organization / dataset.name / f"{layer}{INDEX_SUFFIX}")
        return self.storage.join(dataset.directory, f"{layer}{INDEX_SUFFIX}")

    def _read_beside(self, path: str) -> bytes | None:
        if self.index_dir is not None:
            try:
                return Path(path).read_bytes()
            except FileNotFoundError:
                return None
        identity = self.storage.identity(path)
        if identity is None:
            return None
        if identity.size > MAX_INDEX_BYTES:
            raise SegmentIndexCorrupt(f"segment index {self.storage.relative(path)} is larger than {MAX_INDEX_BYTES}")
        found = self.storage.read_whole(path, limit=MAX_INDEX_BYTES)
        return None if found is None else found[0]

    def segments(self, meshes: LayerMeshes, scan: bool = True) -> SegmentIndex:
        """The layer's segments: its index file when that describes the current data, else a scan of a small
        layer; otherwise a 409 that says to run ``index-segments``."""
        stamp = meshes.stamp(self.storage.is_local)
        key = ("segments", meshes.key, stamp)
        cached: SegmentIndex | None = self.cache.get(key)
        if cached is not None:
            return cached
        location = self.index_location(meshes.dataset, meshes.name)
        data = self._read_beside(location)
        stale = False
        if data is not None:
            index = SegmentIndex.from_bytes(data, f"{meshes.dataset.organization}/{meshes.dataset.name}/{meshes.name}")
            if index.stamp == stamp:
                self.cache.put(key, index, index.nbytes)
                return index
            stale = True
        if not scan or meshes.grid.voxels > SCAN_VOXELS:
            command = (
                f"zarr-gateway index-segments ROOT {meshes.dataset.organization}/{meshes.dataset.name} {meshes.name}"
            )
            why = "its segment index is older than its data" if stale else "it has no segment index"
            raise SegmentIndexRequired(
                f"layer {meshes.name!r} needs a segment index: {why}, and its finest mag holds "
                f"{meshes.grid.voxels} voxels, more than the {SCAN_VOXELS} scanned on demand; run `{command}`"
            )

        def scan_layer() -> SegmentIndex:
            return build_index(meshes.grid, meshes.name, stamp)

        index = self.cached(key, scan_layer, lambda i: i.nbytes)
        return index

    def can_list(self, meshes: LayerMeshes) -> bool:
        """Whether segment properties can be answered now (an index, or a layer small enough to scan)."""
        if meshes.grid.voxels <= SCAN_VOXELS:
            return True
        try:
            self.segments(meshes, scan=False)
        except SegmentIndexRequired:
            return False
        return True

    def largest_segments(self, dataset: Dataset, layer: str, count: int = LARGEST_ON_PAGE) -> list[int]:
        """A few of the largest segments, for a viewer link: from a current index or a scan made already,
        never from a new scan (listings are read by every client that opens the dataset), else none."""
        try:
            meshes = self.layer(dataset, layer)
            return self.segments(meshes, scan=False).largest(count)
        except (SegmentIndexRequired, MeshInputError, MeshNotFound):
            return []
        except (OSError, StorageError, WkwError) as exc:  # a page must not fail for a fault in one layer's data
            log.warning("segments of layer %s of %s/%s: %s", layer, dataset.organization, dataset.name, exc)
            return []

    def cached(self, key: Hashable, compute: Callable[[], T], size: Callable[[T], int]) -> T:
        """``compute()`` cached under ``key``; concurrent requests for the same key wait for the first."""
        with self._lock:
            lock = self._pending.setdefault(key, threading.Lock())
        try:
            with lock:
                cached: T | None = self.cache.get(key)
                if cached is not None:
                    return cached
                value = compute()
                self.cache.put(key, value, size(value))
                return value
        finally:
            with self._lock:
                self._pending.pop(key, None)

    # --- files ---------------------------------------------------------------------------------

    def file(self, dataset: Dataset, layer: str, kind: str, name: str) -> MeshFile:
        """The file ``name`` of mesh source ``kind`` (``multires`` or ``legacy``) of a layer."""
        source = MESH_SOURCES.get(kind)
        if source is None:
            raise MeshNotFound(f"no mesh source {kind!r}; there are {', '.join(MESH_SOURCES)}")
        meshes = self.layer(dataset, layer)
        if name == "info":
            properties = PROPERTIES_DIRECTORY if self.can_list(meshes) else None
            return MeshFile(json_bytes(source.info(meshes, properties)), JSON)
        if name == PROPERTIES_INFO:
            return MeshFile(self._properties(meshes), JSON)
        return source.file(self, meshes, name)

    def _properties(self, meshes: LayerMeshes) -> bytes:
        index = self.segments(meshes)
        labels_path = self.storage.join(meshes.dataset.directory, f"{meshes.name}{LABELS_SUFFIX}")
        labels_version = getattr(self.storage.identity(labels_path), "version", None)
        key = ("properties", meshes.key, index.stamp, id(index), labels_version)

        def render() -> bytes:
            labels = self._labels(meshes, labels_path)
            ids, voxels = index.ids, index.voxels
            if len(ids) > MAX_LISTED_SEGMENTS:
                keep = np.sort(np.lexsort((ids, -voxels.astype(np.int64)))[:MAX_LISTED_SEGMENTS])
                ids, voxels = ids[keep], voxels[keep]
            return json_bytes(segment_properties(ids, voxels, labels))

        return self.cached(key, render, len)

    def _labels(self, meshes: LayerMeshes, path: str) -> dict[int, str]:
        """Names of segments, where the dataset has them: ``{layer}.segment-labels.json`` beside the layer (part
        of the dataset, wherever the index lives), a JSON object from id to name. A file that is not one is
        ignored, and said so in the log."""
        identity = self.storage.identity(path)
        if identity is None:
            return {}
        try:
            if identity.size > MAX_LABELS_BYTES:
                raise ValueError(f"it holds {identity.size} bytes, more than {MAX_LABELS_BYTES}")
            found = self.storage.read_whole(path, limit=MAX_LABELS_BYTES)
            if found is None:
                return {}
            document = load_json(found[0])
            return {parse_segment_id(str(k)): str(v) for k, v in document.items()}
        except (ValueError, AttributeError, MeshInputError) as exc:
            log.warning("segment labels of layer %s are not a JSON object of id to name: %s", meshes.name, exc)
            return {}


class MeshSource(ABC):
    """One precomputed mesh format: its ``info`` and the files below it (``info`` and the segment properties
    are the service's, the same for both)."""

    name: str

    @abstractmethod
    def info(self, meshes: LayerMeshes, properties: str | None) -> dict[str, Any]:
        """The source's ``info`` document."""

    @abstractmethod
    def file(self, service: MeshService, meshes: LayerMeshes, name: str) -> MeshFile:
        """Any other file of the source; a 400 for a name it cannot have."""


class MultiresSource(MeshSource):
    """``neuroglancer_multilod_draco``: ``{id}.index`` and ``{id}``, made together (the manifest holds every
    fragment's size) and cached; one level of detail per mag."""

    name = "multires"

    def info(self, meshes: LayerMeshes, properties: str | None) -> dict[str, Any]:
        return multires_info(meshes.voxel_nm, properties)

    def file(self, service: MeshService, meshes: LayerMeshes, name: str) -> MeshFile:
        manifest, data = self._files(service, meshes, parse_segment_id(name.removesuffix(".index")))
        return MeshFile(manifest if name.endswith(".index") else data, OCTET_STREAM)

    def _files(self, service: MeshService, meshes: LayerMeshes, segment: int) -> tuple[bytes, bytes]:
        index = service.segments(meshes)
        entry = index.lookup(segment)
        if entry is None:
            return empty_manifest(meshes.grid.chunk_shape), b""
        key = ("multires", meshes.key, index.stamp, segment)

        def make() -> tuple[bytes, bytes]:
            return self._make(meshes, segment, entry.cubes)

        return service.cached(key, make, lambda files: len(files[0]) + len(files[1]) + 64)

    @staticmethod
    def _make(meshes: LayerMeshes, segment: int, cubes: list[Vec3]) -> tuple[bytes, bytes]:
        grid = meshes.grid
        plans = []
        work = 0
        for level in grid.levels:
            shift = level.lod
            positions = sorted({(x >> shift, y >> shift, z >> shift) for x, y, z in cubes}, key=morton_key)
            edge = level.cube_voxels
            work += len(positions) * (edge[0] + 1) * (edge[1] + 1) * (edge[2] + 1)
            plans.append((level, positions))
        if work > MULTIRES_VOXELS:
            raise MeshTooLarge(
                f"segment {segment} spans {len(cubes)} cubes: its multi-resolution mesh would read {work} voxels, "
                f"more than the {MULTIRES_VOXELS} one request may; the legacy source "
                f"(.../{meshes.name}/legacy/) makes its mesh one cube per request"
            )
        levels = []
        for level, positions in plans:
            fragments = []
            for position in positions:
                parts = [segment_surface(level.source, segment, lo, hi) for lo, hi in level.parts(position)]
                fragments.append(draco_fragment(Surface.concatenate(parts), level, position))
            levels.append(LevelFragments(level, positions, fragments))
        manifest = multires_manifest(grid.chunk_shape, levels)
        return manifest, b"".join(f for lf in levels for f in lf.fragments)


class LegacySource(MeshSource):
    """``neuroglancer_legacy_mesh``: ``{id}:0`` lists the segment's level-0 cubes, ``{id}:0:{x}_{y}_{z}`` is one
    of them, meshed when asked for (at the finest mag)."""

    name = "legacy"

    def info(self, meshes: LayerMeshes, properties: str | None) -> dict[str, Any]:
        return legacy_info(properties)

    def file(self, service: MeshService, meshes: LayerMeshes, name: str) -> MeshFile:
        segment_text, sep, rest = name.partition(":")
        if sep != ":" or not (rest == "0" or rest.startswith("0:")):
            raise MeshInputError(
                f"{name!r} is not a legacy mesh file: they are {{id}}:0 and {{id}}:0:{{x}}_{{y}}_{{z}}"
            )
        segment = parse_segment_id(segment_text)
        if rest == "0":
            entry = service.segments(meshes).lookup(segment)
            cubes = [] if entry is None else entry.cubes
            return MeshFile(json_bytes({"fragments": [f"{segment}:0:{x}_{y}_{z}" for x, y, z in cubes]}), JSON)
        match = _CUBE.fullmatch(rest[2:])
        if match is None:
            raise MeshInputError(f"{name!r} is not a legacy fragment: they are {{id}}:0:{{x}}_{{y}}_{{z}}")
        cube = (int(match[1]), int(match[2]), int(match[3]))
        return MeshFile(self._fragment(service, meshes, segment, cube), OCTET_STREAM)

    @staticmethod
    def _fragment(service: MeshService, meshes: LayerMeshes, segment: int, cube: Vec3) -> bytes:
        level = meshes.grid.levels[0]
        lo, hi = level.box(cube)
        window_lo, _ = window_of(lo, hi)
        if any(w >= b for w, b in zip(window_lo, level.source.bbox.hi)):
            raise MeshNotFound(f"cube {cube} lies outside layer {meshes.name!r}")
        key = ("legacy", meshes.key, meshes.stamp(service.storage.is_local), segment, cube)

        def make() -> bytes:
            return legacy_fragment(segment_surface(level.source, segment, lo, hi), level.mag, meshes.voxel_nm)

        return service.cached(key, make, len)


MESH_SOURCES: dict[str, MeshSource] = {source.name: source for source in (MultiresSource(), LegacySource())}
