"""The two precomputed mesh formats, each the files below its directory of a layer.

- ``multires/``: ``info``, ``{id}.index`` (manifest), ``{id}`` (the fragments, read by byte range);
- ``legacy/``: ``info``, ``{id}:0`` (a JSON list of fragments), ``{id}:0:{x}_{y}_{z}`` (one level-0 cube);

and in both ``segment_properties/info`` (the same document). A format is given what one request needs
(:class:`MeshWork`) and makes its files from it; it never calls back into the service.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from gateway_storage.geometry import Vec3

from .budget import MeshBudget
from .cache import LegacyKey, MeshCache, MultiresKey
from .encoding import (
    LevelFragments,
    draco_fragment,
    empty_manifest,
    json_bytes,
    legacy_fragment,
    legacy_info,
    multires_info,
    multires_manifest,
)
from .errors import MeshInputError, MeshNotFound, MeshTooLarge
from .geometry import morton_key
from .layers import LayerMeshes
from .names import parse_cube, parse_segment_id
from .segments import Segments
from .surfaces import Surface, segment_surface, window_of

# Voxels read to make one segment's multi-resolution mesh (every level): beyond it a manifest is a 413
# that points to the legacy source, whose fragments are made one cube per request.
MULTIRES_VOXELS = 128 << 20
PROPERTIES_DIRECTORY = "segment_properties"
PROPERTIES_INFO = f"{PROPERTIES_DIRECTORY}/info"
OCTET_STREAM = "application/octet-stream"
JSON = "application/json"


@dataclass(frozen=True, slots=True)
class MeshFile:
    body: bytes
    media_type: str


@dataclass(frozen=True, slots=True)
class MeshWork:
    """What one request for a file of a layer's mesh source has to work with."""

    meshes: LayerMeshes
    segments: Segments
    cache: MeshCache
    budget: MeshBudget


class MeshSource(ABC):
    """One precomputed mesh format: its ``info``, the segment properties, and the files of its own."""

    name: str

    @abstractmethod
    def info(self, meshes: LayerMeshes, properties: str | None) -> dict[str, Any]:
        """The source's ``info`` document."""

    @abstractmethod
    def own_file(self, work: MeshWork, name: str) -> MeshFile:
        """A file other than ``info`` and the segment properties; a 400 for a name it cannot have."""

    def file(self, work: MeshWork, name: str) -> MeshFile:
        """The file ``name`` below the source's directory."""
        if name == "info":
            properties = PROPERTIES_DIRECTORY if work.segments.can_list(work.meshes) else None
            return MeshFile(json_bytes(self.info(work.meshes, properties)), JSON)
        if name == PROPERTIES_INFO:
            return MeshFile(work.segments.properties(work.meshes), JSON)
        return self.own_file(work, name)


class MultiresSource(MeshSource):
    """``neuroglancer_multilod_draco``: ``{id}.index`` and ``{id}``, made together (the manifest holds every
    fragment's size) and cached; one level of detail per mag."""

    name = "multires"

    def info(self, meshes: LayerMeshes, properties: str | None) -> dict[str, Any]:
        return multires_info(meshes.voxel_nm, properties)

    def own_file(self, work: MeshWork, name: str) -> MeshFile:
        manifest, data = self._files(work, parse_segment_id(name.removesuffix(".index")))
        return MeshFile(manifest if name.endswith(".index") else data, OCTET_STREAM)

    def _files(self, work: MeshWork, segment: int) -> tuple[bytes, bytes]:
        meshes = work.meshes
        index = work.segments.index(meshes)
        entry = index.lookup(segment)
        if entry is None:
            return empty_manifest(meshes.grid.chunk_shape), b""
        cubes = entry.cubes
        return work.cache.made(
            MultiresKey(meshes.key, index.stamp, segment),
            lambda: self._make(meshes, segment, cubes, work.budget),
            lambda files: len(files[0]) + len(files[1]) + 64,
        )

    @staticmethod
    def _make(meshes: LayerMeshes, segment: int, cubes: list[Vec3], budget: MeshBudget) -> tuple[bytes, bytes]:
        grid = meshes.grid
        plans = []
        work = 0
        for level in grid.levels:
            shift = level.lod
            positions = sorted({(x >> shift, y >> shift, z >> shift) for x, y, z in cubes}, key=morton_key)
            edge = level.cube_voxels
            work += len(positions) * (edge[0] + 1) * (edge[1] + 1) * (edge[2] + 1)
            plans.append((level, positions))
        if work > MULTIRES_VOXELS:
            raise MeshTooLarge(
                f"segment {segment} spans {len(cubes)} cubes: its multi-resolution mesh would read {work} voxels, "
                f"more than the {MULTIRES_VOXELS} one request may; the legacy source "
                f"(.../{meshes.name}/legacy/) makes its mesh one cube per request"
            )
        levels = []
        for level, positions in plans:
            fragments = []
            for position in positions:
                parts = [segment_surface(level.source, segment, lo, hi, budget) for lo, hi in level.parts(position)]
                fragments.append(draco_fragment(Surface.concatenate(parts), level, position))
            levels.append(LevelFragments(level, positions, fragments))
        manifest = multires_manifest(grid.chunk_shape, levels)
        return manifest, b"".join(f for lf in levels for f in lf.fragments)


class LegacySource(MeshSource):
    """``neuroglancer_legacy_mesh``: ``{id}:0`` lists the segment's level-0 cubes, ``{id}:0:{x}_{y}_{z}`` is one
    of them, meshed when asked for (at the finest mag)."""

    name = "legacy"

    def info(self, meshes: LayerMeshes, properties: str | None) -> dict[str, Any]:
        return legacy_info(properties)

    def own_file(self, work: MeshWork, name: str) -> MeshFile:
        segment_text, sep, rest = name.partition(":")
        if sep != ":" or not (rest == "0" or rest.startswith("0:")):
            raise MeshInputError(
                f"{name!r} is not a legacy mesh file: they are {{id}}:0 and {{id}}:0:{{x}}_{{y}}_{{z}}"
            )
        segment = parse_segment_id(segment_text)
        if rest == "0":
            entry = work.segments.index(work.meshes).lookup(segment)
            cubes = [] if entry is None else entry.cubes
            return MeshFile(json_bytes({"fragments": [f"{segment}:0:{x}_{y}_{z}" for x, y, z in cubes]}), JSON)
        return MeshFile(self._fragment(work, segment, parse_cube(rest[2:], name)), OCTET_STREAM)

    @staticmethod
    def _fragment(work: MeshWork, segment: int, cube: Vec3) -> bytes:
        meshes = work.meshes
        level = meshes.grid.levels[0]
        lo, hi = level.box(cube)
        window_lo, _ = window_of(lo, hi)
        if any(w >= b for w, b in zip(window_lo, level.source.bbox.hi)):
            raise MeshNotFound(f"cube {cube} lies outside layer {meshes.name!r}")

        def make() -> bytes:
            surface = segment_surface(level.source, segment, lo, hi, work.budget)
            return legacy_fragment(surface, level.mag, meshes.voxel_nm)

        return work.cache.made(LegacyKey(meshes.key, work.segments.stamp(meshes), segment, cube), make, len)


MESH_SOURCES: dict[str, MeshSource] = {source.name: source for source in (MultiresSource(), LegacySource())}
