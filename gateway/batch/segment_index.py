"""The segment index of a layer (gateway/meshes/index.py) as a block task: a block is a box of level-0 cubes
(``gateway.meshes.build.index_boxes``), its output that box's part of the index, and ``finish`` assembles the
parts into the same bytes the one-process build makes, written where the gateway reads indexes."""

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

from gateway_storage import Store, open_store
from gateway_storage.faults import Absent

from ..meshes.build import BLOCK_CUBES, assemble_parts, box_cubes, box_memory_bytes, check_indexable, index_boxes
from ..meshes.index import IndexPart, data_stamp, index_cubes
from ..meshes.layers import LayerMeshes, MeshLayers
from ..meshes.selection import EVERY_SEGMENT, SegmentSelection
from ..sources.catalog import Catalog
from ..sources.dataset import BrokenDataset, Dataset
from ..sources.registry import SourceFormats
from .tasks import Block, box_voxels

SOURCE_CACHE_BYTES = 128 << 20  # the source formats' metadata cache of each process that opens the layer
OPENED_LAYERS = 4  # layers (at a data version) each worker process keeps open between blocks


class DatasetNotFound(Absent, LookupError):
    """No servable dataset of that name under the data root; the message says why."""


def open_dataset(root: str, organization: str, name: str) -> tuple[Store, Dataset]:
    storage = open_store(root)
    dataset = Catalog(storage, SourceFormats(storage, SOURCE_CACHE_BYTES)).dataset(organization, name)
    if dataset is None or isinstance(dataset, BrokenDataset):
        reason = f": {dataset.reason}" if dataset else ""
        raise DatasetNotFound(f"no servable dataset {organization + '/' + name!r} under {root}{reason}")
    return storage, dataset


@dataclass(frozen=True, slots=True)
class SegmentLayer:
    """A segmentation layer by where it lies: what a worker opens (once per process and data version)."""

    root: str
    organization: str
    dataset: str
    layer: str

    def open(self) -> tuple[Store, LayerMeshes]:
        """Its store and meshes; :class:`DatasetNotFound`, or the meshes' 400 and 404 errors, for none."""
        storage, dataset = open_dataset(self.root, self.organization, self.dataset)
        return storage, MeshLayers().layer(dataset, self.layer)


_opened: dict[tuple[SegmentLayer, str], tuple[Store, LayerMeshes]] = {}
_opening = threading.Lock()


def opened(layer: SegmentLayer, version: str) -> tuple[Store, LayerMeshes]:
    """The layer as this process opened it for ``version``: its mags' files stay open from block to block."""
    with _opening:
        found = _opened.get((layer, version))
        if found is None:
            while len(_opened) >= OPENED_LAYERS:
                del _opened[next(iter(_opened))]
            found = _opened[layer, version] = layer.open()
        return found


class SegmentIndexTask:
    """Index one layer block by block; ``finish`` writes the index (atomically) to ``location``."""

    name = "segment-index"

    def __init__(
        self,
        layer: SegmentLayer,
        storage: Store,
        meshes: LayerMeshes,
        location: str,
        block_cubes: int = BLOCK_CUBES,
        selection: SegmentSelection = EVERY_SEGMENT,
        target: Store | None = None,
    ) -> None:
        """``storage`` and ``meshes``: the layer as ``layer.open()`` gave them here. Every block is indexed whole
        (a dust threshold needs each segment's voxels over all blocks); ``selection`` is applied to the whole.
        ``target``: the store ``location`` is written through (the data root's, or the ``segment_index_dir``'s)."""
        check_indexable(meshes.grid)
        self.layer = layer
        self._target = storage if target is None else target
        self.selection = selection
        self.location = location
        self.block_cubes = block_cubes
        self.stamp = data_stamp(meshes.layer.mags)
        # Data in a store that cannot list has no stamp: its outputs are this run's only, never resumed from.
        self._version = self.stamp or f"unstamped-{id(self):x}-{threading.get_native_id()}"
        _opened[layer, self._version] = (storage, meshes)
        self.segments = 0  # of the index written, once finished

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in vars(self).items() if k not in ("blocks_cache", "_target")}  # workers never write it

    @property
    def _meshes(self) -> LayerMeshes:
        return opened(self.layer, self._version)[1]

    def version(self) -> str:
        return self._version

    @cached_property
    def blocks_cache(self) -> list[Block]:
        return [
            Block("_".join(map(str, position)), lo, hi)
            for position, lo, hi in index_boxes(self._meshes.grid, self.block_cubes)
        ]

    def blocks(self) -> Sequence[Block]:
        return self.blocks_cache

    def memory_bytes(self) -> int:
        return box_memory_bytes(self._meshes.grid, self.block_cubes)

    def voxels(self, block: Block) -> int:
        """A box is cut to the finest mag's bounding box already: its own voxels."""
        return box_voxels(block.lo, block.hi)

    def run(self, block: Block) -> bytes:
        grid = self._meshes.grid
        return index_cubes(grid, box_cubes(grid, block.lo, block.hi)).to_bytes()

    def finish(self, outputs: Callable[[Block], bytes]) -> str:
        meshes = opened(self.layer, self._version)[1]
        parts = [IndexPart.from_bytes(outputs(block), f"of block {block.key}") for block in self.blocks()]
        index = assemble_parts(meshes, self.stamp, parts)
        if not self.selection.everything:
            kept = self.selection.keeps(index.ids, index.voxels)
            index = index.select(kept, {**index.meta, "selection": self.selection.describe()})
        self._target.write(self.location, index.to_bytes())
        self.segments = len(index)
        return self.location
