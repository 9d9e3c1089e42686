"""``/data/{tree}/...``: a listing, a metadata document or a chunk of one of the Zarr trees.

The path is parsed once (:func:`~gateway.http.urls.parse_data_path`), the token checked for what it names,
and the target handed to the handler of its level: a table from :class:`~gateway.http.urls.Level` to
handler, built by the composition root.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from ...resources import Resource
from ...zarr.trees import DatasetView, NodeNotFound
from ..auth import Token
from ..errors import HiddenRoots
from ..messages import Answer, Request
from ..pages.dataset import dataset_page_bytes
from ..pages.landing import Landing
from ..pages.links import LinkForm
from ..pages.listing import Entry, page_bytes
from ..urls import DATA_NEEDS, DataTarget, Level, parse_data_path
from .access import Authorizer
from .chunks import Chunks
from .datasets import Datasets, Decision
from .index import Landings
from .listings import Listings, Readable
from .pages import Pages, listing
from .segments import LargestSegments
from .sender import Sender


class LevelHandler(Protocol):
    """Answers a target of one level, once its token has been checked for what the target names."""

    async def answer(self, target: DataTarget, request: Request, token: Token | None, decision: Decision) -> Answer:
        """The listing, document or chunk ``target`` names."""
        ...


class TreeHandler:
    """The trees' one endpoint: parse, check the token, dispatch by level."""

    def __init__(self, access: Authorizer, levels: Mapping[Level, LevelHandler]) -> None:
        assert set(levels) == set(Level), "every level has its handler"
        self.access = access
        self.levels = levels

    async def __call__(self, request: Request) -> Answer:
        target = parse_data_path(request.path)
        token, decision = await self.access.admit(DATA_NEEDS, request)
        return await self.levels[target.level].answer(target, request, token, decision)


def check_placed(target: DataTarget) -> None:
    """A misplaced metadata name is a 404, raised once the nodes above it are known to exist."""
    if target.misplaced is not None:
        raise NodeNotFound(target.misplaced)


@dataclass(frozen=True, slots=True)
class TreeRoot:
    """A tree's root: its organizations, as the landing page of the datasets the decision's grant may read."""

    landings: Landings
    sender: Sender

    async def answer(self, target: DataTarget, request: Request, token: Token | None, decision: Decision) -> Answer:
        check_placed(target)
        tree = target.tree.name

        def page(readable: Readable, landing: Landing) -> Resource:
            entries = [Entry(organization, True) for organization in readable]
            return self.landings.pages.landing_page(target.base, entries, landing, tree)

        return await self.sender.send(request, await self.landings.page(request, token, decision.grant, tree, page))


@dataclass(frozen=True, slots=True)
class OrganizationListing:
    """An organization: the datasets the decision's grant may read there."""

    listings: Listings
    pages: Pages
    sender: Sender

    async def answer(self, target: DataTarget, request: Request, token: Token | None, decision: Decision) -> Answer:
        await self.listings.check_organization(target.organization)
        check_placed(target)

        def page(entries: list[Entry]) -> Resource:
            return self.pages.listing(request, token, target.base, entries)

        grant = decision.grant
        return await self.sender.send(request, await self.listings.dataset_entries(grant, target.organization, page))


@dataclass(frozen=True, slots=True)
class InDataset:
    """A level inside a dataset: the served dataset's view in the target's tree, then this level's resource."""

    datasets: Datasets
    sender: Sender
    pages: Pages

    async def answer(self, target: DataTarget, request: Request, token: Token | None, decision: Decision) -> Answer:
        dataset = await self.datasets.served(decision)
        view = await self.datasets.view_off_loop(dataset, target.tree)
        links = self.pages.links(request, token)
        return await self.sender.send(request, await self.resource(target, view, request, links))

    async def resource(self, target: DataTarget, view: DatasetView, request: Request, links: LinkForm) -> Resource:
        """The document, listing or chunk ``target`` names; a listing's links in the page's form ``links``."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class DatasetLevel(InDataset):
    """A dataset: its metadata documents, or its page (a listing with a card per layer)."""

    largest: LargestSegments
    roots: HiddenRoots

    async def resource(self, target: DataTarget, view: DatasetView, request: Request, links: LinkForm) -> Resource:
        tree, file = target.tree, target.file
        check_placed(target)
        if file is not None:
            return await self.datasets.document(view, (file,), lambda: tree.dataset_document(view, file))
        entries = [Entry(f, False) for f in tree.dataset_files]
        entries += [Entry(name, True) for name in view.groups]
        entries += [Entry(name, True, self.roots.relative(reason)) for name, reason in view.unusable.items()]
        need = dataset_page_bytes(entries) + await self.largest.need([view.dataset])
        async with self.datasets.memory.hold(need, "this page"):
            largest = await self.largest.of(view.dataset)
            page = self.pages.dataset_page
            return await self.datasets.call(page, target.base, view, tree.name, request, entries, links, largest)


@dataclass(frozen=True, slots=True)
class GroupLevel(InDataset):
    """A group (a layer, or the xarray tree's mag): its documents, or a listing of its arrays."""

    async def resource(self, target: DataTarget, view: DatasetView, request: Request, links: LinkForm) -> Resource:
        tree, file = target.tree, target.file
        group = view.group(target.names[2])
        check_placed(target)
        if file is not None:
            key = (group.name, file)
            return await self.datasets.document(view, key, lambda: tree.group_document(view, group, file))
        entries = [Entry(f, False) for f in tree.group_files] + [Entry(a, True) for a in group.arrays]
        async with self.datasets.memory.hold(page_bytes(entries), "this listing"):
            return listing(target.base, entries, links)


@dataclass(frozen=True, slots=True)
class ArrayLevel(InDataset):
    """An array: its documents, a listing of them, or one of its chunks."""

    chunks: Chunks

    async def resource(self, target: DataTarget, view: DatasetView, request: Request, links: LinkForm) -> Resource:
        tree, file = target.tree, target.file
        group = view.group(target.names[2])
        array_name = target.names[3]
        node = view.array(group, array_name)
        check_placed(target)
        if file is not None:
            return await self.datasets.document(
                view, (group.name, array_name, file), lambda: tree.array_document(node, file)
            )
        if target.key is None:
            entries = [Entry(f, False) for f in tree.array_files]
            async with self.datasets.memory.hold(page_bytes(entries), "this listing"):
                return listing(target.base, entries, links)
        return await self.chunks.answer(target, node, target.key, request, view.dataset)
