"""The segment index of a layer: which level-0 cubes hold each segment id, its voxel count and bounding box.

A manifest needs the cubes of a segment before anything is meshed. ``zarr-gateway index-segments``
writes the index once per layer (beside the layer, or in the ``segment_index_dir`` setting for data
roots mounted read-only); without one the gateway scans a small layer itself (``SCAN_VOXELS``).
The index records a stamp of the data it was built from (every file of every mag: path and identity in
the store, see :func:`data_stamp`), and an index whose stamp is not the data's is never used.
"""

import hashlib
import io
import json
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway_storage.faults import Broken
from gateway_storage.geometry import Vec3

from ..settings import STAMP_FILES
from ..sources.mag import MagSource
from .errors import MeshInputError
from .geometry import MeshGrid, morton_key
from .surfaces import read_window, window_of

FORMAT = "zarr-gateway-segment-index"
VERSION = 1
# Without an index, a layer whose finest mag holds at most this many voxels is scanned on demand (once per
# data version per worker, in a thread); a larger one answers 409 until `zarr-gateway index-segments` ran.
SCAN_VOXELS = 64 << 20
# An index file lies beside the layer, where anyone who writes datasets can put one: it is refused (a
# storage fault) if it, or its arrays unpacked, hold more than this, rather than unpacked into memory.
MAX_INDEX_BYTES = 1 << 30


class SegmentIndexCorrupt(Broken, OSError):
    """An index file that cannot be read as one: a storage fault (500), never a wrong answer."""

    prefix = "segment index fault: "


@dataclass(frozen=True, slots=True)
class SegmentEntry:
    voxels: int
    bbox_lo: Vec3  # mag-1 voxels
    bbox_hi: Vec3
    cubes: list[Vec3]  # level-0 grid positions, in Z-curve order


def segment_dtype(source: MagSource) -> np.dtype:
    """The layer's labels dtype; float labels have no segments."""
    if source.dtype.kind not in "ui":
        raise MeshInputError(f"a {source.dtype.name} layer has no segment ids: meshes need integer labels")
    return source.dtype


