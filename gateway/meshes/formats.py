"""The two precomputed mesh formats, each the files below its directory of a layer.

- ``multires/``: ``info``, ``{id}.index`` (manifest), ``{id}`` (the fragments, read by byte range), from the
  layer's stored mesh set where it has a fresh one (:mod:`gateway.meshes.stored`), else made on demand;
- ``legacy/``: ``info``, ``{id}:0`` (a JSON list of fragments), ``{id}:0:{x}_{y}_{z}`` (one level-0 cube);

and in both ``segment_properties/info`` (the same document). A format is given what one request needs
(:class:`MeshWork`) and answers each file as a :class:`Resource` (its body or a reader of its ranges, and an
ETag); it never calls back into the service.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from gateway_storage.geometry import Vec3

from ..extras import MESHES
from ..resources import JSON, OCTET_STREAM, Resource, bytes_resource, make_etag
from .budget import MeshBudget
from .cache import LegacyKey, MeshCache, MultiresKey, StoredKey
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
from .errors import MeshInputError, MeshNotFound, MeshTooLarge, StoredMeshesRequired
from .geometry import Level, MeshGrid, morton_key
from .layers import LayerMeshes
from .names import parse_cube, parse_segment_id
from .segments import Segments
from .stored import ABSENT, SetState, StoredMeshes, StoredSegment, StoredSet
from .surfaces import Surface, holds_surface, request_bytes, segment_surface, window_of

# Voxels read to make one segment's multi-resolution mesh on demand (every level), the default of the
# ``multires_voxels`` setting: beyond it a segment is served from a fresh stored mesh set, or gets on demand the
# coarse levels whose reads fit it (only where even its coarsest level does not is its manifest a 413, 409 where
# the stored set is stale, that points to `mesh-segments` and to the legacy source, one cube per request).
MULTIRES_VOXELS = 128 << 20
PROPERTIES_DIRECTORY = "segment_properties"
PROPERTIES_INFO = f"{PROPERTIES_DIRECTORY}/info"


@dataclass(frozen=True, slots=True)
class MeshWork:
    """What one request for a file of a layer's mesh source has to work with."""

    meshes: LayerMeshes
    segments: Segments
    cache: MeshCache
    budget: MeshBudget
    stored: StoredMeshes
    multires_voxels: int = MULTIRES_VOXELS

    def stored_set(self) -> SetState:
        """The layer's stored mesh set as it is now (fresh only if made from the data as it is now)."""
        place = self.segments.place
        if not place.holds_indexes():
            return ABSENT  # a directory no run has made
        directory = place.mesh_set(self.meshes.dataset, self.meshes.name)
        return self.stored.state(directory, self.segments.stamp(self.meshes))


def layer_segment_id(meshes: LayerMeshes, text: str) -> int:
    """A segment id of the URL that the layer's labels can hold: an id past its data type (say 300 in a uint8
    layer) is a 400, not an empty mesh, so a client that asks for the wrong layer is told."""
    segment = parse_segment_id(text)
    dtype = meshes.grid.finest.dtype
    if segment > np.iinfo(dtype).max:
        raise MeshInputError(
            f"{segment} is not a segment id of layer {meshes.name!r}: its labels are {dtype.name}, "
            f"ids up to {np.iinfo(dtype).max}"
        )
    return segment


class MeshSource(ABC):
    """One precomputed mesh format: its ``info``, the segment properties, and the files of its own."""

    name: str

    @abstractmethod
    def info(self, meshes: LayerMeshes, properties: str | None) -> dict[str, Any]:
        """The source's ``info`` document."""

    @abstractmethod
    def own_file(self, work: MeshWork, name: str) -> Resource:
        """A file other than ``info`` and the segment properties; a 400 for a name it cannot have."""

    @abstractmethod
    def levels(self, grid: MeshGrid) -> list[Level]:
        """The levels of detail whose windows a request for one of its files may read (what it costs)."""

    def most_bytes(self, grid: MeshGrid, name: str) -> int:
        """The most a request for ``name`` may hold, from the metadata alone (the worst case, refused at once past
        the whole budget): nothing for the ``info`` and the segment properties, which mesh nothing (their cost
        follows their files' sizes: :meth:`file_bytes`)."""
        return 0 if name in ("info", PROPERTIES_INFO) else self.own_most_bytes(grid, name)

    @abstractmethod
    def own_most_bytes(self, grid: MeshGrid, name: str) -> int:
        """:meth:`most_bytes` of a file of its own."""

    def file_bytes(self, work: MeshWork, name: str) -> int:
        """What answering ``name`` holds at most, from sizes and metadata alone (stats, the index's directory,
        whether the boxes meshed hold stored chunks): what it holds of the worker's memory budget. Blocking."""
        if name == PROPERTIES_INFO:
            return work.segments.properties_bytes(work.meshes)
        try:
            if name == "info":
                return work.segments.index_bytes(work.meshes)[0]  # whether segments can be listed reads the index
            return self.own_file_bytes(work, name)
        except (MeshInputError, MeshNotFound):
            return 0  # a name it cannot have: answered as such

    @abstractmethod
    def own_file_bytes(self, work: MeshWork, name: str) -> int:
        """:meth:`file_bytes` of a file of its own."""

    def file(self, work: MeshWork, name: str) -> Resource:
        """The file ``name`` below the source's directory; none without the meshes extra, so that no ``info``
        advertises a source whose fragments could not be made."""
        MESHES.require("meshes")
        if name == "info":
            properties = PROPERTIES_DIRECTORY if work.segments.can_list(work.meshes) else None
            return bytes_resource(json_bytes(self.info(work.meshes, properties)), JSON)
        if name == PROPERTIES_INFO:
            return bytes_resource(work.segments.properties(work.meshes), JSON)
        return self.own_file(work, name)


