"""A layer's stored mesh set (gateway/meshes/stored.py) as a block task: each block makes its fragments, and
``finish`` groups them per segment into manifests and shards, written into the set's directory, then the stamp.

Here, not in ``gateway/meshes``: the set is written to files, which the meshes package never does itself (it
reads only through stores). The task holds descriptions (root, names, directory) and opens the layer on the
worker, once per process.
"""

import json
import shutil
import struct
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gateway_storage import Store, open_store

from ..meshes.cache import MeshCache
from ..meshes.errors import MeshInputError
from ..meshes.index import data_stamp
from ..meshes.layers import LayerMeshes
from ..meshes.segments import Segments, index_place
from ..meshes.selection import EVERY_SEGMENT, SegmentSelection
from ..meshes.stored import (
    INFO,
    STAMP,
    TARGET_SHARD_BYTES,
    BlockPlan,
    FragmentRecord,
    MeshSetBlockFailed,
    MeshSetCorrupt,
    SkippedFragment,
    block_lod,
    block_memory_bytes,
    decode_block_output,
    encode_block_output,
    make_block,
    plan_blocks,
    segment_chunk,
    set_info,
    stamp_document,
)
from ..shard_formats.neuroglancer_sharded import ShardChunk, encode_shard, sharding_for
from .segment_index import SegmentLayer
from .tasks import Block, BlockMissing, box_voxels

INDEX_CACHE_BYTES = 2 << 30  # room for the layer's index while a dust threshold is decided on it
SPILL = "zarr-gateway-spill-"  # a scratch directory while ``finish`` sorts fragments by shard
MAX_SET_FILES = 1_000_000  # files of an earlier set looked at to remove its shards
# A block's output: this, the length of a JSON list of the fragments it left out, that list, then its fragments.
_SKIPPED_MAGIC = b"ZGSKIP01"


_opened: dict[tuple[str, str, str, str], LayerMeshes] = {}
_opening = threading.Lock()


