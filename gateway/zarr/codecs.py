"""The codecs the gateway encodes with, and how v2 and v3 metadata name them.

Only codecs that tensorstore, zarr-python and Neuroglancer all decode are
offered; numcodecs' ``lz4`` is not one of them.
"""

import enum
import gzip
import threading
from typing import Any

import numcodecs
import numpy as np
from numcodecs.abc import Codec as NumcodecsCodec
from numcodecs.compat import ensure_contiguous_ndarray

from .blosc import encode_blosc
from .documents import CodecDocument

numcodecs.blosc.use_threads = False  # encoding already runs in a thread pool
# numcodecs guards Blosc's global state with a multiprocessing lock, a named semaphore made on first use. A
# uvicorn worker ends by re-raising SIGTERM, which skips the finalizer that removes it, and the resource
# tracker then warns of a leaked semaphore at every stop. Each process has its own Blosc state: a thread
# lock guards it as well and leaves nothing behind.
numcodecs.blosc._MUTEX, numcodecs.blosc._MUTEX_IS_INIT = threading.Lock(), True

BLOSC_CLEVEL = 5
ZSTD_LEVEL = 1  # fast: chunks are encoded per request
GZIP_LEVEL = 5


class Codec(enum.StrEnum):
    NONE = "none"
    BLOSC_LZ4 = "blosc-lz4"
    BLOSC_ZSTD = "blosc-zstd"
    ZSTD = "zstd"
    GZIP = "gzip"

    @property
    def is_blosc(self) -> bool:
        return self in (Codec.BLOSC_LZ4, Codec.BLOSC_ZSTD)


class DeterministicGZip(numcodecs.GZip):  # type: ignore[misc]  # numcodecs ships no types: its GZip is Any
    """GZip whose header carries no time stamp (numcodecs' stamps the time of encoding).

    One ETag names one body: the same chunk must encode to the same bytes on every request and every
    replica, and a time stamp in the header would make them differ.
    """

    def encode(self, buf: Any) -> bytes:
        data = memoryview(ensure_contiguous_ndarray(buf)).cast("B")
        return gzip.compress(data, compresslevel=self.level, mtime=0)


def codec_from_config(config: dict[str, Any]) -> NumcodecsCodec:
    """A numcodecs codec from its v2 configuration, deterministic for every codec the gateway encodes with."""
    if config.get("id") == "gzip":
        return DeterministicGZip(config.get("level", GZIP_LEVEL))
    return numcodecs.get_codec(dict(config))


def _numcodecs_codec(codec: Codec, itemsize: int) -> NumcodecsCodec | None:
    if codec.is_blosc:
        shuffle = numcodecs.Blosc.SHUFFLE if itemsize > 1 else numcodecs.Blosc.NOSHUFFLE
        return numcodecs.Blosc(cname=codec.value.split("-")[1], clevel=BLOSC_CLEVEL, shuffle=shuffle)
    if codec is Codec.ZSTD:
        return numcodecs.Zstd(level=ZSTD_LEVEL)
    if codec is Codec.GZIP:
        return DeterministicGZip(level=GZIP_LEVEL)
    return None


def encode(codec: Codec, data: np.ndarray, sampled: bool = True) -> bytes:
    """Encode an ``[c, x, y, z]`` chunk as Fortran-order bytes (what both trees declare); ``sampled``: Blosc skips
    the compressor where a sample shows that it saves little (:func:`encode_blosc`)."""
    raw = np.asfortranarray(data)
    encoder = _numcodecs_codec(codec, raw.dtype.itemsize)
    flat = raw.reshape(-1, order="F")
    if encoder is None:
        return flat.tobytes()
    if codec.is_blosc:
        return encode_blosc(flat, encoder, sampled)
    return bytes(encoder.encode(flat))


def v2_compressor(codec: Codec, itemsize: int) -> CodecDocument | None:
    """The ``compressor`` entry of ``.zarray``, with only the members tensorstore's v2 driver accepts."""
    if codec is Codec.ZSTD:
        return {"id": "zstd", "level": ZSTD_LEVEL}
    encoder = _numcodecs_codec(codec, itemsize)
    return None if encoder is None else encoder.get_config()


def v3_codecs(codec: Codec, itemsize: int) -> list[CodecDocument]:
    """Bytes-to-bytes codecs that follow ``transpose`` and ``bytes`` in ``zarr.json``."""
    if codec.is_blosc:
        shuffle = "shuffle" if itemsize > 1 else "noshuffle"
        cname = codec.value.split("-")[1]
        config = {"cname": cname, "clevel": BLOSC_CLEVEL, "shuffle": shuffle, "typesize": itemsize, "blocksize": 0}
        return [{"name": "blosc", "configuration": config}]
    if codec is Codec.ZSTD:
        return [{"name": "zstd", "configuration": {"level": ZSTD_LEVEL, "checksum": False}}]
    if codec is Codec.GZIP:
        return [{"name": "gzip", "configuration": {"level": GZIP_LEVEL}}]
    return []
