"""The HTML the handlers answer with: listings, the landing page and the dataset page, with links for
the address a client used (:class:`~gateway.http.origin.PublicOrigin`)."""

import dataclasses

from ... import extras
from ...sources.catalog import BrokenDataset, Dataset
from ...zarr.resource import Resource, bytes_resource
from ...zarr.trees import DatasetView
from ..auth import Token
from ..messages import SHARE_PREFIX, Request
from ..origin import PublicOrigin
from ..pages.dataset import build_dataset_page, render_dataset_page
from ..pages.landing import Landing, dataset_card, render_landing
from ..pages.listing import Entry, render_listing
from ..pages.markup import HTML
from ..pages.share import share_form
from ..pages.viewer import mixed_content_note, viewer_url


def page_token(token: Token | None) -> str | None:
    """The token a page was asked for with in its address: its links carry it on (a header token they cannot)."""
    return token.value if token is not None and token.in_url else None


def link_prefix(request: Request) -> str:
    """The share link path a page was asked for under (``/s/{capability}``; its links all stay below it), or "".

    Only a page the link was checked for is rendered, so the capability is of URL-safe characters.
    """
    link = request.exchange.path_link
    return "" if link is None else SHARE_PREFIX + link.decode("latin-1")


def listing(base: str, entries: list[Entry]) -> Resource:
    return bytes_resource(render_listing(base, entries), HTML)


class Pages:
    """Renders the pages that link to viewers; ``own_viewer`` when the gateway serves Neuroglancer at
    /neuroglancer/ (the viewer extra)."""

    def __init__(
        self,
        origin: PublicOrigin,
        neuroglancer_url: str,
        own_viewer: bool,
        tokens_needed: bool,
        share_max_seconds: int | None = None,
    ) -> None:
        self.origin = origin
        self.neuroglancer_url = neuroglancer_url
        self.own_viewer = own_viewer
        self.tokens_needed = tokens_needed
        self.share_max_seconds = share_max_seconds  # None: the gateway makes no share links

    def _origin(self, request: Request) -> tuple[str, str]:
        """The public base and root path of a page's links: below the share link it was asked under, if any."""
        base, root_path = self.origin.of(request.headers, request.client)
        prefix = link_prefix(request)
        return base + prefix, root_path + prefix

    def landing(
        self, request: Request, token: Token | None, tree: str, readable: dict[str, list[Dataset | BrokenDataset]]
    ) -> Landing:
        base, root_path = self._origin(request)
        link_token = page_token(token)
        viewer = viewer_url(self.neuroglancer_url, self.own_viewer, root_path, link_token)
        meshes = extras.MESHES.available
        groups = {
            organization: [dataset_card(d, tree, base, root_path, link_token, viewer, meshes) for d in datasets]
            for organization, datasets in readable.items()
        }
        return Landing(groups, link_token is not None, viewer_note=mixed_content_note(viewer, base))

    @staticmethod
    def landing_page(base_path: str, entries: list[Entry], landing: Landing, title: str) -> Resource:
        return bytes_resource(render_landing(base_path, entries, landing, title), HTML)

    def dataset_page(
        self,
        base_path: str,
        view: DatasetView,
        tree: str,
        request: Request,
        entries: list[Entry],
        link_token: str | None,
        largest: dict[str, list[int]],
    ) -> Resource:
        """The dataset's listing with a card per layer (preview, facts, viewer link) and client snippets."""
        base, root_path = self._origin(request)
        viewer = viewer_url(self.neuroglancer_url, self.own_viewer, root_path, link_token)
        under_link = request.exchange.path_link is not None
        page = build_dataset_page(
            view.dataset,
            tree,
            base,
            link_token,
            viewer,
            self.tokens_needed and not under_link,  # below a link, the snippets need no token
            root_path,
            largest=largest,
            with_meshes=extras.MESHES.available,
            viewer_note=mixed_content_note(viewer, base),
        )
        if self.share_max_seconds is not None and not under_link:
            organization, name = view.dataset.organization, view.dataset.name
            form = share_form(root_path, link_token, organization, name, tree, self.share_max_seconds)
            page = dataclasses.replace(page, share=form)
        return bytes_resource(render_dataset_page(base_path, entries, page), HTML)
