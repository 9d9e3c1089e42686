"""Producing the bytes of plain chunks: stored chunks passed through, everything else read and encoded.

A chunk that is exactly one stored chunk lying wholly inside the bounding box
is passed through: a WKW block framed as Blosc (LZ4 not decoded), a Zarr
source's chunk unchanged. Everything else is read as voxels, masked to the
bounding box and encoded as the layout declares.
"""

from dataclasses import dataclass

import numpy as np

from gateway_storage.geometry import Vec3

from ..resources import OCTET_STREAM, FileVersions, Resource, bytes_resource, files_etag, make_etag, stored_etag
from ..sources.mag import ChunkNotFound, MagSource
from .blosc import ENCODING_GENERATION
from .codecs import encode
from .framing import framing_for
from .layout import ArrayLayout
from .native import encode_native

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
    fingerprint = make_etag(
        layout, ENCODING_GENERATION, source.kind, source.location_key, source.bbox.lo, source.bbox.hi
    )
    passes = layout.native is not None or (
        layout.codec.is_blosc and layout.shard_shape is None and layout.chunk_shape == source.stored_chunk_shape
    )
    return ServedMag(source, layout, fingerprint, passes)


def check_grid(layout: ArrayLayout, index: tuple[int, ...]) -> None:
    for axis, (i, n) in enumerate(zip(index, layout.grid_shape)):
        if i >= n:
            raise ChunkNotFound(f"index {i} along axis {'cxyz'[axis]} is past the array's {n} chunks")


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
    made_from = None
    if identity is None:
        etag, mtime, verdict_key = make_etag(served.fingerprint, index, stored.origin, stored.data), None, None
    else:
        etag, mtime = (
            stored_etag(served.fingerprint, index, stored.origin, identity.size, identity.version),
            identity.mtime,
        )
        verdict_key = (stored.origin, identity.version, index)
        if stored.path is not None:
            made_from = FileVersions(served.source.storage, ((stored.path, identity),))
    body = framing_for(stored.encoding).frame(stored.data, stored.uncompressed_size, verdict_key)
    return bytes_resource(body, OCTET_STREAM, etag, mtime, made_from)


def encode_chunk(layout: ArrayLayout, data: np.ndarray, version: str | None = None) -> bytes:
    """The chunk's bytes; ``version`` names its voxels (its ETag) where known."""
    if layout.native is not None:
        return encode_native(layout.native, data)
    return encode(layout.codec, data, sampled=not layout.labels, version=version)


def plain_chunk(served: ServedMag, index: tuple[int, ...]) -> Resource:
    """One chunk of the plain layout: exactly the voxels of that chunk at this mag."""
    return passthrough_chunk(served, index) or encoded_chunk(served, index)


def encoded_chunk(served: ServedMag, index: tuple[int, ...]) -> Resource:
    """A chunk read as voxels, masked to the bounding box and encoded as the layout declares."""
    lo, hi, _ = _chunk_box(served, index)
    region = served.source.read_held(lo, hi)
    if region is None:
        raise ChunkNotFound("no stored data lies in this chunk: it reads as the fill value")
    if region.sources is None:
        body = encode_chunk(served.layout, region.data)
        return bytes_resource(body, OCTET_STREAM, make_etag(served.fingerprint, index, body))
    mtimes = [identity.mtime for _, identity in region.sources if identity is not None]
    etag = files_etag(served.fingerprint, index, served.source.relative, region.sources)
    body = encode_chunk(served.layout, region.data, etag)
    made_from = FileVersions(served.source.storage, tuple(region.sources))
    return bytes_resource(body, OCTET_STREAM, etag, max(mtimes, default=None), made_from)
