"""The ``info`` document of a precomputed volume: a typed model, rendered in one place (:func:`render_info`)."""

import json
from dataclasses import dataclass

from gateway_storage.geometry import Vec3

from .encodings import ChunkEncoding


@dataclass(frozen=True, slots=True)
class Scale:
    """One mag as a scale: its voxels ``[voxel_offset, voxel_offset + size)`` on a grid of ``chunk_size``."""

    key: str
    size: Vec3
    voxel_offset: Vec3
    resolution: tuple[float, float, float]  # nanometers per voxel
    chunk_size: Vec3
    encoding: ChunkEncoding

    @property
    def end(self) -> Vec3:
        return (
            self.voxel_offset[0] + self.size[0],
            self.voxel_offset[1] + self.size[1],
            self.voxel_offset[2] + self.size[2],
        )


@dataclass(frozen=True, slots=True)
class VolumeInfo:
    """A layer as a precomputed volume; ``mesh`` and ``segment_properties`` name sibling directories."""

    type: str  # "image" or "segmentation"
    data_type: str
    num_channels: int
    scales: tuple[Scale, ...]
    mesh: str | None = None
    segment_properties: str | None = None


def render_info(info: VolumeInfo) -> bytes:
    """The ``info`` file: the one place the model becomes JSON (keys sorted, so replicas agree byte for byte)."""
    document: dict[str, object] = {
        "@type": "neuroglancer_multiscale_volume",
        "type": info.type,
        "data_type": info.data_type,
        "num_channels": info.num_channels,
        "scales": [
            {
                "key": scale.key,
                "size": list(scale.size),
                "voxel_offset": list(scale.voxel_offset),
                "resolution": list(scale.resolution),
                "chunk_sizes": [list(scale.chunk_size)],
                "encoding": scale.encoding.name,
                **scale.encoding.scale_fields,
            }
            for scale in info.scales
        ],
    }
    if info.mesh is not None:
        document["mesh"] = info.mesh
    if info.segment_properties is not None:
        document["segment_properties"] = info.segment_properties
    return json.dumps(document, sort_keys=True).encode()
