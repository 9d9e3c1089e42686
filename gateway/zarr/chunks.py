"""Producing the bytes of plain chunks: stored chunks passed through, everything else read and encoded.

A chunk that is exactly one stored chunk lying wholly inside the bounding box
is passed through: a WKW block framed as Blosc (LZ4 not decoded), a Zarr
source's chunk unchanged. Everything else is read as voxels, masked to the
bounding box and encoded as the layout declares.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gateway_storage.geometry import Vec3
from wkw_adapter import BlockDecodeError

from ..sources.mag import ChunkNotFound, MagSource, StoredChunk, StoredEncoding
from .blosc import lz4_bound, lz4_chunk_prefix, memcpy_chunk_prefix
from .codecs import encode
from .layout import ArrayLayout
from .native import encode_native
from .resource import OCTET_STREAM, Resource, bytes_resource, make_etag, stored_etag

__all__ = ["ChunkNotFound", "ServedMag", "encoded_chunk", "passthrough_chunk", "plain_chunk", "served_mag"]


@dataclass(frozen=True, slots=True)
class ServedMag:
    """A mag source together with the layout it is served in; ``fingerprint`` changes with either.

    ``shape`` may exceed the source's own extent (the xarray tree puts every layer on the dataset's
    grid): chunks past the source's extent are absent.
    """

    source: MagSource
    layout: ArrayLayout
    fingerprint: str
    passes_through: bool  # chunks inside the bounding box are the source's stored chunks


def served_mag(source: MagSource, layout: ArrayLayout) -> ServedMag:
    fingerprint = make_etag(layout, source.kind, source.location_key, source.bbox.lo, source.bbox.hi)
    passes = layout.native is not None or (
        layout.codec.is_blosc and layout.shard_shape is None and layout.chunk_shape == source.stored_chunk_shape
    )
    return ServedMag(source, layout, fingerprint, passes)


def check_grid(layout: ArrayLayout, index: tuple[int, ...]) -> None:
    for axis, (i, n) in enumerate(zip(index, layout.grid_shape)):
        if i >= n:
            raise ChunkNotFound(f"index {i} along axis {'cxyz'[axis]} is past the array's {n} chunks")


def _framed_lz4(stored: StoredChunk) -> bytes:
    """An LZ4 block framed as Blosc. It is not decoded: only an impossible size is refused."""
    if len(stored.data) > lz4_bound(stored.uncompressed_size):
        raise BlockDecodeError(
            f"stored LZ4 block of {len(stored.data)} bytes is larger than any "
            f"{stored.uncompressed_size}-byte block can compress to"
        )
    return lz4_chunk_prefix(len(stored.data), stored.uncompressed_size) + stored.data


def _framed_raw(stored: StoredChunk) -> bytes:
    return memcpy_chunk_prefix(stored.uncompressed_size) + stored.data


def _unchanged(stored: StoredChunk) -> bytes:
    return stored.data


# How each kind of stored bytes becomes the body of a chunk the layout declares.
FRAMING: dict[StoredEncoding, Callable[[StoredChunk], bytes]] = {
    StoredEncoding.LZ4_BLOCK: _framed_lz4,
    StoredEncoding.RAW_BLOCK: _framed_raw,
    StoredEncoding.NATIVE: _unchanged,
}


def _chunk_box(served: ServedMag, index: tuple[int, ...]) -> tuple[Vec3, Vec3, bool]:
    """The chunk's voxel box and whether it lies wholly inside the bounding box (written out: per request)."""
    grid = served.layout.grid_shape
    if index[0] >= grid[0] or index[1] >= grid[1] or index[2] >= grid[2] or index[3] >= grid[3]:
        check_grid(served.layout, index)
    _, cx, cy, cz = served.layout.chunk_shape
    x, y, z = index[1] * cx, index[2] * cy, index[3] * cz
    X, Y, Z = x + cx, y + cy, z + cz
    (bx, by, bz), (BX, BY, BZ) = served.source.bbox.lo, served.source.bbox.hi
    if bx >= X or by >= Y or bz >= Z or x >= BX or y >= BY or z >= BZ:
        raise ChunkNotFound("the chunk lies wholly outside the layer's bounding box")
    inside = x >= bx and y >= by and z >= bz and X <= BX and Y <= BY and Z <= BZ
    return (x, y, z), (X, Y, Z), inside


def passthrough_chunk(served: ServedMag, index: tuple[int, ...]) -> Resource | None:
    """The chunk exactly as stored, if it is one stored chunk inside the bounding box; else None.

    For local files this costs a stat and one positioned read, so the HTTP
    layer may call it on the event loop.
    """
    lo, _, inside = _chunk_box(served, index)
    if not (inside and served.passes_through):
        return None
    stored = served.source.stored_chunk(index, lo)
    if stored is None:
        return None
    identity = stored.identity
    if identity is None:
        etag, mtime = make_etag(served.fingerprint, index, stored.origin, stored.data), None
    else:
        etag, mtime = (
            stored_etag(served.fingerprint, index, stored.origin, identity.size, identity.version),
            identity.mtime,
        )
    return bytes_resource(FRAMING[stored.encoding](stored), OCTET_STREAM, etag, mtime)


def encode_chunk(layout: ArrayLayout, data: np.ndarray) -> bytes:
    return encode_native(layout.native, data) if layout.native is not None else encode(layout.codec, data)


def plain_chunk(served: ServedMag, index: tuple[int, ...]) -> Resource:
    """One chunk of the plain layout: exactly the voxels of that chunk at this mag."""
    return passthrough_chunk(served, index) or encoded_chunk(served, index)


def encoded_chunk(served: ServedMag, index: tuple[int, ...]) -> Resource:
    """A chunk read as voxels, masked to the bounding box and encoded as the layout declares."""
    lo, hi, _ = _chunk_box(served, index)
    region = served.source.read_box(lo, hi)
    body = encode_chunk(served.layout, region.data)
    if region.sources is None:
        return bytes_resource(body, OCTET_STREAM, make_etag(served.fingerprint, index, body))
    mtimes = [identity.mtime for _, identity in region.sources if identity is not None]
    etag = make_etag(served.fingerprint, index, [(served.source.relative(p), i) for p, i in region.sources])
    return bytes_resource(body, OCTET_STREAM, etag, max(mtimes, default=None))
