"""A Zarr (v2 or v3) mag of a layer: its own chunks as stored, and any region through tensorstore."""

import functools
import itertools
import json
from typing import Any

import numpy as np

from gateway_storage import ByteLRU, FileIdentity, FileSource, Store
from gateway_storage.cache import CacheCounts
from gateway_storage.geometry import Vec3

from ..shard_formats.sharding_indexed import chunk_extent
from .axes import AxisMap, axis_names
from .bounds import (
    MAX_CHUNKS_PER_SHARD,
    check_chunk_bytes,
    chunked_decoded_bytes,
    malformed_metadata,
    read_document,
    stored_limit,
)
from .decoding import ChunkDecodeError as ChunkDecodeError  # raised by reads; its home is decoding.py
from .decoding import MemoryDecoder, blosc_length, fetch_all
from .formats import SourceFormat
from .mag import ChunkNotFound, MagSource, NativeEncoding, SourceError, StoredChunk, StoredEncoding
from .metadata import ZarrArray, parse_zarr_json, parse_zarray
from .properties import BoundingBox, DataLayer


class ZarrMagSource(MagSource):
    """One mag of a layer stored as a Zarr array, on a local disk or in object storage."""

    kind = "zarr"

    def __init__(
        self,
        mag: Vec3,
        storage: Store,
        directory: str,
        bbox: BoundingBox,
        axis_order: dict[str, int] | None,
        index_cache: ByteLRU[np.ndarray],
        through: Store | None = None,
    ) -> None:
        opening = self._locate(storage, directory, through)
        self.index_cache = index_cache
        document, self.version, array = self._read_metadata(opening, directory)
        with malformed_metadata("Zarr metadata"):  # the models check every field; this confines anything else
            self._open(mag, bbox, axis_order, document, array)

    def _open(
        self,
        mag: Vec3,
        bbox: BoundingBox,
        axis_order: dict[str, int] | None,
        document: dict[str, Any],
        array: ZarrArray,
    ) -> None:
        self.array = array
        self.zarr_format = array.zarr_format
        self.source_shape = array.shape
        self.sharding = array.sharding
        self.axis_map = AxisMap(
            tuple(axis_names(array.dimension_names and list(array.dimension_names), len(array.shape), axis_order)),
            array.shape,
        )
        super().__init__(mag, bbox, array.dtype, self.axis_map.channels, array.fill_value)
        self.native = NativeEncoding(
            array.zarr_format,
            self.axis_map.served_chunk(array.inner_chunks),
            self.axis_map.permutation(list(array.stored_order)),
            array.stored_dtype,
            array.v2_compressor,
            array.v3_codecs,
        )
        decoded = check_chunk_bytes(array.inner_chunks, array.dtype.itemsize)
        if self.sharding is not None and self.sharding.chunks > MAX_CHUNKS_PER_SHARD:
            raise SourceError(f"{self.sharding.chunks} chunks per shard are more than {MAX_CHUNKS_PER_SHARD}")
        self._chunk_bytes = decoded
        # An uncompressed chunk holds exactly its voxels; a compressed one at most an incompressible chunk.
        self._stored_limit = stored_limit(decoded) if array.compressed else decoded
        name, metadata = self._decoding_metadata(document)
        driver = "zarr3" if self.zarr_format == 3 else "zarr"
        self._decoder = MemoryDecoder({"driver": driver}, {name: metadata}, self.location_key)

    @staticmethod
    def _read_metadata(opening: Store, directory: str) -> tuple[dict[str, Any], str, ZarrArray]:
        for name, parse in (("zarr.json", parse_zarr_json), (".zarray", parse_zarray)):
            found = read_document(opening, opening.join(directory, name), name)
            if found is not None:
                document, identity = found
                return document, identity.version, parse(document)
        raise SourceError(f"no Zarr array (.zarray or zarr.json) at {directory}")

    # --- stored chunks -------------------------------------------------------------------------

    def _source_coords(self, index: tuple[int, ...]) -> tuple[int, ...]:
        return self.axis_map.stored_index(index)

    def _chunk_name(self, coords: tuple[int, ...]) -> str:
        parts = [self.array.key_prefix] if self.array.key_prefix else []
        return self.array.separator.join([*parts, *map(str, coords)])

    def _key(self, coords: tuple[int, ...]) -> str:
        return self.storage.join(self.location, self._chunk_name(coords))

    def stored_chunk(self, index: tuple[int, ...], lo: Vec3) -> StoredChunk | None:
        """The stored bytes of served chunk ``index`` (an inner chunk of a shard); absent ones raise."""
        assert self.native is not None
        coords = self._source_coords(index)
        if any(c * n >= s for c, n, s in zip(coords, self.array.inner_chunks, self.source_shape)):
            raise ChunkNotFound("the source holds no such chunk: it reads as the fill value")
        found = self._stored_bytes(coords)
        if found is None:
            raise self.absent()
        data, origin, identity = found
        return StoredChunk(data, StoredEncoding.NATIVE, self._chunk_bytes, origin, identity, self._file_of(coords))

    def decoded_bytes(self, shape: Vec3) -> int:
        """Every (inner) chunk of the source that a grid-aligned box touches is decoded whole."""
        inner = self.axis_map.served_chunk(self.array.inner_chunks)
        return chunked_decoded_bytes(inner, self.dtype.itemsize, self.channels, shape)

    def _shard_index(self, path: str, identity: FileIdentity) -> np.ndarray:
        key = (path, identity)
        cached = self.index_cache.get(key)
        if cached is not None:
            return cached
        sharding = self.sharding
        assert sharding is not None
        size = sharding.index_size
        raw = self.storage.read(path, sharding.index_offset(identity.size, path), size, identity, limit=size)
        table = sharding.decode(raw, path)
        self.index_cache.put(key, table, table.nbytes + 128)
        return table

    # --- any region: the stored chunks it needs, read through the store, decoded by tensorstore ----

    def _decoding_metadata(self, document: dict[str, Any]) -> tuple[str, bytes]:
        """The metadata file tensorstore decodes this array's (inner) chunks with, from an in-memory store.

        A sharded array is decoded as the array of its inner chunks: each is fetched on its own, so a
        read never loads a whole shard, and no shard needs to be put together in memory.
        """
        if self.zarr_format == 2:
            return ".zarray", json.dumps(document).encode()
        if self.sharding is None:
            return "zarr.json", json.dumps(document).encode()
        sharding = document["codecs"][0]["configuration"]
        inner = {key: value for key, value in document.items() if key not in ("attributes", "storage_transformers")}
        inner["chunk_grid"] = {"name": "regular", "configuration": {"chunk_shape": list(self.array.inner_chunks)}}
        inner["chunk_key_encoding"] = {"name": "default", "configuration": {"separator": "/"}}
        inner["codecs"] = sharding["codecs"]
        return "zarr.json", json.dumps(inner).encode()

    def _file_of(self, coords: tuple[int, ...]) -> str:
        """The file (inner) chunk ``coords`` is stored in: its own, or its shard."""
        return self._key(coords) if self.sharding is None else self._shard_of(coords)

    def _shard_of(self, coords: tuple[int, ...]) -> str:
        assert self.sharding is not None
        return self._key(tuple(c // n for c, n in zip(coords, self.sharding.chunks_per_shard)))

    def _stored_bytes(
        self, coords: tuple[int, ...], shards: dict[str, FileIdentity | None] | None = None
    ) -> tuple[bytes, str, FileIdentity] | None:
        """The stored bytes of (inner) chunk ``coords`` through the store, with their origin; None if absent.

        ``shards`` holds the identities of shards already looked up for the same read.
        """
        path = self._file_of(coords)
        if self.sharding is None:
            found = self.storage.read_whole(path, limit=self._stored_limit, settled=True)
            if found is None:
                return None
            return self._checked(found[0], self.relative(path)), self.relative(path), found[1]
        identity = shards[path] if shards is not None and path in shards else self.storage.identity(path)
        if identity is None:
            return None
        index_table = self._shard_index(path, identity)
        where = self.relative(path)
        extent = chunk_extent(index_table, self.sharding.position(coords), identity.size, where)
        if extent is None:
            return None
        offset, nbytes = extent
        origin = f"{self.relative(path)}@{offset}"
        data = self.storage.read(path, offset, nbytes, identity, limit=self._stored_limit)
        return self._checked(data, origin), origin, identity

    def _checked(self, data: bytes, origin: str) -> bytes:
        """A stored chunk as its format's reference reader takes it: an uncompressed one must hold exactly its
        voxels (a torn or truncated rewrite is a fault, never a short answer); a Blosc one ends where its header
        says (numcodecs reads past trailing bytes that some writers leave, such as z5py's 16)."""
        if not self.array.compressed:
            if len(data) != self._chunk_bytes:
                raise ChunkDecodeError(
                    f"{origin}: an uncompressed chunk of {len(data)} bytes, not the chunk's {self._chunk_bytes}"
                )
            return data
        if self.array.blosc:
            length = blosc_length(data)
            if length is not None and length < len(data):
                return data[:length]
        return data

    def _decoding_key(self, coords: tuple[int, ...]) -> str:
        if self.sharding is not None:
            return "/".join(["c", *map(str, coords)])
        return self._chunk_name(coords)

    def read_inside(self, offset: Vec3, shape: Vec3) -> tuple[np.ndarray, list[FileSource] | None]:
        """Voxels of a box; every byte comes through the store (containment, versions), never from elsewhere.

        The stored chunks the box covers are read through the store, put in an in-memory key-value
        store of their own, and decoded by tensorstore from there: tensorstore itself opens no file
        and sends no request, so no symlink below the mag and no object version escapes the store's
        checks.
        """
        out = np.full((self.channels, *shape), self.fill_value, dtype=self.dtype, order="F")
        lo, hi = self.axis_map.stored_box(offset, shape)
        if any(h <= low for low, h in zip(lo, hi)):
            return out, None
        grid = self.array.inner_chunks
        covered = list(itertools.product(*(range(a // g, -(-b // g)) for a, b, g in zip(lo, hi, grid))))
        shards = None
        if self.sharding is not None:  # each shard looked up once for the whole read, not once per inner chunk
            shards = {path: self.storage.identity(path) for path in dict.fromkeys(map(self._shard_of, covered))}
        stored = fetch_all(self.storage, functools.partial(self._stored_bytes, shards=shards), covered)
        data = self._decode(dict(zip(covered, stored)), lo, hi)
        data = self.axis_map.to_served(data)
        out[tuple(slice(0, n) for n in data.shape)] = data
        return out, None

    def files_inside(self, offset: Vec3, shape: Vec3) -> list[str]:
        """The chunk files (or shards) :meth:`read_inside` reads."""
        lo, hi = self.axis_map.stored_box(offset, shape)
        if any(h <= low for low, h in zip(lo, hi)):
            return []
        covered = itertools.product(*(range(a // g, -(-b // g)) for a, b, g in zip(lo, hi, self.array.inner_chunks)))
        return list(dict.fromkeys(map(self._file_of, covered)))

    def _decode(
        self, stored: dict[tuple[int, ...], tuple[bytes, str, FileIdentity] | None], lo: list[int], hi: list[int]
    ) -> np.ndarray:
        chunks = {self._decoding_key(coords): found[0] for coords, found in stored.items() if found is not None}
        return self._decoder.decode(chunks, tuple(slice(a, b) for a, b in zip(lo, hi)))


class ZarrFormat(SourceFormat):
    """``dataFormat: zarr`` and ``zarr3``: any directory (or prefix) holding an array; shard indexes share a cache."""

    data_formats = ("zarr", "zarr3")

    def __init__(self, store: Store, cache_bytes: int) -> None:
        super().__init__(store, cache_bytes)
        self.index_cache: ByteLRU[np.ndarray] = ByteLRU(cache_bytes)

    def holds_mag(self, directory: str, through: Store | None = None) -> bool:
        store = through or self.store
        return store.is_directory(directory) or store.identity(store.join(directory, "zarr.json")) is not None

    def open_mag(
        self,
        mag: Vec3,
        directory: str,
        layer: DataLayer,
        axis_order: dict[str, int] | None,
        through: Store | None = None,
    ) -> MagSource:
        return ZarrMagSource(mag, self.store, directory, layer.bounding_box, axis_order, self.index_cache, through)

    @property
    def caches(self) -> dict[str, CacheCounts]:
        return {"indexes": self.index_cache}
