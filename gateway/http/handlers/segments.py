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

    async def of(self, dataset: Dataset) -> Largest:
        """The largest segments of each segmentation layer of ``dataset``, once its data stamps are taken (waited
        for on the event loop: before them the index cannot be trusted, and a link would select nothing)."""
        await self.meshes.ready_all(dataset)
        return await anyio.to_thread.run_sync(self._largest, dataset, limiter=self.chunk_threads)

    async def of_all(self, datasets: Iterable[Dataset | BrokenDataset]) -> dict[tuple[str, str], Largest]:
        """:meth:`of` each dataset that can be served, by (organization, name)."""
        return {
            (dataset.organization, dataset.name): await self.of(dataset)
            for dataset in datasets
            if isinstance(dataset, Dataset)
        }

    def _largest(self, dataset: Dataset) -> Largest:
        return {
            name: self.meshes.largest_segments(dataset, name)
            for name, layer in dataset.layers.items()
            if layer.properties.category == "segmentation" and layer.mags
        }