class SegmentIndex:
    """Segments sorted by id, with the cubes of each as one concatenated array."""

    def __init__(
        self,
        meta: dict[str, Any],
        ids: np.ndarray,
        voxels: np.ndarray,
        bboxes: np.ndarray,
        starts: np.ndarray,
        cubes: np.ndarray,
    ) -> None:
        self.meta = meta
        self.ids = ids
        self.voxels = voxels
        self.bboxes = bboxes
        self.starts = starts
        self.cubes = cubes

    @property
    def stamp(self) -> str:
        return str(self.meta.get("stamp", ""))

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self._arrays().values()) + 256

    def _arrays(self) -> dict[str, Any]:  # Any: numpy types savez's keywords as bool
        """The index's arrays by the names they are stored under."""
        return {name: getattr(self, name) for name in ("ids", "voxels", "bboxes", "starts", "cubes")}

    def __len__(self) -> int:
        return len(self.ids)

    def lookup(self, segment: int) -> SegmentEntry | None:
        at = int(np.searchsorted(self.ids, np.uint64(segment)))
        if at >= len(self.ids) or int(self.ids[at]) != segment:
            return None
        box = [int(v) for v in self.bboxes[at]]
        cubes = [(int(x), int(y), int(z)) for x, y, z in self.cubes[self.starts[at] : self.starts[at + 1]]]
        return SegmentEntry(int(self.voxels[at]), (box[0], box[1], box[2]), (box[3], box[4], box[5]), cubes)

    def select(self, kept: np.ndarray, meta: dict[str, Any]) -> "SegmentIndex":
        """The index of the segments ``kept`` (a mask over :attr:`ids`) only, with ``meta``."""
        lengths = np.diff(self.starts)
        starts = np.concatenate([np.zeros(1, np.int64), np.cumsum(lengths[kept])]).astype(np.int64)
        cubes = self.cubes[np.repeat(kept, lengths)]
        return SegmentIndex(meta, self.ids[kept], self.voxels[kept], self.bboxes[kept], starts, cubes)

    def largest(self, count: int) -> list[int]:
        """The ids of the ``count`` segments with the most voxels (ties: the smaller id first)."""
        order = np.lexsort((self.ids, -self.voxels.astype(np.int64)))
        return [int(i) for i in self.ids[order[:count]]]

    # --- files ---------------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        meta = np.frombuffer(json.dumps(self.meta, sort_keys=True).encode(), dtype=np.uint8)
        np.savez(buffer, meta=meta, **self._arrays())
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, origin: str) -> "SegmentIndex":
        """An index read back; anything that is not a consistent index raises :class:`SegmentIndexCorrupt`."""
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                unpacked = len(data) + sum(member.file_size for member in archive.infolist())
        except (zipfile.BadZipFile, ValueError, OSError) as exc:
            raise SegmentIndexCorrupt(f"segment index {origin} is unreadable: {exc}") from None
        if unpacked > MAX_INDEX_BYTES:
            raise SegmentIndexCorrupt(f"segment index {origin} unpacks to more than {MAX_INDEX_BYTES} bytes")
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
                meta = json.loads(arrays["meta"].tobytes())
                ids, voxels, bboxes = arrays["ids"], arrays["voxels"], arrays["bboxes"]
                starts, cubes = arrays["starts"], arrays["cubes"]
        except Exception as exc:  # a truncated zip, a missing array, bad JSON: all the same fault
            raise SegmentIndexCorrupt(f"segment index {origin} is unreadable: {exc}") from exc
        n = len(ids)
        consistent = (
            isinstance(meta, dict)
            and meta.get("format") == FORMAT
            and ids.dtype == np.uint64
            and voxels.shape == (n,)
            and bboxes.shape == (n, 6)
            and starts.shape == (n + 1,)
            and cubes.ndim == 2
            and cubes.shape[1] == 3
            and cubes.dtype.kind == "i"
            and (cubes.size == 0 or int(cubes.min()) >= 0)
            and (
                n == 0 or (int(starts[0]) == 0 and int(starts[-1]) == len(cubes) and bool(np.all(np.diff(starts) >= 0)))
            )
            and bool(np.all(np.diff(ids.astype(np.float64)) > 0) if n > 1 else True)
        )
        if not consistent:
            raise SegmentIndexCorrupt(f"segment index {origin} is not a consistent {FORMAT} file")
        if meta.get("version") != VERSION:
            raise SegmentIndexCorrupt(f"segment index {origin} has version {meta.get('version')}, expected {VERSION}")
        return cls(meta, ids, voxels.astype(np.uint64), bboxes.astype(np.int64), starts.astype(np.int64), cubes)


@dataclass(frozen=True, slots=True)
class DataStamp:
    """A stamp of a layer's files, and when the latest of them changed (seconds since the epoch)."""

    digest: str
    newest_change: float


def take_stamp(mags: dict[Vec3, MagSource], limit: int = STAMP_FILES) -> DataStamp | None:
    """A digest of every file of every mag: its path below the mag and its identity in the store (size,
    modification time, inode and change time on a local disk; ETag or generation in an object store), so that
    any rewrite, even one that puts size and modification time back, gives another stamp.

    Walks at most ``limit`` entries per mag (OversizedListingError past it). None where the store cannot list (a
    web server without WebDAV): no stamp tells that data's versions apart."""
    digest = hashlib.blake2b(digest_size=16)
    newest = 0.0
    for mag in sorted(mags):
        source = mags[mag]
        listed = source.listed_files(limit)
        if listed is None:
            return None
        digest.update(f"mag {mag}\0".encode())
        for path, identity in listed:
            digest.update(f"{path}\0{identity.size}\0{identity.version}\0".encode())
            newest = max(newest, identity.changed)
    return DataStamp(digest.hexdigest(), newest)


def data_stamp(mags: dict[Vec3, MagSource], limit: int = STAMP_FILES) -> str | None:
    """The digest of :func:`take_stamp`: what an index and a stored mesh set record of the data they describe."""
    taken = take_stamp(mags, limit)
    return None if taken is None else taken.digest


