"""The organizations and datasets a grant may see, listed in the catalog threads (names alone where names
decide, so that no dataset is loaded to list them), each listing costed from its names and made within the
worker's memory budget."""

from collections.abc import Callable
from typing import TypeVar

from ...sources.dataset import BrokenDataset, Dataset
from ..auth import Grant, granted_names
from ..budget import MemoryBudget
from ..errors import HiddenRoots, HttpError
from ..pages.listing import Entry, listing_bytes
from .datasets import Datasets

T = TypeVar("T")
Readable = dict[str, list[Dataset | BrokenDataset]]  # by organization
Render = Callable[[list[Entry]], T]


class Listings:
    """What lies above the datasets, as a grant sees it."""

    def __init__(self, datasets: Datasets, roots: HiddenRoots, memory: MemoryBudget) -> None:
        self.datasets = datasets  # its catalog threads
        self.catalog = datasets.catalog
        self.roots = roots
        self.memory = memory

    async def check_organization(self, organization: str) -> None:
        """404 for an organization the data root does not hold."""
        if organization not in await self.datasets.call(self.catalog.organizations):
            raise HttpError(404, f"no organization {organization!r}")

    async def organization_entries(self, grant: Grant | None, render: Render[T]) -> T:
        """``render`` of the organizations where ``grant`` covers at least one dataset (every one when open), by
        names alone, made in a catalog thread once its cost is held."""
        organizations = await self.datasets.call(self.catalog.organizations)

        def rendered() -> T:
            if grant is None:
                return render([Entry(org, True) for org in organizations])
            names = self.catalog.dataset_names
            return render([Entry(org, True) for org in organizations if granted_names(grant, org, names(org))])

        async with self.memory.hold(listing_bytes(organizations), "this listing"):
            return await self.datasets.call(rendered)

    async def dataset_entries(self, grant: Grant | None, organization: str, render: Render[T]) -> T:
        """``render`` of the datasets of ``organization`` that ``grant`` may read, a broken one with its reason,
        made in a catalog thread once its cost (from the names) is held."""
        names = await self.datasets.call(self.catalog.dataset_names, organization)

        def rendered() -> T:
            found = []
            for dataset in self.catalog.datasets(organization):
                if grant is not None and not grant.allows(organization, dataset.name):
                    continue
                note = self.roots.relative(dataset.reason) if isinstance(dataset, BrokenDataset) else None
                found.append(Entry(dataset.name, True, note))
            return render(found)

        async with self.memory.hold(listing_bytes(names), "this listing"):
            return await self.datasets.call(rendered)

    async def readable(self, grant: Grant | None, render: Callable[[Readable], T]) -> T:
        """``render`` of the datasets ``grant`` may read by organization, each organization where it may read one
        (every one when open, empty ones too). Every dataset is loaded, and a page of them all costs as much
        again, so both run in a catalog thread, never on the event loop."""

        def readable() -> T:
            found = {}
            for organization in self.catalog.organizations():
                datasets = self.catalog.datasets(organization)
                names = granted_names(grant, organization, [dataset.name for dataset in datasets])
                if grant is None or names:
                    found[organization] = [dataset for dataset in datasets if dataset.name in names]
            return render(found)

        return await self.datasets.call(readable)
