"""Agglomerate mappings of segmentation layers, each served as a segmentation layer of its own.

webKnossos keeps a layer's mappings beside it: ``<layer>/agglomerates/<name>.hdf5`` (the HDF5 dataset
``segment_to_agglomerate``: index a segment id, value its agglomerate id), the same arrays as a Zarr v3 group
``<layer>/agglomerates/<name>/``, and JSON mappings ``<layer>/mappings/<name>.json`` (``classes``: lists of
equivalent ids, each mapped to its smallest, in order, as webKnossos' viewer applies them). The gateway serves each
as the layer ``<layer>__<name>`` (:func:`mapped_name`), whose voxels are the source layer's with the mapping applied:
ids without an entry stay as they are, 0 stays 0.

A real ``segment_to_agglomerate`` holds 10^8 to 10^9 entries, so a chunk looks up only its distinct ids, in
pieces of the array (:data:`PIECE_ENTRIES` entries, or a stored chunk of it) that a bounded cache keeps by file
version; nothing ever reads the whole array. Every byte is read through the store (h5py reads a file object
that reads through it), pinned to the version that was checked, and what a chunk read is named in its sources,
so its ETag and every cache follow a rewrite.
"""

import io
import json
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway_storage import (
    ByteLRU,
    FileIdentity,
    FileSource,
    FileUnsettledError,
    OversizedFileError,
    StorageError,
    Store,
)
from gateway_storage.faults import Broken, Fault
from gateway_storage.geometry import Box, Vec3
from gateway_storage.identity import ListedFile

from ..extras import MAPPINGS
from ..shard_formats.sharding_indexed import chunk_extent
from .bounds import MAX_CHUNKS_PER_SHARD, check_chunk_bytes, malformed_metadata, read_document, stored_limit
from .decoding import ChunkDecodeError, MemoryDecoder
from .documents import load_json
from .mag import MagSource, Region, SourceError
from .metadata import ZarrArray, parse_zarr_json

SEPARATOR = "__"  # <layer>__<mapping>: a person recognises both, and no webKnossos layer name needs it
AGGLOMERATES = "agglomerates"
JSON_MAPPINGS = "mappings"
ARRAY = "segment_to_agglomerate"
OFFSETS = "agglomerate_to_segments_offsets"
HDF5_SUFFIXES = (".hdf5", ".h5")
# A mapping's name becomes part of a layer name, a URL and a page: letters, digits and ``._-`` only.
PLAIN_MAPPING_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
PIECE_ENTRIES = 1 << 14  # entries per piece of a contiguous array: 128 KiB of uint64, read and kept together
MAX_PIECE_BYTES = 8 << 20  # a chunked array's piece is one stored chunk, at most this large
UNWRITTEN_CHUNK_SECONDS = 5.0  # a Zarr chunk missing this long after its array's metadata was written is the fill value
MAX_ENTRIES = 1 << 36  # past any real over-segmentation (10^9 ids): a larger declared extent is refused
MAX_LISTED = 100_000  # entries walked below agglomerates/ and mappings/ when a dataset is loaded
MAX_JSON_BYTES = 16 << 20
MAX_JSON_VALUES = 2_000_000
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


class MappingUnreadable(Broken, OSError):
    """A mapping that was usable when its layer was loaded and cannot be read now (rewritten into something
    else, truncated): a storage fault of the mapped layer's chunks (500), never absent data."""


@dataclass(frozen=True, slots=True)
class Found:
    """A mapping file or group found beside a layer, before it is opened."""

    name: str
    kind: str  # "hdf5", "zarr", "json"
    path: str


def mapped_name(layer: str, mapping: str) -> str:
    return f"{layer}{SEPARATOR}{mapping}"


