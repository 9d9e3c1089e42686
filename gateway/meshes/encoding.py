"""The bytes of Neuroglancer's precomputed mesh formats, as its format documents define them.

- ``neuroglancer_multilod_draco``: an ``info`` JSON, a binary manifest ``{id}.index`` per segment and a
  data file ``{id}`` that concatenates Draco-encoded fragments. Each vertex coordinate is an integer in
  ``[0, 2**bits)`` relative to its fragment's cube; Neuroglancer reads them without Draco's
  dequantization, so they are handed to Draco as quantized values whose grid is the identity
  (``quantization_range = 2**bits - 1`` from the origin 0).
- ``neuroglancer_legacy_mesh``: ``{id}:0`` JSON manifests listing fragment files, each a little-endian
  u32 vertex count, f32 ``x, y, z`` positions in nanometers, then u32 triangle indices.
- ``neuroglancer_segment_properties``: an ``info`` JSON with the ids and their inline properties.
"""

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway_storage.geometry import Vec3

from ..extras import MESHES
from .geometry import Level
from .surfaces import Surface

QUANTIZATION_BITS = 16
_QUANTIZED_MAX = (1 << QUANTIZATION_BITS) - 1
DRACO_COMPRESSION_LEVEL = 7
JSON_SEPARATORS = (",", ":")


def json_bytes(document: object) -> bytes:
    return json.dumps(document, separators=JSON_SEPARATORS, sort_keys=True).encode()


def multires_info(voxel_nm: tuple[float, float, float], properties: str | None) -> dict[str, Any]:
    """The multi-resolution ``info``: stored model space is mag-1 voxel faces, scaled to nanometers."""
    sx, sy, sz = voxel_nm
    info: dict[str, Any] = {
        "@type": "neuroglancer_multilod_draco",
        "vertex_quantization_bits": QUANTIZATION_BITS,
        "transform": [sx, 0, 0, 0, 0, sy, 0, 0, 0, 0, sz, 0],
        "lod_scale_multiplier": 1.0,
    }
    if properties is not None:
        info["segment_properties"] = properties
    return info


def legacy_info(properties: str | None) -> dict[str, Any]:
    info: dict[str, Any] = {"@type": "neuroglancer_legacy_mesh"}
    if properties is not None:
        info["segment_properties"] = properties
    return info


def quantize(surface: Surface, level: Level, position: Vec3) -> np.ndarray:
    """Vertices as integers of the fragment's quantization box: the cube, half a voxel down (``vertex_offset``)."""
    lo, _ = level.box(position)
    extent = np.asarray(level.cube_voxels, dtype=np.float64)
    relative = surface.vertices - (np.asarray(lo, dtype=np.float64) - 0.5)
    scaled = np.floor(relative / extent * _QUANTIZED_MAX + 0.5)
    return np.clip(scaled, 0, _QUANTIZED_MAX).astype(np.uint32)


def draco_fragment(surface: Surface, level: Level, position: Vec3) -> bytes:
    """One fragment, Draco-encoded; empty bytes for no triangles (Neuroglancer reads size 0 as an empty node)."""
    if surface.empty:
        return b""
    MESHES.require("meshes")
    import DracoPy

    points = quantize(surface, level, position).astype(np.float64)
    return bytes(
        DracoPy.encode(
            points,
            surface.faces,
            quantization_bits=QUANTIZATION_BITS,
            quantization_range=float(_QUANTIZED_MAX),
            quantization_origin=np.zeros(3),
            compression_level=DRACO_COMPRESSION_LEVEL,
        )
    )


@dataclass(frozen=True, slots=True)
class LevelFragments:
    """The fragments of one level of detail, in Z-curve order, and their encoded bytes."""

    level: Level
    positions: list[Vec3]
    fragments: list[bytes]


def multires_manifest(chunk_shape: Vec3, levels: Sequence[LevelFragments]) -> bytes:
    """``{id}.index``: chunk shape, grid origin, the levels' scales and vertex offsets, then per level the
    fragment positions (a ``[3, n]`` array) and sizes."""
    count = len(levels)
    parts = [
        struct.pack("<3f", *chunk_shape),
        struct.pack("<3f", 0.0, 0.0, 0.0),
        struct.pack("<I", count),
        struct.pack(f"<{count}f", *(float(1 << lf.level.lod) for lf in levels)),
        struct.pack(f"<{3 * count}f", *(o for lf in levels for o in lf.level.vertex_offset)),
        struct.pack(f"<{count}I", *(len(lf.positions) for lf in levels)),
    ]
    for lf in levels:
        positions = np.asarray(lf.positions, dtype="<u4").reshape(-1, 3)
        parts.append(np.ascontiguousarray(positions.T).tobytes())
        parts.append(np.asarray([len(f) for f in lf.fragments], dtype="<u4").tobytes())
    return b"".join(parts)


def empty_manifest(chunk_shape: Vec3) -> bytes:
    """The manifest of a segment with no voxels: one level without fragments, what Neuroglancer draws as nothing."""
    return b"".join(
        [
            struct.pack("<3f", *chunk_shape),
            struct.pack("<3f", 0.0, 0.0, 0.0),
            struct.pack("<I", 1),
            struct.pack("<f", 1.0),
            struct.pack("<3f", 0.0, 0.0, 0.0),
            struct.pack("<I", 0),
        ]
    )


def legacy_fragment(surface: Surface, mag: Vec3, voxel_nm: tuple[float, float, float]) -> bytes:
    """A legacy fragment: vertex count, nanometer positions, triangles."""
    scale = np.asarray(mag, dtype=np.float64) * np.asarray(voxel_nm, dtype=np.float64)
    positions = (surface.vertices * scale).astype("<f4")
    return b"".join(
        [
            struct.pack("<I", len(positions)),
            positions.tobytes(),
            np.asarray(surface.faces, dtype="<u4").tobytes(),
        ]
    )


def segment_properties(
    ids: np.ndarray, voxels: np.ndarray, labels: dict[int, str], members: np.ndarray | None = None
) -> dict[str, Any]:
    """Inline properties: every id with its voxel count (a number Neuroglancer sorts by), the segments it joins
    where it is an agglomerate of a mapped layer, and, where the dataset names segments, a label (which its
    segment list shows and searches)."""
    numbers = "uint32" if len(voxels) == 0 or int(voxels.max()) < (1 << 32) else "float32"
    properties: list[dict[str, Any]] = []
    if labels:
        properties.append({"id": "label", "type": "label", "values": [labels.get(int(i), "") for i in ids]})
    properties.append(
        {
            "id": "voxels",
            "type": "number",
            "data_type": numbers,
            "description": "voxels of the segment at the finest mag",
            "values": [int(v) for v in voxels],
        }
    )
    if members is not None:
        properties.append(
            {
                "id": "members",
                "type": "number",
                "data_type": "uint32" if len(members) == 0 or int(members.max()) < (1 << 32) else "float32",
                "description": "segments of the source layer the agglomerate joins",
                "values": [int(m) for m in members],
            }
        )
    return {
        "@type": "neuroglancer_segment_properties",
        "inline": {"ids": [str(int(i)) for i in ids], "properties": properties},
    }
