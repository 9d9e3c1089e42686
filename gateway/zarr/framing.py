"""How stored bytes of each encoding become a served chunk: one framing per :class:`StoredEncoding`.

Plain chunks and the inner chunks of virtual shards are framed by the same table, so both check
stored bytes the same way before they leave. A WKW block is checked to decode to exactly its block
size: not every client's decoder refuses a garbled block (zarrita.js decodes one into garbage
without an error), so a corrupt block must be refused here. (A raw LZ4 block carries no checksum: a
block garbled so that it still decodes to exactly its size cannot be told from a good one.) An
encoding without a framing is refused loudly, never sent as raw bytes.
"""

from abc import ABC, abstractmethod
from collections.abc import Hashable

import lz4.block

from gateway_storage.faults import Malformed
from wkw_adapter import BlockDecodeError

from ..sources.mag import StoredEncoding
from .blosc import LZ4_PREFIX_SIZE, MEMCPY_PREFIX_SIZE, lz4_bound, lz4_chunk_prefix, memcpy_chunk_prefix

Stored = bytes | memoryview  # stored bytes as read, or a view of them in a longer read (no copy)


class UnknownEncoding(Malformed, TypeError):
    """Stored bytes of an encoding the Zarr layer has no framing for: a programming error, never raw bytes."""


class _Verdicts:
    """Blocks found to decode exactly, per file version and block: checking one again costs a set lookup
    (well under a microsecond) instead of a decode (about 13 µs for 32 KiB here).

    A plain set, emptied when full (at about 200 bytes an entry): a lookup takes no lock, and set
    operations are atomic under the GIL.
    """

    MAX_ENTRIES = 1 << 16

    def __init__(self) -> None:
        self._good: set[Hashable] = set()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._good

    def add(self, key: Hashable) -> None:
        if len(self._good) >= self.MAX_ENTRIES:
            self._good.clear()
        self._good.add(key)


_verdicts = _Verdicts()


class Framing(ABC):
    """Turns the stored bytes of one encoding into a chunk of the served layout."""

    prefix_size: int  # a framed chunk is this prefix and the stored bytes: its size is known from a block table

    @abstractmethod
    def prefix(self, stored_length: int, uncompressed_size: int) -> bytes:
        """What precedes the stored bytes in the framed chunk."""

    def max_stored_length(self, uncompressed_size: int) -> int | None:
        """The most bytes a valid stored chunk of ``uncompressed_size`` bytes can have; None if unknown."""
        return None

    def refuse_impossible(self, stored_length: int, uncompressed_size: int) -> str | None:
        """Why a stored length cannot be right for this encoding (checked before any byte is read), or None."""
        most = self.max_stored_length(uncompressed_size)
        if most is not None and stored_length > most:
            return f"a stored chunk of {stored_length} bytes is larger than any {uncompressed_size}-byte chunk can be"
        return None

    def check(self, data: Stored, uncompressed_size: int, verdict_key: Hashable | None) -> None:
        """Raise :class:`BlockDecodeError` unless ``data`` is a valid chunk of ``uncompressed_size`` bytes.

        ``verdict_key`` names this very version of the bytes (a file version and a block), so a verdict
        can be remembered; None checks every time. By default only the length is known to check.
        """
        reason = self.refuse_impossible(len(data), uncompressed_size)
        if reason is not None:
            raise BlockDecodeError(reason)

    def frame(self, data: Stored, uncompressed_size: int, verdict_key: Hashable | None) -> bytes:
        """The framed chunk of stored ``data``, once it is checked: the one copy the chunk is made with."""
        self.check(data, uncompressed_size, verdict_key)
        return self.prefix(len(data), uncompressed_size) + data


class Lz4BlockFraming(Framing):
    """A raw LZ4 block framed as a Blosc-1 chunk (not decoded on the way out, only checked)."""

    prefix_size = LZ4_PREFIX_SIZE

    def prefix(self, stored_length: int, uncompressed_size: int) -> bytes:
        return lz4_chunk_prefix(stored_length, uncompressed_size)

    def max_stored_length(self, uncompressed_size: int) -> int:
        return lz4_bound(uncompressed_size)

    def check(self, data: Stored, uncompressed_size: int, verdict_key: Hashable | None) -> None:
        if verdict_key is not None and verdict_key in _verdicts:
            return
        super().check(data, uncompressed_size, None)
        try:
            decoded = len(lz4.block.decompress(data, uncompressed_size=uncompressed_size))
        except lz4.block.LZ4BlockError as exc:
            raise BlockDecodeError(f"stored LZ4 block does not decode: {exc}") from None
        if decoded != uncompressed_size:
            raise BlockDecodeError(f"stored LZ4 block decodes to {decoded} bytes, not the block's {uncompressed_size}")
        if verdict_key is not None:
            _verdicts.add(verdict_key)


class RawBlockFraming(Framing):
    """Uncompressed voxels framed as a "memcpyed" Blosc-1 chunk."""

    prefix_size = MEMCPY_PREFIX_SIZE

    def prefix(self, stored_length: int, uncompressed_size: int) -> bytes:
        return memcpy_chunk_prefix(uncompressed_size)

    def max_stored_length(self, uncompressed_size: int) -> int:
        return uncompressed_size

    def check(self, data: Stored, uncompressed_size: int, verdict_key: Hashable | None) -> None:
        if len(data) != uncompressed_size:
            raise BlockDecodeError(f"a raw block of {len(data)} bytes, not the block's {uncompressed_size}")


class NativeFraming(Framing):
    """A Zarr source's chunk in its own codecs: sent unchanged, as its metadata declares it."""

    prefix_size = 0

    def prefix(self, stored_length: int, uncompressed_size: int) -> bytes:
        return b""


FRAMINGS: dict[StoredEncoding, Framing] = {
    StoredEncoding.LZ4_BLOCK: Lz4BlockFraming(),
    StoredEncoding.RAW_BLOCK: RawBlockFraming(),
    StoredEncoding.NATIVE: NativeFraming(),
}


def framing_for(encoding: StoredEncoding) -> Framing:
    """The framing of ``encoding``; :class:`UnknownEncoding` if there is none."""
    found = FRAMINGS.get(encoding)
    if found is None:
        raise UnknownEncoding(f"no framing for stored encoding {encoding!r}: refusing to send its bytes")
    return found
