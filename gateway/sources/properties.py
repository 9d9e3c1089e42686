"""Pydantic models of ``datasource-properties.json`` as webknossos-libs writes it.

Unknown keys are kept (``extra="allow"``) so that the rewritten file a client
reads back carries everything the original said.
"""

import math
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway_storage.geometry import Box, Vec3, parse_mag

from .paths import is_plain_name

ELEMENT_CLASSES: dict[str, tuple[str, int]] = {
    "uint8": ("uint8", 1),
    "uint16": ("uint16", 1),
    "uint24": ("uint8", 3),
    "uint32": ("uint32", 1),
    "uint48": ("uint16", 3),  # what webknossos-libs writes for 3 channels of uint16
    "uint64": ("uint64", 1),
    "int8": ("int8", 1),
    "int16": ("int16", 1),
    "int32": ("int32", 1),
    "int64": ("int64", 1),
    "float": ("float32", 1),
    "double": ("float64", 1),
}


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class DatasetId(_Model):
    name: str
    team: str = ""


class VoxelSize(_Model):
    factor: tuple[float, float, float]
    unit: str = "nanometer"

    @field_validator("factor")
    @classmethod
    def _positive(cls, factor: tuple[float, float, float]) -> tuple[float, float, float]:
        if not all(math.isfinite(f) and f > 0 for f in factor):
            raise ValueError("voxel size factors must be positive finite numbers")
        return factor


# webKnossos stores bounding boxes as 32-bit integers; a larger extent is no real dataset, and arrays and
# coordinates as long as it would be absurd.
MAX_EXTENT = 2**31 - 1


class BoundingBox(_Model):
    top_left: Vec3 = Field(alias="topLeft")
    width: int = Field(ge=0)
    height: int = Field(ge=0)
    depth: int = Field(ge=0)

    @model_validator(mode="after")
    def _served_extent(self) -> "BoundingBox":
        if any(t < 0 for t in self.top_left):
            raise ValueError(
                f"topLeft {list(self.top_left)} is negative: a Zarr array starts at voxel 0, so it cannot be served"
            )
        end = self.box.hi
        if any(e > MAX_EXTENT for e in end):
            raise ValueError(f"the bounding box ends at {list(end)}, past the largest extent {MAX_EXTENT}")
        return self

    @property
    def size(self) -> Vec3:
        return (self.width, self.height, self.depth)

    @property
    def box(self) -> Box:
        """The bounding box in mag-1 voxels."""
        return Box.sized(self.top_left, self.size)


class MagEntry(_Model):
    mag: Vec3
    path: str | None = None
    axis_order: dict[str, int] | None = Field(default=None, alias="axisOrder")

    @field_validator("mag", mode="before")
    @classmethod
    def _mag(cls, value: Any) -> Vec3:
        return parse_mag(value)


class WkwResolution(_Model):
    resolution: Vec3
    cube_length: int = Field(default=1024, alias="cubeLength")

    @field_validator("resolution", mode="before")
    @classmethod
    def _mag(cls, value: Any) -> Vec3:
        return parse_mag(value)


class DataLayer(_Model):
    name: str = Field(min_length=1)
    category: Literal["color", "segmentation"]
    bounding_box: BoundingBox = Field(alias="boundingBox")
    element_class: Literal[tuple(ELEMENT_CLASSES)] = Field(alias="elementClass")  # type: ignore[valid-type]
    data_format: Literal["wkw", "zarr", "zarr3", "n5", "neuroglancerPrecomputed"] = Field(alias="dataFormat")
    num_channels: int | None = Field(default=None, alias="numChannels", ge=1)
    mags: list[MagEntry] | None = None
    wkw_resolutions: list[WkwResolution] | None = Field(default=None, alias="wkwResolutions")
    largest_segment_id: int | None = Field(default=None, alias="largestSegmentId")

    @field_validator("name")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        if not is_plain_name(name):
            raise ValueError(f"layer name {name!r} must be a plain directory name")
        return name

    @model_validator(mode="after")
    def _has_mags(self) -> "DataLayer":
        if not self.mags and not self.wkw_resolutions:
            raise ValueError(f"layer {self.name!r} lists no mags (neither 'mags' nor 'wkwResolutions')")
        return self

    @property
    def dtype(self) -> np.dtype:
        """The dtype of one channel."""
        return np.dtype(ELEMENT_CLASSES[self.element_class][0])

    @property
    def channels(self) -> int:
        if self.num_channels is not None:
            return self.num_channels
        return ELEMENT_CLASSES[self.element_class][1]

    def mag_entries(self) -> list[MagEntry]:
        """Mags in the modern form, whichever form the file used, finest first."""
        entries = self.mags or [MagEntry(mag=r.resolution) for r in self.wkw_resolutions or []]
        return sorted(entries, key=lambda e: max(e.mag))


class DatasourceProperties(_Model):
    id: DatasetId
    scale: VoxelSize
    data_layers: list[DataLayer] = Field(alias="dataLayers")

    @field_validator("scale", mode="before")
    @classmethod
    def _legacy_scale(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return {"factor": value, "unit": "nanometer"}
        return value

    @model_validator(mode="after")
    def _unique_layers(self) -> "DatasourceProperties":
        names = [layer.name for layer in self.data_layers]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate layer names: {', '.join(duplicates)}")
        return self