class MultiresSource(MeshSource):
    """``neuroglancer_multilod_draco``: ``{id}.index`` and ``{id}``. From a fresh stored set, the manifest and the
    fragment data passed through (ETags of the shard's version); else made together on demand (the manifest holds
    every fragment's size) and cached: a level of detail per mag, and coarser ones past the coarsest mag
    (:class:`~gateway.meshes.geometry.MeshGrid`); a segment too large for all of them gets its coarse levels."""

    name = "multires"

    def info(self, meshes: LayerMeshes, properties: str | None) -> dict[str, Any]:
        return multires_info(meshes.voxel_nm, properties)

    def levels(self, grid: MeshGrid) -> list[Level]:
        return grid.levels

    def own_most_bytes(self, grid: MeshGrid, name: str) -> int:
        return request_bytes(self.levels(grid))  # every level, as many boxes as a segment may span

    def own_file_bytes(self, work: MeshWork, name: str) -> int:
        """Nothing meshed for a segment of a fresh stored set; else the index, and unless the index held already
        does not list the segment, every level's windows and the surface of each box that holds stored chunks
        (all of them where the index is not held yet)."""
        segment = layer_segment_id(work.meshes, name.removesuffix(".index"))
        if work.stored_set().fresh is not None:
            return 0
        held = work.segments.held(work.meshes)
        if held is None:
            return work.segments.index_bytes(work.meshes)[0] + request_bytes(self.levels(work.meshes.grid))
        entry = held.lookup(segment)
        if entry is None:
            return 0
        boxes = 0
        for level in work.meshes.grid.levels:
            positions = {(x >> level.lod, y >> level.lod, z >> level.lod) for x, y, z in entry.cubes}
            boxes += sum(holds_surface(level.source, lo, hi) for p in positions for lo, hi in level.parts(p))
        return request_bytes(self.levels(work.meshes.grid), boxes)

    def own_file(self, work: MeshWork, name: str) -> Resource:
        segment = layer_segment_id(work.meshes, name.removesuffix(".index"))
        manifest_asked = name.endswith(".index")
        state = work.stored_set()
        if state.fresh is not None:
            return self._stored(work, state.fresh, segment, manifest_asked)
        manifest, data = self._files(work, segment, state)
        return bytes_resource(manifest if manifest_asked else data, OCTET_STREAM)

    @staticmethod
    def _stored(work: MeshWork, stored: StoredSet, segment: int, manifest_asked: bool) -> Resource:
        """A segment's file from a fresh stored set: a segment it lacks has no voxels (an empty manifest)."""
        found: StoredSegment | None = work.cache.made(
            StoredKey(work.meshes.key, stored.version, segment),
            lambda: stored.segment(segment),
            lambda entry: 256 + (0 if entry is None else len(entry.manifest)),
        )
        if found is None:
            return bytes_resource(empty_manifest(work.meshes.grid.chunk_shape) if manifest_asked else b"", OCTET_STREAM)
        tag = ("stored-mesh", found.name, found.identity.version, segment, found.data_start, found.data_size)
        if manifest_asked:
            return bytes_resource(found.manifest, OCTET_STREAM, make_etag(*tag, "manifest"))
        return Resource(
            found.data_size,
            make_etag(*tag, "data"),
            OCTET_STREAM,
            reader=stored.reader(found),
            local_reads=stored.store.is_local,
        )

    def _files(self, work: MeshWork, segment: int, state: SetState) -> tuple[bytes, bytes]:
        meshes = work.meshes
        index = work.segments.index(meshes)
        entry = index.lookup(segment)
        if entry is None:
            return empty_manifest(meshes.grid.chunk_shape), b""
        cubes = entry.cubes
        return work.cache.made(
            MultiresKey(meshes.key, index.stamp, segment),
            lambda: self._make(meshes, segment, cubes, work, state),
            lambda files: len(files[0]) + len(files[1]) + 64,
        )

    @staticmethod
    def _make(
        meshes: LayerMeshes, segment: int, cubes: list[Vec3], work: MeshWork, state: SetState
    ) -> tuple[bytes, bytes]:
        """The segment's manifest and fragments: every level whose reads fit ``multires_voxels`` (together). A
        segment too large for all of them gets its coarse levels (:meth:`_levels_within`; the manifest's chunk
        shape is then its finest level's cube, as the format places fragments at ``chunk_shape * 2**lod``), so a
        viewer shows it at once; a stored set, once made, serves every level."""
        grid = meshes.grid
        plans = []
        for level in grid.levels:
            shift = level.lod
            positions = sorted({(x >> shift, y >> shift, z >> shift) for x, y, z in cubes}, key=morton_key)
            plans.append((level, positions))
        reads = [len(positions) * level.read_voxels for level, positions in plans]
        first, last = MultiresSource._levels_within(reads, work.multires_voxels)
        if last < 0:
            MultiresSource._refuse(meshes, segment, cubes, work, state, min(reads))
        levels = []
        for level, positions in plans[first : last + 1]:
            fragments = []
            for position in positions:
                parts = [
                    segment_surface(level.source, segment, lo, hi, work.budget) for lo, hi in level.parts(position)
                ]
                fragments.append(draco_fragment(Surface.concatenate(parts), level, position))
            levels.append(LevelFragments(level, positions, fragments))
        manifest = multires_manifest(levels[0].level.cube_size, levels)
        return manifest, b"".join(f for lf in levels for f in lf.fragments)

    @staticmethod
    def _levels_within(reads: list[int], bound: int) -> tuple[int, int]:
        """The levels ``first..last`` to make, given each one's reads: the coarsest level that fits the bound alone,
        and the finer ones below it while all fit together (``last`` is -1 where no level fits). A level made
        coarser by mode reads more than the stored one below it, so the coarsest may be left out."""
        for last in range(len(reads) - 1, -1, -1):
            total = reads[last]
            if total > bound:
                continue
            first = last
            while first > 0 and total + reads[first - 1] <= bound:
                first -= 1
                total += reads[first]
            return first, last
        return 0, -1

    @staticmethod
    def _refuse(
        meshes: LayerMeshes, segment: int, cubes: list[Vec3], work: MeshWork, state: SetState, voxels: int
    ) -> NoReturn:
        """No level fits: a 413 that points to `mesh-segments` (a 409 where the set is stale)."""
        dataset = f"{meshes.dataset.organization}/{meshes.dataset.name}"
        command = f"zarr-gateway mesh-segments ROOT {dataset} {meshes.name}"
        why = (
            f"segment {segment} spans {len(cubes)} cubes: its level of detail that reads least would read {voxels} "
            f"voxels, more than the {work.multires_voxels} one request may"
        )
        if state.exists:
            raise StoredMeshesRequired(f"{why}, and the layer's stored mesh set is {state.why}: run `{command}`")
        raise MeshTooLarge(
            f"{why}; `{command}` stores the layer's meshes, and the legacy source "
            f"(.../{meshes.name}/legacy/) makes its mesh one cube per request"
        )


