"""``/data/precomputed/...``: the Neuroglancer precomputed tree (:mod:`gateway.precomputed`), made in a chunk
thread below the dataset level; above it the organizations and datasets a grant may see."""

from dataclasses import dataclass

import anyio

from ...meshes.formats import PROPERTIES_DIRECTORY
from ...precomputed.tree import INFO, MESH_DIRECTORY, ListingRow, PrecomputedTree, parse_precomputed_path
from ...resources import Resource
from ..budget import MemoryBudget
from ..messages import Answer, Request
from ..pages.listing import Entry
from ..urls import PRECOMPUTED_NEEDS
from .access import Authorizer
from .datasets import Datasets
from .listings import Listings
from .pages import Pages
from .sender import Sender

WHAT = {"listing": "this listing", "metadata": "this document", "mesh": "this mesh request"}  # for a 413's reason
# What below a layer of the tree asks the mesh service (its listing too): its data stamp is taken first.
MESH_AWARE = frozenset({INFO, MESH_DIRECTORY, PROPERTIES_DIRECTORY})


@dataclass(frozen=True, slots=True)
class PrecomputedHandler:
    """The precomputed trees, access decided as for every tree (tokens in headers, queries and paths); a chunk
    holds its cost of the worker's memory budget while it is made, as the Zarr trees' chunks do."""

    access: Authorizer
    datasets: Datasets
    listings: Listings
    tree: PrecomputedTree
    sender: Sender
    chunk_threads: anyio.CapacityLimiter
    memory: MemoryBudget
    pages: Pages  # the listings above the datasets, in the page's credential form

    async def __call__(self, request: Request) -> Answer:
        target = parse_precomputed_path(request.path)
        names = target.names
        token, decision = await self.access.admit(PRECOMPUTED_NEEDS, request)

        def page(entries: list[Entry]) -> Resource:
            return self.pages.listing(request, token, target.base, entries)

        if not names:
            return await self.sender.send(request, await self.listings.organization_entries(decision.grant, page))
        if len(names) < 2:
            await self.listings.check_organization(names[0])
            return await self.sender.send(request, await self.listings.dataset_entries(decision.grant, names[0], page))
        dataset = await self.datasets.served(decision)
        if len(names) > 2 and (not target.below or target.below[0] in MESH_AWARE):
            await self.tree.meshes.ready(dataset, names[2])  # its data stamp, taken off the chunk threads
        accept = request.headers.get(b"accept-encoding", b"").decode("latin-1")
        need = self.tree.working_bytes(dataset, target)  # from the metadata: nothing is read or built yet
        what = WHAT.get(target.route, "this chunk")
        if target.route != "chunk":  # a 413 for the worst case at once; held: what it will read, from stats
            self.memory.check(need, what)
            need = await anyio.to_thread.run_sync(self.tree.reading_bytes, dataset, target, limiter=self.chunk_threads)

        def listing_page(base: str, rows: list[ListingRow]) -> Resource:  # a layer's, scale's or mesh directory's
            return page([Entry(*row) for row in rows])  # in the page's credential form, as the listings above

        async with self.memory.hold(need, what):
            found = await anyio.to_thread.run_sync(
                self.tree.answer, dataset, target, accept, listing_page, limiter=self.chunk_threads
            )
        answer = await self.sender.send(request, found.resource)
        answer.headers += found.headers
        return answer
