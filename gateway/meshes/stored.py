"""Stored mesh sets: a layer's multi-resolution meshes made ahead, per block, and served as they were written.

A set is a directory beside the layer's segment index (``<layer>.meshes/`` at its
:class:`~gateway.meshes.segments.IndexPlace`) in Neuroglancer's sharded multi-resolution format, as igneous writes it:

- ``info``: ``neuroglancer_multilod_draco`` with a ``sharding`` of ``neuroglancer_uint64_sharded_v1``
  (:mod:`gateway.shard_formats.neuroglancer_sharded`, read as precomputed volumes' shards are), keyed by
  segment id;
- ``<shard>.shard``: per segment its manifest as the chunk, its fragment data just before it;
- ``stamp.json``, written last: the data stamp the set was made from and the size of every file above. A set
  without it is incomplete (being written, or a run that failed); a set whose stamp is not the data's is stale.
  Neither is ever served.

The work is split into blocks (:func:`plan_blocks`): a *fine* block is one cube of level ``block_lod`` and makes
every fragment of levels ``0..block_lod`` inside it, a *coarse* block one cube of a coarser level. Each reads a
window once and meshes every segment in it with the code of on-demand meshes (:func:`surfaces.window_surface`,
:func:`encoding.draco_fragment`), so the fragments are the same bytes. Levels up to ``block_lod`` list the
positions on-demand meshing lists (from the level-0 cubes that hold a segment); coarse blocks find segments in
their own windows, and every position's parent is listed (as an empty fragment where it had none), so each
segment's octree is whole.

Every read of a set is bounded and goes through a store; a crafted file is a storage fault with the reason.
"""

import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway_storage import FileIdentity, Store
from gateway_storage.faults import Unavailable
from gateway_storage.geometry import Vec3

from ..shard_formats.neuroglancer_sharded import ShardChunk, ShardError, Sharding, sharding_document
from ..sources.bounds import read_document
from ..sources.mag import SourceError
from ..sources.metadata import PrecomputedSharding
from ..sources.precomputed_source import read_minishard_index, sharding_of
from .budget import MeshBudget
from .encoding import LevelFragments, draco_fragment, json_bytes, multires_info, multires_manifest
from .errors import MeshTooLarge, MeshTooSlow
from .geometry import Level, MeshGrid, morton_key
from .surfaces import Surface, read_window, window_of, window_surface

FORMAT = "zarr-gateway-mesh-set"
VERSION = 1
INFO = "info"
STAMP = "stamp.json"
# A fine block holds at most this many voxels of the finest mag (256^3 at mag 1: 64 level-0 cubes, levels 0-2).
BLOCK_VOXELS = 1 << 24
# One block's fragments are held until the block is done: past this the block fails with the reason (a 256^3 block
# of the sample's kind of tissue, 148 segments, made 3 MiB).
MAX_BLOCK_OUTPUT_BYTES = 64 << 20
# Marching cubes and simplification per voxel of a window, on top of the window and its mask: zmesh 1.15 peaked
# at 134-146 bytes per voxel over its baseline on dense surfaces (26,000 triangles in a 65^3 window).
MESHER_BYTES_PER_VOXEL = 160
# Shards hold about this much, so that assembling one (where the run was started) holds about this much.
TARGET_SHARD_BYTES = 256 << 20
# Bounds of what is read from a stored set (all of it may be crafted).
MAX_MANIFEST_BYTES = 64 << 20  # 16 bytes per fragment: four million fragments
MAX_RANGE_READ_BYTES = 8 << 20  # a range of fragment data is sent in pieces of 4 MiB
MAX_LEVELS = 32  # levels of detail of a manifest (the grid makes at most 11)


class MeshSetCorrupt(ShardError):
    """A stored mesh set whose files are not of its format, or not those its stamp lists: a storage fault."""


class MeshSetBlockFailed(Unavailable, RuntimeError):
    """A block of a mesh set could not be made; the message names the block and the reason."""


# --- blocks ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BlockPlan:
    """One block: the cube at ``position`` of level ``lod``; fine (``lod == block_lod``) or coarse."""

    lod: int
    position: Vec3

    @property
    def key(self) -> str:
        return f"{self.lod}_{self.position[0]}_{self.position[1]}_{self.position[2]}"


