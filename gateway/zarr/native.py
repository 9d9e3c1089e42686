"""Serving a Zarr source's own chunk encoding: how each tree declares it, and encoding new chunks in it.

A source chunk can be sent unchanged when the tree can declare exactly how
it is encoded: v3 always can (a transpose, then the source's codecs); v2 only
when the byte order is C or F over the served axes and the codecs are one
v2 compressor. Chunks that straddle the bounding box are re-encoded here in
the same encoding, so every chunk of an array matches its metadata.
"""

from typing import Any, Literal

import numcodecs
import numpy as np

from ..sources.mag import NativeEncoding
from .codecs import DeterministicGZip, codec_from_config
from .documents import CodecDocument

_V2_TO_V3 = {"blosc", "gzip", "zstd"}
_SHUFFLE_NAMES = {0: "noshuffle", 1: "shuffle", 2: "bitshuffle"}


def _effective_order(native: NativeEncoding) -> list[int]:
    """The permutation without axes of length 1, which may sit anywhere without changing the bytes."""
    return [a for a in native.permutation if native.chunk_shape[a] > 1]


def v2_order(native: NativeEncoding) -> Literal["C", "F"] | None:
    """ "C" or "F" if a v2 ``order`` describes the stored bytes, else None."""
    order = _effective_order(native)
    if order == sorted(order):
        return "C"
    if order == sorted(order, reverse=True):
        return "F"
    return None


def v2_compressor(native: NativeEncoding) -> tuple[bool, CodecDocument | None]:
    """(expressible, compressor) of the native encoding as a v2 ``compressor``."""
    if native.zarr_format == 2:
        return True, native.v2_compressor
    if not native.v3_codecs:
        return True, None
    if len(native.v3_codecs) != 1 or native.v3_codecs[0]["name"] not in _V2_TO_V3:
        return False, None
    codec = native.v3_codecs[0]
    config = dict(codec.get("configuration") or {})
    if codec["name"] == "blosc":
        shuffle = {v: k for k, v in _SHUFFLE_NAMES.items()}.get(config.get("shuffle", "noshuffle"), 0)
        return True, {
            "id": "blosc",
            "cname": config.get("cname", "lz4"),
            "clevel": config.get("clevel", 5),
            "shuffle": shuffle,
            "blocksize": config.get("blocksize", 0),
        }
    return True, {"id": codec["name"], "level": config.get("level", 1 if codec["name"] == "zstd" else 5)}


def v3_codecs(native: NativeEncoding) -> list[CodecDocument] | None:
    """The bytes-to-bytes codecs of the native encoding in v3 form, or None if v3 cannot name them."""
    if native.zarr_format == 3:
        return list(native.v3_codecs)
    compressor = native.v2_compressor
    if compressor is None:
        return []
    name = compressor.get("id")
    if name not in _V2_TO_V3:
        return None
    if name == "blosc":
        config: dict[str, Any] = {
            "cname": compressor.get("cname", "lz4"),
            "clevel": compressor.get("clevel", 5),
            "shuffle": _SHUFFLE_NAMES.get(compressor.get("shuffle", 1), "shuffle"),
            "typesize": native.dtype.itemsize,
            "blocksize": compressor.get("blocksize", 0),
        }
        return [{"name": "blosc", "configuration": config}]
    if name == "zstd":
        return [{"name": "zstd", "configuration": {"level": compressor.get("level", 1), "checksum": False}}]
    return [{"name": "gzip", "configuration": {"level": compressor.get("level", 5)}}]


def _v3_numcodec(codec: CodecDocument) -> numcodecs.abc.Codec | None:
    config = codec.get("configuration") or {}
    if codec["name"] == "blosc":
        shuffle = {v: k for k, v in _SHUFFLE_NAMES.items()}[config.get("shuffle", "noshuffle")]
        return numcodecs.Blosc(config["cname"], config.get("clevel", 5), shuffle, config.get("blocksize", 0))
    if codec["name"] == "gzip":
        return DeterministicGZip(config.get("level", 5))
    if codec["name"] == "zstd":
        return numcodecs.Zstd(config.get("level", 0), checksum=config.get("checksum", False))
    return None  # crc32c: appended below


def encode_native(native: NativeEncoding, data: np.ndarray) -> bytes:
    """Encode a served ``[c, x, y, z]`` chunk exactly as the source encodes its chunks."""
    raw = np.ascontiguousarray(np.transpose(data, native.permutation), dtype=native.dtype).tobytes()
    if native.zarr_format == 2:
        if native.v2_compressor is None:
            return raw
        # an array, not bytes: Blosc's typesize (and so its shuffle) is the item size, as a Zarr writer's
        return bytes(codec_from_config(native.v2_compressor).encode(np.frombuffer(raw, native.dtype)))
    import crc32c

    for codec in native.v3_codecs:
        encoder = _v3_numcodec(codec)
        if encoder is None:
            raw = raw + crc32c.crc32c(raw).to_bytes(4, "little")
        else:
            raw = bytes(encoder.encode(np.frombuffer(raw, dtype=native.dtype)))
    return raw
