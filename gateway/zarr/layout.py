"""One description of a served layer and its mag arrays, from which both trees' metadata derive."""

import functools
from dataclasses import dataclass

import numpy as np

from ..sources.mag import NativeEncoding
from . import native
from .codecs import Codec, v2_compressor, v3_codecs

Vec3 = tuple[int, int, int]
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


def zarray(layout: ArrayLayout) -> dict:
    """``.zarray`` for the Zarr v2 tree."""
    dtype, order, compressor = layout.dtype.str, "F", v2_compressor(layout.codec, layout.dtype.itemsize)
    if layout.native is not None:  # only layouts whose order v2 can name are served in the source's encoding
        dtype, order = layout.native.dtype.str, native.v2_order(layout.native) or "F"
        compressor = native.v2_compressor(layout.native)[1]
    return {
        "zarr_format": 2,
        "shape": list(layout.shape),
        "chunks": list(layout.chunk_shape),
        "dtype": dtype,
        "compressor": compressor,
        "fill_value": layout.json_fill_value,
        "order": order,
        "filters": None,
        "dimension_separator": ".",
    }


def _inner_codecs(layout: ArrayLayout) -> list[dict]:
    if layout.native is not None:
        permutation = list(layout.native.permutation)
        transpose = [] if permutation == sorted(permutation) else [_transpose(permutation)]
        endian = "big" if layout.native.dtype.byteorder == ">" else "little"
        bytes_codec = {"name": "bytes", "configuration": {"endian": endian}}
        return [*transpose, bytes_codec, *(native.v3_codecs(layout.native) or [])]
    return [
        _transpose(V3_TRANSPOSE),
        {"name": "bytes", "configuration": {"endian": "little"}},
        *v3_codecs(layout.codec, layout.dtype.itemsize),
    ]


def array_zarr_json(
    layout: ArrayLayout, dimension_names: tuple[str, ...] = AXES, attributes: dict | None = None
) -> dict:
    """``zarr.json`` of an array; with three dimension names the channel axis (of length 1) is left out."""
    codecs = _inner_codecs(layout)
    grid_chunk = layout.chunk_shape
    if layout.shard_shape is not None:
        grid_chunk = layout.shard_shape
        sharding = {
            "chunk_shape": list(layout.chunk_shape),
            "codecs": codecs,
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
            "index_location": "end",
        }
        codecs = [{"name": "sharding_indexed", "configuration": sharding}]
    shape: list[int] = list(layout.shape)
    chunks: list[int] = list(grid_chunk)
    if len(dimension_names) == len(shape) - 1:  # no channel axis: the bytes are the same, the rank is not
        shape, chunks, codecs = shape[1:], chunks[1:], [_without_channel(codec) for codec in codecs]
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": shape,
        "data_type": layout.dtype.name,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": layout.json_fill_value,
        "codecs": codecs,
        "dimension_names": list(dimension_names),
        "attributes": attributes or {},
    }


def _without_channel(codec: dict) -> dict:
    """A codec over ``(c, x, y, z)`` as one over ``(x, y, z)``: a transpose loses the channel axis, and so do
    the inner chunk shape and inner codecs of a shard; other codecs are unchanged."""
    if codec["name"] == "sharding_indexed":
        sharding = codec["configuration"]
        inner = {
            **sharding,
            "chunk_shape": sharding["chunk_shape"][1:],
            "codecs": [_without_channel(inner_codec) for inner_codec in sharding["codecs"]],
        }
        return {"name": "sharding_indexed", "configuration": inner}
    if codec["name"] != "transpose":
        return codec
    return _transpose([axis - 1 for axis in codec["configuration"]["order"] if axis != 0])


def _transpose(order: list[int]) -> dict:
    return {"name": "transpose", "configuration": {"order": order}}


def group_zarr_json(attributes: dict | None = None, members: dict[str, dict] | None = None) -> dict:
    """A v3 group's ``zarr.json``; ``members`` (paths below the group and their documents) are consolidated inline.

    Inline consolidated metadata is how a client that cannot list a directory (an object store's HTTP client,
    zarr-python's ``members()`` over plain HTTP) finds the group's members: zarr-python 3's format.
    """
    document: dict = {"zarr_format": 3, "node_type": "group", "attributes": attributes or {}}
    if members is not None:
        document["consolidated_metadata"] = {"kind": "inline", "must_understand": False, "metadata": members}
    return document


def _axes(unit: str) -> list[dict]:
    return [{"name": "c", "type": "channel"}] + [{"name": a, "type": "space", "unit": unit} for a in AXES[1:]]


def _datasets(layer: LayerDescription) -> list[dict]:
    return [
        {
            "path": m.path,
            "coordinateTransformations": [
                {"type": "scale", "scale": [1.0, *(v * f for v, f in zip(layer.voxel_size, m.mag))]}
            ],
        }
        for m in layer.mags
    ]


def ome_v04(layer: LayerDescription) -> dict:
    """Layer ``.zattrs``: OME-NGFF 0.4 multiscales."""
    multiscale = {"version": "0.4", "name": layer.name, "axes": _axes(layer.unit), "datasets": _datasets(layer)}
    return {"multiscales": [multiscale]}


def ome_v05(layer: LayerDescription) -> dict:
    """Layer group attributes in the v3 tree: OME-NGFF 0.5 under ``ome``."""
    multiscale = {"name": layer.name, "axes": _axes(layer.unit), "datasets": _datasets(layer)}
    return {"ome": {"version": "0.5", "multiscales": [multiscale]}}
