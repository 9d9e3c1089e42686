"""Blosc-1 chunks: framing around bytes that are already compressed or raw, and the encoder of the rest.

A stored WKW LZ4 block is a raw LZ4 block; a Blosc-1 chunk whose header says
"lz4, typesize 1, no shuffle, one block, not split" carries exactly such a
block, so it can be served without decoding (docs/architecture.md). Raw bytes go in a
"memcpyed" chunk, whose size is known without looking at the data.

Chunks made from voxels are Blosc-1 chunks too: every client decodes those (numcodecs, zarr-python,
tensorstore and Neuroglancer embed c-blosc 1, which refuses the chunks blosc2 writes), and
``encode_blosc`` skips the compressor where it would save little (docs/benchmarks.md has the figures).
"""

import struct

import numpy as np
from numcodecs import Blosc

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


# Part of every served array's fingerprint (so of its ETags): a change to the bytes this module makes for
# the same voxels must change it, or one ETag would name two bodies on replicas of different versions.
ENCODING_GENERATION = 2

# A large chunk is compressed only if a sample of it shrinks by at least this share: below it, LZ4
# costs more time than the bytes it saves take on a fast network, and noisy EM data saves 2-6 %.
MIN_SAVING = 0.1
# c-blosc 1 compresses such chunks in blocks of this size (at clevel 5, LZ4, any typesize). The sample is
# made of whole blocks: LZ4 finds more in a shorter input (its search skips further the longer it finds
# nothing), so pieces smaller than a block would promise savings the chunk does not make.
BLOSC_BLOCK = 1 << 17
PROBE_FROM = 2 * BLOSC_BLOCK  # chunks of at least two blocks are sampled first
BLOCKS_PER_PROBE = 8  # one block in this many is sampled, spread over the chunk


def encode_blosc(flat: np.ndarray, codec: Blosc, sampled: bool = True) -> bytes:
    """A Blosc-1 chunk of the flat array: ``codec``'s, or (``sampled``) the raw bytes framed as memcpyed where
    blocks of a large chunk, spread over it, show that compressing would save less than ``MIN_SAVING``. The
    same array always gives the same bytes."""
    if sampled and flat.nbytes >= PROBE_FROM:
        raw = flat.data.cast("B")
        blocks = -(-flat.nbytes // BLOSC_BLOCK)
        count = max(1, blocks // BLOCKS_PER_PROBE)
        starts = [(2 * i + 1) * blocks // (2 * count) * BLOSC_BLOCK for i in range(count)]
        pieces = [raw[start : start + BLOSC_BLOCK] for start in starts]
        compressed = sum(len(codec.encode(piece)) - MEMCPY_PREFIX_SIZE for piece in pieces)
        if compressed > (1 - MIN_SAVING) * sum(len(piece) for piece in pieces):
            return b"".join((memcpy_chunk_prefix(flat.nbytes), raw))
    return bytes(codec.encode(flat))


def encode_blosc_lz4(flat: np.ndarray, clevel: int) -> bytes:
    """:func:`encode_blosc` with LZ4 and no shuffle (the micro-benchmark's name for the gateway's encoder)."""
    return encode_blosc(flat, Blosc("lz4", clevel, Blosc.NOSHUFFLE))