def block_lod(grid: MeshGrid, block_voxels: int = BLOCK_VOXELS) -> int:
    """The coarsest level whose cube holds at most ``block_voxels`` voxels of the finest mag (level 0 at least)."""
    finest = grid.finest.mag
    chosen = 0
    for level in grid.levels:
        size = level.cube_size
        if (size[0] // finest[0]) * (size[1] // finest[1]) * (size[2] // finest[2]) <= block_voxels:
            chosen = level.lod
    return chosen


def plan_blocks(grid: MeshGrid, fine_lod: int) -> list[BlockPlan]:
    """Every fine block (each cube of level ``fine_lod`` over the level-0 cubes), then every cube of each coarser
    level."""
    cubes = grid.cubes_of_finest()
    plans = []
    for level in grid.levels[fine_lod:]:
        shift = level.lod
        positions = sorted({(x >> shift, y >> shift, z >> shift) for x, y, z in cubes}, key=morton_key)
        plans += [BlockPlan(level.lod, position) for position in positions]
    return plans


@dataclass(frozen=True, slots=True)
class SkippedFragment:
    """A segment's fragment a block could not make within a mesh request's bounds (a pattern past the surface
    bound even two times coarser, too many triangles, too slow): left out of the set, and listed by the run."""

    segment: int
    lod: int
    position: Vec3
    reason: str


@dataclass(frozen=True, slots=True)
class FragmentRecord:
    segment: int
    lod: int
    position: Vec3
    data: bytes


def _where(level: Level, lo: Vec3, hi: Vec3) -> str:
    return f"the box {lo}..{hi} of mag {'-'.join(map(str, level.mag))}"


def _segments_in(window: np.ndarray, keep: np.ndarray | None = None) -> list[int]:
    """The segments of ``window`` (of those in the sorted ``keep`` only, where a run selects some)."""
    ids = np.unique(window)
    ids = ids[ids > 0]
    if keep is not None:
        ids = ids[np.isin(ids.astype(np.uint64), keep, assume_unique=True)]
    return [int(i) for i in ids]


def _level_fragments(
    level: Level, position: Vec3, segments: Iterable[int], skipped: list[SkippedFragment]
) -> Iterator[FragmentRecord]:
    """The fragment of each of ``segments`` at ``position`` of ``level``: its parts' windows read once for all."""
    parts = level.parts(position)
    windows = [read_window(level.source, *window_of(lo, hi)) for lo, hi in parts]
    for segment in segments:
        budget = MeshBudget(f"segment {segment} at level {level.lod} {position}")
        try:
            budget.check_time()
            surfaces = [
                window_surface(window, segment, lo, _where(level, lo, hi), budget)
                for window, (lo, hi) in zip(windows, parts)
            ]
        except (MeshTooLarge, MeshTooSlow) as exc:
            skipped.append(SkippedFragment(segment, level.lod, position, str(exc)))
            continue
        fragment = draco_fragment(Surface.concatenate(surfaces), level, position)
        yield FragmentRecord(segment, level.lod, position, fragment)


def make_block(
    grid: MeshGrid,
    plan: BlockPlan,
    fine_lod: int,
    keep: np.ndarray | None = None,
    skipped: list[SkippedFragment] | None = None,
) -> list[FragmentRecord]:
    """Every fragment of a block. A fine block meshes each level-0 cube's segments (those of its window) and, at
    levels ``1..fine_lod``, at each position the segments of the level-0 cubes below it; a coarse block the
    segments its own windows hold. ``keep``: the only segments meshed (sorted uint64), where a run selects some.
    A fragment past a mesh request's bounds is left out and added to ``skipped``."""
    left_out: list[SkippedFragment] = [] if skipped is None else skipped
    if plan.lod > fine_lod:
        level = grid.levels[plan.lod]
        found: set[int] = set()
        for lo, hi in level.parts(plan.position):
            found.update(_segments_in(read_window(level.source, *window_of(lo, hi)), keep))
        return list(_level_fragments(level, plan.position, sorted(found), left_out))
    records: list[FragmentRecord] = []
    span = 1 << plan.lod
    first = grid.levels[0]
    members: dict[Vec3, list[int]] = {}
    limits = [(min(r), max(r) + 1) for r in zip(*grid.cubes_of_finest())]
    for cube in _cubes_of(plan.position, span, limits):
        lo, hi = first.box(cube)
        window = read_window(first.source, *window_of(lo, hi))
        segments = _segments_in(window, keep)
        if segments:
            members[cube] = segments
        records += _level_fragments_of_window(first, cube, window, segments, left_out)
        _check_output(records, plan)
    for level in grid.levels[1 : fine_lod + 1]:
        shift = level.lod
        above: dict[Vec3, set[int]] = {}
        for (x, y, z), segments in members.items():
            above.setdefault((x >> shift, y >> shift, z >> shift), set()).update(segments)
        for position in sorted(above, key=morton_key):
            records += _level_fragments(level, position, sorted(above[position]), left_out)
            _check_output(records, plan)
    return records


def _level_fragments_of_window(
    level: Level, cube: Vec3, window: np.ndarray, segments: list[int], skipped: list[SkippedFragment]
) -> Iterator[FragmentRecord]:
    """The level-0 fragments of one cube, from the window already read (to find its segments)."""
    lo, hi = level.box(cube)
    for segment in segments:
        budget = MeshBudget(f"segment {segment} at level 0 {cube}")
        try:
            surface = window_surface(window, segment, lo, _where(level, lo, hi), budget)
        except (MeshTooLarge, MeshTooSlow) as exc:
            skipped.append(SkippedFragment(segment, 0, cube, str(exc)))
            continue
        yield FragmentRecord(segment, 0, cube, draco_fragment(Surface.concatenate([surface]), level, cube))


def _cubes_of(position: Vec3, span: int, limits: list[tuple[int, int]]) -> list[Vec3]:
    ranges = [range(max(p * span, lo), min((p + 1) * span, hi)) for p, (lo, hi) in zip(position, limits)]
    return [(x, y, z) for z in ranges[2] for y in ranges[1] for x in ranges[0]]


def _check_output(records: list[FragmentRecord], plan: BlockPlan) -> None:
    held = sum(len(r.data) for r in records)
    if held > MAX_BLOCK_OUTPUT_BYTES:
        raise MeshSetBlockFailed(
            f"block {plan.key} makes more than {MAX_BLOCK_OUTPUT_BYTES} bytes of fragments: its blocks are too "
            "large for its segments' surfaces (make them smaller)"
        )


def block_memory_bytes(grid: MeshGrid) -> int:
    """The most one block holds at once: the windows of one position (eight octants above level 0) decoded, their
    masks and the mesher's work, and the fragments made so far (at most ``MAX_BLOCK_OUTPUT_BYTES``)."""
    most = 0
    for level in grid.levels:
        parts = level.parts((0, 0, 0))
        shapes = [(hi[0] - lo[0] + 1, hi[1] - lo[1] + 1, hi[2] - lo[2] + 1) for lo, hi in parts]
        decoded = sum(level.source.decoded_bytes(shape) for shape in shapes)
        voxels = max(s[0] * s[1] * s[2] for s in shapes)
        most = max(most, decoded + voxels * (2 + MESHER_BYTES_PER_VOXEL))
    return most + MAX_BLOCK_OUTPUT_BYTES


# --- a block's output: its fragments as bytes ---------------------------------------------------------

_OUTPUT_MAGIC = b"ZGMESH01"
_RECORD = np.dtype([("segment", "<u8"), ("lod", "<u4"), ("position", "<u4", (3,)), ("size", "<u8")])


def encode_block_output(records: list[FragmentRecord]) -> bytes:
    table = np.zeros(len(records), dtype=_RECORD)
    for row, record in zip(table, records):
        row["segment"], row["lod"], row["position"], row["size"] = (
            record.segment,
            record.lod,
            record.position,
            len(record.data),
        )
    return b"".join([_OUTPUT_MAGIC, struct.pack("<Q", len(records)), table.tobytes(), *(r.data for r in records)])


def decode_block_output(data: bytes, origin: str) -> list[FragmentRecord]:
    """A block's output read back; anything that is not one is refused (it is read from the run's work directory)."""
    head = len(_OUTPUT_MAGIC) + 8
    if len(data) < head or not data.startswith(_OUTPUT_MAGIC):
        raise MeshSetCorrupt(f"the output of block {origin} is not a block of a mesh set")
    (count,) = struct.unpack_from("<Q", data, len(_OUTPUT_MAGIC))
    if count * _RECORD.itemsize > len(data) - head:
        raise MeshSetCorrupt(f"the output of block {origin} lists more fragments than it holds")
    table = np.frombuffer(data, dtype=_RECORD, count=count, offset=head)
    at = head + count * _RECORD.itemsize
    if at + int(table["size"].astype(object).sum()) != len(data):
        raise MeshSetCorrupt(f"the output of block {origin} is not as long as its fragments")
    records = []
    for row in table:
        size = int(row["size"])
        position = (int(row["position"][0]), int(row["position"][1]), int(row["position"][2]))
        records.append(FragmentRecord(int(row["segment"]), int(row["lod"]), position, data[at : at + size]))
        at += size
    return records


# --- a segment's files ---------------------------------------------------------------------------------


def segment_chunk(grid: MeshGrid, segment: int, fragments: dict[tuple[int, Vec3], bytes]) -> ShardChunk:
    """A segment's manifest (the chunk) and its fragment data (before it), from its fragments by level and
    position; every level is listed, and every position's parent (an empty fragment where it has none)."""
    by_level: list[dict[Vec3, bytes]] = [{} for _ in grid.levels]
    for (lod, position), data in fragments.items():
        if not 0 <= lod < len(by_level):
            raise MeshSetCorrupt(f"a fragment of segment {segment} is of level {lod}, which the layer lacks")
        by_level[lod][position] = data
    for lod in range(1, len(by_level)):
        for x, y, z in list(by_level[lod - 1]):
            by_level[lod].setdefault((x >> 1, y >> 1, z >> 1), b"")
    levels = []
    for level, found in zip(grid.levels, by_level):
        positions = sorted(found, key=morton_key)
        levels.append(LevelFragments(level, positions, [found[p] for p in positions]))
    manifest = multires_manifest(grid.chunk_shape, levels)
    return ShardChunk(segment, manifest, b"".join(f for lf in levels for f in lf.fragments))


def set_info(voxel_nm: tuple[float, float, float], sharding: Sharding) -> bytes:
    return json_bytes({**multires_info(voxel_nm, None), "sharding": sharding_document(sharding)})


def stamp_document(layer: str, stamp: str, files: dict[str, int], selection: dict[str, Any] | None = None) -> bytes:
    """``stamp.json``: what the set was made from, the size of each of its files, and the segments a run selected
    (None: every one)."""
    document = {"format": FORMAT, "version": VERSION, "layer": layer, "stamp": stamp, "files": files}
    return json_bytes(document if selection is None else {**document, "selection": selection})


# --- reading a set ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SetState:
    """A layer's stored set as found now: ``fresh`` (servable) or why not (``exists``: a stale or incomplete set)."""

    fresh: "StoredSet | None"
    exists: bool
    why: str


ABSENT = SetState(None, False, "absent")


@dataclass(frozen=True, slots=True)
class StoredSegment:
    """A segment in a fresh set: its manifest, and where its fragment data lies in which version of its shard."""

    manifest: bytes
    shard: str
    identity: FileIdentity
    data_start: int
    data_size: int
    name: str  # the shard below its root, for ETags


class StoredSet:
    """A fresh set's sharding and file sizes; looks up segments through the store."""

    def __init__(self, store: Store, directory: str, sharding: Sharding, files: dict[str, int], version: str) -> None:
        self.store = store
        self.directory = directory
        self.sharding = sharding
        self.files = files
        self.version = version  # of stamp.json: what cache entries of this set are keyed by

    def segment(self, segment: int) -> StoredSegment | None:
        """The segment's manifest and data, or None if the set holds no mesh of it (it has no voxels)."""
        shard, minishard = self.sharding.locate(segment)
        name = self.sharding.shard_name(shard)
        path = self.store.join(self.directory, name)
        identity = self.store.identity(path)
        if identity is None:
            if name in self.files:
                raise MeshSetCorrupt(f"shard {name} of the mesh set is missing")
            return None  # a shard without any segment is not written
        where = self.store.relative(path)
        if identity.size != self.files.get(name):
            raise MeshSetCorrupt(f"{where} holds {identity.size} bytes, not the {self.files.get(name)} its stamp lists")
        place = read_minishard_index(self.store, path, identity, self.sharding, minishard, where).get(segment)
        if place is None:
            return None
        start, size = place
        manifest = self._read(path, start, size, identity, MAX_MANIFEST_BYTES)
        data_size = manifest_data_size(manifest, f"the manifest of segment {segment} in {where}")
        if data_size > start - self.sharding.index_bytes:
            raise MeshSetCorrupt(f"the fragments of segment {segment} in {where} would start before its data")
        return StoredSegment(manifest, path, identity, start - data_size, data_size, where)

    def _read(self, path: str, offset: int, size: int, identity: FileIdentity, limit: int) -> bytes:
        # Written whole and renamed into place, and listed by a stamp written after them: no read waits to settle.
        return self.store.read(path, offset, size, identity, limit=limit, settled=False)

    def reader(self, found: StoredSegment) -> Callable[[int, int], bytes]:
        """Bytes ``[start, end)`` of a segment's fragment data, read from its shard (that version only)."""

        def read(start: int, end: int) -> bytes:
            return self._read(found.shard, found.data_start + start, end - start, found.identity, MAX_RANGE_READ_BYTES)

        return read


def manifest_data_size(manifest: bytes, what: str) -> int:
    """The sum of a manifest's fragment sizes, once its layout is checked: the length of its fragment data."""
    try:
        (lods,) = struct.unpack_from("<I", manifest, 24)
        if lods > MAX_LEVELS:
            raise ValueError(f"{lods} levels of detail")
        counts = np.frombuffer(manifest, "<u4", lods, 28 + 16 * lods).tolist()
        at = 28 + 20 * lods
        total = 0
        for count in counts:
            total += int(np.frombuffer(manifest, "<u4", count, at + 12 * count).astype(np.int64).sum())
            at += 16 * count
    except (struct.error, ValueError) as exc:
        raise MeshSetCorrupt(f"{what} is not a multi-resolution manifest: {exc}") from None
    if at != len(manifest):
        raise MeshSetCorrupt(f"{what} is not a multi-resolution manifest ({len(manifest)} bytes, {at} expected)")
    return total


class StoredMeshes:
    """The stored sets of a data root's layers, found through the store of their place; holds caches only."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._opened: dict[str, tuple[FileIdentity, Any]] = {}

    def state(self, directory: str, stamp: str) -> SetState:
        """The set in ``directory``: fresh if its stamp is ``stamp`` (the data's now), else why not."""
        stamp_path = self.store.join(directory, STAMP)
        identity = self.store.identity(stamp_path)
        if identity is None:
            if self.store.is_directory(directory):
                return SetState(None, True, "incomplete (it has no stamp: it is being written, or its run failed)")
            return ABSENT
        cached = self._opened.get(directory)
        if cached is None or cached[0] != identity:
            cached = (identity, self._open(directory, stamp_path))
            self._opened[directory] = cached
        made_from, sharding, files = cached[1]
        if made_from != stamp:
            return SetState(None, True, "stale (made from another version of the data)")
        return SetState(StoredSet(self.store, directory, sharding, files, identity.version), True, "fresh")

    def _open(self, directory: str, stamp_path: str) -> tuple[str, Sharding, dict[str, int]]:
        stamp = self._document(stamp_path)
        files = stamp.get("files")
        if (
            stamp.get("format") != FORMAT
            or stamp.get("version") != VERSION
            or not isinstance(stamp.get("stamp"), str)
            or not isinstance(files, dict)
            or not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in files.items())
        ):
            raise MeshSetCorrupt(f"{self.store.relative(stamp_path)} is not a {FORMAT} stamp of version {VERSION}")
        info_path = self.store.join(directory, INFO)
        info_identity = self.store.identity(info_path)
        if info_identity is None or info_identity.size != files.get(INFO):
            raise MeshSetCorrupt(f"{self.store.relative(info_path)} is not the info its stamp lists")
        info = self._document(info_path)
        if info.get("@type") != "neuroglancer_multilod_draco":
            raise MeshSetCorrupt(f"{self.store.relative(info_path)} is not a neuroglancer_multilod_draco info")
        try:
            sharding = sharding_of(PrecomputedSharding.model_validate(info.get("sharding")))
        except (ValueError, SourceError) as exc:
            raise MeshSetCorrupt(f"{self.store.relative(info_path)}: its sharding is not one: {exc}") from None
        if sharding.data_gzip:
            raise MeshSetCorrupt(f"{self.store.relative(info_path)}: its manifests must be raw (data_encoding)")
        return stamp["stamp"], sharding, files

    def _document(self, path: str) -> dict[str, Any]:
        """A JSON object of the set, read as every document of the data root is (strict, bounded)."""
        where = self.store.relative(path)
        try:
            found = read_document(self.store, path, where)
        except SourceError as exc:
            raise MeshSetCorrupt(str(exc)) from None
        if found is None:
            raise MeshSetCorrupt(f"{where} vanished while it was read")
        return found[0]
