"""Chunk encodings of the precomputed format, and the gzip content coding on top of any answer.

``raw``: the chunk's voxels, x fastest, then y, z, channel, little-endian. ``compressed_segmentation``: the
format's label compression (PyPI ``compressed-segmentation``), for uint32 and uint64 segmentations; without
the ``precomputed`` extra those are served ``raw``. gzip is made without a timestamp, so that one input and
one zlib give one body: the ETag of a gzipped answer names the zlib version too.
"""

import gzip
import zlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from ..extras import PRECOMPUTED, MissingExtraError

GZIP_LEVEL = 6
GZIP_CODING = f"gzip-{GZIP_LEVEL}-zlib-{zlib.ZLIB_VERSION}"  # part of a gzipped answer's ETag
BLOCK_SIZE = (8, 8, 8)


class ChunkEncoding(ABC):
    """How one chunk's voxels (``[c, x, y, z]``) become the bytes of its file."""

    name: str
    scale_fields: ClassVar[Mapping[str, Any]] = {}  # what the scale says about the encoding besides its name

    @abstractmethod
    def encode(self, voxels: np.ndarray) -> bytes: ...


class RawEncoding(ChunkEncoding):
    name = "raw"

    def encode(self, voxels: np.ndarray) -> bytes:
        little = voxels.astype(voxels.dtype.newbyteorder("<"), copy=False)
        return np.moveaxis(little, 0, -1).tobytes(order="F")  # [x, y, z, c], x fastest


class CompressedSegmentation(ChunkEncoding):
    name = "compressed_segmentation"
    scale_fields: ClassVar[Mapping[str, Any]] = {"compressed_segmentation_block_size": list(BLOCK_SIZE)}
    dtypes = (np.dtype("uint32"), np.dtype("uint64"))

    def encode(self, voxels: np.ndarray) -> bytes:
        import compressed_segmentation

        # [x, y, z, c], channels encoded one by one. The library takes only a writable buffer (its typed
        # memoryviews are not const), and a read may be a read-only view of a decoded block: copied then.
        labels = np.require(np.moveaxis(voxels, 0, -1), requirements=("F_CONTIGUOUS", "WRITEABLE"))
        body: bytes = compressed_segmentation.compress(labels, block_size=BLOCK_SIZE, order="F")
        return body


RAW = RawEncoding()
COMPRESSED_SEGMENTATION = CompressedSegmentation()


def has_compressed_segmentation() -> bool:
    try:
        PRECOMPUTED.require("compressed_segmentation chunks")
    except MissingExtraError:
        return False
    return True


def encoding_for(category: str, dtype: np.dtype, raw_only: bool, compressor_installed: bool) -> ChunkEncoding:
    """A segmentation of uint32 or uint64 labels is compressed, unless raw is asked for or cannot be helped."""
    if category == "segmentation" and dtype in CompressedSegmentation.dtypes and compressor_installed and not raw_only:
        return COMPRESSED_SEGMENTATION
    return RAW


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` value takes gzip (named, or ``*``, with a non-zero weight)."""
    accepted: dict[str, bool] = {}
    for item in accept_encoding.lower().split(","):
        coding, _, parameters = item.partition(";")
        weight = parameters.strip().removeprefix("q=").strip() if parameters.strip().startswith("q=") else "1"
        try:
            accepted[coding.strip()] = float(weight) > 0
        except ValueError:
            accepted[coding.strip()] = False
    return accepted.get("gzip", accepted.get("x-gzip", accepted.get("*", False)))


def gzip_body(body: bytes) -> bytes:
    return gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)
