"""A Zarr (v2 or v3) mag of a layer: its own chunks as stored, and any region through tensorstore."""

import functools
import itertools
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway_storage import ByteLRU, FileIdentity, FileSource, Store
from gateway_storage.cache import CacheCounts
from gateway_storage.geometry import Vec3

from .axes import AxisMap, axis_names
from .bounds import (
    MAX_CHUNKS_PER_SHARD,
    check_chunk_bytes,
    chunked_decoded_bytes,
    json_type,
    malformed_metadata,
    read_document,
)
from .decoding import ChunkDecodeError as ChunkDecodeError  # raised by reads; its home is decoding.py
from .decoding import MemoryDecoder, fetch_all
from .formats import SourceFormat
from .mag import ChunkNotFound, MagSource, NativeEncoding, SourceError, StoredChunk, StoredEncoding
from .properties import BoundingBox, DataLayer
from .shard_index import decode_shard_index, index_nbytes, is_absent

_SUPPORTED_V2_COMPRESSORS = {"blosc", "zlib", "gzip", "zstd", "bz2"}
_SUPPORTED_V3_CODECS = {"transpose", "bytes", "blosc", "gzip", "zstd", "crc32c", "sharding_indexed"}


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SourceError(f"{what} must be a JSON object, not {json_type(value)}")
    return value


def _codec_list(value: Any, what: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise SourceError(f"{what} must be a JSON array, not {json_type(value)}")
    for codec in value:
        if not isinstance(_mapping(codec, f"each of {what}").get("name"), str):
            raise SourceError(f"each of {what} needs a 'name' string")
        _mapping(codec.get("configuration") or {}, f"the configuration of codec {codec['name']!r}")
    return value


def _lengths(value: Any, rank: int, what: str, least: int) -> tuple[int, ...]:
    """``rank`` integers of at least ``least`` (a shape: 0; a chunk shape: 1)."""
    if (
        not isinstance(value, list)
        or len(value) != rank
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= least for v in value)
    ):
        raise SourceError(f"{what} must be {rank} integers of at least {least}, not {json_type(value)} {value!r:.80}")
    return tuple(value)


@dataclass(frozen=True, slots=True)
class _Sharding:
    chunks_per_shard: tuple[int, ...]  # source dims
    index_at_end: bool
    index_checksum: bool

    @property
    def chunks(self) -> int:
        return int(np.prod(self.chunks_per_shard, dtype=object))

    @property
    def index_size(self) -> int:
        return index_nbytes(self.chunks, self.index_checksum)


