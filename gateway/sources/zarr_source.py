"""A Zarr (v2 or v3) mag of a layer: its own chunks as stored, and any region through tensorstore."""

import functools
import itertools
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway_storage import ByteLRU, FileIdentity, FileSource, Store
from gateway_storage.cache import CacheCounts
from gateway_storage.geometry import Vec3

from .formats import SourceFormat
from .mag import ChunkNotFound, MagSource, NativeEncoding, StoredChunk, StoredEncoding
from .properties import BoundingBox, DataLayer
from .shard_index import decode_shard_index, index_nbytes, is_absent

SERVED_AXES = ("c", "x", "y", "z")
_FETCHES = ThreadPoolExecutor(8, thread_name_prefix="chunk-fetch")  # chunk reads from object storage, in parallel
_SUPPORTED_V2_COMPRESSORS = {"blosc", "zlib", "gzip", "zstd", "bz2"}
_SUPPORTED_V3_CODECS = {"transpose", "bytes", "blosc", "gzip", "zstd", "crc32c", "sharding_indexed"}


class SourceError(ValueError):
    """A Zarr array the gateway cannot serve; the message is the reason shown to users."""


@dataclass(frozen=True, slots=True)
class _Sharding:
    chunks_per_shard: tuple[int, ...]  # source dims
    index_at_end: bool
    index_checksum: bool

    @property
    def chunks(self) -> int:
        return int(np.prod(self.chunks_per_shard))

    @property
    def index_size(self) -> int:
        return index_nbytes(self.chunks, self.index_checksum)


def _separator(value: object, default: str) -> str:
    """A chunk key separator (``default`` where none is given): the specs allow ``.`` and ``/`` only."""
    if value is None:
        return default
    if value not in (".", "/"):
        raise SourceError(f"chunk key separator {value!r} is neither '.' nor '/'")
    return str(value)


def _axes(document: dict[str, Any], rank: int, axis_order: dict[str, int] | None) -> list[str]:
    names = document.get("dimension_names")
    if names and all(isinstance(n, str) for n in names):
        axes = [n.lower() for n in names]
    elif axis_order:
        axes = [""] * rank
        for name, position in axis_order.items():
            if 0 <= position < rank:
                axes[position] = name.lower()
    elif rank in (3, 4):
        axes = list(SERVED_AXES[4 - rank :])
    else:
        raise SourceError(f"a {rank}-dimensional array without axis names cannot be mapped to c, x, y, z")
    if sorted(a for a in axes if a != "c") != ["x", "y", "z"] or len(axes) != rank or axes.count("c") > 1:
        raise SourceError(f"axes {axes} cannot be mapped to c, x, y, z (need x, y, z and at most one c)")
    return axes


