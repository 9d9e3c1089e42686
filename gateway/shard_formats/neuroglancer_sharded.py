"""Writing Neuroglancer's sharded key-value format (``neuroglancer_uint64_sharded_v1``): uint64 keys to byte
strings, packed into ``2**shard_bits`` shard files, from its format document. Reading it is the precomputed
source's (:mod:`gateway.sources.precomputed_source`: ``Sharding``, ``read_minishard_index``), for volumes and
stored mesh sets alike.

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

from ..sources.precomputed_source import Sharding

SHARDED_TYPE = "neuroglancer_uint64_sharded_v1"
# Chosen as igneous chooses them for hashed keys: a shard index of 8 KiB (512 minishards) and minishard indexes
# of about 32 KiB (1365 keys of 24 bytes); a layer of fewer keys has fewer minishards and one shard.
TARGET_MINISHARD_BITS = 9
TARGET_KEYS_PER_MINISHARD = (1 << 15) // 24
GZIP_LEVEL = 6


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
    entries = np.zeros((1 << sharding.minishard_bits, 2), dtype="<u8")
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
        index = _encoded(np.asarray([keys, starts, sizes], dtype="<u8").tobytes(), sharding.minishard_index_gzip)
        entries[minishard] = (at, at + len(index))
        body.append(index)
        at += len(index)
    return entries.tobytes() + b"".join(body)