def _v3_codec_chain(
    codecs: list[dict[str, Any]], rank: int
) -> tuple[list[int] | None, str, tuple[dict[str, Any], ...]]:
    """(transpose order, endian, bytes-to-bytes codecs) of a chain without sharding."""
    order = None
    endian = "little"
    rest: list[dict[str, Any]] = []
    seen_bytes = False
    for codec in codecs:
        name = codec.get("name")
        config = codec.get("configuration") or {}
        if name not in _SUPPORTED_V3_CODECS or name == "sharding_indexed":
            raise SourceError(f"codec {name!r} is not supported here")
        if name == "transpose":
            if seen_bytes or order is not None:
                raise SourceError("only one transpose, before 'bytes', is supported")
            order = config.get("order")
            if not isinstance(order, list) or sorted(order) != list(range(rank)):
                raise SourceError(f"transpose order {order!r:.80} is not a permutation of the {rank} dimensions")
        elif name == "bytes":
            seen_bytes = True
            endian = config.get("endian", "little")
            if endian not in ("little", "big"):
                raise SourceError(f"bytes endian {endian!r:.40} is neither 'little' nor 'big'")
        else:
            rest.append(codec)
    if not seen_bytes:
        raise SourceError("the codec chain has no 'bytes' codec")
    return order, endian, tuple(rest)


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
    ) -> None:
        self.storage = storage
        self.location = directory
        self.root = storage.root_of(directory)  # the root it lies under: replicas agree on relative paths
        self.index_cache = index_cache
        document, self.zarr_format, self.version = self._read_metadata(directory)
        with malformed_metadata("Zarr metadata"):  # every field's type is checked where it matters; this is the rest
            self._parse(mag, bbox, document, axis_order)

    def _parse(self, mag: Vec3, bbox: BoundingBox, document: dict[str, Any], axis_order: dict[str, int] | None) -> None:
        shape = document.get("shape")
        if not isinstance(shape, list):
            raise SourceError(f"shape must be a JSON array, not {json_type(shape)}")
        rank = len(shape)
        self.source_shape = _lengths(shape, rank, "shape", 0)
        self.axis_map = AxisMap(tuple(axis_names(document.get("dimension_names"), rank, axis_order)), self.source_shape)
        channels = self.axis_map.channels
        dtype, fill_value = self._dtype_and_fill(document)
        super().__init__(mag, bbox, dtype, channels, fill_value)
        self.sharding: _Sharding | None = None
        self.native = self._native_encoding(document, dtype)
        name, metadata = self._decoding_metadata(document)
        driver = "zarr3" if self.zarr_format == 3 else "zarr"
        self._decoder = MemoryDecoder({"driver": driver}, {name: metadata}, self.location_key)
        self._check_bounds(dtype)

    def _check_bounds(self, dtype: np.dtype) -> None:
        check_chunk_bytes(self._inner(), dtype.itemsize)
        if self.sharding is not None and self.sharding.chunks > MAX_CHUNKS_PER_SHARD:
            raise SourceError(f"{self.sharding.chunks} chunks per shard are more than {MAX_CHUNKS_PER_SHARD}")

    def _read_metadata(self, directory: str) -> tuple[dict[str, Any], int, str]:
        for name, version in (("zarr.json", 3), (".zarray", 2)):
            found = read_document(self.storage, self.storage.join(directory, name), name)
            if found is not None:
                document, identity = found
                if version == 3 and document.get("node_type") != "array":
                    raise SourceError("zarr.json does not describe an array")
                return document, version, identity.version
        raise SourceError(f"no Zarr array (.zarray or zarr.json) at {directory}")

    def _dtype_and_fill(self, document: dict[str, Any]) -> tuple[np.dtype, float]:
        try:
            dtype = np.dtype(document["dtype"] if self.zarr_format == 2 else document["data_type"])
        except (KeyError, TypeError) as exc:
            raise SourceError(f"unsupported data type: {exc}") from None
        if dtype.kind not in "uif" or dtype.itemsize > 8:
            raise SourceError(f"unsupported data type {dtype}")
        fill = document.get("fill_value") or 0
        if not isinstance(fill, int | float) or isinstance(fill, bool):
            raise SourceError(f"unsupported fill value {fill!r}")
        return dtype, fill

    def _native_encoding(self, document: dict[str, Any], dtype: np.dtype) -> NativeEncoding | None:
        rank = len(self.source_shape)
        if self.zarr_format == 2:
            if document.get("filters"):
                raise SourceError("Zarr v2 filters are not supported")
            compressor = document.get("compressor")
            if compressor is not None and _mapping(compressor, "compressor").get("id") not in _SUPPORTED_V2_COMPRESSORS:
                raise SourceError(f"compressor {compressor.get('id')!r} is not supported (tensorstore cannot read it)")
            self.chunks = _lengths(document.get("chunks"), rank, "chunks", 1)
            self.separator: str = document.get("dimension_separator", ".")
            if self.separator not in (".", "/"):
                raise SourceError(f"dimension_separator {self.separator!r} is neither '.' nor '/'")
            self.key_prefix = ""
            order = document.get("order", "C")
            if order not in ("C", "F"):
                raise SourceError(f"order {order!r} is neither 'C' nor 'F'")
            stored = list(range(rank)) if order == "C" else list(range(rank))[::-1]
            return NativeEncoding(
                2, self.axis_map.served_chunk(self.chunks), self.axis_map.permutation(stored), dtype, compressor
            )
        grid = _mapping(document.get("chunk_grid"), "chunk_grid")
        if grid.get("name") != "regular":
            raise SourceError(f"chunk grid {grid.get('name')!r} is not regular")
        grid_config = _mapping(grid.get("configuration"), "the configuration of chunk_grid")
        self.chunks = _lengths(grid_config.get("chunk_shape"), rank, "chunk_shape", 1)
        encoding = _mapping(document.get("chunk_key_encoding", {"name": "default"}), "chunk_key_encoding")
        config = _mapping(encoding.get("configuration") or {}, "the configuration of chunk_key_encoding")
        if encoding.get("name") == "default":
            self.separator, self.key_prefix = config.get("separator", "/"), "c"
        elif encoding.get("name") == "v2":
            self.separator, self.key_prefix = config.get("separator", "."), ""
        else:
            raise SourceError(f"chunk key encoding {encoding.get('name')!r} is not supported")
        if self.separator not in (".", "/"):
            raise SourceError(f"chunk key separator {self.separator!r} is neither '.' nor '/'")
        codecs = _codec_list(document.get("codecs") or [], "codecs")
        inner_chunks = self.chunks
        if codecs and codecs[0].get("name") == "sharding_indexed":
            if len(codecs) != 1:
                raise SourceError("codecs after sharding_indexed are not supported")
            sharding = _mapping(codecs[0].get("configuration"), "the configuration of sharding_indexed")
            inner_chunks = _lengths(sharding.get("chunk_shape"), rank, "the inner chunk_shape", 1)
            index_codecs = [c["name"] for c in _codec_list(sharding.get("index_codecs", []), "index_codecs")]
            if index_codecs not in (["bytes"], ["bytes", "crc32c"]):
                raise SourceError(f"shard index codecs {index_codecs} are not supported")
            if any(s % c for s, c in zip(self.chunks, inner_chunks)):
                raise SourceError("the shard shape is not a multiple of the inner chunk shape")
            self.sharding = _Sharding(
                tuple(s // c for s, c in zip(self.chunks, inner_chunks)),
                sharding.get("index_location", "end") == "end",
                "crc32c" in index_codecs,
            )
            codecs = _codec_list(sharding.get("codecs"), "the codecs of sharding_indexed")
        order, endian, rest = _v3_codec_chain(codecs, rank)
        self.inner_chunks = inner_chunks
        stored_dtype = dtype.newbyteorder("<" if endian == "little" else ">")
        stored = order if order is not None else list(range(rank))
        return NativeEncoding(
            3, self.axis_map.served_chunk(inner_chunks), self.axis_map.permutation(stored), stored_dtype, None, rest
        )

    # --- stored chunks -------------------------------------------------------------------------

    def _source_coords(self, index: tuple[int, ...]) -> tuple[int, ...]:
        return self.axis_map.stored_index(index)

    def _chunk_name(self, coords: tuple[int, ...]) -> str:
        parts = [self.key_prefix] if self.key_prefix else []
        return self.separator.join([*parts, *map(str, coords)])

    def _key(self, coords: tuple[int, ...]) -> str:
        return self.storage.join(self.location, self._chunk_name(coords))

    def stored_chunk(self, index: tuple[int, ...], lo: Vec3) -> StoredChunk | None:
        """The stored bytes of served chunk ``index`` (an inner chunk of a shard); absent ones raise."""
        assert self.native is not None
        coords = self._source_coords(index)
        if any(c * n >= s for c, n, s in zip(coords, self._inner(), self.source_shape)):
            raise ChunkNotFound("the source holds no such chunk: it reads as the fill value")
        size = int(np.prod(self.native.chunk_shape)) * self.native.dtype.itemsize
        found = self._stored_bytes(coords)
        if found is None:
            raise ChunkNotFound("the source holds no such chunk: it reads as the fill value")
        data, origin, identity = found
        return StoredChunk(data, StoredEncoding.NATIVE, size, origin, identity)

    def _inner(self) -> tuple[int, ...]:
        return self.inner_chunks if self.sharding is not None else self.chunks

    def decoded_bytes(self, shape: Vec3) -> int:
        """Every (inner) chunk of the source that a grid-aligned box touches is decoded whole."""
        inner = self.axis_map.served_chunk(self._inner())
        return chunked_decoded_bytes(inner, self.dtype.itemsize, self.channels, shape)

    def _shard_index(self, path: str, identity: FileIdentity) -> np.ndarray:
        key = (path, identity)
        cached = self.index_cache.get(key)
        if cached is not None:
            return cached
        sharding = self.sharding
        assert sharding is not None
        size = sharding.index_size
        if identity.size < size:
            raise OSError(f"{path}: shard is smaller than its index")
        raw = self.storage.read(path, identity.size - size if sharding.index_at_end else 0, size, identity)
        table = decode_shard_index(raw, sharding.chunks, sharding.index_checksum, path)
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
        inner["chunk_grid"] = {"name": "regular", "configuration": {"chunk_shape": list(self.inner_chunks)}}
        inner["chunk_key_encoding"] = {"name": "default", "configuration": {"separator": "/"}}
        inner["codecs"] = sharding["codecs"]
        return "zarr.json", json.dumps(inner).encode()

    def _shard_of(self, coords: tuple[int, ...]) -> str:
        assert self.sharding is not None
        return self._key(tuple(c // n for c, n in zip(coords, self.sharding.chunks_per_shard)))

    def _stored_bytes(
        self, coords: tuple[int, ...], shards: dict[str, FileIdentity | None] | None = None
    ) -> tuple[bytes, str, FileIdentity] | None:
        """The stored bytes of (inner) chunk ``coords`` through the store, with their origin; None if absent.

        ``shards`` holds the identities of shards already looked up for the same read.
        """
        if self.sharding is None:
            path = self._key(coords)
            found = self.storage.read_whole(path)
            return None if found is None else (found[0], self.relative(path), found[1])
        cps = self.sharding.chunks_per_shard
        path = self._shard_of(coords)
        identity = shards[path] if shards is not None and path in shards else self.storage.identity(path)
        if identity is None:
            return None
        index_table = self._shard_index(path, identity)
        position = int(np.ravel_multi_index(tuple(c % n for c, n in zip(coords, cps)), cps))
        offset, nbytes = (int(v) for v in index_table[position])
        if is_absent(offset, nbytes):
            return None
        if offset + nbytes > identity.size:
            raise OSError(f"{self.relative(path)}: shard index points past the end of the shard")
        return self.storage.read(path, offset, nbytes, identity), f"{self.relative(path)}@{offset}", identity

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
        grid = self._inner()
        covered = list(itertools.product(*(range(a // g, -(-b // g)) for a, b, g in zip(lo, hi, grid))))
        shards = None
        if self.sharding is not None:  # each shard looked up once for the whole read, not once per inner chunk
            shards = {path: self.storage.identity(path) for path in dict.fromkeys(map(self._shard_of, covered))}
        stored = fetch_all(self.storage, functools.partial(self._stored_bytes, shards=shards), covered)
        data = self._decode(dict(zip(covered, stored)), lo, hi)
        data = self.axis_map.to_served(data)
        out[tuple(slice(0, n) for n in data.shape)] = data
        return out, None

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

    def holds_mag(self, directory: str) -> bool:
        store = self.store
        return store.is_directory(directory) or store.identity(store.join(directory, "zarr.json")) is not None

    def open_mag(self, mag: Vec3, directory: str, layer: DataLayer, axis_order: dict[str, int] | None) -> MagSource:
        return ZarrMagSource(mag, self.store, directory, layer.bounding_box, axis_order, self.index_cache)

    @property
    def caches(self) -> dict[str, CacheCounts]:
        return {"indexes": self.index_cache}
