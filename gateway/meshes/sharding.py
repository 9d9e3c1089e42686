"""Neuroglancer's sharded key-value format (``neuroglancer_uint64_sharded_v1``): uint64 keys to byte strings,
packed into ``2**shard_bits`` shard files, written and read from its format document.

A key is hashed (``identity`` or MurmurHash3 x86 128 of the key's 8 little-endian bytes, low 64 bits) after
``preshift_bits``; the hash's low ``minishard_bits`` pick the minishard, the next ``shard_bits`` the shard. A
shard file begins with its shard index (per minishard: start and end of its minishard index, relative to the
index's end), and a minishard index is a ``[3, n]`` uint64 array of delta-coded keys, delta-coded starts (each
relative to the end of the chunk before) and sizes. The multi-resolution mesh format stores each segment's
fragment data just before its manifest, the chunk the index points to; :func:`encode_shard` takes such a
prefix per chunk.

Everything read here may be crafted: every offset and size is checked against the file and against a bound
before anything is allocated for it (:class:`ShardFormatError`, a storage fault).
"""

import math
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

SHARDED_TYPE = "neuroglancer_uint64_sharded_v1"
HASHES = ("identity", "murmurhash3_x86_128")
ENCODINGS = ("raw", "gzip")
INDEX_ENTRY_BYTES = 16  # per minishard: start and end of its minishard index, uint64le each
# Chosen as igneous chooses them for hashed keys: a shard index of 8 KiB (512 minishards) and minishard indexes
# of about 32 KiB (1365 keys of 24 bytes); a layer of fewer keys has fewer minishards and one shard.
TARGET_MINISHARD_BITS = 9
TARGET_KEYS_PER_MINISHARD = (1 << 15) // 24
GZIP_LEVEL = 6

Hash = Literal["identity", "murmurhash3_x86_128"]
Encoding = Literal["raw", "gzip"]


class ShardFormatError(OSError):
    """A sharding specification or a shard file that is not one of the format: a storage fault, never a miss."""


