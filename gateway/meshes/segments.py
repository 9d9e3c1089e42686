"""A layer's segments: its segment index (read through a store, or scanned), their labels and properties.

The index lives where ``index-segments`` writes it (:class:`IndexPlace`), and so does a stored mesh set
(``mesh-segments``): beside the layer, in the data root's store, or below ``segment_index_dir``, a local
directory opened as a store of its own (for data roots mounted read-only). Either way it is read through a
store, so containment, versions and the size bound hold for it as for any data file.
"""

import io
import logging
import zipfile
from abc import ABC, abstractmethod

import numpy as np

from gateway_storage import FileIdentity, LocalStore, StorageError, Store
from wkw_adapter import WkwError

from ..sources.dataset import Dataset
from ..sources.documents import load_json
from .cache import LargestKey, MeshCache, PropertiesKey, SegmentsKey
from .encoding import json_bytes, segment_properties
from .errors import MeshInputError, SegmentIndexRequired
from .index import MAX_INDEX_BYTES, SCAN_VOXELS, SegmentIndex, SegmentIndexCorrupt, build_index
from .layers import LayerMeshes
from .names import parse_segment_id

log = logging.getLogger("gateway.meshes")

INDEX_SUFFIX = ".segment-index.npz"
MESH_SET_SUFFIX = ".meshes"  # a directory: the stored mesh set (gateway/meshes/stored.py)
LABELS_SUFFIX = ".segment-labels.json"
# The largest index file a dataset page reads (for a few of the largest segments to select in its viewer link):
# about a million segments. A larger one is read only when its segments are asked for.
PAGE_INDEX_BYTES = 64 << 20
MAX_LISTED_SEGMENTS = 100_000  # segment properties list at most this many segments, the largest
# A segment labels file larger than this, or naming more segments, is ignored (and said so in the log): a name
# for each listed segment (``MAX_LISTED_SEGMENTS``) at tens of bytes each. Both are checked before it is parsed.
MAX_LABELS_BYTES = 8 << 20
MAX_LABELS = 2 * MAX_LISTED_SEGMENTS
# What making a layer's segment properties holds beside its index, counted against the worker's memory budget before
# it is made: per listed segment, its id, voxels and members as Python objects and as JSON (222 bytes measured
# for 100,000 segments with labels and member counts), and per byte of a labels file, the file parsed and its
# ids and names as a dict (6.8 measured for 200,000 names).
LISTED_SEGMENT_BYTES = 256
LABELS_HELD_PER_BYTE = 8


class IndexPlace(ABC):
    """Where the segment indexes and stored mesh sets of a data root live, and the store they are read through."""

    store: Store

    @abstractmethod
    def beside(self, dataset: Dataset, layer: str, suffix: str) -> str:
        """The path of ``<layer><suffix>`` at this place."""

    def location(self, dataset: Dataset, layer: str) -> str:
        """Where ``index-segments`` writes the layer's index and the gateway reads it."""
        return self.beside(dataset, layer, INDEX_SUFFIX)

    def mesh_set(self, dataset: Dataset, layer: str) -> str:
        """The directory of the layer's stored mesh set (``mesh-segments`` writes it, the gateway serves it)."""
        return self.beside(dataset, layer, MESH_SET_SUFFIX)

    def holds_indexes(self) -> bool:
        """Whether any index can be there: a directory of indexes that no run has made yet holds none."""
        return True


