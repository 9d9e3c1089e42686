"""``/``: the trees, and the datasets the request's token may read; and the landing page of each tree's root."""

from collections.abc import Callable
from dataclasses import dataclass

from ...precomputed.tree import TREES as PRECOMPUTED_TREES
from ...resources import Resource
from ...zarr.trees import TREES
from ..auth import Grant, Token
from ..messages import Answer, Request, raw_headers
from ..pages.landing import HOME_TREE, Landing, landing_bytes
from ..pages.listing import Entry
from ..pages.markup import path_of
from ..urls import DATA_PREFIX
from .access import Authorizer
from .listings import Listings, Readable
from .pages import Pages
from .segments import LargestSegments
from .sender import Sender
from .share import DEFAULT_TREE

# The trees ``/`` lists: the Zarr trees and the precomputed ones (which no page links to otherwise).
HOME_TREES = (*TREES, *PRECOMPUTED_TREES)
TOKEN_FORMS = "?token=... at the end of its address, or /t/.../ in front of its path (the form a viewer needs)"
NO_TOKEN_NOTE = f"Open this page with a token to see the datasets it may read: {TOKEN_FORMS}."
SIGN_IN_NOTE = f"Sign in at /login, or open this page with a token to see your datasets: {TOKEN_FORMS}."


@dataclass(frozen=True, slots=True)
class Landings:
    """Landing pages: the datasets a grant may read, each viewer link with a few of its largest segments."""

    listings: Listings
    pages: Pages
    largest: LargestSegments

    async def page(
        self,
        request: Request,
        token: Token | None,
        grant: Grant | None,
        tree: str,
        render: Callable[[Readable, Landing], Resource],
    ) -> Resource:
        """``render`` of the readable datasets and their cards; the datasets are listed and the page rendered in
        catalog threads, the data stamps waited for on the event loop in between (as the dataset page does), while
        the page's cost (from the names and the index files' sizes) is held of the worker's memory budget."""
        readable = await self.listings.readable(grant, lambda found: found)  # loaded: the catalog's, not the page's
        datasets = [dataset for found in readable.values() for dataset in found]
        names = [*readable, *(dataset.name for dataset in datasets)]
        async with self.listings.memory.hold(landing_bytes(names) + await self.largest.need(datasets), "this page"):
            largest = await self.largest.of_all(datasets)

            def rendered() -> Resource:
                return render(readable, self.pages.landing(request, token, tree, readable, largest))

            return await self.listings.datasets.call(rendered)


@dataclass(frozen=True, slots=True)
class IndexHandler:
    """The landing page (none of the datasets without a token, when one is needed: the page itself is open)."""

    access: Authorizer
    landings: Landings
    sender: Sender

    def _to_shared(self, request: Request, token: Token | None, names: tuple[str, str]) -> Answer:
        """The start page of a share link (``/s/{capability}/``, the link checked): a redirect to its dataset's page,
        below the link, so that a link cut back to its prefix, or a page's way back to the start, leads on."""
        page = self.landings.pages.links(request, token).href(f"{DATA_PREFIX}{DEFAULT_TREE}/{path_of(*names)}/")
        return Answer(302, raw_headers({"Location": page, "Cache-Control": "no-store"}))

    @property
    def _note(self) -> str:
        return NO_TOKEN_NOTE if self.access.access.identities is None else SIGN_IN_NOTE

    async def __call__(self, request: Request) -> Answer:
        token = self.access.token(request)
        pages = self.landings.pages
        entries = [Entry(f"data/{name}", True) for name in HOME_TREES]
        if token is None and not self.access.open:
            landing = Landing({}, note=self._note)
            return await self.sender.send(request, pages.landing_page("/", entries, landing, "zarr-gateway"))
        decision = await self.access.authorize(token, ())
        if decision.grant is not None and decision.grant.shared is not None:
            return self._to_shared(request, token, decision.grant.shared)
        resource = await self.landings.page(
            request,
            token,
            decision.grant,
            HOME_TREE,
            lambda readable, landing: pages.landing_page("/", entries, landing, "zarr-gateway"),
        )
        return await self.sender.send(request, resource)