class LegacySource(MeshSource):
    """``neuroglancer_legacy_mesh``: ``{id}:0`` lists the segment's level-0 cubes, ``{id}:0:{x}_{y}_{z}`` is one
    of them, meshed when asked for (at the finest mag)."""

    name = "legacy"

    def info(self, meshes: LayerMeshes, properties: str | None) -> dict[str, Any]:
        return legacy_info(properties)

    def levels(self, grid: MeshGrid) -> list[Level]:
        return grid.levels[:1]  # its fragments are level-0 cubes

    def own_most_bytes(self, grid: MeshGrid, name: str) -> int:
        """A fragment meshes one box of level 0; the list of a segment's cubes meshes none."""
        return request_bytes(self.levels(grid), 1) if name.partition(":")[2].startswith("0:") else 0

    def own_file_bytes(self, work: MeshWork, name: str) -> int:
        """A fragment: its cube's window, and its surface where the window holds stored chunks; the list of a
        segment's cubes: the index."""
        segment_text, _, rest = name.partition(":")
        if not rest.startswith("0:"):
            return work.segments.index_bytes(work.meshes)[0]
        layer_segment_id(work.meshes, segment_text)
        level = work.meshes.grid.levels[0]
        lo, hi = level.box(parse_cube(rest[2:], name))
        return request_bytes([level], int(holds_surface(level.source, lo, hi)))

    def own_file(self, work: MeshWork, name: str) -> Resource:
        segment_text, sep, rest = name.partition(":")
        if sep != ":" or not (rest == "0" or rest.startswith("0:")):
            raise MeshInputError(
                f"{name!r} is not a legacy mesh file: they are {{id}}:0 and {{id}}:0:{{x}}_{{y}}_{{z}}"
            )
        segment = layer_segment_id(work.meshes, segment_text)
        if rest == "0":
            entry = work.segments.index(work.meshes).lookup(segment)
            cubes = [] if entry is None else entry.cubes
            return bytes_resource(json_bytes({"fragments": [f"{segment}:0:{x}_{y}_{z}" for x, y, z in cubes]}), JSON)
        return bytes_resource(self._fragment(work, segment, parse_cube(rest[2:], name)), OCTET_STREAM)

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