class BesideLayers(IndexPlace):
    """``<dataset>/<layer>.segment-index.npz`` (and ``<layer>.meshes/``) in the data root itself (a writable root)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def beside(self, dataset: Dataset, layer: str, suffix: str) -> str:
        return self.store.join(dataset.directory, f"{layer}{suffix}")


class InDirectory(IndexPlace):
    """``<directory>/<org>/<dataset>/<layer>.segment-index.npz`` (and ``<layer>.meshes/``): a local directory beside
    a read-only root."""

    def __init__(self, directory: str) -> None:
        self.store = LocalStore(directory)

    def beside(self, dataset: Dataset, layer: str, suffix: str) -> str:
        return self.store.join(self.store.root, dataset.organization, dataset.name, f"{layer}{suffix}")

    def holds_indexes(self) -> bool:
        return self.store.is_directory(self.store.root)


def index_place(storage: Store, index_dir: str | None) -> IndexPlace:
    """The place of the ``segment_index_dir`` setting: that directory, or beside the layers when unset."""
    return BesideLayers(storage) if index_dir is None else InDirectory(index_dir)


class Segments:
    """The segment index of each layer, its labels and its ``segment_properties/info``, cached."""

    def __init__(self, storage: Store, place: IndexPlace, cache: MeshCache) -> None:
        self.storage = storage
        self.place = place
        self.cache = cache

    def stamp(self, meshes: LayerMeshes) -> str:
        return meshes.stamp()

    def _index_identity(self, meshes: LayerMeshes) -> FileIdentity | None:
        """The layer's index file, if it has one."""
        if not self.place.holds_indexes():
            return None
        return self.place.store.identity(self.place.location(meshes.dataset, meshes.name))

    def _read_index(self, meshes: LayerMeshes) -> SegmentIndex | None:
        store = self.place.store
        identity = self._index_identity(meshes)
        if identity is None:
            return None
        path = self.place.location(meshes.dataset, meshes.name)
        if identity.size > MAX_INDEX_BYTES:
            raise SegmentIndexCorrupt(f"segment index {store.relative(path)} is larger than {MAX_INDEX_BYTES}")
        check_archive(store, path, identity)
        found = store.read_whole(path, limit=MAX_INDEX_BYTES)
        return None if found is None else SegmentIndex.from_bytes(found[0], meshes.title)

    def index(self, meshes: LayerMeshes, scan: bool = True) -> SegmentIndex:
        """The layer's segments: its index file when that describes the current data, else a scan of a small
        layer; otherwise a 409 that says to run ``index-segments``."""
        return self._index_at(meshes, self.stamp(meshes), scan)

    def _index_at(self, meshes: LayerMeshes, stamp: str, scan: bool = True) -> SegmentIndex:
        key = SegmentsKey(meshes.key, stamp)
        cached: SegmentIndex | None = self.cache.get(key)
        if cached is not None:
            return cached
        stored = self._read_index(meshes)
        if stored is not None and stored.stamp == stamp:
            self.cache.put(key, stored, stored.nbytes)
            return stored
        if not scan or meshes.grid.voxels > SCAN_VOXELS:
            dataset = f"{meshes.dataset.organization}/{meshes.dataset.name}"
            command = f"zarr-gateway index-segments ROOT {dataset} {meshes.name}"
            why = "its segment index is older than its data" if stored is not None else "it has no segment index"
            raise SegmentIndexRequired(
                f"layer {meshes.name!r} needs a segment index: {why}, and its finest mag holds "
                f"{meshes.grid.voxels} voxels, more than the {SCAN_VOXELS} scanned on demand; run `{command}`"
            )
        return self.cache.made(key, lambda: build_index(meshes.grid, meshes.name, stamp), _nbytes)

    def largest(self, meshes: LayerMeshes, count: int) -> list[int]:
        """A few of the largest segments, for a page every client that opens the dataset reads: from an index
        held already, or from an index file of at most ``PAGE_INDEX_BYTES``; never a scan, never a larger file
        (which only a request for the segments themselves reads). Found once per version of the data and of
        the index file, whoever asks meanwhile; a failure is remembered, as none, until either changes."""
        stamp = self.stamp(meshes)
        identity = self._index_identity(meshes)
        key = LargestKey(meshes.key, stamp, None if identity is None else identity.version, count)
        return self.cache.made(key, lambda: self._find_largest(meshes, stamp, identity, count), _list_bytes)

    def largest_bytes(self, meshes: LayerMeshes, count: int) -> int:
        """What :meth:`largest` holds, from sizes alone: nothing where they are found already or the index is
        held; else the index file a page may read (:meth:`index_bytes`), none past ``PAGE_INDEX_BYTES``."""
        identity = self._index_identity(meshes)
        key = LargestKey(meshes.key, self.stamp(meshes), None if identity is None else identity.version, count)
        if self.cache.get(key) is not None or self.held(meshes) is not None:
            return 0
        if identity is None or identity.size > PAGE_INDEX_BYTES:
            return 0
        try:
            return self.index_bytes(meshes)[0]
        except (SegmentIndexCorrupt, OSError, StorageError):
            return 0  # refused without reading it: the page finds none, and remembers

    def _find_largest(self, meshes: LayerMeshes, stamp: str, identity: FileIdentity | None, count: int) -> list[int]:
        held: SegmentIndex | None = self.cache.get(SegmentsKey(meshes.key, stamp))
        if held is not None:
            return held.largest(count)
        if identity is None or identity.size > PAGE_INDEX_BYTES:
            return []
        try:
            return self._index_at(meshes, stamp, scan=False).largest(count)
        except SegmentIndexRequired:
            return []
        except (SegmentIndexCorrupt, OSError, StorageError, WkwError) as exc:  # a page never fails for one layer
            log.warning("largest segments of layer %s: %s (until its index file or data change)", meshes.name, exc)
            return []

    def can_list(self, meshes: LayerMeshes) -> bool:
        """Whether segment properties can be answered now (an index, or a layer small enough to scan)."""
        if meshes.grid.voxels <= SCAN_VOXELS:
            return True
        try:
            self.index(meshes, scan=False)
        except SegmentIndexRequired:
            return False
        return True

    def held(self, meshes: LayerMeshes) -> SegmentIndex | None:
        """The layer's index of the data as it is now, if it is held already (nothing is read)."""
        found: SegmentIndex | None = self.cache.get(SegmentsKey(meshes.key, self.stamp(meshes)))
        return found

    def index_bytes(self, meshes: LayerMeshes) -> tuple[int, int]:
        """What reading the layer's segment index holds, and the segments it lists at most, from sizes alone: 0
        for an index held already; the file and its arrays unpacked (from its zip directory, read in bounded
        pieces); else the labels a scan of the finest mag reads (a layer too large to scan reads none)."""
        held = self.held(meshes)
        if held is not None:
            return 0, len(held)
        identity = self._index_identity(meshes)
        if identity is not None and identity.size <= MAX_INDEX_BYTES:
            path = self.place.location(meshes.dataset, meshes.name)
            unpacked = check_archive(self.place.store, path, identity)
            return identity.size + sum(unpacked.values()), unpacked.get("ids.npy", 0) // 8
        voxels = meshes.grid.voxels if meshes.grid.voxels <= SCAN_VOXELS else 0
        return voxels * meshes.grid.finest.dtype.itemsize, voxels

    def properties_bytes(self, meshes: LayerMeshes) -> int:
        """What making ``segment_properties/info`` holds, from sizes alone (stats and the index's directory),
        before anything is read: the index (:meth:`index_bytes`), the labels file parsed and the listed segments
        as objects and JSON (:data:`LISTED_SEGMENT_BYTES` each, their labels' text beside); 0 once it is made."""
        key, labels = self._properties_key(meshes)
        if self.cache.get(key) is not None:
            return 0
        index, segments = self.index_bytes(meshes)
        listed = min(segments, MAX_LISTED_SEGMENTS)
        labels_size = 0 if labels is None or labels.size > MAX_LABELS_BYTES else labels.size  # else never read
        return index + labels_size * (LABELS_HELD_PER_BYTE + 1) + listed * LISTED_SEGMENT_BYTES

    def _properties_key(self, meshes: LayerMeshes) -> tuple[PropertiesKey, FileIdentity | None]:
        """The key of the layer's ``segment_properties/info`` now, and its labels file's identity."""
        index_identity = self._index_identity(meshes)
        labels_identity = self.storage.identity(self._labels_path(meshes))
        key = PropertiesKey(
            meshes.key,
            self.stamp(meshes),
            None if index_identity is None else index_identity.version,
            None if labels_identity is None else labels_identity.version,
        )
        return key, labels_identity

    def _labels_path(self, meshes: LayerMeshes) -> str:
        return self.storage.join(meshes.dataset.directory, f"{meshes.name}{LABELS_SUFFIX}")

    def properties(self, meshes: LayerMeshes) -> bytes:
        """``segment_properties/info``: the segments (the largest ``MAX_LISTED_SEGMENTS``), voxels and labels."""
        key, _ = self._properties_key(meshes)
        stamp, labels_path = key.stamp, self._labels_path(meshes)

        def render() -> bytes:
            index = self._index_at(meshes, stamp)
            labels = self._labels(meshes, labels_path)
            ids, voxels = index.ids, index.voxels
            if len(ids) > MAX_LISTED_SEGMENTS:
                keep = np.sort(np.lexsort((ids, -voxels.astype(np.int64)))[:MAX_LISTED_SEGMENTS])
                ids, voxels = ids[keep], voxels[keep]
            members = next(iter(meshes.layer.mags.values())).member_counts(ids)
            return json_bytes(segment_properties(ids, voxels, labels, members))

        return self.cache.made(key, render, len)

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
            document = load_json(found[0], max_values=MAX_LABELS + 1)  # the object and each name
            if not isinstance(document, dict) or len(document) > MAX_LABELS:
                raise ValueError(f"it is not an object of at most {MAX_LABELS} ids and names")
            return {parse_segment_id(str(k)): str(v) for k, v in document.items()}
        except (ValueError, AttributeError, MeshInputError) as exc:
            log.warning("segment labels of layer %s are not a JSON object of id to name: %s", meshes.name, exc)
            return {}