@dataclass(frozen=True, slots=True)
class ShardingSpec:
    """The ``sharding`` member of an ``info``."""

    preshift_bits: int
    hash: Hash
    minishard_bits: int
    shard_bits: int
    minishard_index_encoding: Encoding = "gzip"
    data_encoding: Encoding = "raw"

    @classmethod
    def for_keys(cls, count: int, total_bytes: int = 0, shard_bytes: int = 1 << 62) -> "ShardingSpec":
        """Hashed keys spread over as few shards as keep each minishard index near its target size and each shard
        near ``shard_bytes`` of ``total_bytes`` (the keys are hashed, so shards fill evenly)."""
        minishards = max(1, math.ceil(count / TARGET_KEYS_PER_MINISHARD))
        minishard_bits = min(TARGET_MINISHARD_BITS, max(0, math.ceil(math.log2(minishards))))
        shards = max(1, math.ceil(minishards / (1 << minishard_bits)), math.ceil(total_bytes / shard_bytes))
        return cls(0, "murmurhash3_x86_128", minishard_bits, max(0, math.ceil(math.log2(shards))))

    @classmethod
    def from_json(cls, document: Any) -> "ShardingSpec":
        """A specification read from an ``info``, every member checked."""
        if not isinstance(document, dict) or document.get("@type") != SHARDED_TYPE:
            raise ShardFormatError(f"the sharding specification is not a {SHARDED_TYPE} object")
        bits: dict[str, int] = {}
        for name in ("preshift_bits", "minishard_bits", "shard_bits"):
            value = document.get(name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 64:
                raise ShardFormatError(f"sharding {name} is {value!r}, not an integer from 0 to 64")
            bits[name] = value
        if bits["minishard_bits"] + bits["shard_bits"] > 64:
            raise ShardFormatError("sharding minishard_bits and shard_bits take more than the 64 bits of a key")
        hashed = document.get("hash")
        encodings = [document.get(name, "raw") for name in ("minishard_index_encoding", "data_encoding")]
        if hashed not in HASHES or any(e not in ENCODINGS for e in encodings):
            raise ShardFormatError(f"sharding hash {hashed!r} or encodings {encodings} are not of the format")
        return cls(
            bits["preshift_bits"], hashed, bits["minishard_bits"], bits["shard_bits"], encodings[0], encodings[1]
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "@type": SHARDED_TYPE,
            "preshift_bits": self.preshift_bits,
            "hash": self.hash,
            "minishard_bits": self.minishard_bits,
            "shard_bits": self.shard_bits,
            "minishard_index_encoding": self.minishard_index_encoding,
            "data_encoding": self.data_encoding,
        }

    @property
    def shard_count(self) -> int:
        return 1 << self.shard_bits

    @property
    def index_bytes(self) -> int:
        """The shard index's length, where the offsets of a shard file start."""
        return INDEX_ENTRY_BYTES << self.minishard_bits

    def shard_name(self, shard: int) -> str:
        """``<shard>.shard``: lowercase hex, zero padded to ``ceil(shard_bits / 4)`` digits."""
        return f"{shard:0{math.ceil(self.shard_bits / 4)}x}.shard"

    def hashed(self, keys: np.ndarray) -> np.ndarray:
        shifted: np.ndarray = keys.astype(np.uint64) >> np.uint64(self.preshift_bits)
        return shifted if self.hash == "identity" else murmurhash3_x86_128_low64(shifted)

    def locate(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The shard and the minishard of each key."""
        hashed = self.hashed(keys)
        minishard = hashed & np.uint64((1 << self.minishard_bits) - 1)
        shard = (hashed >> np.uint64(self.minishard_bits)) & np.uint64((1 << self.shard_bits) - 1)
        return shard.astype(np.int64), minishard.astype(np.int64)

    def locate_one(self, key: int) -> tuple[int, int]:
        shard, minishard = self.locate(np.asarray([key], dtype=np.uint64))
        return int(shard[0]), int(minishard[0])


_M32 = np.uint64(0xFFFFFFFF)


def _mul(a: np.ndarray, b: int) -> np.ndarray:
    return (a * np.uint64(b)) & _M32


def _rotl(value: np.ndarray, bits: int) -> np.ndarray:
    return ((value << np.uint64(bits)) | (value >> np.uint64(32 - bits))) & _M32


def _fmix(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(16))
    h = _mul(h, 0x85EBCA6B)
    h = h ^ (h >> np.uint64(13))
    h = _mul(h, 0xC2B2AE35)
    mixed: np.ndarray = h ^ (h >> np.uint64(16))
    return mixed


def murmurhash3_x86_128_low64(keys: np.ndarray) -> np.ndarray:
    """MurmurHash3 x86 128 (seed 0) of each key's 8 little-endian bytes: the low 8 bytes of the digest.

    Eight bytes are shorter than one 16-byte block, so only the tail rounds and the finalization run: the low
    word is mixed into ``h1``, the high word into ``h2``. Arithmetic is on 32-bit words held in uint64.
    """
    keys = keys.astype(np.uint64)
    k1 = keys & _M32
    k2 = keys >> np.uint64(32)
    zero = np.zeros_like(keys)
    h2 = zero ^ _mul(_rotl(_mul(k2, 0xAB0E9789), 16), 0x38B34AE5)
    h1 = zero ^ _mul(_rotl(_mul(k1, 0x239B961B), 15), 0xAB0E9789)
    length = np.uint64(8)
    h1, h2, h3, h4 = h1 ^ length, h2 ^ length, zero ^ length, zero ^ length
    h1 = (h1 + h2 + h3 + h4) & _M32
    h2, h3, h4 = (h2 + h1) & _M32, (h3 + h1) & _M32, (h4 + h1) & _M32
    h1, h2, h3, h4 = _fmix(h1), _fmix(h2), _fmix(h3), _fmix(h4)
    h1 = (h1 + h2 + h3 + h4) & _M32
    h2 = (h2 + h1) & _M32
    result: np.ndarray = h1 | (h2 << np.uint64(32))
    return result


# --- writing ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShardChunk:
    """One key's value, and bytes stored just before it that the index does not point to (mesh fragment data)."""

    key: int
    value: bytes
    prefix: bytes = b""


def _encoded(data: bytes, encoding: Encoding) -> bytes:
    return zlib.compress(data, GZIP_LEVEL, wbits=31) if encoding == "gzip" else data


def encode_shard(spec: ShardingSpec, chunks: Iterable[ShardChunk]) -> bytes:
    """One shard file of ``chunks`` (all of this shard): per minishard, its chunks by key, then its index."""
    by_minishard: dict[int, list[ShardChunk]] = {}
    for chunk in chunks:
        by_minishard.setdefault(spec.locate_one(chunk.key)[1], []).append(chunk)
    entries = np.zeros((1 << spec.minishard_bits, 2), dtype="<u8")
    body: list[bytes] = []
    at = 0  # relative to the end of the shard index
    for minishard in sorted(by_minishard):
        members = sorted(by_minishard[minishard], key=lambda c: c.key)
        keys, starts, sizes = [], [], []
        previous_key, previous_end = 0, 0
        for chunk in members:
            value = _encoded(chunk.value, spec.data_encoding)
            body += [chunk.prefix, value]
            at += len(chunk.prefix)
            keys.append(chunk.key - previous_key)
            starts.append(at - previous_end)
            sizes.append(len(value))
            previous_key, at = chunk.key, at + len(value)
            previous_end = at
        index = _encoded(np.asarray([keys, starts, sizes], dtype="<u8").tobytes(), spec.minishard_index_encoding)
        entries[minishard] = (at, at + len(index))
        body.append(index)
        at += len(index)
    return entries.tobytes() + b"".join(body)


# --- reading ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChunkPlace:
    """Where a key's value lies in its shard file: ``[start, start + size)``, absolute."""

    start: int
    size: int


def minishard_index_range(spec: ShardingSpec, entry: bytes, file_size: int, limit: int) -> tuple[int, int] | None:
    """The absolute byte range of a minishard index from its 16-byte shard index entry; None for an empty one."""
    start, end = (int(v) for v in np.frombuffer(entry, dtype="<u8", count=2))
    if start == end:
        return None
    first, last = spec.index_bytes + start, spec.index_bytes + end
    if end < start or last > file_size:
        raise ShardFormatError(f"the shard index points past the file ({first}..{last} of {file_size} bytes)")
    if end - start > limit:
        raise ShardFormatError(f"a minishard index of {end - start} bytes, more than the {limit} a shard may hold")
    return first, last


def decode(data: bytes, encoding: Encoding, limit: int, what: str) -> bytes:
    """``data`` decoded, refused once it would decode to more than ``limit`` bytes (a gzip bomb is stopped early)."""
    if encoding == "raw":
        return data
    inflater = zlib.decompressobj(wbits=47)  # gzip or zlib headers, as readers of the format accept
    try:
        decoded = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise ShardFormatError(f"{what} is not gzip data: {exc}") from None
    if len(decoded) > limit:
        raise ShardFormatError(f"{what} decodes to more than {limit} bytes")
    if not inflater.eof:
        raise ShardFormatError(f"{what} is truncated gzip data")
    return decoded


def find_chunk(spec: ShardingSpec, minishard_index: bytes, key: int, file_size: int) -> ChunkPlace | None:
    """The place of ``key``'s value from a decoded minishard index, or None if the minishard does not hold it."""
    if len(minishard_index) % 24:
        raise ShardFormatError(f"a minishard index of {len(minishard_index)} bytes is not a [3, n] uint64 array")
    table = np.frombuffer(minishard_index, dtype="<u8").reshape(3, -1)
    if table.shape[1] == 0:
        return None
    # Python integers, not uint64 sums: crafted deltas must not wrap around to a plausible offset.
    keys = np.cumsum(table[0].astype(object))
    ends = np.cumsum(table[1].astype(object) + table[2].astype(object))
    found = np.flatnonzero(keys == key)
    if len(found) == 0:
        return None
    at = int(found[0])
    size = int(table[2][at])
    start = spec.index_bytes + int(ends[at]) - size
    if start + size > file_size:
        raise ShardFormatError(f"the minishard index points past the file ({start}+{size} of {file_size} bytes)")
    return ChunkPlace(start, size)


def shard_keys(spec: ShardingSpec, keys: Sequence[int]) -> dict[int, list[int]]:
    """``keys`` grouped by their shard."""
    shards, _ = spec.locate(np.asarray(keys, dtype=np.uint64))
    grouped: dict[int, list[int]] = {}
    for key, shard in zip(keys, shards.tolist()):
        grouped.setdefault(shard, []).append(key)
    return grouped
