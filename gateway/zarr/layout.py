"""One description of a served layer and its mag arrays, from which both trees' metadata derive."""

import functools
from dataclasses import dataclass
from typing import Literal

import numpy as np

from gateway_storage.geometry import Vec3

from ..sources.mag import NativeEncoding
from . import documents, native
from .codecs import Codec, v2_compressor, v3_codecs
from .documents import Attributes, CodecDocument

AXES = ("c", "x", "y", "z")
# (c, x, y, z) with x fastest in memory: Zarr v2 order "F", or a v3 transpose to (z, y, x, c).
V3_TRANSPOSE = [3, 2, 1, 0]


@dataclass(frozen=True)  # no slots: grid_shape is cached on the instance
class ArrayLayout:
    """A served mag array: shape ``(c, x, y, z)``, its chunking, and how chunks are encoded.

    ``shard_shape`` is set for the v3 sharded layout; ``chunk_shape`` is then
    the inner chunk.
    """

    shape: tuple[int, int, int, int]
    chunk_shape: tuple[int, int, int, int]
    dtype: np.dtype
    codec: Codec
    shard_shape: tuple[int, int, int, int] | None = None
    fill_value: float = 0
    native: NativeEncoding | None = None  # chunks encoded as a Zarr source stores them, not with ``codec``
    # Segment ids: runs of equal ids always compress, so chunks are compressed without sampling first whether
    # that saves enough (the sample's compress, a second release of the GIL, cost a mapped 64³ chunk a third
    # of its CPU under load: docs/benchmarks.md)
    labels: bool = False

    @property
    def json_fill_value(self) -> int | float:
        return float(self.fill_value) if self.dtype.kind == "f" else int(self.fill_value)

    @functools.cached_property
    def grid_shape(self) -> tuple[int, ...]:
        """How many (outer) chunks there are along each axis."""
        outer = self.shard_shape or self.chunk_shape
        return tuple(-(-s // c) for s, c in zip(self.shape, outer))


@dataclass(frozen=True, slots=True)
class MagArray:
    mag: Vec3
    path: str
    layout: ArrayLayout


@dataclass(frozen=True, slots=True)
class LayerDescription:
    name: str
    voxel_size: tuple[float, float, float]
    unit: str
    mags: tuple[MagArray, ...]


def zarray(layout: ArrayLayout) -> documents.ZArray:
    """``.zarray`` for the Zarr v2 tree."""
    if layout.native is not None:  # only layouts whose order v2 can name are served in the source's encoding
        order = native.v2_order(layout.native) or "F"
        compressor = native.v2_compressor(layout.native)[1]
        return documents.zarray(
            layout.shape, layout.chunk_shape, layout.native.dtype.str, layout.json_fill_value, order, compressor
        )
    compressor = v2_compressor(layout.codec, layout.dtype.itemsize)
    return documents.zarray(layout.shape, layout.chunk_shape, layout.dtype.str, layout.json_fill_value, "F", compressor)


def _inner_codecs(layout: ArrayLayout) -> list[CodecDocument]:
    if layout.native is not None:
        permutation = list(layout.native.permutation)
        transpose = [] if permutation == sorted(permutation) else [documents.transpose_codec(permutation)]
        endian: Literal["little", "big"] = "big" if layout.native.dtype.byteorder == ">" else "little"
        return [*transpose, documents.bytes_codec(endian), *(native.v3_codecs(layout.native) or [])]
    return [
        documents.transpose_codec(V3_TRANSPOSE),
        documents.bytes_codec(),
        *v3_codecs(layout.codec, layout.dtype.itemsize),
    ]


def array_zarr_json(
    layout: ArrayLayout, dimension_names: tuple[str, ...] = AXES, attributes: Attributes | None = None
) -> documents.ArrayZarrJson:
    """``zarr.json`` of an array; with three dimension names the channel axis (of length 1) is left out."""
    codecs = _inner_codecs(layout)
    grid_chunk = layout.chunk_shape
    if layout.shard_shape is not None:
        grid_chunk = layout.shard_shape
        codecs = [
            documents.codec(
                "sharding_indexed",
                chunk_shape=list(layout.chunk_shape),
                codecs=codecs,
                index_codecs=[documents.bytes_codec(), documents.codec("crc32c")],
                index_location="end",
            )
        ]
    shape: list[int] = list(layout.shape)
    chunks: list[int] = list(grid_chunk)
    if len(dimension_names) == len(shape) - 1:  # no channel axis: the bytes are the same, the rank is not
        shape, chunks, codecs = shape[1:], chunks[1:], [_without_channel(codec) for codec in codecs]
    return documents.array_zarr_json(
        shape, layout.dtype.name, chunks, layout.json_fill_value, codecs, dimension_names, attributes or {}
    )


def _without_channel(codec: CodecDocument) -> CodecDocument:
    """A codec over ``(c, x, y, z)`` as one over ``(x, y, z)``: a transpose loses the channel axis, and so do
    the inner chunk shape and inner codecs of a shard; other codecs are unchanged."""
    if codec["name"] == "sharding_indexed":
        sharding = codec["configuration"]
        inner = {
            **sharding,
            "chunk_shape": sharding["chunk_shape"][1:],
            "codecs": [_without_channel(inner_codec) for inner_codec in sharding["codecs"]],
        }
        return documents.codec("sharding_indexed", **inner)
    if codec["name"] != "transpose":
        return codec
    return documents.transpose_codec([axis - 1 for axis in codec["configuration"]["order"] if axis != 0])


def _datasets(layer: LayerDescription) -> list[documents.MultiscaleDataset]:
    return [documents.ome_dataset(m.path, [1.0, *(v * f for v, f in zip(layer.voxel_size, m.mag))]) for m in layer.mags]


def ome_v04(layer: LayerDescription) -> documents.OmeV04Attributes:
    """Layer ``.zattrs``: OME-NGFF 0.4 multiscales."""
    return documents.ome_v04(layer.name, documents.ome_axes(AXES[1:], layer.unit), _datasets(layer))


def ome_v05(layer: LayerDescription) -> documents.OmeV05Attributes:
    """Layer group attributes in the v3 tree: OME-NGFF 0.5 under ``ome``."""
    return documents.ome_v05(layer.name, documents.ome_axes(AXES[1:], layer.unit), _datasets(layer))
