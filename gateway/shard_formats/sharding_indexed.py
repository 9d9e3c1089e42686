"""Zarr v3's ``sharding_indexed`` codec: a shard's inner-chunk grid and its index, written for virtual shards and
read from sharded sources.

An index is one ``(offset, nbytes)`` pair of little-endian uint64 per inner chunk, in C order of the shard's
inner-chunk grid, ``(2**64 - 1, 2**64 - 1)`` for an absent chunk, optionally followed by a crc32c of the pairs
(the ``bytes`` then ``crc32c`` index codecs), at the start or the end of the shard.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import crc32c
import numpy as np

from gateway_storage.faults import Broken

EMPTY = 2**64 - 1
_PAIR_BYTES = 16
_CHECKSUM_BYTES = 4


class ShardIndexError(Broken, OSError):
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


@dataclass(frozen=True, slots=True)
class ShardLayout:
    """A shard's inner chunks per dimension and where its index lies: what reading one inner chunk needs."""

    chunks_per_shard: tuple[int, ...]
    index_at_end: bool = True
    index_checksum: bool = True

    @property
    def chunks(self) -> int:
        return int(np.prod(self.chunks_per_shard, dtype=object))

    @property
    def index_size(self) -> int:
        return index_nbytes(self.chunks, self.index_checksum)

    def index_offset(self, shard_size: int, where: str) -> int:
        """Where the index starts in a shard file of ``shard_size`` bytes; one shorter than its index is a fault."""
        if shard_size < self.index_size:
            raise ShardIndexError(f"{where}: the shard is smaller than its index")
        return shard_size - self.index_size if self.index_at_end else 0

    def position(self, coords: Sequence[int]) -> int:
        """The entry of the inner chunk at ``coords`` (in the array's inner-chunk grid, or the shard's): C order."""
        cps = self.chunks_per_shard
        return int(np.ravel_multi_index(tuple(c % n for c, n in zip(coords, cps)), cps))

    def decode(self, raw: bytes, where: str) -> np.ndarray:
        """The index read from a shard, ``(chunks, 2)`` pairs (checked against its crc32c where it has one)."""
        return decode_shard_index(raw, self.chunks, self.index_checksum, where)

    def encode(self, coords: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, present: np.ndarray) -> bytes:
        """The index (with its crc32c) of the inner chunks at the rows of ``coords`` (the shard's grid), placed by
        :meth:`position`; every other inner chunk absent."""
        at = np.ravel_multi_index(tuple(coords.T), self.chunks_per_shard)
        all_offsets, all_sizes = np.zeros(self.chunks, dtype=np.uint64), np.zeros(self.chunks, dtype=np.uint64)
        all_present = np.zeros(self.chunks, dtype=bool)
        all_offsets[at], all_sizes[at], all_present[at] = offsets, sizes, present
        return encode_shard_index(all_offsets, all_sizes, all_present)


def chunk_extent(table: np.ndarray, position: int, shard_size: int, where: str) -> tuple[int, int] | None:
    """``(offset, nbytes)`` of the inner chunk at ``position`` of a decoded index (None: absent), checked against
    the shard's size: an entry pointing past its end is a fault."""
    offset, nbytes = (int(v) for v in table[position])
    if is_absent(offset, nbytes):
        return None
    if offset + nbytes > shard_size:
        raise ShardIndexError(f"{where}: the shard index points past the end of the shard")
    return offset, nbytes
