"""Neuroglancer precomputed's sharded format (``neuroglancer_uint64_sharded_v1``): uint64 keys (a volume's chunk
ids, a mesh set's segment ids) to byte strings, packed into ``2**shard_bits`` shard files, from its format
document. Precomputed volumes and stored mesh sets are read through it (the reads themselves, through a store,
are the precomputed source's: ``read_minishard_index``), and mesh sets are written with it.

A shard file begins with its shard index (per minishard: start and end of its minishard index, relative to the
index's end); each minishard's chunks follow, by key, then its index, a ``[3, n]`` uint64 array of delta-coded
keys, delta-coded starts (each relative to the end of the chunk before) and sizes. The multi-resolution mesh
format stores each segment's fragment data just before its manifest, the chunk the index points to: a
:class:`ShardChunk` carries such a prefix.
"""

import math
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway_storage.faults import Broken

SHARDED_TYPE = "neuroglancer_uint64_sharded_v1"
SHARD_INDEX_ENTRY_BYTES = 16  # per minishard: start and end of its index, uint64 little-endian
MINISHARD_ENTRY_BYTES = 24  # per key: key, start and size, each a delta-coded uint64 little-endian
_UINT64 = np.dtype("<u8")
# Chosen as igneous chooses them for hashed keys: a shard index of 8 KiB (512 minishards) and minishard indexes
# of about 32 KiB (1365 keys of 24 bytes); a layer of fewer keys has fewer minishards and one shard.
TARGET_MINISHARD_BITS = 9
TARGET_KEYS_PER_MINISHARD = (1 << 15) // MINISHARD_ENTRY_BYTES
GZIP_LEVEL = 6


class ShardError(Broken, OSError):
    """A shard whose index cannot be right: a storage fault, answered 5xx."""


def compressed_morton_code(position: tuple[int, ...], grid_shape: tuple[int, ...]) -> int:
    """A chunk's id in a sharded volume: the bits of its grid position interleaved (x first), each dimension
    contributing only as many bits as its grid needs."""
    bits = [max(0, (g - 1).bit_length()) for g in grid_shape]
    code, out_bit = 0, 0
    for bit in range(max(bits, default=0)):
        for d, p in enumerate(position):
            if bit < bits[d]:
                code |= ((p >> bit) & 1) << out_bit
                out_bit += 1
    return code


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF


