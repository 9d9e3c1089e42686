"""An N5 mag of a layer (``dataFormat: n5``): its full blocks passed through, any region decoded by tensorstore.

An N5 dataset is a directory with an ``attributes.json`` (``dimensions``, ``blockSize``, ``dataType``,
``compression``) and one file per block at ``<i0>/<i1>/...`` in the order of ``dimensions``. A block is a
big-endian header (mode, rank, the block's own shape, in mode 1 also its element count) followed by
the block's voxels, big-endian and first dimension fastest, through the dataset's compression.

A default-mode block of the full ``blockSize`` is, once its header is stripped, exactly a Zarr chunk
whose metadata says: that chunk shape, a big-endian dtype, Fortran order over the N5 dimensions
(a transpose in v3), and the compression as a compressor (``raw``: none, ``gzip``: gzip, or zlib for
``useZlib``, ``zstd``: zstd, ``blosc``: blosc, whose chunks carry their own typesize and shuffle).
Any other block (cut short at the array's edge, in varlength mode, or at the bounding box) is read
as voxels and encoded in that same encoding.
"""

import itertools
import json
from typing import Any

import numpy as np

from gateway_storage import FileIdentity, FileSource, Store
from gateway_storage.cache import CacheCounts
from gateway_storage.geometry import Vec3

from .axes import AxisMap, axis_names
from .bounds import check_chunk_bytes, chunked_decoded_bytes, malformed_metadata, read_document, stored_limit
from .decoding import BLOSC_HEADER_BYTES, ChunkDecodeError, MemoryDecoder, blosc_length, fetch_all
from .formats import SourceFormat
from .mag import ChunkNotFound, MagSource, NativeEncoding, SourceError, StoredChunk, StoredEncoding
from .metadata import N5Attributes, parse_document
from .properties import BoundingBox, DataLayer

ATTRIBUTES = "attributes.json"  # every N5 dataset directory holds one
_DEFAULT_MODE = 0
_DEFAULT_GZIP_LEVEL = 6  # what zlib's -1 means; Zarr readers refuse a level outside 0-9 in metadata


def _compressor(compression: dict[str, Any]) -> tuple[bool, dict[str, Any] | None]:
    """(passes through, the Zarr v2 compressor) of an N5 ``compression``; other compressions are only decoded."""
    kind = compression["type"]
    level = compression.get("level", -1)
    level = level if isinstance(level, int) and 0 <= level <= 9 else _DEFAULT_GZIP_LEVEL
    if kind == "raw":
        return True, None
    if kind == "gzip":
        return True, {"id": "zlib" if compression.get("useZlib") is True else "gzip", "level": level}
    if kind == "zstd":
        zstd_level = compression.get("level")
        return True, {
            "id": "zstd",
            "level": zstd_level if isinstance(zstd_level, int) and -7 <= zstd_level <= 22 else 3,
        }
    if kind == "blosc":
        config = {key: compression.get(key) for key in ("cname", "clevel", "shuffle", "blocksize")}
        if not isinstance(config["cname"], str) or not all(
            isinstance(config[key], int) and not isinstance(config[key], bool)
            for key in ("clevel", "shuffle", "blocksize")
            if config[key] is not None
        ):
            raise SourceError(f"{ATTRIBUTES}: blosc compression {compression!r} is malformed")
        return True, {
            "id": "blosc",
            "cname": config["cname"],
            "clevel": config["clevel"] if config["clevel"] is not None else 5,
            "shuffle": config["shuffle"] if config["shuffle"] is not None else 1,
            "blocksize": config["blocksize"] or 0,
        }
    return False, None  # bzip2, xz...: tensorstore decodes them (or refuses the mag when it opens)


