"""The precomputed tree: ``/data/precomputed/{organization}/{dataset}/{layer}/`` is a Neuroglancer precomputed
volume (``info``, ``{scale key}/{chunk key}``), with the layer's meshes and segment properties beside it.

``/data/precomputed_raw/...`` is the same tree with every chunk ``raw`` (segmentations included), for clients
that cannot decode ``compressed_segmentation``. ``mesh/`` and ``segment_properties/`` are the mesh service's
multi-resolution source (:mod:`gateway.meshes`), delegated to, not made again. Everything here may read
storage: callers run :meth:`PrecomputedTree.answer` in a thread.
"""

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import get_args

import numpy as np

from gateway_storage import StoreUnavailableError
from gateway_storage.geometry import mag_name

from ..extras import MESHES, MissingExtraError
from ..meshes.errors import MeshInputError, MeshNotFound
from ..meshes.formats import PROPERTIES_DIRECTORY, PROPERTIES_INFO
from ..meshes.service import MeshService
from ..resources import JSON, OCTET_STREAM, Resource, bytes_resource, files_etag, make_etag
from ..sources.dataset import Dataset, Layer
from ..sources.mag import ChunkNotFound, MagSource
from ..sources.metadata import PrecomputedDataType
from ..sources.paths import UNSAFE_SEGMENTS, is_safe_segment
from ..zarr.keys import MalformedKey
from ..zarr.trees import NodeNotFound
from .encodings import GZIP_CODING, ChunkEncoding, accepts_gzip, encoding_for, gzip_body, has_compressed_segmentation
from .info import Scale, VolumeInfo, render_info
from .keys import chunk_box

PRECOMPUTED_PREFIX = "/data/precomputed"  # both trees below /data/ start so: routed before the Zarr trees
TREES = {"precomputed": False, "precomputed_raw": True}  # tree name: whether every chunk is raw
INFO = "info"
MESH_DIRECTORY = "mesh"
MESH_KIND = "multires"  # the mesh service's source that the precomputed ``mesh`` directory is
# The data types of the format (Neuroglancer's precomputed volume spec and its DataType: no int64, no float64).
DATA_TYPES: tuple[str, ...] = get_args(PrecomputedDataType)
VARY = (b"vary", b"Accept-Encoding")

ListingRow = tuple[str, bool, str | None]  # name, is a directory, why it cannot be served
RenderListing = Callable[[str, list[ListingRow]], Resource]
INFO_BYTES = 64 << 10  # a volume's info while it is made: its scales as objects, JSON text and bytes


@dataclass(frozen=True, slots=True)
class PrecomputedTarget:
    """What a path of the tree names: a node (organization, dataset, layer: as far as given) and the path below."""

    tree_name: str
    names: tuple[str, ...]
    below: tuple[str, ...] = ()

    @property
    def raw_only(self) -> bool:
        return TREES[self.tree_name]

    @property
    def base(self) -> str:
        """The node's own path, ending in "/": what its listing's links start with."""
        return "/data/" + "/".join((self.tree_name, *self.names, *self.below)) + "/"

    @property
    def route(self) -> str:
        """The kind of resource, a bounded metric label."""
        if len(self.names) < 3 or not self.below:
            return "listing"
        if self.below[0] in (MESH_DIRECTORY, PROPERTIES_DIRECTORY):
            return "mesh"
        return "metadata" if self.below == (INFO,) else "chunk"


def parse_precomputed_path(path: str) -> PrecomputedTarget:
    """The target of a path below ``/data/precomputed``; :class:`NodeNotFound` for another tree's name."""
    tree_name, _, rest = path.removeprefix("/data/").partition("/")
    if tree_name not in TREES:
        raise NodeNotFound(f"unknown tree {tree_name!r}; the precomputed trees are {', '.join(TREES)}")
    segments = [s for s in rest.split("/") if s]
    if not all(is_safe_segment(s) for s in segments):
        raise MalformedKey(UNSAFE_SEGMENTS)
    return PrecomputedTarget(tree_name, tuple(segments[:3]), tuple(segments[3:]))


