"""A few of the largest segments of each segmentation layer, which the pages' viewer links select, so that a
viewer's 3-D panel shows meshes at once: the landing page and the dataset page ask here alike."""

from collections.abc import Iterable
from dataclasses import dataclass

import anyio

from ...meshes.service import MeshService
from ...sources.dataset import BrokenDataset, Dataset

Largest = dict[str, list[int]]  # by layer


@dataclass(frozen=True, slots=True)
class LargestSegments:
    meshes: MeshService
    chunk_threads: anyio.CapacityLimiter

    async def need(self, datasets: Iterable[Dataset | BrokenDataset]) -> int:
        """What :meth:`of_all` of ``datasets`` holds at most (the index files it reads), from sizes alone, once
        their data stamps are taken (waited for on the event loop: before them the index cannot be trusted, and
        a link would select nothing): the page holds it with its own cost, before any is read."""
        served = [dataset for dataset in datasets if isinstance(dataset, Dataset)]
        for dataset in served:
            await self.meshes.ready_all(dataset)

        def need() -> int:
            return sum(self.meshes.largest_bytes(d, name) for d in served for name in _segmentations(d))

        return await anyio.to_thread.run_sync(need, limiter=self.chunk_threads)

    async def of(self, dataset: Dataset) -> Largest:
        """The largest segments of each segmentation layer of ``dataset`` (its data stamps taken: :meth:`need`)."""
        return await anyio.to_thread.run_sync(self._largest, dataset, limiter=self.chunk_threads)

    async def of_all(self, datasets: Iterable[Dataset | BrokenDataset]) -> dict[tuple[str, str], Largest]:
        """:meth:`of` each dataset that can be served, by (organization, name)."""
        return {
            (dataset.organization, dataset.name): await self.of(dataset)
            for dataset in datasets
            if isinstance(dataset, Dataset)
        }

    def _largest(self, dataset: Dataset) -> Largest:
        return {name: self.meshes.largest_segments(dataset, name) for name in _segmentations(dataset)}


def _segmentations(dataset: Dataset) -> list[str]:
    """The layers of ``dataset`` whose largest segments a page shows."""
    return [
        name for name, layer in dataset.layers.items() if layer.properties.category == "segmentation" and layer.mags
    ]