class N5MagSource(MagSource):
    """One mag of a layer stored as an N5 dataset, on a local disk or in object storage."""

    kind = "n5"

    def __init__(
        self,
        mag: Vec3,
        storage: Store,
        directory: str,
        bbox: BoundingBox,
        axis_order: dict[str, int] | None,
        through: Store | None = None,
    ) -> None:
        opening = self._locate(storage, directory, through)
        found = read_document(opening, opening.join(directory, ATTRIBUTES), ATTRIBUTES)
        if found is None:
            raise SourceError(f"no N5 dataset ({ATTRIBUTES}) at {self.location_key}")
        document = found[0]
        if "compression" not in document and isinstance(document.get("compressionType"), str):
            document = {**document, "compression": {"type": document["compressionType"]}}  # N5 before version 2
        attributes: N5Attributes = parse_document(N5Attributes, document, ATTRIBUTES)
        with malformed_metadata(ATTRIBUTES):
            self._open(mag, bbox, document, attributes, axis_order)

    def _open(
        self,
        mag: Vec3,
        bbox: BoundingBox,
        document: dict[str, Any],
        attributes: N5Attributes,
        axis_order: dict[str, int] | None,
    ) -> None:
        rank = len(attributes.dimensions)
        self.block_shape = attributes.block_size
        dtype = np.dtype(attributes.data_type)
        self._block_bytes = check_chunk_bytes(self.block_shape, dtype.itemsize, f"{ATTRIBUTES}: a block")
        names = None if attributes.axes is None else list(attributes.axes)
        self.axis_map = AxisMap(tuple(axis_names(names, rank, axis_order)), attributes.dimensions)
        super().__init__(mag, bbox, dtype, self.axis_map.channels)
        passes, compressor = _compressor(attributes.compression.model_dump())
        stored_order = list(range(rank))[::-1]  # first dimension fastest: C order of the reversed dimensions
        if passes:
            chunk = self.axis_map.served_chunk(self.block_shape)
            permutation = self.axis_map.permutation(stored_order)
            self.native = NativeEncoding(2, chunk, permutation, dtype.newbyteorder(">"), compressor)
        self._header_bytes = 4 + 4 * rank
        # a block file holds its header (mode 1 adds an element count) and at most an incompressible block
        self._stored_limit = stored_limit(self._block_bytes) + self._header_bytes + 4
        self._decoder = MemoryDecoder({"driver": "n5"}, {ATTRIBUTES: json.dumps(document).encode()}, self.location_key)
        self._decoder.check()

    def decoded_bytes(self, shape: Vec3) -> int:
        """Every block a grid-aligned box touches is decoded whole."""
        block = self.axis_map.served_chunk(self.block_shape)
        return chunked_decoded_bytes(block, self.dtype.itemsize, self.channels, shape)

    def _read_block(self, name: str) -> tuple[bytes, FileIdentity] | None:
        path = self.storage.join(self.location, name)
        return self.storage.read_whole(path, limit=self._stored_limit, settled=True)

    @property
    def reads_are_cheap(self) -> bool:
        return self.storage.is_local

    def _block_name(self, coords: tuple[int, ...]) -> str:
        return "/".join(map(str, coords))

    @property
    def stored_chunk_shape(self) -> tuple[int, int, int, int] | None:
        return None if self.native is None else self.native.chunk_shape

    def stored_chunk(self, index: tuple[int, ...], lo: Vec3) -> StoredChunk | None:
        """The payload of a full default-mode block; None for any other block (it is read as voxels)."""
        if self.native is None:
            return None  # a compression Zarr cannot name: every block is decoded
        coords = self.axis_map.stored_index(index)
        shape = self.axis_map.shape
        if any(c * b >= s for c, b, s in zip(coords, self.block_shape, shape)):
            raise ChunkNotFound("the source holds no such block: it reads as the fill value")
        if any((c + 1) * b > s for c, b, s in zip(coords, self.block_shape, shape)):
            return None  # a block at the array's edge is cut short in N5 and whole in Zarr
        path = self.storage.join(self.location, self._block_name(coords))
        found = self._read_block(self._block_name(coords))
        if found is None:
            raise self.absent("block")
        data, identity = found
        header = self._header_bytes
        if len(data) < header:
            raise ChunkDecodeError(f"{self.relative(path)}: the N5 block is shorter than its header")
        mode, rank = int.from_bytes(data[0:2], "big"), int.from_bytes(data[2:4], "big")
        dims = tuple(int.from_bytes(data[4 + 4 * d : 8 + 4 * d], "big") for d in range(len(self.block_shape)))
        if mode != _DEFAULT_MODE or rank != len(self.block_shape) or dims != self.block_shape:
            return None  # tensorstore reads (or refuses) it
        payload = data[header:]
        self._check_size(payload, path)
        return StoredChunk(payload, StoredEncoding.NATIVE, self._block_bytes, self.relative(path), identity, path)

    def _check_size(self, payload: bytes, path: str) -> None:
        """Refuse a payload whose length cannot be right: a raw block must hold every voxel, a Blosc one says how
        long it is, a gzip one ends with its size. A cut-short block is a fault, never sent as if whole."""
        assert self.native is not None
        compressor = self.native.v2_compressor
        if compressor is None:
            expected = self._block_bytes
        elif compressor["id"] == "blosc":
            length = blosc_length(payload)
            if length is not None and int.from_bytes(payload[4:8], "little") != self._block_bytes:
                raise ChunkDecodeError(f"{self.relative(path)}: the Blosc block does not hold a whole block")
            expected = BLOSC_HEADER_BYTES if length is None else length
        elif compressor["id"] == "gzip":  # a gzip member ends with the size it holds (modulo 2^32)
            if payload[:2] != b"\x1f\x8b" or int.from_bytes(payload[-4:], "little") != self._block_bytes % 2**32:
                raise ChunkDecodeError(f"{self.relative(path)}: the gzip block is cut short or not gzip")
            return
        else:
            return
        if len(payload) != expected:
            raise ChunkDecodeError(
                f"{self.relative(path)}: the N5 block holds {len(payload)} bytes after its header, expected {expected}"
            )

    def read_inside(self, offset: Vec3, shape: Vec3) -> tuple[np.ndarray, list[FileSource] | None]:
        """Voxels of a box: the blocks it covers read through the store, decoded by tensorstore from memory."""
        out = np.full((self.channels, *shape), self.fill_value, dtype=self.dtype, order="F")
        lo, hi = self.axis_map.stored_box(offset, shape)
        if any(h <= low for low, h in zip(lo, hi)):
            return out, None
        ranges = (range(a // b, -(-z // b)) for a, z, b in zip(lo, hi, self.block_shape))
        names = [self._block_name(coords) for coords in itertools.product(*ranges)]
        found = fetch_all(self.storage, self._read_block, names)
        chunks = {name: block[0] for name, block in zip(names, found) if block is not None}
        data = self.axis_map.to_served(self._decoder.decode(chunks, tuple(slice(a, b) for a, b in zip(lo, hi))))
        out[tuple(slice(0, n) for n in data.shape)] = data
        return out, None

    def files_inside(self, offset: Vec3, shape: Vec3) -> list[str]:
        """The block files :meth:`read_inside` reads."""
        lo, hi = self.axis_map.stored_box(offset, shape)
        if any(h <= low for low, h in zip(lo, hi)):
            return []
        ranges = (range(a // b, -(-z // b)) for a, z, b in zip(lo, hi, self.block_shape))
        return [self.storage.join(self.location, self._block_name(coords)) for coords in itertools.product(*ranges)]


class N5Format(SourceFormat):
    """``dataFormat: n5``: a mag is an N5 dataset directory (it holds an ``attributes.json``); no caches."""

    data_formats = ("n5",)
    cache_weight = 0

    def holds_mag(self, directory: str, through: Store | None = None) -> bool:
        return self._holds_file(directory, ATTRIBUTES, through)

    def open_mag(
        self,
        mag: Vec3,
        directory: str,
        layer: DataLayer,
        axis_order: dict[str, int] | None,
        through: Store | None = None,
    ) -> MagSource:
        return N5MagSource(mag, self.store, directory, layer.bounding_box, axis_order, through)

    @property
    def caches(self) -> dict[str, CacheCounts]:
        return {}
