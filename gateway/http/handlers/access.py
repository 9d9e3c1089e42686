"""The one access decision of the data routes, the previews, the meshes and the proxy's ``/auth``."""

from ...sources.dataset import Dataset
from ..auth import Access, Grant, Token, check_dataset, check_files, check_organization
from ..messages import HttpError, Request
from ..urls import Needs
from .datasets import Datasets, Decision

Original = tuple[bytes, bytes | None, bytes | None]  # the query, path token and share link of a URI /auth checks


class Authorizer:
    """Reads a request's one token and decides what it may read, on the datasets of the catalog."""

    def __init__(self, access: Access, datasets: Datasets) -> None:
        self.access = access
        self.datasets = datasets

    @property
    def open(self) -> bool:
        """No tokens file: every dataset is readable without a token."""
        return self.access.open

    def token(self, request: Request, original: Original | None = None) -> Token | None:
        """The request's one token (400 for more): every route that reads a token reads it here. ``original``:
        the query, path token and share link of the URI the proxy's ``/auth`` checks, in place of the request's."""
        own = (request.query_string, request.path_token, request.path_link)
        query, path_token, path_link = original or own
        return self.access.read(request, query, path_token, path_link)

    async def authorize(self, token: Token | None, names: tuple[str, ...]) -> Decision:
        """What ``token`` may read of what ``names`` (organization, dataset: as far as a path names them) point
        at, or 401/403: the one decision, for the data routes, the previews and the proxy's ``/auth``. Its grant
        is None when the gateway is open; a dataset is looked up once, here where a grant must cover the
        datasets whose files it reads (the very dataset then served), else where it is served."""
        grant = await self.access.grant(token)
        if len(names) >= 2:
            check_dataset(grant, names[0], names[1])
            if grant is not None:
                found = await self.datasets.lookup(names[0], names[1])
                check_files(grant, names[0], names[1], set() if found is None else found.owners)
                return Decision(grant, names, found, looked_up=True)
        elif names and grant is not None:
            # names alone: no dataset is loaded to authorize an organization
            names_there = await self.datasets.call(self.datasets.catalog.dataset_names, names[0])
            check_organization(grant, names[0], names_there)
        return Decision(grant, names)

    async def admit(
        self, needs: Needs, request: Request, path: str | None = None, original: Original | None = None
    ) -> tuple[Token | None, Decision]:
        """The credential and decision ``needs`` (a place's, :data:`gateway.http.urls.PLACES`) asks of ``request``,
        in the route's order: the path parsed (its 400 or 404), the credential read (400 for more than one), then
        401 or 403. ``path`` and ``original``: the original URI's, for the proxy's ``/auth``, in place of the
        request's."""
        if not needs.credential:
            return None, Decision(None, ())
        names = () if needs.names is None else needs.names(request.path if path is None else path)
        token = self.token(request, original)
        if needs.delegating and token is not None and not token.delegates:
            raise HttpError(403, "a share link cannot make share links: ask the person who shared it")
        return token, await self.authorize(token, names)

    async def decide_loaded(self, token: Token | None, dataset: Dataset) -> Grant | None:
        """:meth:`authorize` for a dataset in hand (the one a kept answer was made in): no lookup."""
        grant = await self.access.grant(token)
        check_dataset(grant, dataset.organization, dataset.name)
        check_files(grant, dataset.organization, dataset.name, dataset.owners)
        return grant

    async def readable_dataset(self, needs: Needs, request: Request) -> Dataset:
        """The dataset ``request``'s path names, once ``needs`` admit it (the previews', the meshes', a share's)."""
        _, decision = await self.admit(needs, request)
        return await self.datasets.served(decision)
