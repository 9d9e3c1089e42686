"""The metadata documents of every chunked format, parsed by strict frozen models into what a source consumes.

Zarr v2 ``.zarray`` and v3 ``zarr.json`` become one :class:`ZarrArray` (the chunk grid, the chunk keys, the
stored encoding and the shards, each decided once); an N5 ``attributes.json`` is :class:`N5Attributes`; a
Neuroglancer precomputed ``info`` is :class:`PrecomputedInfo` with the :class:`PrecomputedScale` of a mag.
Whoever can write a dataset can write its metadata, so a number is never a string or a boolean, every
shape has the array's rank, and values no real array holds (a fill value its data type cannot hold, an
extent past ``MAX_EXTENT``) make the mag unusable with the reason, before any request reads it. Keys the
gateway does not read are kept (``extra="allow"``): every format lets writers add their own.
"""

from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..shard_formats.sharding_indexed import ShardLayout
from .mag import SourceError
from .properties import MAX_EXTENT

Extent = Annotated[int, Field(strict=True, ge=0, le=MAX_EXTENT)]
Edge = Annotated[int, Field(strict=True, ge=1, le=MAX_EXTENT)]
Offset = Annotated[int, Field(strict=True, ge=-MAX_EXTENT, le=MAX_EXTENT)]
Bits = Annotated[int, Field(strict=True, ge=0, le=64)]
Number = Annotated[int, Field(strict=True)] | Annotated[float, Field(strict=True)]

_V2_COMPRESSORS = ("blosc", "zlib", "gzip", "zstd", "bz2")  # what tensorstore decodes
_V3_BYTES_CODECS = ("blosc", "gzip", "zstd", "crc32c")  # bytes-to-bytes codecs tensorstore decodes
_V3_DATA_TYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64")
_SHARDING = "sharding_indexed"


class _Model(BaseModel):
    """Frozen; keys the gateway does not read are kept (attributes, user metadata, codec options)."""

    model_config = ConfigDict(frozen=True, extra="allow")


class Codec(_Model):
    """A v2 ``compressor`` (``id``) or a v3 codec (``name``, ``configuration``)."""

    name: str = ""
    id: str = ""
    configuration: dict[str, Any] | None = None


class ZarrayDocument(_Model):
    """A Zarr v2 ``.zarray``."""

    zarr_format: Literal[2] = 2
    shape: tuple[Extent, ...]
    chunks: tuple[Edge, ...]
    dtype: str
    compressor: Codec | None = None
    fill_value: Number | None = None
    order: Literal["C", "F"] = "C"
    filters: tuple[()] | None = None  # filters are not supported: none, or an empty list
    dimension_separator: Literal[".", "/"] = "."
    dimension_names: tuple[str | None, ...] | None = None  # written by some tools beside the spec

    @model_validator(mode="after")
    def _rank(self) -> "ZarrayDocument":
        if len(self.chunks) != len(self.shape):
            raise ValueError(f"chunks has {len(self.chunks)} dimensions, shape {len(self.shape)}")
        if self.compressor is not None and self.compressor.id not in _V2_COMPRESSORS:
            raise ValueError(f"compressor {self.compressor.id!r} is not one of {', '.join(_V2_COMPRESSORS)}")
        return self


class ChunkGridConfiguration(_Model):
    chunk_shape: tuple[Edge, ...]


class ChunkGrid(_Model):
    name: Literal["regular"]
    configuration: ChunkGridConfiguration


class ChunkKeyConfiguration(_Model):
    separator: Literal[".", "/"] | None = None


class ChunkKeyEncoding(_Model):
    name: Literal["default", "v2"] = "default"
    configuration: ChunkKeyConfiguration = ChunkKeyConfiguration()


class ShardingConfiguration(_Model):
    chunk_shape: tuple[Edge, ...]
    codecs: tuple[Codec, ...]
    index_codecs: tuple[Codec, ...] = ()
    index_location: Literal["start", "end"] = "end"


class ZarrJsonDocument(_Model):
    """A Zarr v3 ``zarr.json`` of an array."""

    zarr_format: Literal[3]
    node_type: Literal["array"]
    shape: tuple[Extent, ...]
    data_type: str
    chunk_grid: ChunkGrid
    chunk_key_encoding: ChunkKeyEncoding = ChunkKeyEncoding()
    fill_value: Number | None = None
    codecs: tuple[Codec, ...] = ()
    dimension_names: tuple[str | None, ...] | None = None

    @model_validator(mode="after")
    def _rank(self) -> "ZarrJsonDocument":
        if len(self.chunk_grid.configuration.chunk_shape) != len(self.shape):
            raise ValueError(
                f"chunk_shape has {len(self.chunk_grid.configuration.chunk_shape)} dimensions, shape {len(self.shape)}"
            )
        return self