@dataclass(frozen=True, slots=True)
class ServedScale:
    scale: Scale
    source: MagSource
    fingerprint: str  # changes with the source and with how it is served


@dataclass(frozen=True, slots=True)
class Volume:
    """A layer as one precomputed volume (its ``info`` without the mesh fields, which are looked up per request)."""

    dataset: Dataset
    layer: Layer
    info: VolumeInfo
    scales: dict[str, ServedScale] = field(default_factory=dict)

    def scale(self, key: str) -> ServedScale:
        found = self.scales.get(key)
        if found is None:
            raise NodeNotFound(
                f"no scale {key!r} in layer {self.layer.properties.name!r}; there are {', '.join(self.scales)}"
            )
        return found


@dataclass(frozen=True, slots=True)
class Found:
    """An answer of the tree: its resource and the headers it adds (content coding, Vary)."""

    resource: Resource
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


class PrecomputedTree:
    """Both precomputed trees over the catalog's datasets; holds caches only."""

    def __init__(
        self,
        meshes: MeshService,
        meters_per_unit: Callable[[str], float],
        chunk_edge: int,
        listing_bytes: Callable[[list[ListingRow]], int],
    ) -> None:
        self.meshes = meshes
        self.meters_per_unit = meters_per_unit
        self.chunk_edge = chunk_edge
        self.listing_bytes = listing_bytes  # what a listing of rows holds while it is rendered
        self.compresses = has_compressed_segmentation()
        self._volumes: dict[tuple[str, str, str, bool], Volume] = {}

    # --- the one entry point ------------------------------------------------------------------

    def answer(
        self, dataset: Dataset, target: PrecomputedTarget, accept_encoding: str, render_listing: RenderListing
    ) -> Found:
        """What ``target`` (a dataset or below, its dataset found and the access decided) answers; a listing is
        rendered by ``render_listing``, the request's own (its links keep the page's credential form)."""
        rows = self._listed(dataset, target)
        if rows is not None:
            return Found(render_listing(target.base, rows))
        volume = self.volume(dataset, target.names[2], target.raw_only)
        below = target.below
        mesh_file = self._mesh_name(target)
        if mesh_file is not None:
            return self._mesh_file(volume, mesh_file)
        gzip = accepts_gzip(accept_encoding)
        if below == (INFO,):
            return _coded(bytes_resource(render_info(self._full_info(volume)), JSON), gzip)
        served = volume.scale(below[0])
        if len(below) > 2:
            raise MalformedKey(
                f"{'/'.join(below[1:])!r} is not a chunk key: they are x0-x1_y0-y1_z0-z1, directly below the scale"
            )
        return _coded(self._chunk(served, below[1]), gzip)

    def reading_bytes(self, dataset: Dataset, target: PrecomputedTarget) -> int:
        """What answering ``target`` holds at most, from sizes and metadata: a listing its rows
        (``listing_bytes``), a volume's ``info`` the document and the index it asks of the mesh service, a mesh
        file or the segment properties what the mesh service says (:meth:`MeshService.file_bytes`), a chunk
        :meth:`working_bytes`. Blocking (stats), so in a thread."""
        rows = self._listed(dataset, target)
        if rows is not None:
            return self.listing_bytes(rows)
        layer = target.names[2]
        mesh_file = self._mesh_name(target)
        if mesh_file is not None:
            return self.meshes.file_bytes(dataset, layer, MESH_KIND, mesh_file)
        if target.below == (INFO,):
            return INFO_BYTES + self.meshes.file_bytes(dataset, layer, MESH_KIND, INFO)
        return self.working_bytes(dataset, target)

    def _listed(self, dataset: Dataset, target: PrecomputedTarget) -> list[ListingRow] | None:
        """The rows of the listing ``target`` names, or None for a file."""
        if len(target.names) == 2:
            return self.layer_rows(dataset)
        below = target.below
        if not below:
            return self._volume_rows(self.volume(dataset, target.names[2], target.raw_only))
        if len(below) == 1 and below[0] in (MESH_DIRECTORY, PROPERTIES_DIRECTORY):
            return [(INFO, False, None)]
        if len(below) == 1 and below[0] != INFO:
            self.volume(dataset, target.names[2], target.raw_only).scale(below[0])
            return []  # chunks are not listed, as in the Zarr trees
        return None

    @staticmethod
    def _mesh_name(target: PrecomputedTarget) -> str | None:
        """The mesh service's name of a file below ``mesh/`` or ``segment_properties/``, or None."""
        first, rest = target.below[0], "/".join(target.below[1:])
        if first == MESH_DIRECTORY:
            return rest
        if first == PROPERTIES_DIRECTORY:
            return PROPERTIES_INFO if rest == INFO else f"{PROPERTIES_DIRECTORY}/{rest}"
        return None

    def working_bytes(self, dataset: Dataset, target: PrecomputedTarget) -> int:
        """The most memory answering ``target`` holds at once, from the metadata alone (0 but for a chunk or a mesh
        file): the blocks it decodes, the chunk, its encoded body and a gzipped copy; a mesh file what one mesh
        request may (:meth:`MeshService.working_bytes`). Cheap: no file is read."""
        if len(target.names) < 3 or len(target.below) != 2 or target.below[0] == PROPERTIES_DIRECTORY:
            return 0
        if target.below[0] == MESH_DIRECTORY:
            return self.meshes.working_bytes(dataset, target.names[2], MESH_KIND, target.below[1])
        source = self.volume(dataset, target.names[2], target.raw_only).scale(target.below[0]).source
        edge = (self.chunk_edge,) * 3
        chunk = self.chunk_edge**3 * source.channels * source.dtype.itemsize
        return source.decoded_bytes(edge) + 3 * chunk

    # --- volumes ------------------------------------------------------------------------------

    def layer_rows(self, dataset: Dataset) -> list[ListingRow]:
        """The dataset's layers, each a directory, or listed with the reason it cannot be served."""
        rows: list[ListingRow] = []
        for name, layer in dataset.layers.items():
            reason = unusable_reason(layer)
            rows.append((name, reason is None, reason))
        return rows

    def volume(self, dataset: Dataset, name: str, raw_only: bool) -> Volume:
        layer = dataset.layers.get(name)
        if layer is None:
            raise NodeNotFound(
                f"no layer {name!r} in {dataset.organization}/{dataset.name}; there are {', '.join(dataset.layers)}"
            )
        reason = unusable_reason(layer)
        if layer.away is not None:
            raise StoreUnavailableError(f"layer {name!r} cannot be reached: {layer.away}")
        if reason is not None:
            raise NodeNotFound(f"no servable layer {name!r} in {dataset.organization}/{dataset.name}: {reason}")
        key = (dataset.organization, dataset.name, name, raw_only)
        found = self._volumes.get(key)
        if found is None or found.dataset is not dataset:
            found = self._volumes[key] = self._build(dataset, layer, raw_only)
        return found

    def _build(self, dataset: Dataset, layer: Layer, raw_only: bool) -> Volume:
        properties = layer.properties
        scale = dataset.properties.scale
        nm = self.meters_per_unit(scale.unit) / 1e-9
        encoding = encoding_for(properties.category, properties.dtype, raw_only, self.compresses)
        edge = (self.chunk_edge,) * 3
        served: dict[str, ServedScale] = {}
        for mag, source in sorted(layer.mags.items(), key=lambda item: (max(item[0]), item[0])):
            lo, hi = source.bbox.lo, source.bbox.hi
            resolution = (scale.factor[0] * nm * mag[0], scale.factor[1] * nm * mag[1], scale.factor[2] * nm * mag[2])
            size = (hi[0] - lo[0], hi[1] - lo[1], hi[2] - lo[2])
            entry = Scale(mag_name(mag), size, lo, resolution, edge, encoding)
            fingerprint = make_etag(
                "precomputed", source.kind, source.location_key, entry.key, lo, size, edge, encoding.name
            )
            served[entry.key] = ServedScale(entry, source, fingerprint)
        channels = next(iter(layer.mags.values())).channels
        kind = "segmentation" if properties.category == "segmentation" else "image"
        info = VolumeInfo(kind, properties.dtype.name, channels, tuple(s.scale for s in served.values()))
        return Volume(dataset, layer, info, served)

    def _volume_rows(self, volume: Volume) -> list[ListingRow]:
        info = self._full_info(volume)
        rows: list[ListingRow] = [(INFO, False, None)]
        rows += [(scale.key, True, None) for scale in info.scales]
        rows += [(name, True, None) for name in (info.mesh, info.segment_properties) if name is not None]
        return rows

    def _full_info(self, volume: Volume) -> VolumeInfo:
        """The volume's info with ``mesh`` and ``segment_properties`` where the mesh service has them now."""
        if volume.layer.properties.category != "segmentation":
            return volume.info
        try:
            MESHES.require("meshes")
            meshes = self.meshes.layer(volume.dataset, volume.layer.properties.name)
        except (MeshInputError, MeshNotFound, MissingExtraError):
            return volume.info  # a layer without meshes by nature (its data type), or without the extra
        properties = PROPERTIES_DIRECTORY if self.meshes.segments.can_list(meshes) else None
        return replace(volume.info, mesh=MESH_DIRECTORY, segment_properties=properties)

    # --- files --------------------------------------------------------------------------------

    def _mesh_file(self, volume: Volume, name: str) -> Found:
        # never gzipped: fragments are read by range
        return Found(self.meshes.file(volume.dataset, volume.layer.properties.name, MESH_KIND, name))

    @staticmethod
    def _chunk(served: ServedScale, key: str) -> Resource:
        """One chunk, read from the mag and encoded; absent (404) where the source knows that nothing is stored
        in it and it reads as zeros, which is what precomputed clients fill an absent chunk with. The format
        has no fill value to declare: a chunk of another fill value is answered with it."""
        scale, source = served.scale, served.source
        lo, hi = chunk_box(key, scale.voxel_offset, scale.end, scale.chunk_size)
        region = source.read_held(lo, hi) if source.fill_value == 0 else source.read_box(lo, hi)
        if region is None:
            raise ChunkNotFound("no stored data lies in this chunk: it reads as zeros (CloudVolume: fill_missing=True)")
        body = scale.encoding.encode(region.data)
        if region.sources is None:
            return bytes_resource(body, OCTET_STREAM, make_etag(served.fingerprint, key, body))
        mtimes = [identity.mtime for _, identity in region.sources if identity is not None]
        etag = files_etag(served.fingerprint, key, source.relative, region.sources)
        return bytes_resource(body, OCTET_STREAM, etag, max(mtimes, default=None))


def unusable_reason(layer: Layer) -> str | None:
    """Why a layer cannot be a precomputed volume, or None."""
    if not layer.mags:
        return "; ".join(layer.problems) or "it has no servable mag"
    dtype: np.dtype = layer.properties.dtype
    if dtype.name not in DATA_TYPES:
        return f"its data type {dtype.name} is none of the precomputed format's ({', '.join(DATA_TYPES)})"
    return None


def _coded(resource: Resource, gzip: bool) -> Found:
    """``resource`` gzipped when the client takes gzip (its own ETag: one ETag, one body), always with Vary."""
    if not gzip:
        return Found(resource, [VARY])
    body = gzip_body(resource.body or b"")
    coded = bytes_resource(body, resource.media_type, make_etag(resource.etag, GZIP_CODING), resource.last_modified)
    return Found(coded, [VARY, (b"content-encoding", b"gzip")])


__all__ = [
    "PRECOMPUTED_PREFIX",
    "ChunkEncoding",
    "Found",
    "PrecomputedTarget",
    "PrecomputedTree",
    "parse_precomputed_path",
]