def _v3_codec_chain(codecs: list[dict[str, Any]]) -> tuple[list[int] | None, str, tuple[dict[str, Any], ...]]:
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
            order = list(config["order"])
        elif name == "bytes":
            seen_bytes = True
            endian = config.get("endian", "little")
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
        self.source_shape = tuple(int(s) for s in document["shape"])
        rank = len(self.source_shape)
        self.axes = _axes(document, rank, axis_order)
        # served axis of each source dimension
        self.served_axis = [SERVED_AXES.index(a) for a in self.axes]
        channels = self.source_shape[self.axes.index("c")] if "c" in self.axes else 1
        dtype, fill_value = self._dtype_and_fill(document)
        super().__init__(mag, bbox, dtype, channels, fill_value)
        self.sharding: _Sharding | None = None
        self.native = self._native_encoding(document, dtype)
        self._metadata_file = self._decoding_metadata(document)
        self._decoders = threading.local()

    def _read_metadata(self, directory: str) -> tuple[dict[str, Any], int, str]:
        for name, version in (("zarr.json", 3), (".zarray", 2)):
            found = self.storage.read_whole(self.storage.join(directory, name))
            if found is not None:
                try:
                    document = json.loads(found[0])
                except ValueError as exc:
                    raise SourceError(f"{name} is not JSON: {exc}") from None
                if version == 3 and document.get("node_type") != "array":
                    raise SourceError("zarr.json does not describe an array")
                return document, version, found[1].version
        raise SourceError(f"no Zarr array (.zarray or zarr.json) at {directory}")

    def _dtype_and_fill(self, document: dict[str, Any]) -> tuple[np.dtype, float]:
        try:
            dtype = np.dtype(document["dtype"] if self.zarr_format == 2 else document["data_type"])
        except (KeyError, TypeError) as exc:
            raise SourceError(f"unsupported data type: {exc}") from None
        if dtype.kind not in "uif" or dtype.itemsize > 8:
            raise SourceError(f"unsupported data type {dtype}")
        fill = document.get("fill_value") or 0
        if not isinstance(fill, int | float):
            raise SourceError(f"unsupported fill value {fill!r}")
        return dtype, fill

    def _permutation(self, stored_order: list[int]) -> tuple[int, ...]:
        """Served-axis permutation whose C order is the stored byte order."""
        order = [self.served_axis[d] for d in stored_order]
        if "c" not in self.axes:
            order = [0, *order]  # a channel axis of length 1 may sit anywhere
        return tuple(order)

    def _native_encoding(self, document: dict[str, Any], dtype: np.dtype) -> NativeEncoding | None:
        rank = len(self.source_shape)
        if self.zarr_format == 2:
            if document.get("filters"):
                raise SourceError("Zarr v2 filters are not supported")
            compressor = document.get("compressor")
            if compressor is not None and compressor.get("id") not in _SUPPORTED_V2_COMPRESSORS:
                raise SourceError(f"compressor {compressor.get('id')!r} is not supported (tensorstore cannot read it)")
            self.chunks = tuple(int(c) for c in document["chunks"])
            self.separator = _separator(document.get("dimension_separator"), ".")
            self.key_prefix = ""
            stored = list(range(rank)) if document.get("order", "C") == "C" else list(range(rank))[::-1]
            return NativeEncoding(2, self._served_chunk(self.chunks), self._permutation(stored), dtype, compressor)
        grid = document.get("chunk_grid", {})
        if grid.get("name") != "regular":
            raise SourceError(f"chunk grid {grid.get('name')!r} is not regular")
        self.chunks = tuple(int(c) for c in grid["configuration"]["chunk_shape"])
        encoding = document.get("chunk_key_encoding", {"name": "default"})
        config = encoding.get("configuration") or {}
        if encoding.get("name") == "default":
            self.separator, self.key_prefix = _separator(config.get("separator"), "/"), "c"
        elif encoding.get("name") == "v2":
            self.separator, self.key_prefix = _separator(config.get("separator"), "."), ""
        else:
            raise SourceError(f"chunk key encoding {encoding.get('name')!r} is not supported")
        codecs = document.get("codecs") or []
        inner_chunks = self.chunks
        if codecs and codecs[0].get("name") == "sharding_indexed":
            if len(codecs) != 1:
                raise SourceError("codecs after sharding_indexed are not supported")
            sharding = codecs[0]["configuration"]
            inner_chunks = tuple(int(c) for c in sharding["chunk_shape"])
            index_codecs = [c.get("name") for c in sharding.get("index_codecs", [])]
            if index_codecs not in (["bytes"], ["bytes", "crc32c"]):
                raise SourceError(f"shard index codecs {index_codecs} are not supported")
            if any(s % c for s, c in zip(self.chunks, inner_chunks)):
                raise SourceError("the shard shape is not a multiple of the inner chunk shape")
            self.sharding = _Sharding(
                tuple(s // c for s, c in zip(self.chunks, inner_chunks)),
                sharding.get("index_location", "end") == "end",
                "crc32c" in index_codecs,
            )
            codecs = sharding["codecs"]
        order, endian, rest = _v3_codec_chain(codecs)
        self.inner_chunks = inner_chunks
        stored_dtype = dtype.newbyteorder("<" if endian == "little" else ">")
        stored = order if order is not None else list(range(rank))
        return NativeEncoding(3, self._served_chunk(inner_chunks), self._permutation(stored), stored_dtype, None, rest)

    def _served_chunk(self, chunks: tuple[int, ...]) -> tuple[int, int, int, int]:
        served = [1, 1, 1, 1]
        for d, size in enumerate(chunks):
            served[self.served_axis[d]] = size
        c, x, y, z = served
        return (c, x, y, z)

    # --- stored chunks -------------------------------------------------------------------------

    def _source_coords(self, index: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(index[self.served_axis[d]] for d in range(len(self.source_shape)))

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
        served_lo = (0, *offset)
        served_hi = (self.channels, *(o + s for o, s in zip(offset, shape)))
        lo = [served_lo[a] for a in self.served_axis]
        hi = [min(served_hi[a], n) for a, n in zip(self.served_axis, self.source_shape)]
        if any(h <= low for low, h in zip(lo, hi)):
            return out, None
        grid = self._inner()
        covered = list(itertools.product(*(range(a // g, -(-b // g)) for a, b, g in zip(lo, hi, grid))))
        shards = None
        if self.sharding is not None:  # each shard looked up once for the whole read, not once per inner chunk
            shards = {path: self.storage.identity(path) for path in dict.fromkeys(map(self._shard_of, covered))}
        if self.storage.is_local or len(covered) == 1:
            stored = [self._stored_bytes(coords, shards) for coords in covered]
        else:  # object storage: one request per chunk, so several at a time
            stored = list(_FETCHES.map(functools.partial(self._stored_bytes, shards=shards), covered))
        try:
            data = self._decode(dict(zip(covered, stored)), lo, hi)
        except ValueError as exc:
            raise ChunkDecodeError(f"{self.location_key}: {exc}") from None
        order = sorted(range(len(self.axes)), key=lambda d: self.served_axis[d])
        data = np.transpose(data, order)
        if "c" not in self.axes:
            data = data[None]
        out[tuple(slice(0, n) for n in data.shape)] = data
        return out, None

    def _decode(
        self, stored: dict[tuple[int, ...], tuple[bytes, str, FileIdentity] | None], lo: list[int], hi: list[int]
    ) -> np.ndarray:
        memory, array = self._decoder()
        keys = [self._decoding_key(coords) for coords, found in stored.items() if found is not None]
        try:
            for key, found in zip(keys, (f for f in stored.values() if f is not None)):
                memory[key] = found[0]
            window = array[tuple(slice(a, b) for a, b in zip(lo, hi))]
            voxels: np.ndarray = window.read(order="F").result()
            return voxels  # Fortran order, as ``out`` is: the copy into it is cheaper
        finally:
            for key in keys:  # the store holds exactly the chunks of one read: absent ones read as the fill value
                del memory[key]

    def _decoder(self) -> tuple[Any, Any]:
        """This thread's in-memory store and the array tensorstore decodes from it (opened once: 0.1 ms).

        One per thread, so each read sees only its own chunks; the context keeps no chunk cache, so
        nothing of an earlier read is ever decoded again.
        """
        found: tuple[Any, Any] | None = getattr(self._decoders, "opened", None)
        if found is None:
            import tensorstore as ts

            context = ts.Context()
            memory = ts.KvStore.open({"driver": "memory"}, context=context).result()
            name, metadata = self._metadata_file
            memory[name] = metadata
            driver = "zarr3" if self.zarr_format == 3 else "zarr"
            array = ts.open({"driver": driver, "kvstore": {"driver": "memory"}}, context=context, read=True).result()
            found = self._decoders.opened = (memory, array)
        return found


class ChunkDecodeError(OSError):
    """Stored chunks that tensorstore cannot decode: the bytes are wrong (a storage fault, never absent data).

    Tensorstore only decodes here, from memory: store faults were raised by the store before it ran.
    """


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