class Mapping(ABC):
    """One mapping: the dtype of its agglomerate ids and the lookup of sorted distinct segment ids."""

    kind: str

    def __init__(self, store: Store, found: Found, pieces: ByteLRU[np.ndarray]) -> None:
        self.store = store
        self.name = found.name
        self.path = found.path
        self.pieces = pieces
        self.key = store.relative(found.path)  # the same on every replica
        self._lock = threading.Lock()

    dtype: np.dtype  # of its stored entries
    loaded_holds: np.dtype  # what :meth:`holds` said when the mapping was opened (its layer's data type follows)

    def largest_id(self) -> int | None:
        """The largest agglomerate id the current version declares, where it says: webKnossos reads it as the
        length of ``agglomerate_to_segments_offsets`` less one."""
        return None

    def holds(self) -> np.dtype:
        """The narrowest unsigned type that holds every agglomerate id of the current version: the stored type,
        or a narrower one where the mapping declares its largest id (a uint32 layer's mapped chunks then stay
        uint32: half the bytes to map, encode and send). An entry past it is a fault of the file (see apply)."""
        largest = self.largest_id()
        if largest is None:
            return self.dtype
        narrowest = next(dtype for dtype, top in TOPS.items() if largest <= top)
        return narrowest if narrowest.itemsize < self.dtype.itemsize else self.dtype

    def outdated(self) -> bool:
        """Whether the layer must be loaded again to serve the current version: the type that holds its ids
        changed (so the layer's data type does, in every tree). A version that cannot be read is no reason:
        its chunks say what is wrong."""
        return False

    @abstractmethod
    def lookup(self, ids: np.ndarray) -> tuple[np.ndarray, list[FileSource]]:
        """Agglomerate ids (``self.dtype``) of sorted distinct segment ids; ids without an entry map to
        themselves. Also every file read and the version read."""

    @abstractmethod
    def listed(self, limit: int) -> list[ListedFile]:
        """Every file of the mapping with its identity (relative to the data root): what a data stamp takes."""

    def named_files(self) -> list[str] | None:
        """Every file a lookup may read, before it reads (None where that depends on the ids)."""
        return None

    def member_counts(self, ids: np.ndarray) -> np.ndarray | None:
        """How many segments each agglomerate id joins, where the mapping says; None where it does not."""
        return None

    @property
    def lookups_are_cheap(self) -> bool:
        """Whether a lookup is a few small reads at most (it may then run where a chunk's small reads run):
        reading pieces is; parsing a whole document again after a rewrite is not."""
        return True

    def span(self, low: int, high: int, dtype: np.dtype) -> tuple[np.ndarray, list[FileSource]]:
        """Agglomerate ids of every segment id from ``low`` to ``high`` (an array of the caller's own), and
        every file read: what a chunk whose ids lie close together is translated through. As ``dtype`` where
        every one is known to fit it, else uint64. A mapping that keeps its entries in pieces copies them as
        they are kept, without a search per id."""
        return self.lookup(np.arange(low, high + 1, dtype=np.uint64))

    def apply(self, data: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, list[FileSource]]:
        """``data`` with the mapping applied, as ``dtype``; 0 stays 0."""
        flat = data.reshape(-1, order="F")
        if not flat.size:
            return flat.astype(dtype).reshape(data.shape, order="F"), []
        low, high = int(flat.min()), int(flat.max())
        if high - low < min(flat.size, TABLE_SPAN):
            mapped, sources = self._through_span(flat, low, high, dtype)
        else:
            mapped, sources = self._by_runs(flat, dtype)
        return mapped.reshape(data.shape, order="F"), sources

    def _through_span(
        self, flat: np.ndarray, low: int, high: int, dtype: np.dtype
    ) -> tuple[np.ndarray, list[FileSource]]:
        """A chunk whose ids span fewer values than it has voxels (a blockwise watershed numbers the
        supervoxels of a region together): one gather per voxel from the mapping's entries over that span, as
        they are stored. No distinct ids to find, no runs to lay out again: a third of the time of
        :meth:`_by_runs` for such chunks."""
        table, sources = self.span(low, high, dtype)
        offsets = flat - flat.dtype.type(low)
        if table.dtype != dtype and int(table.max()) > TOPS[dtype]:
            # Some entry of the span is past the type: a fault of this chunk only where one of its ids has it.
            self._narrowed(table.take(offsets), dtype)
        table = table.astype(dtype, copy=False)
        if low == 0:
            table[0] = 0
        return table.take(offsets), sources

    def _by_runs(self, flat: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, list[FileSource]]:
        """Labels come in runs along x: the distinct ids are found among the runs' first values (a tenth of the
        voxels or fewer in real segmentations), each run's agglomerate is looked up once, and the runs are laid
        out again. A chunk's few ids cost a few calls each step: per-call costs are what a 32³ chunk pays."""
        changes = np.flatnonzero(flat[1:] != flat[:-1])
        edges = np.empty(changes.size + 2, dtype=np.intp)  # where each run starts, and the end
        edges[0], edges[-1] = 0, flat.size
        np.add(changes, 1, out=edges[1:-1])
        firsts = flat[edges[:-1]]
        ids = _distinct(firsts)
        values, sources = self.lookup(ids.astype(np.uint64, copy=False))
        values = self._narrowed(values, dtype)
        if ids[0] == 0:
            values[0] = 0
        return np.repeat(_translated(firsts, ids, values), edges[1:] - edges[:-1]), sources

    def _narrowed(self, values: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """Agglomerate ids as the layer's ``dtype`` (a copy), refused where one is past it."""
        if values.dtype != dtype and values.size and int(values.max()) > TOPS[dtype]:
            raise MappingUnreadable(
                f"mapping {self.key}: holds agglomerate id {int(values.max())}, past {dtype}, the layer's data "
                "type (the type that holds the largest id the mapping declares)"
            )
        return values.astype(dtype)

    def _identity(self, path: str, through: Store | None = None) -> FileIdentity:
        """The file's current identity, looked up through ``through`` where given (the catalog's recorder: a
        rewrite of the version opened makes the next look load the layer again), else the mapping's store."""
        identity = (through or self.store).identity(path)
        if identity is None:
            raise MappingUnreadable(f"mapping {self.store.relative(path)} is gone")
        return identity


# The unsigned types, narrowest first, with the largest id each holds (np.iinfo costs microseconds a call).
TOPS = {np.dtype(t): int(np.iinfo(t).max) for t in (np.uint8, np.uint16, np.uint32, np.uint64)}
TABLE_SPAN = 1 << 18  # ids spanning at most this many values are translated by a table over the span, not a search


def _distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)``: a sort and a mask, without np.unique's own steps (a third of its time here)."""
    ordered = np.sort(values)
    if ordered.size < 2:
        return ordered
    keep = np.empty(ordered.size, dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


def _translated(keys: np.ndarray, ids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``values[np.searchsorted(ids, keys)]`` for keys that are all among ``ids`` (sorted, distinct): where the
    ids lie close together (as supervoxels of one region do), by a table over their span, a gather instead of a
    binary search per key. Slots of the table between the ids are never read, so never written."""
    low = ids[0]
    if int(ids[-1]) - int(low) >= TABLE_SPAN:
        return np.asarray(values[np.searchsorted(ids, keys)])
    table = np.empty(int(ids[-1]) - int(low) + 1, dtype=values.dtype)
    table[ids - low] = values
    return np.asarray(table[keys - low])


def _with_entries(ids: np.ndarray, entries: int) -> tuple[np.ndarray, int]:
    """The result array of a lookup of sorted ``ids``, those past the mapping's ``entries`` (the last ones) set
    to themselves, and how many come before them."""
    inside = int(np.searchsorted(ids, entries))
    out = np.empty(ids.shape, dtype=np.uint64)
    out[inside:] = ids[inside:]
    return out, inside


def _checked_dtype(dtype: np.dtype, where: str) -> np.dtype:
    if dtype.kind != "u" or dtype.itemsize > 8:
        raise SourceError(f"{where} is {dtype}: agglomerate ids are unsigned integers (uint8 to uint64)")
    return np.dtype(dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype)


RUN_BYTES = 2 << 20  # consecutive pieces are read at once up to this many bytes (or one piece)


def _runs(pieces: np.ndarray, most: int) -> Iterator[tuple[int, int]]:
    """Runs of consecutive piece numbers (sorted, distinct) as ``(first, last + 1)``, each of ``most`` pieces
    at most: each read at once."""
    if pieces.size == 0:
        return
    breaks = np.flatnonzero(np.diff(pieces) != 1) + 1
    for run in np.split(pieces, breaks):
        for start in range(int(run[0]), int(run[-1]) + 1, most):
            yield start, min(start + most, int(run[-1]) + 1)


def _pieces(wanted: np.ndarray, piece_entries: int) -> tuple[list[int], list[int]]:
    """The numbers of the pieces the sorted entries ``wanted`` lie in, and where each piece's entries start."""
    if not wanted.size:
        return [], []
    numbers_of = wanted // piece_entries
    starts = [0, *(np.flatnonzero(numbers_of[1:] != numbers_of[:-1]) + 1).tolist()]
    return numbers_of[starts].tolist(), starts


def _gather(
    out: np.ndarray,
    wanted: np.ndarray,
    piece_entries: int,
    pieces: tuple[list[int], list[int]],
    piece_of: Callable[[int], np.ndarray],
) -> None:
    """The entries at ``wanted`` (sorted; ``pieces`` from :func:`_pieces`) into ``out``, each from its piece
    (``piece_of(number)``): a slice of ``wanted`` per piece, so that many pieces cost what their entries do."""
    numbers, starts = pieces
    for number, start, end in zip(numbers, starts, [*starts[1:], wanted.size], strict=True):
        out[start:end] = piece_of(number)[(wanted[start:end] - np.uint64(number * piece_entries)).astype(np.intp)]


# --- HDF5 -----------------------------------------------------------------------------------------------


class StoredFile(io.RawIOBase):
    """One version of a stored file as a read-only file object (what h5py reads): every read goes through the
    store, which refuses any other version and anything past the file."""

    def __init__(self, store: Store, path: str, identity: FileIdentity) -> None:
        self.store = store
        self.path = path
        self.identity = identity
        self.position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.identity.size}[whence]
        self.position = base + offset
        return self.position

    def tell(self) -> int:
        return self.position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        size = max(0, min(len(view), self.identity.size - self.position))
        if size:
            data = self.store.read(self.path, self.position, size, self.identity, limit=MAX_PIECE_BYTES * 4)
            view[:size] = data
        self.position += size
        return size


@dataclass(frozen=True, slots=True)
class _Opened:
    identity: FileIdentity
    dataset: Any  # h5py.Dataset
    entries: int
    piece: int  # entries per piece
    dtype: np.dtype  # of its entries, as served (little-endian)
    offset: int | None  # of a contiguous array's bytes in the file: read there at once, without h5py
    offsets: Any  # agglomerate_to_segments_offsets (h5py.Dataset), where the file holds it as a 1-D integer array


class Hdf5Mapping(Mapping):
    kind = "hdf5"

    def __init__(self, store: Store, found: Found, pieces: ByteLRU[np.ndarray], through: Store | None = None) -> None:
        super().__init__(store, found, pieces)
        MAPPINGS.require(f"the HDF5 mapping {found.name!r}")
        self._opened = self._open(self._identity(found.path, through))
        self.dtype = self._opened.dtype
        self.loaded_holds = self.holds()

    def _open(self, identity: FileIdentity) -> _Opened:
        """Open one version, checked before any of its array is read: signature, dataset, shape, type, and that
        the file stores every byte the array declares (a truncated or sparse file is refused here)."""
        import h5py

        where = f"agglomerate file {self.key}"
        if identity.size < len(HDF5_SIGNATURE) or (
            self.store.read(self.path, 0, len(HDF5_SIGNATURE), identity, limit=64) != HDF5_SIGNATURE
        ):
            raise SourceError(f"{where} is not an HDF5 file")
        try:
            handle = h5py.File(StoredFile(self.store, self.path, identity), "r")
        except (StorageError, OversizedFileError):
            raise
        except Exception as exc:  # h5py's errors for a damaged file are OSError, KeyError, ValueError, RuntimeError
            raise SourceError(f"{where} is not a readable HDF5 file ({type(exc).__name__}: {exc})") from None
        try:
            link = handle.get(ARRAY, getlink=True)
            if link is None:
                raise SourceError(f"{where} holds no dataset {ARRAY!r}")
            if not isinstance(link, h5py.HardLink):
                raise SourceError(f"{where}: {ARRAY!r} is a link to elsewhere, which is not read")
            dataset = handle[ARRAY]
            if not isinstance(dataset, h5py.Dataset):
                raise SourceError(f"{where}: {ARRAY!r} is not a dataset")
            return self._checked(dataset, identity, where, _offsets_of(handle))
        except SourceError:
            handle.close()
            raise
        except (StorageError, OversizedFileError):
            handle.close()
            raise
        except Exception as exc:
            handle.close()
            raise SourceError(f"{where} is not a readable HDF5 file ({type(exc).__name__}: {exc})") from None

    def _checked(self, dataset: Any, identity: FileIdentity, where: str, offsets: Any) -> _Opened:
        if dataset.ndim != 1:
            raise SourceError(f"{where}: {ARRAY} has shape {dataset.shape}, not one dimension")
        dtype = _checked_dtype(dataset.dtype, f"{where}: {ARRAY}")
        entries = int(dataset.shape[0])
        if entries > MAX_ENTRIES:
            raise SourceError(f"{where}: {ARRAY} declares {entries} entries, more than {MAX_ENTRIES}")
        if dataset.is_virtual or dataset.external:
            raise SourceError(f"{where}: {ARRAY} is stored in other files, which are not read")
        declared = entries * dataset.dtype.itemsize
        if dataset.chunks is None:
            offset = dataset.id.get_offset()
            if entries and (offset is None or offset + declared > identity.size):
                raise SourceError(
                    f"{where}: {ARRAY} declares {declared} bytes that the file of {identity.size} bytes does not "
                    "hold (a truncated or sparse file)"
                )
            return _Opened(identity, dataset, entries, PIECE_ENTRIES, dtype, offset, offsets)
        piece = int(dataset.chunks[0])
        check_chunk_bytes((piece,), dataset.dtype.itemsize, f"a stored chunk of {ARRAY}")
        if piece * dataset.dtype.itemsize > MAX_PIECE_BYTES:
            raise SourceError(f"{where}: chunks of {piece} entries are more than one read here holds")
        expected = -(-entries // piece)
        stored = dataset.id.get_num_chunks()
        if stored != expected:
            raise SourceError(
                f"{where}: {ARRAY} stores {stored} of its {expected} chunks (a sparse file: missing entries would "
                "read as agglomerate 0)"
            )
        return _Opened(identity, dataset, entries, piece, dtype, None, offsets)

    def _current(self) -> _Opened:
        identity = self._identity(self.path)
        opened = self._opened
        if identity != opened.identity:
            with self._lock:
                if identity != self._opened.identity:
                    try:
                        fresh = self._open(identity)
                    except SourceError as exc:
                        raise MappingUnreadable(str(exc)) from None
                    self._opened, self.dtype = fresh, fresh.dtype  # lookups give uint64 of any stored type
                opened = self._opened
        return opened

    def largest_id(self) -> int | None:
        offsets = self._opened.offsets
        return None if offsets is None or offsets.shape[0] < 1 else int(offsets.shape[0]) - 1

    def outdated(self) -> bool:
        try:
            self._current()
        except (Fault, OSError, SourceError):
            return False
        return self.holds() != self.loaded_holds

    def lookup(self, ids: np.ndarray) -> tuple[np.ndarray, list[FileSource]]:
        opened = self._current()
        out, inside = _with_entries(ids, opened.entries)
        wanted = ids[:inside]
        pieces = _pieces(wanted, opened.piece)
        _gather(out, wanted, opened.piece, pieces, self._pieces_of(opened, pieces[0]).__getitem__)
        return out, [(self.path, opened.identity)]

    def span(self, low: int, high: int, dtype: np.dtype) -> tuple[np.ndarray, list[FileSource]]:
        opened = self._current()
        stored_end = max(low, min(high + 1, opened.entries))  # the ids past the array map to themselves
        size = opened.piece
        numbers = range(low // size, (stored_end - 1) // size + 1) if low < stored_end else range(0)
        found = self._pieces_of(opened, numbers)
        fits = all(piece.dtype.itemsize <= dtype.itemsize for piece in found.values())
        out = np.empty(high - low + 1, dtype=dtype if fits else np.uint64)
        out[stored_end - low :] = np.arange(stored_end, high + 1, dtype=out.dtype)
        for number in numbers:
            first, last = max(low, number * size), min(stored_end, (number + 1) * size)
            out[first - low : last - low] = found[number][first - number * size : last - number * size]
        return out, [(self.path, opened.identity)]

    def _pieces_of(self, opened: _Opened, numbers: Iterable[int]) -> dict[int, np.ndarray]:
        """The pieces ``numbers`` (ascending) of the version opened: kept ones from the cache, the others read,
        consecutive ones at once, and kept."""
        found: dict[int, np.ndarray] = {}
        missing = []
        for number in numbers:
            piece = self.pieces.get((self.key, opened.identity.version, number))
            if piece is None:
                missing.append(number)
            else:
                found[number] = piece
        most = max(1, RUN_BYTES // (opened.piece * self.dtype.itemsize))
        for start, stop in _runs(np.asarray(missing, dtype=np.int64), most):
            values = self._read(opened, start * opened.piece, min(stop * opened.piece, opened.entries))
            for number in range(start, stop):
                piece = self._kept(values[(number - start) * opened.piece : (number - start + 1) * opened.piece])
                found[number] = piece
                self.pieces.put((self.key, opened.identity.version, number), piece, piece.nbytes)
        return found

    def _kept(self, entries: np.ndarray) -> np.ndarray:
        """A piece as it is kept (a copy: never a view of a larger read): in the type that holds the
        agglomerates the file declares where all its entries fit, so a webKnossos file's uint64 entries take
        half the memory for a uint32 layer and its chunks copy them without a check; else as stored (a chunk
        that uses an entry past it is a fault, see :meth:`apply`)."""
        holds = self.loaded_holds
        if entries.dtype.itemsize > holds.itemsize and (not entries.size or int(entries.max()) <= TOPS[holds]):
            return entries.astype(holds)
        return entries.copy()

    def _read(self, opened: _Opened, first: int, last: int) -> np.ndarray:
        """Entries ``first`` to ``last`` in their stored type (little-endian): a contiguous array's bytes in one
        read of the store (h5py's reads through a file object cost several times as much), a chunked one's
        through h5py."""
        dtype = opened.dataset.dtype
        if opened.offset is not None:
            at, size = opened.offset + first * dtype.itemsize, (last - first) * dtype.itemsize
            data = self.store.read(self.path, at, size, opened.identity, limit=MAX_PIECE_BYTES * 4)
            return np.frombuffer(data, dtype=dtype).astype(opened.dtype, copy=False)
        try:
            return np.asarray(opened.dataset[first:last], dtype=opened.dtype)
        except (StorageError, OversizedFileError):
            raise
        except Exception as exc:
            raise MappingUnreadable(f"agglomerate file {self.key} cannot be read: {exc}") from None

    def listed(self, limit: int) -> list[ListedFile]:
        return [ListedFile(self.key, self._identity(self.path))]

    def named_files(self) -> list[str] | None:
        return [self.path]

    def member_counts(self, ids: np.ndarray) -> np.ndarray | None:
        """From ``agglomerate_to_segments_offsets`` (agglomerate a's segments lie between entries a and a + 1),
        reading only the entries of ``ids``; None where the file has no such 1-D dataset."""
        offsets = self._current().offsets
        if offsets is None:
            return None
        inside = ids < max(offsets.shape[0] - 1, 0)  # past them: a segment left as it is, one member
        wanted = np.unique(np.concatenate([ids[inside], ids[inside] + 1])).astype(np.int64)
        counts = np.ones(ids.shape, dtype=np.int64)
        if wanted.size:
            try:
                values = np.asarray(offsets[wanted], dtype=np.int64)
            except (StorageError, OversizedFileError):
                raise
            except Exception as exc:
                raise MappingUnreadable(f"agglomerate file {self.key} cannot be read: {exc}") from None
            at = np.searchsorted(wanted, ids[inside].astype(np.int64))
            counts[inside] = values[at + 1] - values[at]
        return counts


def _offsets_of(handle: Any) -> Any:
    """``agglomerate_to_segments_offsets`` of an open file where it is a 1-D integer dataset stored in the file
    itself (a link to elsewhere is never followed), else None."""
    import h5py

    link = handle.get(OFFSETS, getlink=True)
    if not isinstance(link, h5py.HardLink):
        return None
    offsets = handle[OFFSETS]
    if not isinstance(offsets, h5py.Dataset) or offsets.ndim != 1 or offsets.dtype.kind not in "ui":
        return None
    return None if offsets.is_virtual or offsets.external else offsets


# --- Zarr v3 --------------------------------------------------------------------------------------------


class ZarrVector:
    """One version of a 1-D array of a Zarr v3 agglomerate group (that of its ``zarr.json``): a piece is one
    stored (inner) chunk, decoded from memory. webKnossos writes them sharded (chunks of 256 KiB in shards of up
    to 1 GiB): an inner chunk is then read by its shard's index, never the shard."""

    def __init__(
        self,
        store: Store,
        group: str,
        name: str,
        pieces: ByteLRU[np.ndarray],
        key: str,
        through: Store | None = None,
        settled: bool = False,
    ) -> None:
        self.store = store
        self.pieces = pieces
        self.key = f"{key}/{name}"
        self.path = store.join(group, name)
        self.metadata_path = store.join(self.path, "zarr.json")
        where = f"agglomerate group {key}"
        located = read_document(through or store, self.metadata_path, f"{where}: {name}/zarr.json", settled)
        if located is None:
            raise SourceError(f"{where} holds no array {name!r} (no {name}/zarr.json)")
        document, self.metadata_identity = located
        # Pieces are kept by the metadata's version too: a chunk file left as it was means other entries under
        # another type or codec.
        self._cached = (self.key, self.metadata_identity.version)
        if document.get("zarr_format") != 3 or document.get("node_type") != "array":
            raise SourceError(f"{where}: {name}/zarr.json is not a Zarr v3 array")
        with malformed_metadata(f"{where}: {name}/zarr.json"):
            array: ZarrArray = parse_zarr_json(document)
        if len(array.shape) != 1:
            raise SourceError(f"{where}: {name} has shape {array.shape}, not one dimension")
        self.dtype = _checked_dtype(array.dtype, f"{where}: {name}")
        self.entries = int(array.shape[0])
        if self.entries > MAX_ENTRIES:
            raise SourceError(f"{where}: {name} declares {self.entries} entries, more than {MAX_ENTRIES}")
        self.array = array
        self.sharding = array.sharding
        if self.sharding is not None and self.sharding.chunks > MAX_CHUNKS_PER_SHARD:
            raise SourceError(f"{where}: {self.sharding.chunks} chunks per shard are more than {MAX_CHUNKS_PER_SHARD}")
        self.piece = int(array.inner_chunks[0])
        decoded = check_chunk_bytes((self.piece,), array.dtype.itemsize, f"a chunk of {name}")
        if decoded > MAX_PIECE_BYTES:
            raise SourceError(f"{where}: chunks of {self.piece} entries are more than one read here holds")
        self._stored_limit = stored_limit(decoded) if array.compressed else decoded
        inner = dict(document)
        if self.sharding is not None:  # decoded as the array of its inner chunks, each fetched on its own
            inner["chunk_grid"] = {"name": "regular", "configuration": {"chunk_shape": [self.piece]}}
            inner["chunk_key_encoding"] = {"name": "default", "configuration": {"separator": "/"}}
            inner["codecs"] = document["codecs"][0]["configuration"]["codecs"]
        inner.pop("attributes", None)
        self._decoder = MemoryDecoder({"driver": "zarr3"}, {"zarr.json": json.dumps(inner).encode()}, self.key)
        self._decoder.check()

    def _file_of(self, number: int) -> str:
        """The file piece ``number`` is stored in: its chunk's, or its shard's."""
        if self.sharding is not None:
            number //= self.sharding.chunks_per_shard[0]
        parts = [self.array.key_prefix] if self.array.key_prefix else []
        return self.store.join(self.path, self.array.separator.join([*parts, str(number)]))

    def _decoder_key(self, number: int) -> str:
        if self.sharding is not None:
            return f"c/{number}"
        parts = [self.array.key_prefix] if self.array.key_prefix else []
        return self.array.separator.join([*parts, str(number)])

    def values(self, wanted: np.ndarray, checked: bool = False) -> tuple[np.ndarray, list[FileSource]]:
        """The entries at ``wanted`` (each below ``entries``), and every file read with its version. ``checked``:
        the caller has just seen that the metadata is still this version (else it is looked at here)."""
        if not checked and self.store.identity(self.metadata_path) != self.metadata_identity:
            raise MappingUnreadable(f"agglomerate group {self.key}: its metadata changed while it was read")
        files: dict[str, FileIdentity | None] = {self.metadata_path: self.metadata_identity}

        def piece_of(number: int) -> np.ndarray:
            path = self._file_of(number)
            if path not in files:
                files[path] = self.store.identity(path)
            identity = files[path]
            key = (*self._cached, path, None if identity is None else identity.version, number)
            piece = self.pieces.get(key)
            if piece is None:
                piece = self._read_piece(number, path, identity)
                self.pieces.put(key, piece, piece.nbytes)
            return piece

        result = np.empty(wanted.shape, dtype=np.uint64)
        _gather(result, wanted, self.piece, _pieces(wanted, self.piece), piece_of)
        return result, list(files.items())

    def _read_piece(self, number: int, path: str, identity: FileIdentity | None) -> np.ndarray:
        first, last = number * self.piece, min((number + 1) * self.piece, self.entries)
        if identity is None:
            # Writers put the metadata first (zarr-python renames it into place: trusted at once), then the
            # chunks: one missing beside young metadata may be on its way, never entries of the fill value yet.
            young = self.metadata_identity.changed + UNWRITTEN_CHUNK_SECONDS - time.time()
            if young > 0:
                raise FileUnsettledError(f"{self.store.relative(path)} may not be written yet", young)
        data = None if identity is None else self._stored(number, path, identity)
        if data is None:
            return np.full(last - first, self.array.fill_value, dtype=np.uint64)
        decoded = self._decoder.decode({self._decoder_key(number): data}, (slice(first, last),))
        return np.asarray(decoded, dtype=np.uint64)

    def _stored(self, number: int, path: str, identity: FileIdentity) -> bytes | None:
        """The stored bytes of piece ``number``: its chunk file, or its inner chunk by the shard's index."""
        if self.sharding is None:
            return self.store.read(path, 0, identity.size, identity, limit=self._stored_limit)
        size = self.sharding.index_size
        index_key = (*self._cached, path, identity.version, "index")
        where = self.store.relative(path)
        table = self.pieces.get(index_key)
        if table is None:
            raw = self.store.read(path, self.sharding.index_offset(identity.size, where), size, identity, limit=size)
            table = self.sharding.decode(raw, where)
            self.pieces.put(index_key, table, table.nbytes)
        extent = chunk_extent(table, self.sharding.position((number,)), identity.size, where)
        if extent is None:
            return None
        offset, nbytes = extent
        return self.store.read(path, offset, nbytes, identity, limit=self._stored_limit)


class ZarrMapping(Mapping):
    """A Zarr v3 agglomerate group: ``segment_to_agglomerate``, and ``agglomerate_to_segments_offsets`` for the
    members of each agglomerate. Proofreading writes the group again (another length, chunking, type, sharding):
    the array is opened again whenever its ``zarr.json`` is another version, as an HDF5 file is."""

    kind = "zarr"

    def __init__(self, store: Store, found: Found, pieces: ByteLRU[np.ndarray], through: Store | None = None) -> None:
        super().__init__(store, found, pieces)
        # Metadata written moments ago is FileUnsettledError (no layer yet, looked at again): its writer may not
        # have written the chunks yet, which would read as entries of the fill value.
        self.table = ZarrVector(store, found.path, ARRAY, pieces, self.key, through, settled=True)
        self.dtype = self.table.dtype
        self._refused: tuple[FileIdentity, str] | None = None  # the last version that could not be opened, and why
        self._offsets_metadata = store.join(found.path, OFFSETS, "zarr.json")
        self._declared = self._declared_largest(through or store, settled=True)
        self.loaded_holds = self.holds()

    def _current(self) -> ZarrVector:
        """The array of the group's current version (one stat of its metadata): opened again, once for all
        waiting lookups, when the metadata changed; MappingUnreadable (naming the file) for a version that
        cannot be opened, said again without reading it until it changes."""
        identity = self._identity(self.table.metadata_path)
        table = self.table
        if identity == table.metadata_identity:
            return table
        with self._lock:
            table = self.table
            if identity == table.metadata_identity:
                return table  # another lookup opened it meanwhile
            if self._refused is not None and self._refused[0] == identity:
                raise MappingUnreadable(self._refused[1])
            try:  # under the settle rule, as when the layer was loaded
                table = ZarrVector(self.store, self.path, ARRAY, self.pieces, self.key, settled=True)
            except (SourceError, ChunkDecodeError) as exc:
                self._refused = (identity, str(exc))
                raise MappingUnreadable(str(exc)) from None
            self.table, self.dtype = table, table.dtype  # lookups give uint64 of any stored type
            return table

    def _declared_largest(self, store: Store, settled: bool = False) -> tuple[FileIdentity | None, int | None]:
        """The identity of the offsets array's metadata and the largest id its length declares (None where the
        group holds no usable such array: its lookups do not need it)."""
        try:
            located = read_document(store, self._offsets_metadata, f"agglomerate group {self.key}: {OFFSETS}", settled)
        except SourceError:
            return store.identity(self._offsets_metadata), None
        if located is None:
            return None, None
        document, identity = located
        shape = document.get("shape")
        if document.get("node_type") != "array" or not isinstance(shape, list) or len(shape) != 1:
            return identity, None
        length = shape[0]
        if not isinstance(length, int) or isinstance(length, bool) or length < 1:
            return identity, None
        return identity, length - 1

    def largest_id(self) -> int | None:
        return self._declared[1]

    def outdated(self) -> bool:
        """Whether the stored type of the current version, or the largest id its offsets declare, needs
        another data type of the layer."""
        try:
            self._current()
            if self.store.identity(self._offsets_metadata) != self._declared[0]:
                self._declared = self._declared_largest(self.store, settled=True)
        except (Fault, OSError):  # unreadable or still being written: its chunks say so, or it is looked at again
            return False
        return self.holds() != self.loaded_holds

    def lookup(self, ids: np.ndarray) -> tuple[np.ndarray, list[FileSource]]:
        table = self._current()
        out, inside = _with_entries(ids, table.entries)
        out[:inside], files = table.values(ids[:inside], checked=True)
        return out, files

    def member_counts(self, ids: np.ndarray) -> np.ndarray | None:
        try:
            offsets = ZarrVector(self.store, self.path, OFFSETS, self.pieces, self.key)
        except SourceError:
            return None
        inside = ids < max(offsets.entries - 1, 0)  # past them: a segment left as it is, one member
        wanted = np.unique(np.concatenate([ids[inside], ids[inside] + 1]))
        counts = np.ones(ids.shape, dtype=np.int64)
        if wanted.size:
            values = offsets.values(wanted)[0].astype(np.int64)
            at = np.searchsorted(wanted, ids[inside])
            counts[inside] = values[at + 1] - values[at]
        return counts

    def listed(self, limit: int) -> list[ListedFile]:
        listed = self.store.list_files(self.path, limit) or []
        return [ListedFile(f"{self.key}/{entry.path}", entry.identity) for entry in listed]


# --- JSON -----------------------------------------------------------------------------------------------


class JsonMapping(Mapping):
    """A JSON mapping (``classes`` of equivalent ids): every id of a class maps to the class's smallest id, so
    the mapped layer keeps the source's data type. Parsed whole once per version (it is bounded)."""

    kind = "json"

    def __init__(
        self,
        store: Store,
        found: Found,
        pieces: ByteLRU[np.ndarray],
        source_dtype: np.dtype,
        through: Store | None = None,
    ) -> None:
        super().__init__(store, found, pieces)
        self.dtype = self.loaded_holds = source_dtype
        identity = self._identity(found.path, through)
        self._parsed = (identity, *self._parse(identity))

    def _parse(self, identity: FileIdentity) -> tuple[np.ndarray, np.ndarray]:
        where = f"mapping {self.key}"
        if identity.size > MAX_JSON_BYTES:
            raise SourceError(f"{where} is {identity.size} bytes, more than the {MAX_JSON_BYTES} read here")
        # under the settle rule: a file still being written is no mapping yet, and never a broken one
        data = self.store.read(self.path, 0, identity.size, identity, limit=MAX_JSON_BYTES)
        try:
            document = load_json(data, max_values=MAX_JSON_VALUES)
        except ValueError as exc:
            raise SourceError(f"{where} is not usable JSON: {exc}") from None
        classes = document.get("classes") if isinstance(document, dict) else None
        if not isinstance(classes, list) or not all(isinstance(c, list) for c in classes):
            raise SourceError(f"{where} holds no 'classes' (a list of lists of segment ids)")
        top = int(np.iinfo(self.dtype).max)
        mapped: dict[int, int] = {}
        for members in classes:
            if not members:
                continue  # an empty class maps nothing
            if not all(isinstance(i, int) and not isinstance(i, bool) for i in members):
                raise SourceError(f"{where}: a class holds something other than integer segment ids")
            smallest, largest = min(members), max(members)
            if smallest < 0 or largest > top:
                raise SourceError(f"{where}: id {smallest if smallest < 0 else largest} is beyond {self.dtype}")
            # As webKnossos applies classes in order: a class whose smallest id an earlier class mapped joins
            # that class's id, and a later class's mapping of an id replaces an earlier one.
            target = mapped.get(smallest, smallest)
            for member in members:
                mapped[member] = target
        keys = np.fromiter(mapped.keys(), dtype=np.uint64, count=len(mapped))
        order = np.argsort(keys)
        return keys[order], np.fromiter(mapped.values(), dtype=np.uint64, count=len(mapped))[order]

    def lookup(self, ids: np.ndarray) -> tuple[np.ndarray, list[FileSource]]:
        identity = self._identity(self.path)
        if identity != self._parsed[0]:
            with self._lock:
                if identity != self._parsed[0]:
                    try:
                        self._parsed = (identity, *self._parse(identity))
                    except SourceError as exc:
                        raise MappingUnreadable(str(exc)) from None
        _, keys, values = self._parsed
        out = ids.astype(np.uint64, copy=True)
        at = np.searchsorted(keys, ids)
        hit = at < keys.size
        hit[hit] = keys[at[hit]] == ids[hit]
        out[hit] = values[at[hit]]
        return out, [(self.path, identity)]

    def listed(self, limit: int) -> list[ListedFile]:
        return [ListedFile(self.key, self._identity(self.path))]

    def named_files(self) -> list[str] | None:
        return [self.path]

    @property
    def lookups_are_cheap(self) -> bool:
        return False  # a rewritten file is parsed whole (up to MAX_JSON_BYTES) by the next lookup

    def member_counts(self, ids: np.ndarray) -> np.ndarray | None:
        """The size of each id's class (1 for an id in none)."""
        _, _, values = self._parsed
        classes, sizes = np.unique(values, return_counts=True)
        counts = np.ones(ids.shape, dtype=np.int64)
        if classes.size:
            at = np.minimum(np.searchsorted(classes, ids), classes.size - 1)
            hit = classes[at] == ids
            counts[hit] = sizes[at[hit]]
        return counts


# --- the mapped layer's mags ----------------------------------------------------------------------------


class MappedMag(MagSource):
    """A mag of a mapped layer: the source mag's voxels with the mapping applied. Nothing is passed through as
    stored, and every chunk names the mapping's files beside the source's."""

    kind = "mapped"

    def __init__(self, source: MagSource, mapping: Mapping, dtype: np.dtype) -> None:
        self.source = source
        self.mapping = mapping
        self.storage = source.storage
        self.location = source.location
        self.root = source.root
        self.mag = source.mag
        self.bbox = source.bbox
        self.dtype = dtype
        self.channels = source.channels
        self.fill_value = 0

    @property
    def location_key(self) -> str:
        return f"{self.source.location_key}#{self.mapping.key}"

    def decoded_bytes(self, shape: Vec3) -> int:
        voxels = shape[0] * shape[1] * shape[2] * self.channels
        return self.source.decoded_bytes(shape) + voxels * self.dtype.itemsize  # and the mapped copy

    def files_read(self, shape: Vec3) -> int:
        return self.source.files_read(shape)  # and a few pieces of the mapping

    @property
    def reads_are_cheap(self) -> bool:
        return self.source.reads_are_cheap and self.mapping.lookups_are_cheap

    def read_inside(self, offset: Vec3, shape: Vec3) -> tuple[np.ndarray, list[FileSource] | None]:
        data, sources = self.source.read_inside(offset, shape)
        mapped, read = self.mapping.apply(data, self.dtype)
        return mapped, None if sources is None else [*sources, *read]

    def read_held(self, lo: Vec3, hi: Vec3) -> Region | None:
        """The source's own answer to whether anything is stored (it may learn it from the read), mapped."""
        wanted = Box(lo, hi)
        inner = self.bbox.clip(wanted)
        held = None if inner is None else self.source.read_held(inner.lo, inner.hi)
        if inner is None or held is None:
            return None
        mapped, read = self.mapping.apply(held.data, self.dtype)
        return self.placed(wanted, inner, mapped, None if held.sources is None else [*held.sources, *read])

    def files_inside(self, offset: Vec3, shape: Vec3) -> list[str] | None:
        own = self.source.files_inside(offset, shape)
        named = self.mapping.named_files()
        return None if own is None or named is None else [*own, *named]

    def holds_data(self, lo: Vec3, hi: Vec3) -> bool:
        return self.source.holds_data(lo, hi)

    def member_counts(self, ids: np.ndarray) -> np.ndarray | None:
        return self.mapping.member_counts(ids)

    def listed_files(self, limit: int) -> list[ListedFile] | None:
        own = self.source.listed_files(limit)
        return None if own is None else [*own, *self.mapping.listed(limit)]


def mapped_dtype(source: np.dtype, mapping: Mapping) -> np.dtype:
    """The data type of a mapped layer: the narrowest that holds the agglomerate ids (those the mapping opened
    declares) and every source id left unmapped."""
    if source.kind != "u":
        raise SourceError(f"the layer holds {source}: mappings apply to unsigned integer segment ids")
    return np.promote_types(source, mapping.loaded_holds)


class Mappings:
    """Finds and opens the mappings beside a layer; owns the cache of their pieces (one per worker)."""

    def __init__(self, store: Store, cache_bytes: int) -> None:
        self.store = store
        self.pieces: ByteLRU[np.ndarray] = ByteLRU(cache_bytes)

    def find(self, layer_directory: str, through: Store | None = None) -> list[Found]:
        """Every mapping beside a layer, by name: HDF5 files and Zarr groups in ``agglomerates/``, JSON files
        in ``mappings/``, looked up through ``through`` where given (the catalog's recorder of a load). Raises
        OversizedListingError for a folder of more than MAX_LISTED entries."""
        store = through or self.store
        found: list[Found] = []
        agglomerates = store.join(layer_directory, AGGLOMERATES)
        if not self._inside(store, agglomerates):
            agglomerates = ""  # a folder symlinked out of the root is not listed: its names are not the data's
        for entry in self._top_files(store, agglomerates):
            for suffix in HDF5_SUFFIXES:
                if entry.endswith(suffix):
                    found.append(Found(entry.removesuffix(suffix), "hdf5", store.join(agglomerates, entry)))
        for name in store.list_directories(agglomerates) if agglomerates else []:
            path = store.join(agglomerates, name)
            if store.identity(store.join(path, "zarr.json")) is not None:
                found.append(Found(name, "zarr", path))
        mappings = store.join(layer_directory, JSON_MAPPINGS)
        for entry in self._top_files(store, mappings if self._inside(store, mappings) else ""):
            if entry.endswith(".json"):
                found.append(Found(entry.removesuffix(".json"), "json", store.join(mappings, entry)))
        return sorted(found, key=lambda f: (f.name, f.kind))

    @staticmethod
    def _inside(store: Store, directory: str) -> bool:
        try:
            return store.resolve(directory) is not None
        except ValueError:  # a name no file can have
            return False

    @staticmethod
    def _top_files(store: Store, directory: str) -> list[str]:
        if not directory or not store.is_directory(directory):
            return []
        listed = store.list_files(directory, MAX_LISTED) or []
        return [entry.path for entry in listed if "/" not in entry.path]

    def open(self, found: Found, source_dtype: np.dtype, through: Store | None = None) -> Mapping:
        """The mapping, checked; SourceError (or MissingExtraError) with the reason it cannot be served. Opening
        looks its files up through ``through`` where given (the catalog's recorder of a load)."""
        if not PLAIN_MAPPING_NAME.fullmatch(found.name):
            raise SourceError(
                f"mapping name {found.name!r} is not served: a layer name holds letters, digits, '.', '_' and '-' only"
            )
        if found.kind == "hdf5":
            return Hdf5Mapping(self.store, found, self.pieces, through)
        if found.kind == "zarr":
            return ZarrMapping(self.store, found, self.pieces, through)
        return JsonMapping(self.store, found, self.pieces, source_dtype, through)