# An index is a zip archive (numpy's npz) of a few arrays: its directory is read first, in pieces of at most
# this many bytes, and must account for the file, before the file is read whole.
DIRECTORY_READ_BYTES = 1 << 20
ARCHIVE_SLACK = 64 << 10  # what an archive holds beside its members' data: headers and its directory


class _StoredFile(io.RawIOBase):
    """A file of a store as a seekable file object read by bounded positioned reads: what ``zipfile`` needs to
    read an archive's directory without reading its members."""

    def __init__(self, store: Store, path: str, identity: FileIdentity) -> None:
        self.store, self.path, self.identity = store, path, identity
        self.position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.identity.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer: "memoryview | bytearray") -> int:  # type: ignore[override]
        size = min(len(buffer), max(0, self.identity.size - self.position))
        if size == 0:
            return 0
        data = self.store.read(self.path, self.position, size, self.identity, limit=DIRECTORY_READ_BYTES)
        buffer[: len(data)] = data
        self.position += len(data)
        return len(data)


def check_archive(store: Store, path: str, identity: FileIdentity) -> dict[str, int]:
    """Refuse an index file that is not a zip archive whose members account for its size and unpack within
    ``MAX_INDEX_BYTES``, reading only its directory: a file of NULs, however large, is refused before it is
    read. :class:`SegmentIndexCorrupt` with the reason; else the bytes each member unpacks to, by name."""
    where = f"segment index {store.relative(path)}"
    try:
        with zipfile.ZipFile(io.BufferedReader(_StoredFile(store, path, identity), 1 << 16)) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise SegmentIndexCorrupt(f"{where} is unreadable: {exc}") from None
    unpacked = sum(member.file_size for member in members)
    stored = sum(member.compress_size for member in members)
    if unpacked > MAX_INDEX_BYTES:
        raise SegmentIndexCorrupt(f"{where} unpacks to more than {MAX_INDEX_BYTES} bytes")
    if identity.size > stored + ARCHIVE_SLACK * max(1, len(members)):
        raise SegmentIndexCorrupt(f"{where} holds {identity.size} bytes, of which its members are {stored}")
    return {member.filename: member.file_size for member in members}


def _list_bytes(ids: list[int]) -> int:
    return 64 + 32 * len(ids)


def _nbytes(index: SegmentIndex) -> int:
    return index.nbytes