@dataclass(frozen=True, slots=True)
class ZarrArray:
    """What a Zarr source serves from, decided once from its metadata document."""

    zarr_format: int
    shape: tuple[int, ...]  # source dims
    chunks: tuple[int, ...]  # the chunk grid (of shards, in a sharded array)
    inner_chunks: tuple[int, ...]  # the chunks that are decoded: inner chunks of a shard, or ``chunks``
    dtype: np.dtype  # served (a v2 array's as its .zarray names it)
    stored_dtype: np.dtype  # in the stored byte order
    fill_value: int | float
    stored_order: tuple[int, ...]  # the source dims from slowest to fastest in a chunk's bytes
    separator: str
    key_prefix: str  # "c" in v3's default chunk keys
    v2_compressor: dict[str, Any] | None
    v3_codecs: tuple[dict[str, Any], ...]  # bytes-to-bytes codecs of a (inner) chunk
    sharding: ShardLayout | None
    dimension_names: tuple[str | None, ...] | None

    @property
    def compressed(self) -> bool:
        """Whether a stored chunk's length may differ from its voxels' (a codec changes it)."""
        return self.v2_compressor is not None or bool(self.v3_codecs)

    @property
    def blosc(self) -> bool:
        """Whether a stored chunk is a Blosc frame as a whole (Blosc is its outermost codec)."""
        if self.v2_compressor is not None:
            return bool(self.v2_compressor.get("id") == "blosc")
        return bool(self.v3_codecs) and self.v3_codecs[-1].get("name") == "blosc"


def validation_reason(exc: ValidationError) -> str:
    """A pydantic error as one line that names each field."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'document'}: {e['msg']}" for e in exc.errors())


def _dtype(name: str) -> np.dtype:
    try:
        dtype = np.dtype(name)
    except TypeError:
        raise SourceError(f"unsupported data type {name!r:.40}") from None
    if dtype.kind not in "uif" or dtype.itemsize > 8:
        raise SourceError(f"unsupported data type {dtype}")
    return dtype


def _fill_value(value: int | float | None, dtype: np.dtype) -> int | float:
    """The fill value, if ``dtype`` can hold it exactly (an integer type: an integer in its range)."""
    if value is None:
        return 0
    if dtype.kind == "f":
        if abs(value) > np.finfo(dtype).max:
            raise SourceError(f"fill_value {value!r:.40} does not fit {dtype.name}")
        return value
    info = np.iinfo(dtype)
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # some writers say 0.0
    if not isinstance(value, int) or not info.min <= value <= info.max:
        raise SourceError(f"fill_value {value!r:.40} is not a {dtype.name} (from {info.min} to {info.max})")
    return value


def parse_document(model: type[_Model], document: dict[str, Any], name: str) -> Any:
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        raise SourceError(f"{name} is invalid: {validation_reason(exc)}") from None


def parse_zarray(document: dict[str, Any]) -> ZarrArray:
    """A Zarr v2 ``.zarray``; SourceError with the reason for one the gateway cannot serve."""
    parsed: ZarrayDocument = parse_document(ZarrayDocument, document, ".zarray")
    dtype = _dtype(parsed.dtype)
    rank = len(parsed.shape)
    stored_order = tuple(range(rank)) if parsed.order == "C" else tuple(reversed(range(rank)))
    compressor = None if parsed.compressor is None else parsed.compressor.model_dump(exclude_defaults=True)
    return ZarrArray(
        2,
        parsed.shape,
        parsed.chunks,
        parsed.chunks,
        dtype,
        dtype,
        _fill_value(parsed.fill_value, dtype),
        stored_order,
        parsed.dimension_separator,
        "",
        compressor,
        (),
        None,
        parsed.dimension_names,
    )


def _codec_chain(codecs: tuple[Codec, ...], rank: int) -> tuple[tuple[int, ...], str, tuple[dict[str, Any], ...]]:
    """(stored order, endian, bytes-to-bytes codecs) of a chain without sharding."""
    order: tuple[int, ...] | None = None
    endian: str | None = None
    rest: list[dict[str, Any]] = []
    for codec in codecs:
        config = codec.configuration or {}
        if codec.name == "transpose":
            if endian is not None or order is not None:
                raise SourceError("only one transpose, before 'bytes', is supported")
            wanted = config.get("order")
            if not isinstance(wanted, list) or sorted(wanted) != list(range(rank)):
                raise SourceError(f"transpose order {wanted!r:.80} is not a permutation of the {rank} dimensions")
            order = tuple(wanted)
        elif codec.name == "bytes":
            endian = config.get("endian", "little")
            if endian not in ("little", "big"):
                raise SourceError(f"bytes endian {endian!r:.40} is neither 'little' nor 'big'")
        elif codec.name in _V3_BYTES_CODECS and endian is not None:
            rest.append(codec.model_dump(exclude_defaults=True))
        else:
            raise SourceError(f"codec {codec.name!r:.40} is not supported here (or not after 'bytes')")
    if endian is None:
        raise SourceError("the codec chain has no 'bytes' codec")
    return order if order is not None else tuple(range(rank)), endian, tuple(rest)


def parse_zarr_json(document: dict[str, Any]) -> ZarrArray:
    """A Zarr v3 array ``zarr.json``; SourceError with the reason for one the gateway cannot serve."""
    if document.get("node_type") != "array":
        raise SourceError("zarr.json does not describe an array")
    parsed: ZarrJsonDocument = parse_document(ZarrJsonDocument, document, "zarr.json")
    if parsed.data_type not in _V3_DATA_TYPES:
        raise SourceError(f"unsupported data type {parsed.data_type!r:.40}")
    dtype = np.dtype(parsed.data_type)
    rank = len(parsed.shape)
    chunks = parsed.chunk_grid.configuration.chunk_shape
    encoding = parsed.chunk_key_encoding
    default = encoding.name == "default"
    separator = encoding.configuration.separator or ("/" if default else ".")
    codecs, inner, sharding = parsed.codecs, chunks, None
    if codecs and codecs[0].name == _SHARDING:
        if len(codecs) != 1:
            raise SourceError("codecs after sharding_indexed are not supported")
        config: ShardingConfiguration = parse_document(
            ShardingConfiguration, codecs[0].configuration or {}, "zarr.json sharding_indexed"
        )
        inner = config.chunk_shape
        index_codecs = [c.name for c in config.index_codecs]
        if index_codecs not in (["bytes"], ["bytes", "crc32c"]):
            raise SourceError(f"shard index codecs {index_codecs} are not supported")
        if len(inner) != rank or any(s % c for s, c in zip(chunks, inner)):
            raise SourceError("the shard shape is not a multiple of the inner chunk shape")
        sharding = ShardLayout(
            tuple(s // c for s, c in zip(chunks, inner)), config.index_location == "end", "crc32c" in index_codecs
        )
        codecs = config.codecs
    stored_order, endian, rest = _codec_chain(codecs, rank)
    return ZarrArray(
        3,
        parsed.shape,
        chunks,
        inner,
        dtype,
        dtype.newbyteorder("<" if endian == "little" else ">"),
        _fill_value(parsed.fill_value, dtype),
        stored_order,
        separator,
        "c" if default else "",
        None,
        rest,
        sharding,
        parsed.dimension_names,
    )


# --- N5 -------------------------------------------------------------------------------------------------

N5DataType = Literal["uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float32", "float64"]
N5_DATA_TYPES: tuple[str, ...] = get_args(N5DataType)


class N5Compression(_Model):
    """An N5 ``compression``: its ``type``, and the options of that type (kept as extras)."""

    type: str


class N5Attributes(_Model):
    """An N5 dataset's ``attributes.json`` (``compression`` spelled as N5 2 does it)."""

    dimensions: tuple[Extent, ...] = Field(min_length=1)
    block_size: tuple[Edge, ...] = Field(alias="blockSize")
    data_type: N5DataType = Field(alias="dataType")
    compression: N5Compression
    axes: tuple[str, ...] | None = None

    @model_validator(mode="after")
    def _rank(self) -> "N5Attributes":
        if len(self.block_size) != len(self.dimensions):
            raise ValueError(f"blockSize has {len(self.block_size)} dimensions, dimensions {len(self.dimensions)}")
        return self


