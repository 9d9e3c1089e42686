"""The Zarr v3 ``sharding_indexed`` index: written for virtual shards, read from sharded sources.

An index is one ``(offset, nbytes)`` pair of little-endian uint64 per inner chunk, in C order of the
inner-chunk grid, ``(2**64 - 1, 2**64 - 1)`` for an absent chunk, optionally followed by a crc32c
of the pairs (the ``bytes`` then ``crc32c`` index codecs).
"""

import crc32c
import numpy as np

EMPTY = 2**64 - 1
_PAIR_BYTES = 16
_CHECKSUM_BYTES = 4


class ShardIndexError(OSError):
    """A stored shard index that cannot be right: a storage fault, answered 5xx."""


def index_nbytes(chunks: int, checksum: bool = True) -> int:
    return _PAIR_BYTES * chunks + (_CHECKSUM_BYTES if checksum else 0)


def encode_shard_index(offsets: np.ndarray, sizes: np.ndarray, present: np.ndarray) -> bytes:
    """The index of ``len(offsets)`` inner chunks (C order), absent where ``present`` is False, with its crc32c."""
    table = np.full((offsets.size, 2), EMPTY, dtype="<u8")
    table[present, 0] = offsets[present]
    table[present, 1] = sizes[present]
    raw = table.tobytes()
    return raw + crc32c.crc32c(raw).to_bytes(_CHECKSUM_BYTES, "little")


def decode_shard_index(raw: bytes, chunks: int, checksum: bool, where: str) -> np.ndarray:
    """``(chunks, 2)`` uint64 pairs; a checksum that does not match raises :class:`ShardIndexError`."""
    if len(raw) != index_nbytes(chunks, checksum):
        raise ShardIndexError(
            f"{where}: the shard index has {len(raw)} bytes, expected {index_nbytes(chunks, checksum)}"
        )
    table_bytes = raw[: _PAIR_BYTES * chunks]
    if checksum and crc32c.crc32c(table_bytes) != int.from_bytes(raw[-_CHECKSUM_BYTES:], "little"):
        raise ShardIndexError(f"{where}: shard index checksum does not match")
    return np.frombuffer(table_bytes, dtype="<u8").reshape(-1, 2)


def is_absent(offset: int, nbytes: int) -> bool:
    return offset == EMPTY and nbytes == EMPTY
