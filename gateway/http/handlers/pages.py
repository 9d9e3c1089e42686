"""The HTML the handlers answer with: listings, the landing page and the dataset page, with links for
the address a client used (:class:`~gateway.http.origin.PublicOrigin`) in the credential form of the page."""

import dataclasses
from collections.abc import Mapping, Sequence

from ... import extras
from ...resources import Resource, bytes_resource
from ...sources.dataset import BrokenDataset, Dataset
from ...zarr.trees import DatasetView
from ..auth import Token
from ..messages import Request, link_prefix
from ..origin import PublicOrigin
from ..pages.dataset import build_dataset_page, render_dataset_page
from ..pages.landing import Landing, dataset_card, render_landing
from ..pages.links import LinkForm, link_form
from ..pages.listing import Entry, render_listing
from ..pages.markup import HTML
from ..pages.share import share_form
from ..pages.viewer import mixed_content_note, viewer_url


def page_links(request: Request, token: Token | None, root_path: str = "") -> LinkForm:
    """The credential form of a page (:func:`~gateway.http.pages.links.link_form`): a header token, which no
    link can carry, leaves links as they are."""
    in_address = token.value if token is not None and token.in_url else None
    return link_form(in_address, request.path_token is not None, root_path)


def listing(base: str, entries: list[Entry], links: LinkForm | None = None) -> Resource:
    return bytes_resource(render_listing(base, entries, links or LinkForm()), HTML)


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
        root_note: str | None = None,
    ) -> None:
        self.origin = origin
        self.neuroglancer_url = neuroglancer_url
        self.own_viewer = own_viewer
        self.tokens_needed = tokens_needed
        self.share_max_seconds = share_max_seconds  # None: the gateway makes no share links
        self.root_note = root_note  # the landing pages say it: a data root pointed at a dataset, say

    def _origin(self, request: Request) -> tuple[str, str]:
        """The public base and root path of a page's links: below the share link it was asked under, if any."""
        base, root_path = self.origin.of(request.headers, request.client)
        prefix = link_prefix(request)
        return base + prefix, root_path + prefix

    def links(self, request: Request, token: Token | None) -> LinkForm:
        """The page's credential form below the public root path (and the share link it was asked under)."""
        return page_links(request, token, self._origin(request)[1])

    def listing(self, request: Request, token: Token | None, base: str, entries: list[Entry]) -> Resource:
        """A listing whose links keep the page's credential form."""
        return listing(base, entries, self.links(request, token))

    def landing(
        self,
        request: Request,
        token: Token | None,
        tree: str,
        readable: dict[str, list[Dataset | BrokenDataset]],
        largest: Mapping[tuple[str, str], Mapping[str, Sequence[int]]] | None = None,
    ) -> Landing:
        """The landing page's cards; ``largest`` by (organization, dataset): the segments their links select."""
        base, root_path = self._origin(request)
        links = page_links(request, token, root_path)
        viewer = viewer_url(self.neuroglancer_url, self.own_viewer, links)
        meshes = extras.MESHES.available
        found = largest or {}
        groups = {
            organization: [
                dataset_card(d, tree, base, links, viewer, meshes, found.get((d.organization, d.name)))
                for d in datasets
            ]
            for organization, datasets in readable.items()
        }
        return Landing(groups, links, self.root_note, mixed_content_note(viewer, base))

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
        links: LinkForm,
        largest: dict[str, list[int]],
    ) -> Resource:
        """The dataset's listing with a card per layer (preview, facts, viewer link) and client snippets."""
        base, _ = self._origin(request)
        viewer = viewer_url(self.neuroglancer_url, self.own_viewer, links)
        under_link = request.path_link is not None
        page = build_dataset_page(
            view.dataset,
            tree,
            base,
            links,
            viewer,
            self.tokens_needed and not under_link,  # below a link, the snippets need no token
            largest=largest,
            with_meshes=extras.MESHES.available,
            viewer_note=mixed_content_note(viewer, base),
        )
        if self.share_max_seconds is not None and not under_link:
            organization, name = view.dataset.organization, view.dataset.name
            form = share_form(links, organization, name, tree, self.share_max_seconds)
            page = dataclasses.replace(page, share=form)
        return bytes_resource(render_dataset_page(base_path, entries, page), HTML)