# --- Neuroglancer precomputed ---------------------------------------------------------------------------

PrecomputedDataType = Literal["uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "float32"]


class PrecomputedSharding(_Model):
    """A scale's ``neuroglancer_uint64_sharded_v1`` sharding as its ``info`` states it."""

    type: Literal["neuroglancer_uint64_sharded_v1"] = Field(alias="@type")
    preshift_bits: Bits
    hash: Literal["identity", "murmurhash3_x86_128"]
    minishard_bits: Bits
    shard_bits: Bits
    minishard_index_encoding: Literal["raw", "gzip"] = "raw"
    data_encoding: Literal["raw", "gzip"] = "raw"

    @model_validator(mode="after")
    def _bits(self) -> "PrecomputedSharding":
        if self.minishard_bits + self.shard_bits > 64:
            raise ValueError("minishard_bits and shard_bits add up to more than 64")
        return self


class PrecomputedScale(_Model):
    """One scale of a precomputed volume (a mag)."""

    key: str
    size: tuple[Edge, Edge, Edge]
    voxel_offset: tuple[Offset, Offset, Offset] = (0, 0, 0)
    chunk_sizes: tuple[tuple[Edge, Edge, Edge], ...] = Field(min_length=1)
    sharding: PrecomputedSharding | None = None


class PrecomputedInfo(_Model):
    """A precomputed volume's ``info``; its scales are parsed one at a time (a mag is one of them)."""

    data_type: PrecomputedDataType
    num_channels: Annotated[int, Field(strict=True, ge=1)]
    scales: tuple[dict[str, Any], ...]

    def scale(self, key: str, name: str) -> PrecomputedScale:
        """The scale of ``key``; SourceError if there is none or it is invalid."""
        for scale in self.scales:
            if scale.get("key") == key:
                parsed: PrecomputedScale = parse_document(PrecomputedScale, scale, f"{name} scale {key!r}")
                return parsed
        raise SourceError(f"{name} has no scale with key {key!r} (the last component of the mag's path)")