def _fmix32(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def murmurhash3_x86_128_low64(key: int) -> int:
    """The low 64 bits of MurmurHash3_x86_128 (seed 0) of ``key`` as 8 little-endian bytes: the sharded
    format's ``murmurhash3_x86_128`` hash. Eight bytes are all tail: two 32-bit lanes, no full block."""
    c1, c2, c3 = 0x239B961B, 0xAB0E9789, 0x38B34AE5
    k1, k2 = key & 0xFFFFFFFF, (key >> 32) & 0xFFFFFFFF
    k2 = (_rotl32((k2 * c2) & 0xFFFFFFFF, 16) * c3) & 0xFFFFFFFF
    h2 = k2
    k1 = (_rotl32((k1 * c1) & 0xFFFFFFFF, 15) * c2) & 0xFFFFFFFF
    h1 = k1
    h1, h2, h3, h4 = h1 ^ 8, h2 ^ 8, 8, 8
    h1 = (h1 + h2 + h3 + h4) & 0xFFFFFFFF
    h2, h3, h4 = (h2 + h1) & 0xFFFFFFFF, (h3 + h1) & 0xFFFFFFFF, (h4 + h1) & 0xFFFFFFFF
    h1, h2, h3, h4 = _fmix32(h1), _fmix32(h2), _fmix32(h3), _fmix32(h4)
    h1 = (h1 + h2 + h3 + h4) & 0xFFFFFFFF
    h2 = (h2 + h1) & 0xFFFFFFFF
    return h1 | (h2 << 32)


@dataclass(frozen=True, slots=True)
class Sharding:
    """A ``neuroglancer_uint64_sharded_v1`` sharding: which shard and minishard hold a key, and where their
    indexes lie."""

    preshift_bits: int
    hash: str
    minishard_bits: int
    shard_bits: int
    minishard_index_gzip: bool
    data_gzip: bool

    def locate(self, chunk_id: int) -> tuple[int, int]:
        """(shard, minishard) of a chunk id."""
        shifted = chunk_id >> self.preshift_bits
        hashed = shifted if self.hash == "identity" else murmurhash3_x86_128_low64(shifted)
        minishard = hashed & ((1 << self.minishard_bits) - 1)
        shard = (hashed >> self.minishard_bits) & ((1 << self.shard_bits) - 1)
        return shard, minishard

    def shard_name(self, shard: int) -> str:
        return f"{shard:0{-(-self.shard_bits // 4)}x}.shard"

    @property
    def index_bytes(self) -> int:
        """The shard index's size: where a shard's data (and every offset of its indexes) starts."""
        return SHARD_INDEX_ENTRY_BYTES << self.minishard_bits

    def entry_offset(self, minishard: int, shard_size: int, where: str) -> int:
        """Where the shard index entry of ``minishard`` lies in a shard of ``shard_size`` bytes."""
        if shard_size < self.index_bytes:
            raise ShardError(f"{where}: the shard is shorter than its index")
        return SHARD_INDEX_ENTRY_BYTES * minishard

    def minishard_span(self, entry: bytes, minishard: int, shard_size: int, where: str) -> tuple[int, int] | None:
        """``(offset, nbytes)`` in the shard of the minishard index that ``entry`` (its shard index entry) points
        to; None for an empty minishard."""
        start, end = (int(v) for v in np.frombuffer(entry, dtype=_UINT64))
        if end < start:
            raise ShardError(f"{where}: minishard {minishard} ends before it starts")
        if end == start:
            return None
        if self.index_bytes + end > shard_size:
            raise ShardError(f"{where}: minishard {minishard} ends past the end of the shard")
        return self.index_bytes + start, end - start

    def decode_minishard_index(
        self, raw: bytes, minishard: int, shard_size: int, where: str
    ) -> dict[int, tuple[int, int]]:
        """Key to ``(offset in the shard, size)`` of a minishard index (decompressed), every chunk checked to lie
        within the shard."""
        if len(raw) % MINISHARD_ENTRY_BYTES:
            raise ShardError(
                f"{where}: minishard index {minishard} has {len(raw)} bytes, not a multiple of {MINISHARD_ENTRY_BYTES}"
            )
        columns = np.frombuffer(raw, dtype=_UINT64).reshape(3, -1).astype(object)  # Python ints: no overflow
        ids = np.cumsum(columns[0])
        sizes = columns[2]
        starts = np.cumsum(columns[1] + np.concatenate([[0], sizes[:-1]]))
        table: dict[int, tuple[int, int]] = {}
        for chunk_id, chunk_start, size in zip(ids, starts, sizes):
            offset = self.index_bytes + int(chunk_start)
            if offset + int(size) > shard_size:
                raise ShardError(f"{where}: minishard {minishard} points past the end of the shard")
            table[int(chunk_id)] = (offset, int(size))
        return table


def sharding_for(count: int, total_bytes: int = 0, shard_bytes: int = 1 << 62) -> Sharding:
    """Hashed keys spread over as few shards as keep each minishard index near its target size and each shard
    near ``shard_bytes`` of ``total_bytes`` (the keys are hashed, so shards fill evenly); minishard indexes
    gzipped, values raw (as igneous writes mesh sets)."""
    minishards = max(1, math.ceil(count / TARGET_KEYS_PER_MINISHARD))
    minishard_bits = min(TARGET_MINISHARD_BITS, max(0, math.ceil(math.log2(minishards))))
    shards = max(1, math.ceil(minishards / (1 << minishard_bits)), math.ceil(total_bytes / shard_bytes))
    return Sharding(0, "murmurhash3_x86_128", minishard_bits, max(0, math.ceil(math.log2(shards))), True, False)


def sharding_document(sharding: Sharding) -> dict[str, Any]:
    """The ``sharding`` member of an ``info``."""
    return {
        "@type": SHARDED_TYPE,
        "preshift_bits": sharding.preshift_bits,
        "hash": sharding.hash,
        "minishard_bits": sharding.minishard_bits,
        "shard_bits": sharding.shard_bits,
        "minishard_index_encoding": "gzip" if sharding.minishard_index_gzip else "raw",
        "data_encoding": "gzip" if sharding.data_gzip else "raw",
    }


@dataclass(frozen=True, slots=True)
class ShardChunk:
    """One key's value, and bytes stored just before it that the index does not point to (mesh fragment data)."""

    key: int
    value: bytes
    prefix: bytes = b""


def _encoded(data: bytes, gzip: bool) -> bytes:
    return zlib.compress(data, GZIP_LEVEL, wbits=31) if gzip else data


def encode_shard(sharding: Sharding, chunks: Iterable[ShardChunk]) -> bytes:
    """One shard file of ``chunks`` (all of this shard): per minishard, its chunks by key, then its index."""
    by_minishard: dict[int, list[ShardChunk]] = {}
    for chunk in chunks:
        by_minishard.setdefault(sharding.locate(chunk.key)[1], []).append(chunk)
    entries = np.zeros((1 << sharding.minishard_bits, 2), dtype=_UINT64)
    body: list[bytes] = []
    at = 0  # relative to the end of the shard index
    for minishard in sorted(by_minishard):
        keys, starts, sizes = [], [], []
        previous_key, previous_end = 0, 0
        for chunk in sorted(by_minishard[minishard], key=lambda c: c.key):
            value = _encoded(chunk.value, sharding.data_gzip)
            body += [chunk.prefix, value]
            at += len(chunk.prefix)
            keys.append(chunk.key - previous_key)
            starts.append(at - previous_end)
            sizes.append(len(value))
            previous_key, at = chunk.key, at + len(value)
            previous_end = at
        index = _encoded(np.asarray([keys, starts, sizes], dtype=_UINT64).tobytes(), sharding.minishard_index_gzip)
        entries[minishard] = (at, at + len(index))
        body.append(index)
        at += len(index)
    return entries.tobytes() + b"".join(body)
