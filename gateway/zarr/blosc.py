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
PROBE_FROM = 1 << 18  # chunks of at least this many bytes are sampled first
_PROBE_PIECES = 4
_PROBE_PIECE_BYTES = 1 << 14


def encode_blosc(flat: np.ndarray, codec: Blosc) -> bytes:
    """A Blosc-1 chunk of the flat array: ``codec``'s, or the raw bytes framed as memcpyed where a sample
    of a large chunk (pieces spread over it, so a half-empty chunk is not judged by its full half) shows
    that compressing would save less than ``MIN_SAVING``. The same array always gives the same bytes."""
    if flat.nbytes >= PROBE_FROM:
        step = len(flat) // _PROBE_PIECES
        piece = _PROBE_PIECE_BYTES // flat.itemsize
        probe = np.concatenate([flat[i * step + step // 2 :][:piece] for i in range(_PROBE_PIECES)])
        if len(codec.encode(probe)) - MEMCPY_PREFIX_SIZE > (1 - MIN_SAVING) * probe.nbytes:
            return b"".join((memcpy_chunk_prefix(flat.nbytes), flat.data.cast("B")))
    return bytes(codec.encode(flat))


def encode_blosc_lz4(flat: np.ndarray, clevel: int) -> bytes:
    """:func:`encode_blosc` with LZ4 and no shuffle (the micro-benchmark's name for the gateway's encoder)."""
    return encode_blosc(flat, Blosc("lz4", clevel, Blosc.NOSHUFFLE))
