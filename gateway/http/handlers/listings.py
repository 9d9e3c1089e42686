"""The organizations and datasets a grant may see, listed in the catalog threads (names alone where names
decide, so that no dataset is loaded to list them)."""

from collections.abc import Callable
from typing import TypeVar

from ...sources.dataset import BrokenDataset, Dataset
from ..auth import Grant, granted_names
from ..errors import HiddenRoots, HttpError
from ..pages.listing import Entry
from .datasets import Datasets

T = TypeVar("T")
Readable = dict[str, list[Dataset | BrokenDataset]]  # by organization


class Listings:
    """What lies above the datasets, as a grant sees it."""

    def __init__(self, datasets: Datasets, roots: HiddenRoots) -> None:
        self.datasets = datasets  # its catalog threads
        self.catalog = datasets.catalog
        self.roots = roots

    async def check_organization(self, organization: str) -> None:
        """404 for an organization the data root does not hold."""
        if organization not in await self.datasets.call(self.catalog.organizations):
            raise HttpError(404, f"no organization {organization!r}")

    async def organization_entries(self, grant: Grant | None) -> list[Entry]:
        """The organizations where ``grant`` covers at least one dataset (every one when open), by names alone."""

        def entries() -> list[Entry]:
            organizations = self.catalog.organizations()
            if grant is None:
                return [Entry(org, True) for org in organizations]
            return [
                Entry(org, True) for org in organizations if granted_names(grant, org, self.catalog.dataset_names(org))
            ]

        return await self.datasets.call(entries)

    async def dataset_entries(self, grant: Grant | None, organization: str) -> list[Entry]:
        """The datasets of ``organization`` that ``grant`` may read, a broken one with its reason."""

        def entries() -> list[Entry]:
            found = []
            for dataset in self.catalog.datasets(organization):
                if grant is not None and not grant.allows(organization, dataset.name):
                    continue
                note = self.roots.relative(dataset.reason) if isinstance(dataset, BrokenDataset) else None
                found.append(Entry(dataset.name, True, note))
            return found

        return await self.datasets.call(entries)

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
