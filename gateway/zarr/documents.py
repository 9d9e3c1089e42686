"""The metadata documents the trees serve, as types, and the one place each is rendered.

Zarr v2 (``.zarray``, ``.zgroup``, ``.zattrs``, ``.zmetadata``), Zarr v3 (``zarr.json`` of an array or a group,
with inline consolidated metadata) and the OME-NGFF 0.4 and 0.5 multiscales blocks. Every array, whether it
serves a mag or a small coordinate array held in memory, is rendered by :func:`zarray` and
:func:`array_zarr_json`, so the two cannot drift apart.
"""

from collections.abc import Mapping, Sequence
from typing import Any, Literal, NotRequired, TypedDict

Attributes = Mapping[str, object]  # ``.zattrs`` or a ``zarr.json``'s ``attributes``: any JSON object
Document = Mapping[str, object]  # any metadata document a tree serves, as it goes out as JSON
# A codec's JSON object (``{"name": ..., "configuration": ...}`` in v3, ``{"id": ..., ...}`` as a v2 compressor):
# the gateway's own, or a source's as read from its metadata, whose members the codec's spec defines.
CodecDocument = dict[str, Any]

# --- Zarr v2 -----------------------------------------------------------------------------------------


class ZArray(TypedDict):
    """``.zarray`` (Zarr v2 storage specification)."""

    zarr_format: Literal[2]
    shape: list[int]
    chunks: list[int]
    dtype: str
    compressor: CodecDocument | None
    fill_value: int | float
    order: Literal["C", "F"]
    filters: None
    dimension_separator: Literal["."]


class ZGroup(TypedDict):
    zarr_format: Literal[2]


class ZMetadata(TypedDict):
    """``.zmetadata``: every document below a group, by path, as zarr-python's consolidated format."""

    zarr_consolidated_format: Literal[1]
    metadata: dict[str, ZArray | ZGroup | Attributes]


def zarray(
    shape: Sequence[int],
    chunks: Sequence[int],
    dtype: str,
    fill_value: int | float,
    order: Literal["C", "F"],
    compressor: CodecDocument | None = None,
) -> ZArray:
    return {
        "zarr_format": 2,
        "shape": list(shape),
        "chunks": list(chunks),
        "dtype": dtype,
        "compressor": compressor,
        "fill_value": fill_value,
        "order": order,
        "filters": None,
        "dimension_separator": ".",
    }


def zgroup() -> ZGroup:
    return {"zarr_format": 2}


def zmetadata(metadata: dict[str, ZArray | ZGroup | Attributes]) -> ZMetadata:
    return {"zarr_consolidated_format": 1, "metadata": metadata}


def v2_array_attributes(attributes: Attributes, dimension_names: Sequence[str]) -> dict[str, object]:
    """Array ``.zattrs``: xarray and viewers read the dimension names from ``_ARRAY_DIMENSIONS``."""
    return {**attributes, "_ARRAY_DIMENSIONS": list(dimension_names)}


# --- Zarr v3 -----------------------------------------------------------------------------------------


class _Configured(TypedDict):
    name: str
    configuration: dict[str, Any]


class ArrayZarrJson(TypedDict):
    """An array's ``zarr.json`` (Zarr v3 core specification)."""

    zarr_format: Literal[3]
    node_type: Literal["array"]
    shape: list[int]
    data_type: str
    chunk_grid: _Configured
    chunk_key_encoding: _Configured
    fill_value: int | float
    codecs: list[CodecDocument]
    dimension_names: list[str]
    attributes: Attributes


class ConsolidatedMetadata(TypedDict):
    """Inline consolidated metadata of a v3 group: zarr-python 3's format, keyed by paths below the group."""

    kind: Literal["inline"]
    must_understand: Literal[False]
    metadata: "dict[str, ArrayZarrJson | GroupZarrJson]"


