"""``zarr-gateway index-segments``: build a layer's segment index and write it where every replica reads it."""

import time
from dataclasses import dataclass

from ..sources.catalog import Dataset
from .errors import MeshInputError, MeshTooLarge
from .index import SegmentIndex, build_index, data_stamp
from .service import MeshService


class DataChangedWhileIndexing(RuntimeError):
    """The layer's files changed during the build: the index would describe no version of the data."""


@dataclass(frozen=True, slots=True)
class BuiltIndex:
    location: str  # where the gateway reads it: a local path (the caller writes it there)
    index: SegmentIndex
    voxels: int  # of the layer's bounding box at the finest mag (the cubes read hold a margin more)
    seconds: float

    @property
    def voxels_per_second(self) -> float:
        return self.voxels / self.seconds if self.seconds > 0 else float("inf")


def index_layer(service: MeshService, dataset: Dataset, layer: str, progress: bool = True) -> BuiltIndex:
    """Read the layer's finest mag once, cube by cube, and make its index, to be written to its location (the
    command line writes it atomically). Rerun it after the data changes: the gateway ignores an index older
    than the data."""
    if not service.place.store.is_local:
        raise MeshInputError("an index of data in object storage needs a local segment_index_dir to be written to")
    meshes = service.layer(dataset, layer)
    grid = meshes.grid
    cubes = len(grid.cubes_of_finest())
    local = service.storage.is_local
    before = data_stamp(meshes.layer.mags, local)
    started = time.perf_counter()
    # rich comes with the 'meshes' extra, as zmesh does; imported here so the gateway's core never needs it
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.completed:,.0f}/{task.total:,.0f} cubes"),  # voxels read hold margins the summary's lack
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        disable=not progress,
        console=Console(stderr=True),  # the summary goes to standard output
    ) as bar:
        task = bar.add_task(f"indexing {dataset.organization}/{dataset.name}/{layer}", total=cubes)
        try:
            index = build_index(grid, layer, before, advance=lambda _voxels: bar.advance(task, 1))
        except MeshTooLarge as exc:  # no fragment of it could be made either: an index would serve nothing
            raise MeshInputError(f"layer {layer!r} cannot be indexed: {exc}") from None
    seconds = time.perf_counter() - started
    if data_stamp(meshes.layer.mags, local) != before:
        raise DataChangedWhileIndexing(f"the files of layer {layer!r} changed while it was indexed: run it again")
    return BuiltIndex(service.place.location(dataset, layer), index, grid.voxels, seconds)
