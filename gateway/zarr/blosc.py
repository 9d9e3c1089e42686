"""Blosc-1 chunk framing around bytes that are already compressed or raw.

A stored WKW LZ4 block is a raw LZ4 block; a Blosc-1 chunk whose header says
"lz4, typesize 1, no shuffle, one block, not split" carries exactly such a
block, so it can be served without decoding (docs/architecture.md). Raw bytes go in a
"memcpyed" chunk, whose size is known without looking at the data.
"""

import struct

from wkw_adapter import lz4_bound as lz4_bound  # where the LZ4 bound is defined: the WKW format needs it first

_HEADER = struct.Struct("<BBBBIII")
_VERSION = 2
_VERSION_LZ = 1
_FLAG_MEMCPYED = 0x02
_FLAG_NO_SPLIT = 0x10
_CODE_LZ4 = 1 << 5
LZ4_PREFIX_SIZE = 16 + 4 + 4
MEMCPY_PREFIX_SIZE = 16


def lz4_chunk_prefix(compressed_size: int, uncompressed_size: int) -> bytes:
    """The bytes that precede a raw LZ4 block to make it a Blosc-1 chunk."""
    total = LZ4_PREFIX_SIZE + compressed_size
    header = _HEADER.pack(
        _VERSION, _VERSION_LZ, _FLAG_NO_SPLIT | _CODE_LZ4, 1, uncompressed_size, uncompressed_size, total
    )
    return header + struct.pack("<II", LZ4_PREFIX_SIZE - 4, compressed_size)


def memcpy_chunk_prefix(size: int) -> bytes:
    """The header that makes ``size`` raw bytes a Blosc-1 chunk."""
    return _HEADER.pack(
        _VERSION, _VERSION_LZ, _FLAG_MEMCPYED | _FLAG_NO_SPLIT, 1, size, size, size + MEMCPY_PREFIX_SIZE
    )