class GroupZarrJson(TypedDict):
    """A group's ``zarr.json``."""

    zarr_format: Literal[3]
    node_type: Literal["group"]
    attributes: Attributes
    consolidated_metadata: NotRequired[ConsolidatedMetadata]


def array_zarr_json(
    shape: Sequence[int],
    data_type: str,
    chunk_shape: Sequence[int],
    fill_value: int | float,
    codecs: list[CodecDocument],
    dimension_names: Sequence[str],
    attributes: Attributes,
) -> ArrayZarrJson:
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(shape),
        "data_type": data_type,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunk_shape)}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": fill_value,
        "codecs": codecs,
        "dimension_names": list(dimension_names),
        "attributes": attributes,
    }


def group_zarr_json(
    attributes: Attributes | None = None, members: "dict[str, ArrayZarrJson | GroupZarrJson] | None" = None
) -> GroupZarrJson:
    """A v3 group's ``zarr.json``; ``members`` (paths below the group and their documents) are consolidated inline.

    Inline consolidated metadata is how a client that cannot list a directory (an object store's HTTP client,
    zarr-python's ``members()`` over plain HTTP) finds the group's members: zarr-python 3's format.
    """
    document: GroupZarrJson = {"zarr_format": 3, "node_type": "group", "attributes": attributes or {}}
    if members is not None:
        document["consolidated_metadata"] = {"kind": "inline", "must_understand": False, "metadata": members}
    return document


def codec(name: str, **configuration: Any) -> CodecDocument:
    """A v3 codec's JSON object."""
    return {"name": name, "configuration": configuration}


def bytes_codec(endian: Literal["little", "big"] = "little") -> CodecDocument:
    return codec("bytes", endian=endian)


def transpose_codec(order: list[int]) -> CodecDocument:
    return codec("transpose", order=order)


# --- OME-NGFF multiscales -----------------------------------------------------------------------------


class Axis(TypedDict):
    name: str
    type: Literal["channel", "space"]
    unit: NotRequired[str]


class ScaleTransformation(TypedDict):
    type: Literal["scale"]
    scale: list[float]


class MultiscaleDataset(TypedDict):
    path: str
    coordinateTransformations: list[ScaleTransformation]


class Multiscale(TypedDict):
    """One multiscales entry; 0.4 names its ``version`` here, 0.5 in the ``ome`` block around it."""

    version: NotRequired[Literal["0.4"]]
    name: str
    axes: list[Axis]
    datasets: list[MultiscaleDataset]


class OmeV04Attributes(TypedDict):
    """A layer group's ``.zattrs`` in the v2 tree (OME-NGFF 0.4)."""

    multiscales: list[Multiscale]


class OmeBlock(TypedDict):
    version: Literal["0.5"]
    multiscales: list[Multiscale]


class OmeV05Attributes(TypedDict):
    """A layer group's attributes in the v3 tree (OME-NGFF 0.5, under ``ome``)."""

    ome: OmeBlock


def ome_axes(spatial: Sequence[str], unit: str) -> list[Axis]:
    """A channel axis ``c``, then the spatial axes in ``unit``."""
    channel: Axis = {"name": "c", "type": "channel"}
    space: list[Axis] = [{"name": a, "type": "space", "unit": unit} for a in spatial]
    return [channel, *space]


def ome_dataset(path: str, scale: Sequence[float]) -> MultiscaleDataset:
    return {"path": path, "coordinateTransformations": [{"type": "scale", "scale": list(scale)}]}


def ome_v04(name: str, axes: list[Axis], datasets: list[MultiscaleDataset]) -> OmeV04Attributes:
    return {"multiscales": [{"version": "0.4", "name": name, "axes": axes, "datasets": datasets}]}


def ome_v05(name: str, axes: list[Axis], datasets: list[MultiscaleDataset]) -> OmeV05Attributes:
    return {"ome": {"version": "0.5", "multiscales": [{"name": name, "axes": axes, "datasets": datasets}]}}
