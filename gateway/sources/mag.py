"""What every mag source offers the Zarr layer: geometry, regions as voxels, stored chunks, stored file cubes.

WKW and Zarr sources implement the same operations; the Zarr layer never asks which kind it holds.
"""

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway_storage import AnchoredStore, FileIdentity, FileSource, Store
from gateway_storage.faults import Absent, Malformed
from gateway_storage.geometry import Box, Vec3
from gateway_storage.identity import ListedFile

from .properties import BoundingBox


class ChunkNotFound(Absent, LookupError):
    """A chunk or shard that is absent by design (outside the bounding box, past the grid, not stored): a 404."""


class SourceError(Malformed, ValueError):
    """A mag the gateway cannot serve (its metadata is wrong or unsupported); the message is the reason shown."""


class StoredEncoding(enum.Enum):
    """How stored bytes are encoded, so the Zarr layer knows how to frame them."""

    LZ4_BLOCK = "lz4-block"  # a raw LZ4 block (WKW LZ4/LZ4HC)
    RAW_BLOCK = "raw-block"  # uncompressed voxels in Fortran order (WKW raw)
    NATIVE = "native"  # a Zarr source's chunk in its own codecs


@dataclass(slots=True)
class StoredChunk:
    """One chunk's bytes exactly as stored, with what its ETag and framing need."""

    data: bytes
    encoding: StoredEncoding
    uncompressed_size: int
    origin: str  # where it lies, relative to the data root (the same on every replica)
    identity: FileIdentity | None
    path: str | None = None  # the file in the store, where a keeper of the answer may look its version up again


@dataclass(frozen=True, slots=True)
class StoredBlocks:
    """The blocks of one stored file cube in file order: what a virtual shard is laid out from.

    ``block_coords[i]`` are the cube-local ``(x, y, z)`` block coordinates of file block ``i``;
    ``block_table()`` computes where the blocks lie, so it costs nothing when a cached plan is used;
    ``read_span(offset, length)`` reads file bytes of this very version of the file.
    """

    origin: str
    identity: FileIdentity
    block_edge: int
    blocks_per_edge: int
    block_bytes: int
    encoding: StoredEncoding
    block_table: Callable[[], tuple[np.ndarray, np.ndarray]]  # each block's (offset, length) in the file
    block_coords: np.ndarray  # (blocks, 3) int64
    read_span: Callable[[int, int], bytes]


@dataclass(frozen=True, slots=True)
class Region:
    """An ``[c, x, y, z]`` array and where it came from.

    ``sources`` lists the identity of every file read (an exact validator);
    None means the reader cannot say, and the caller derives the ETag from
    the bytes themselves.

    ``data`` may be a read-only view of a decoded or cached block (a whole aligned block is handed out
    without a copy): whoever writes into it, or hands it to a library that takes only writable buffers,
    copies it first.
    """

    data: np.ndarray
    sources: list[FileSource] | None


@dataclass(frozen=True, slots=True)
class NativeEncoding:
    """How a Zarr source stores one (inner) chunk, in terms of the served ``(c, x, y, z)`` array.

    The stored bytes of a chunk are the C-order bytes of the served chunk
    transposed by ``permutation``, in ``dtype``'s byte order, then passed
    through ``v2_compressor`` (a v2 source) or ``v3_codecs`` (a v3 source:
    its bytes-to-bytes codecs).
    """

    zarr_format: int
    chunk_shape: tuple[int, int, int, int]
    permutation: tuple[int, ...]
    dtype: np.dtype
    v2_compressor: dict[str, Any] | None = None  # as the source's .zarray says (parsed JSON)
    v3_codecs: tuple[dict[str, Any], ...] = ()  # as its zarr.json says


# Every served chunk holds every channel of its voxels, so channels multiply what one chunk costs: a few bytes of
# metadata could declare thousands (chunks absent, made of the fill value). A WKW header holds at most 255;
# multiplexed imaging writes tens. More make the mag unusable with the reason.
MAX_CHANNELS = 256