@dataclass(frozen=True)
class MeshSetTask:
    """The stored mesh set of one segmentation layer, written to ``directory``.

    ``fine_lod``: the level of a fine block's cube (None: the coarsest whose cube holds at most
    ``BLOCK_VOXELS`` finest voxels); levels above it are made one cube per block. ``selection`` and ``keep``:
    the segments a run selected (see :mod:`gateway.meshes.selection`) and, resolved, the only ids meshed.
    """

    root: str
    organization: str
    dataset: str
    layer: str
    directory: str
    fine_lod: int | None = None
    selection: SegmentSelection = EVERY_SEGMENT
    keep: tuple[int, ...] | None = None
    index_dir: str | None = None  # the ``segment_index_dir`` the set is written below (None: beside the layer)
    name: str = field(default="meshes", init=False)
    # What the last ``finish`` left out, for the run to list: fragments past a request's bounds, failed blocks.
    skipped: list[SkippedFragment] = field(default_factory=list, init=False, compare=False, repr=False)
    failed_blocks: list[BlockMissing] = field(default_factory=list, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        key = self.selection.key()  # the outputs of a run with another selection are kept apart
        object.__setattr__(self, "name", f"meshes-{key}" if key else "meshes")

    @classmethod
    def for_layer(
        cls,
        root: str,
        dataset: str,
        layer: str,
        index_dir: str | None = None,
        selection: SegmentSelection = EVERY_SEGMENT,
    ) -> "MeshSetTask":
        """The task whose set the gateway serves: at the layer's index place (``segment_index_dir`` or beside it).
        A dust threshold is decided on the layer's segment index (current, or a small layer scanned here):
        SegmentIndexRequired where it has none."""
        organization, _, name = dataset.partition("/")
        storage, meshes = SegmentLayer(root, organization, name, layer).open()
        place = index_place(storage, index_dir)
        directory = place.mesh_set(meshes.dataset, layer)
        keep = selection.ids
        if selection.needs_voxels:
            index = Segments(storage, place, MeshCache(INDEX_CACHE_BYTES)).index(meshes)
            keep = tuple(int(i) for i in index.ids[selection.keeps(index.ids, index.voxels)])
        return cls(root, organization, name, layer, directory, selection=selection, keep=keep, index_dir=index_dir)

    def target(self) -> Store:
        """The store the set is written through: the data root's (a local directory or a bucket), or the
        ``segment_index_dir``'s."""
        storage = open_store(self.root)
        return index_place(storage, self.index_dir).store

    def meshes(self) -> LayerMeshes:
        """The layer, opened once per process."""
        key = (self.root, self.organization, self.dataset, self.layer)
        with _opening:
            found = _opened.get(key)
            if found is None:
                found = _opened[key] = SegmentLayer(*key).open()[1]
            return found

    @property
    def _fine_lod(self) -> int:
        grid = self.meshes().grid
        return block_lod(grid) if self.fine_lod is None else min(self.fine_lod, len(grid.levels) - 1)

    def version(self) -> str:
        stamp = data_stamp(self.meshes().layer.mags)
        if stamp is None:
            raise MeshInputError(f"layer {self.layer!r} lies in a store that cannot be listed: it has no data stamp")
        return stamp

    def blocks(self) -> Sequence[Block]:
        grid = self.meshes().grid
        found = []
        for plan in plan_blocks(grid, self._fine_lod):
            size = grid.levels[plan.lod].cube_size
            lo = (plan.position[0] * size[0], plan.position[1] * size[1], plan.position[2] * size[2])
            found.append(Block(plan.key, lo, (lo[0] + size[0], lo[1] + size[1], lo[2] + size[2])))
        return found

    def memory_bytes(self) -> int:
        return block_memory_bytes(self.meshes().grid)

    def voxels(self, block: Block) -> int:
        """A fine block's box (mag-1 voxels, a whole cube of its level) cut to the finest mag's bounding box, in
        that mag's voxels; a coarse block reads coarser mags of voxels the fine blocks counted: none."""
        if int(block.key.split("_")[0]) > self._fine_lod:
            return 0
        finest = self.meshes().grid.finest
        box = finest.bbox
        mag = finest.mag
        lo = tuple(max(block.lo[a] // mag[a], box.lo[a]) for a in range(3))
        hi = tuple(min(-(-block.hi[a] // mag[a]), box.hi[a]) for a in range(3))
        return box_voxels((lo[0], lo[1], lo[2]), (hi[0], hi[1], hi[2]))

    def run(self, block: Block) -> bytes:
        lod, x, y, z = (int(part) for part in block.key.split("_"))
        skipped: list[SkippedFragment] = []
        try:
            keep = None if self.keep is None else np.asarray(self.keep, dtype=np.uint64)
            records = make_block(self.meshes().grid, BlockPlan(lod, (x, y, z)), self._fine_lod, keep, skipped)
        except MeshSetBlockFailed:
            raise
        except Exception as exc:
            raise MeshSetBlockFailed(
                f"block {block.key} ({block.lo}..{block.hi}) of layer {self.layer!r}: {type(exc).__name__}: {exc}"
            ) from exc
        listed = json.dumps([[s.segment, s.lod, list(s.position), s.reason] for s in skipped]).encode()
        return b"".join([_SKIPPED_MAGIC, struct.pack("<Q", len(listed)), listed, encode_block_output(records)])

    def _records(self, outputs: Callable[[Block], bytes], block: Block) -> list[FragmentRecord]:
        """A block's fragments from its output (its skipped fragments are read by :meth:`_skipped_of`)."""
        return decode_block_output(_split_output(outputs(block), block.key)[1], block.key)

    def _kept_blocks(self, outputs: Callable[[Block], bytes]) -> list[Block]:
        """The blocks with an output, noting those that failed in this run and the fragments the others left out."""
        self.skipped.clear()
        self.failed_blocks.clear()
        kept = []
        for block in self.blocks():
            try:
                listed = _split_output(outputs(block), block.key)[0]
            except BlockMissing as missing:
                self.failed_blocks.append(missing)
                continue
            self.skipped.extend(listed)
            kept.append(block)
        return kept

    def finish(self, outputs: Callable[[Block], bytes]) -> str:
        """Group every block's fragments by shard (spilled to files, so one shard is held at a time), write the
        shards and the info, then the stamp: until it is written the set is incomplete and never served."""
        meshes = self.meshes()
        version = self.version()
        blocks = self._kept_blocks(outputs)
        segments: set[int] = set()
        total = 0
        for block in blocks:
            for record in self._records(outputs, block):
                segments.add(record.segment)
                total += len(record.data)
        sharding = sharding_for(len(segments), total, TARGET_SHARD_BYTES)
        store, target = self.target(), self.directory
        store.delete(store.join(target, STAMP))  # from here on the set is incomplete
        for listed in store.list_files(target, MAX_SET_FILES) or []:
            if "/" not in listed.path and listed.path.endswith(".shard"):
                store.delete(store.join(target, listed.path))
        spill = Path(tempfile.mkdtemp(prefix=SPILL))  # a local scratch directory, wherever the set goes
        try:
            for block in blocks:
                by_shard: dict[int, list[FragmentRecord]] = {}
                for record in self._records(outputs, block):
                    by_shard.setdefault(sharding.locate(record.segment)[0], []).append(record)
                for shard, members in by_shard.items():
                    encoded = encode_block_output(members)
                    with open(spill / str(shard), "ab") as out:
                        out.write(len(encoded).to_bytes(8, "little") + encoded)
            files = {}
            for part in sorted(spill.iterdir(), key=lambda p: int(p.name)):
                name = sharding.shard_name(int(part.name))
                body = encode_shard(sharding, self._chunks(meshes, part))
                store.write(store.join(target, name), body)
                files[name] = len(body)
                part.unlink()
        finally:
            shutil.rmtree(spill, ignore_errors=True)
        info = set_info(meshes.voxel_nm, sharding)
        store.write(store.join(target, INFO), info)
        files[INFO] = len(info)
        if self.version() != version:
            raise MeshSetBlockFailed(f"the files of layer {self.layer!r} changed while its meshes were made: run again")
        selection = None if self.selection.everything else self.selection.describe()
        store.write(store.join(target, STAMP), stamp_document(self.layer, version, files, selection))
        return target

    @staticmethod
    def _chunks(meshes: LayerMeshes, part: Path) -> list[ShardChunk]:
        """The segments of one shard from its spill file: each one's fragments by level and position."""
        data = part.read_bytes()
        fragments: dict[int, dict[tuple[int, tuple[int, int, int]], bytes]] = {}
        at = 0
        while at < len(data):
            size = int.from_bytes(data[at : at + 8], "little")
            for record in decode_block_output(data[at + 8 : at + 8 + size], part.name):
                fragments.setdefault(record.segment, {})[record.lod, record.position] = record.data
            at += 8 + size
        return [segment_chunk(meshes.grid, segment, fragments[segment]) for segment in sorted(fragments)]


def _split_output(data: bytes, origin: str) -> tuple[list[SkippedFragment], bytes]:
    """A block's output as its skipped fragments and its encoded fragments; refused unless it is one."""
    head = len(_SKIPPED_MAGIC) + 8
    if len(data) < head or not data.startswith(_SKIPPED_MAGIC):
        raise MeshSetCorrupt(f"the output of block {origin} is not a block of a mesh set")
    (size,) = struct.unpack_from("<Q", data, len(_SKIPPED_MAGIC))
    try:
        listed = json.loads(data[head : head + size])
        skipped = [
            SkippedFragment(int(s), int(lod), (int(p[0]), int(p[1]), int(p[2])), str(r)) for s, lod, p, r in listed
        ]
    except (ValueError, TypeError, IndexError) as exc:
        raise MeshSetCorrupt(f"the output of block {origin} lists its skipped fragments wrongly: {exc}") from None
    return skipped, data[head + size :]