@dataclass(frozen=True, slots=True)
class IndexPart:
    """What some level-0 cubes hold: the ids of each cube (its margin included), and the voxel counts and
    bounding boxes of each cube's own voxels. Parts of disjoint cubes, in any order, assemble into one index."""

    member_ids: np.ndarray  # uint64, one per (id, cube) pair
    member_cubes: np.ndarray  # (pairs, 3) int32: the cube of each pair
    member_keys: np.ndarray  # uint64: the cube's Z-curve index, per pair
    found_ids: np.ndarray  # uint64, one per (id, cube) where the cube holds voxels of the id
    found_counts: np.ndarray  # uint64: those voxels
    found_lo: np.ndarray  # (found, 3) int64: their bounding box in mag-1 voxels
    found_hi: np.ndarray

    @classmethod
    def concatenate(cls, parts: "list[IndexPart]") -> "IndexPart":
        return cls(*(np.concatenate([getattr(p, name) for p in parts]) for name in cls.__slots__))

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        np.savez(buffer, **{name: getattr(self, name) for name in self.__slots__})
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, origin: str) -> "IndexPart":
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
                part = cls(*(arrays[name] for name in cls.__slots__))
        except Exception as exc:  # a truncated zip, a missing array: the same fault
            raise SegmentIndexCorrupt(f"index part {origin} is unreadable: {exc}") from exc
        pairs, found = len(part.member_ids), len(part.found_ids)
        if not (
            part.member_cubes.shape == (pairs, 3)
            and part.member_keys.shape == (pairs,)
            and part.found_counts.shape == (found,)
            and part.found_lo.shape == part.found_hi.shape == (found, 3)
        ):
            raise SegmentIndexCorrupt(f"index part {origin} is not a consistent part of an index")
        return part


EMPTY_PART = IndexPart(
    np.zeros(0, np.uint64),
    np.zeros((0, 3), np.int32),
    np.zeros(0, np.uint64),
    np.zeros(0, np.uint64),
    np.zeros(0, np.uint64),
    np.zeros((0, 3), np.int64),
    np.zeros((0, 3), np.int64),
)
# Bytes per voxel of one cube's window while it is indexed: the window, the sorted copy and the unique values
# (3 x itemsize), the sort's permutation, the inverse, one axis's plane numbers (8 each) and a mask.
WINDOW_BYTES_PER_VOXEL = (3, 25)  # (times the itemsize, plus)
PAIR_BYTES = 8 + 12 + 8  # an (id, cube) pair of a part: id, cube position, Z-curve key
FOUND_BYTES = 8 + 8 + 24 + 24  # a found id of a part: id, count, box


def index_part_bytes(grid: MeshGrid, cubes: int, window_voxels: int, inner_voxels: int) -> int:
    """The most memory indexing ``cubes`` level-0 cubes into one part holds at once, its bytes included: one
    window at a time (with the stored chunks it decodes), and a part as large as it can grow, twice (the arrays
    and their bytes): an (id, cube) pair for each of the ``window_voxels`` voxels of the cubes' windows inside
    the bounding box (and the fill value, once a cube), a found id for each of their ``inner_voxels``."""
    source = grid.finest
    edge = grid.levels[0].cube_voxels
    window = (edge[0] + 1) * (edge[1] + 1) * (edge[2] + 1)
    times, plus = WINDOW_BYTES_PER_VOXEL
    reading = window * (times * source.dtype.itemsize + plus) + source.decoded_bytes(
        (edge[0] + 1, edge[1] + 1, edge[2] + 1)
    )
    labels = edge[0] * edge[1] * edge[2] * max(edge)  # which labels occur in which plane, one axis at a time
    part = (window_voxels + cubes) * PAIR_BYTES + inner_voxels * FOUND_BYTES
    return reading + labels + 2 * part


