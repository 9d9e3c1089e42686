"""The catalog as the handlers use it: loads and listings in threads of their own bound, never on the
event loop; the tree views of a dataset and their documents, built once and off the loop."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio

from ...resources import Resource
from ...sources.catalog import Catalog
from ...sources.dataset import BrokenDataset, Dataset, DatasetUnusable
from ...zarr.shards import ShardPlans
from ...zarr.trees import DatasetView, ServeOptions, Tree
from ..auth import Grant
from ..budget import MemoryBudget
from ..errors import HttpError

T = TypeVar("T")
# Threads that load and list datasets: a bound of their own, so that however long a load takes (a large
# properties file, a slow volume), chunk reads keep their threads and the event loop keeps answering.
CATALOG_THREADS = 2


@dataclass(frozen=True, slots=True)
class Decision:
    """A request's access, decided once (``Authorizer.authorize``): its token's grant (None: the gateway is open)
    for what its path ``names``, and the dataset named there as that decision looked it up, where it did (a grant
    is checked against the very dataset's owners, and that dataset is the one served)."""

    grant: Grant | None
    names: tuple[str, ...]
    found: Dataset | BrokenDataset | None = None
    looked_up: bool = False  # always where a grant was checked: a dataset served unlooked-up needs no owners check


class Datasets:
    """The catalog and its views; holds caches only, so replicas answer alike."""

    def __init__(
        self,
        catalog: Catalog,
        options: ServeOptions,
        shards: ShardPlans,
        chunk_threads: anyio.CapacityLimiter,
        memory: MemoryBudget,
    ) -> None:
        self.catalog = catalog
        self.memory = memory
        self.options = options
        self.shards = shards
        self.chunk_threads = chunk_threads
        self.catalog_threads = anyio.CapacityLimiter(CATALOG_THREADS)
        self._views: dict[tuple[str, str, str], DatasetView] = {}

    async def call(self, function: Callable[..., T], *args: Any) -> T:
        """Catalog work (loading, listing): in a thread of its own bound, never on the event loop."""
        return await anyio.to_thread.run_sync(function, *args, limiter=self.catalog_threads)

    async def lookup(self, organization: str, name: str) -> Dataset | BrokenDataset | None:
        """A dataset of the catalog: as loaded, when it was looked at less than a second ago; as loaded, after
        a stat in a chunk thread, when it still holds (so loads that fill the catalog threads hold up no
        other dataset); else from a catalog thread."""
        fresh = self.catalog.fresh(organization, name)
        if fresh is not None:
            return fresh
        held = await anyio.to_thread.run_sync(self.catalog.unchanged, organization, name, limiter=self.chunk_threads)
        return held if held is not None else await self.call(self.catalog.dataset, organization, name)

    async def served(self, decision: Decision) -> Dataset:
        """The dataset the decision's path names, to serve: the very one the decision checked the owners of, where
        a grant had to cover them (never looked up again, so never another version); else looked up now."""
        organization, name = decision.names[:2]
        dataset = decision.found if decision.looked_up else await self.lookup(organization, name)
        if dataset is None:
            raise HttpError(404, f"no dataset {organization}/{name}")
        if isinstance(dataset, BrokenDataset):
            raise DatasetUnusable(f"dataset {organization}/{name} cannot be served: {dataset.reason}")
        return dataset

    # --- views and their documents --------------------------------------------------------------

    def view(self, dataset: Dataset, tree: Tree) -> DatasetView:
        key = (dataset.organization, dataset.name, tree.name)
        view = self._views.get(key)
        if view is None or view.dataset is not dataset:
            view = self._views[key] = tree.build(dataset, self.options, self.shards)
        return view

    async def view_off_loop(self, dataset: Dataset, tree: Tree) -> DatasetView:
        """:meth:`view`; one not built yet is built in a catalog thread (a dataset of many layers takes long)."""
        view = self._views.get((dataset.organization, dataset.name, tree.name))
        if view is not None and view.dataset is dataset:
            return view
        return await self.call(self.view, dataset, tree)

    async def document(self, view: DatasetView, key: tuple[str, ...], make: Callable[[], Any]) -> Resource:
        """A metadata document of a dataset, a group or an array; one not rendered yet is rendered in a catalog
        thread (the consolidated metadata of many layers takes long), holding its cost of the worker's memory
        budget (:meth:`DatasetView.document_bytes`) while it is made."""
        found = view.documents.get(key)
        if found is not None:
            return found
        async with self.memory.hold(view.document_bytes(key), "this document"):
            return await self.call(view.document, key, make)
