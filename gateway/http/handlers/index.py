"""``/``: the trees, and the datasets the request's token may read."""

from dataclasses import dataclass

from ...zarr.resource import Resource
from ...zarr.trees import TREES
from ..messages import Answer, Request
from ..pages.landing import HOME_TREE, Landing
from ..pages.listing import Entry
from .access import Authorizer
from .listings import Listings, Readable
from .pages import Pages
from .sender import Sender

# The trees ``/`` lists.
HOME_TREES = tuple(TREES)
NO_TOKEN_NOTE = "Open this page with a token (?token=... in its address) to see the datasets it may read."
SIGN_IN_NOTE = "Sign in at /login, or open this page with a token (?token=... in its address), to see your datasets."


@dataclass(frozen=True, slots=True)
class IndexHandler:
    """The landing page (none of the datasets without a token, when one is needed: the page itself is open)."""

    access: Authorizer
    listings: Listings
    pages: Pages
    sender: Sender

    @property
    def _note(self) -> str:
        return NO_TOKEN_NOTE if self.access.access.identities is None else SIGN_IN_NOTE

    async def __call__(self, request: Request) -> Answer:
        token = self.access.token(request)
        entries = [Entry(f"data/{name}", True) for name in HOME_TREES]
        if token is None and not self.access.open:
            return await self.sender.send(
                request, self.pages.landing_page("/", entries, Landing({}, note=self._note), "zarr-gateway")
            )

        def page(readable: Readable) -> Resource:
            landing = self.pages.landing(request, token, HOME_TREE, readable)
            return self.pages.landing_page("/", entries, landing, "zarr-gateway")

        grant = await self.access.authorize(token, ())
        return await self.sender.send(request, await self.listings.readable(grant, page))