class MagSource:
    """One mag of a layer. Voxels outside the bounding box are never returned."""

    kind = "abstract"
    native: NativeEncoding | None = None  # the source's own chunk encoding (Zarr sources)
    storage: Store  # what every byte of the mag is read through (anchored at ``location``)
    location: str  # where the data lives
    root: str  # the data root ``location`` lies in

    def _locate(self, storage: Store, directory: str, through: Store | None = None) -> Store:
        """Where the mag's files lie: ``directory`` in ``storage``, below the root replicas name paths from.

        Every byte of the mag is read through an :class:`AnchoredStore` of its directory: a file below it
        is absent (its chunk reads as the fill value) only while the directory is there, so a volume that
        went or a mag directory that was deleted is a storage fault for every format, however it reads.
        Returns the anchored view that opening the mag reads its metadata through: ``through`` (the catalog's
        recorder of what a load looked at) where given, so that chunk reads later go straight to ``storage``.
        """
        self.storage = AnchoredStore(storage, directory)
        self.location = directory
        self.root = storage.root_of(directory)
        return self.storage if through is None else AnchoredStore(through, directory)

    def absent(self, what: str = "chunk") -> ChunkNotFound:
        """A chunk absent by the format's rules: raised once the anchored store has found the file missing
        in a mag directory that is there."""
        return ChunkNotFound(f"the source holds no such {what}: it reads as the fill value")

    def __init__(self, mag: Vec3, bbox: BoundingBox, dtype: np.dtype, channels: int, fill_value: float = 0) -> None:
        if not 1 <= channels <= MAX_CHANNELS:
            raise SourceError(f"{channels} channels: a mag holds 1 to {MAX_CHANNELS} (each served chunk holds all)")
        self.mag = mag
        self.bbox = bbox.box.at_mag(mag)  # in this mag's voxels
        self.dtype = dtype
        self.channels = channels
        self.fill_value = fill_value

    @property
    def location_key(self) -> str:
        """``location`` relative to the data root: the same on every replica, wherever it mounts the root."""
        return self.relative(self.location)

    def relative(self, path: str) -> str:
        """A path below the data root, without the root itself."""
        return path.removeprefix(self.root).lstrip("/")

    @property
    def shape(self) -> Vec3:
        """Served extent in this mag's voxels: every voxel of the bounding box, from the origin."""
        return self.bbox.hi

    def decoded_bytes(self, shape: Vec3) -> int:
        """The most voxel bytes that reading a grid-aligned box of ``shape`` decodes: by default its own
        voxels; a source that decodes whole stored chunks counts every one the box touches."""
        return shape[0] * shape[1] * shape[2] * self.channels * self.dtype.itemsize

    def files_read(self, shape: Vec3) -> int:
        """The most files that reading a grid-aligned box of ``shape`` looks at (each a stat; a new version of one
        an open and a containment check): by default one."""
        return 1

    @property
    def reads_are_cheap(self) -> bool:
        """Whether a stat and a small read may run on the event loop (local page cache, not a network)."""
        return False

    def read_box(self, lo: Vec3, hi: Vec3) -> Region:
        """Box ``[lo, hi)`` with voxels outside the bounding box set to the fill value."""
        wanted = Box(lo, hi)
        inner = self.bbox.clip(wanted)
        if inner is None:
            return Region(np.full((self.channels, *wanted.size), self.fill_value, dtype=self.dtype, order="F"), [])
        return self.placed(wanted, inner, *self.read_inside(inner.lo, inner.size))

    def read_held(self, lo: Vec3, hi: Vec3) -> Region | None:
        """:meth:`read_box`, or None where the source knows that nothing is stored in the box (it reads as the
        fill value): such a chunk is answered as absent instead of being made of fill values (a large one would
        cost its whole size in memory). A source that learns it from the read itself need not look first."""
        wanted = Box(lo, hi)
        inner = self.bbox.clip(wanted)
        if inner is None or not self.holds_data(inner.lo, inner.hi):
            return None
        return self.placed(wanted, inner, *self.read_inside(inner.lo, inner.size))

    def placed(self, wanted: Box, inner: Box, data: np.ndarray, sources: list[FileSource] | None) -> Region:
        """The voxels read of ``inner`` (the part of ``wanted`` inside the bounding box) in the box ``wanted``,
        the fill value around them."""
        if inner == wanted:
            return Region(data, sources)
        out = np.full((self.channels, *wanted.size), self.fill_value, dtype=self.dtype, order="F")
        out[(slice(None), *inner.shifted(wanted.lo).slices())] = data
        return Region(out, sources)

    def read_inside(self, offset: Vec3, shape: Vec3) -> tuple[np.ndarray, list[FileSource] | None]:
        """Voxels of a box that lies inside the bounding box, as ``[c, x, y, z]``."""
        raise NotImplementedError

    def files_covering(self, lo: Vec3, hi: Vec3) -> list[str] | None:
        """Every file :meth:`read_box` of ``[lo, hi)`` would read, absent ones too, each once; None where the
        source cannot name them before it reads. A stat of each tells, before any read, whether that read
        could give other voxels than an earlier one (how a preview is revalidated without reading)."""
        inner = self.bbox.clip(Box(lo, hi))
        return [] if inner is None else self.files_inside(inner.lo, inner.size)

    def files_inside(self, offset: Vec3, shape: Vec3) -> list[str] | None:
        """:meth:`files_covering` of a box that lies inside the bounding box."""
        return None

    def listed_files(self, limit: int) -> list[ListedFile] | None:
        """Every file the mag's voxels are read from, with its identity (what a data stamp digests); None from a
        store that cannot list. Past ``limit`` entries, OversizedListingError."""
        return self.storage.list_files(self.location, limit)

    def member_counts(self, ids: np.ndarray) -> np.ndarray | None:
        """How many segments of a source layer each id joins (a mapped layer's agglomerates); None for a layer
        whose ids are its segments."""
        return None

    def holds_data(self, lo: Vec3, hi: Vec3) -> bool:
        """False only where the source knows that nothing is stored for box ``[lo, hi)`` (it reads as the
        fill value), so that such a chunk is answered as absent instead of being made of fill values."""
        return True

    # --- stored bytes, where a source can hand them out unchanged ------------------------------

    @property
    def stored_chunk_shape(self) -> tuple[int, int, int, int] | None:
        """The ``(c, x, y, z)`` shape of the chunks :meth:`stored_chunk` hands out; None if it hands out none."""
        return None

    def stored_chunk(self, index: tuple[int, ...], lo: Vec3) -> StoredChunk | None:
        """The stored chunk at grid ``index`` (voxel corner ``lo``), or None where nothing is stored there
        that could be sent as is (the caller then reads voxels). Raises :class:`ChunkNotFound` when the
        source knows the chunk is absent and reads as the fill value."""
        return None

    @property
    def file_cube_edge(self) -> int | None:
        """Voxels per edge of the file cubes :meth:`stored_blocks` describes; None if the source has none."""
        return None

    def stored_blocks(self, cube: Vec3) -> StoredBlocks | None:
        """The stored blocks of file cube ``cube``, or None if no file holds it."""
        return None