def index_cubes(
    grid: MeshGrid, cubes: Iterable[Vec3], advance: Callable[[int], None] = lambda voxels: None
) -> IndexPart:
    """Read each of ``cubes`` (level-0 grid positions) of the finest mag once and record what it holds.

    A segment belongs to a cube when its mesh window (the cube and one voxel below it) holds one of its
    voxels; voxel counts and bounding boxes come from the cubes themselves, so each voxel counts once.
    ``advance`` is told the voxels read after each cube (for a progress bar).
    """
    source = grid.finest
    segment_dtype(source)
    level = grid.levels[0]
    mag = np.asarray(source.mag, dtype=np.int64)
    parts = [EMPTY_PART]
    for cube in cubes:
        lo, hi = level.box(cube)
        window = read_window(source, *window_of(lo, hi))
        inner = window[1:, 1:, 1:]
        values, inverse, counts = np.unique(inner, return_inverse=True, return_counts=True)
        margins = np.concatenate([window[0].ravel(), window[:, 0].ravel(), window[:, :, 0].ravel()])
        present = np.union1d(values, np.unique(margins))
        present = present[present > 0].astype(np.uint64)
        if len(present):
            keep = values > 0
            box_lo, box_hi = _label_boxes(inverse.reshape(inner.shape), len(values))
            parts.append(
                IndexPart(
                    present,
                    np.tile(np.asarray(cube, dtype=np.int32), (len(present), 1)),
                    np.full(len(present), morton_key(cube), dtype=np.uint64),
                    values[keep].astype(np.uint64),
                    counts[keep].astype(np.uint64),
                    (box_lo[keep] + np.asarray(lo)) * mag,
                    (box_hi[keep] + np.asarray(lo)) * mag,
                )
            )
        advance(int(window.size))
    return IndexPart.concatenate(parts)


def index_meta(grid: MeshGrid, layer: str, stamp: str | None) -> dict[str, Any]:
    """What an index of ``layer`` records beside its arrays."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "layer": layer,
        "mag": list(grid.finest.mag),
        "cube_edge": list(grid.levels[0].cube_voxels),
        "stamp": stamp,
    }


def build_index(
    grid: MeshGrid, layer: str, stamp: str | None, advance: Callable[[int], None] = lambda voxels: None
) -> SegmentIndex:
    """The index of every level-0 cube of the finest mag, read in this process (see :func:`index_cubes`)."""
    return assemble_index(index_meta(grid, layer, stamp), [index_cubes(grid, grid.cubes_of_finest(), advance)])


def _label_boxes(labels: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Per label ``0..count-1`` of an ``(x, y, z)`` array: the lowest and one past the highest index on each axis,
    from a table of which labels occur in which plane across each axis."""
    lo = np.empty((count, 3), dtype=np.int64)
    hi = np.empty((count, 3), dtype=np.int64)
    flat = labels.ravel()
    for axis in range(3):
        planes = labels.shape[axis]
        shape = [1, 1, 1]
        shape[axis] = planes
        plane_of = np.broadcast_to(np.arange(planes).reshape(shape), labels.shape).ravel()
        present = np.zeros((count, planes), dtype=bool)
        present[flat, plane_of] = True
        lo[:, axis] = present.argmax(axis=1)
        hi[:, axis] = planes - present[:, ::-1].argmax(axis=1)
    return lo, hi


def assemble_index(meta: dict[str, Any], parts: list[IndexPart]) -> SegmentIndex:
    """The index of the cubes of ``parts`` (disjoint, in any order): the same bytes whatever their order."""
    whole = IndexPart.concatenate([EMPTY_PART, *parts])
    if not len(whole.member_ids):
        empty = np.zeros(0, dtype=np.uint64)
        return SegmentIndex(
            meta, empty, empty, np.zeros((0, 6), np.int64), np.zeros(1, np.int64), np.zeros((0, 3), np.int32)
        )
    # An (id, cube) pair occurs once: sorted by id, then by the cube's Z-curve index, the order is total.
    order = np.lexsort((whole.member_keys, whole.member_ids))
    pair_ids, pair_cubes = whole.member_ids[order], whole.member_cubes[order]
    ids, starts = np.unique(pair_ids, return_index=True)
    starts = np.append(starts, len(pair_ids)).astype(np.int64)
    voxels = np.zeros(len(ids), dtype=np.uint64)
    lo = np.full((len(ids), 3), np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full((len(ids), 3), np.iinfo(np.int64).min, dtype=np.int64)
    # Sums, minima and maxima of integers: the same whatever order the parts come in.
    at = np.searchsorted(ids, whole.found_ids)
    np.add.at(voxels, at, whole.found_counts)
    np.minimum.at(lo, at, whole.found_lo)
    np.maximum.at(hi, at, whole.found_hi)
    # An id seen only in the one-voxel margin below a cube is in the cube above it too (with its voxels).
    return SegmentIndex(meta, ids, voxels, np.concatenate([lo, hi], axis=1), starts, pair_cubes)
