"""The landing page, at ``/`` and at each tree's root: the datasets a token may read, grouped by organization,
each with a thumbnail, its layers and links to its page and to the viewer.

It is also the listing of its directory: the children (the trees at ``/``, the organizations at a tree's root)
are the page's only ``<a href="...">`` links, every other link is written by :func:`markup.other_link`.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape

from ...sources.dataset import BrokenDataset, Dataset
from .dataset import viewer_layers, viewer_note_markup
from .links import PLAIN, LinkForm
from .listing import Entry, listing_bytes, listing_items, token_note
from .markup import other_link, page_head, path_of, text
from .neuroglancer import neuroglancer_link

HOME_TREE = "zarr"  # the tree whose dataset pages ``/`` links to
# A landing page holds each organization and dataset as its listing does, and again as its card group and card
# with their links: 33 MiB measured for 40,000 organizations, against 15 MiB for their listing.
LANDING_COPIES = 3


def landing_bytes(names: Iterable[str]) -> int:
    """The most a landing page of the organizations and datasets ``names`` holds while it is made."""
    return LANDING_COPIES * listing_bytes(names)


@dataclass(frozen=True, slots=True)
class DatasetCard:
    organization: str
    name: str
    page_url: str
    viewer_url: str | None  # None: nothing to view (no servable layer)
    thumbnail_url: str | None
    layers: tuple[tuple[str, str], ...]  # (name, category) of each servable layer
    note: str | None = None  # why the dataset cannot be served


@dataclass(frozen=True, slots=True)
class Landing:
    """What a landing page shows besides its listing."""

    groups: Mapping[str, Sequence[DatasetCard]]  # by organization, in listing order
    links: LinkForm = PLAIN  # the page's credential form, which its links keep
    note: str | None = None  # e.g. that a token shows the datasets
    viewer_note: str | None = None


def dataset_card(
    dataset: Dataset | BrokenDataset,
    tree: str,
    base: str,
    links: LinkForm,
    viewer: str,
    with_meshes: bool,
    largest: Mapping[str, Sequence[int]] | None = None,
) -> DatasetCard:
    """The card of one dataset; ``links`` the page's credential form, kept by every link; ``largest`` a few of the
    largest segments of its segmentation layers, which the viewer link selects (as the dataset page's does)."""
    names = path_of(dataset.organization, dataset.name)
    page_url = links.href(f"/data/{tree}/{names}/")
    if isinstance(dataset, BrokenDataset):
        return DatasetCard(dataset.organization, dataset.name, page_url, None, None, (), dataset.reason)
    servable = [(name, layer) for name, layer in dataset.layers.items() if layer.mags]
    if not servable:
        return DatasetCard(dataset.organization, dataset.name, page_url, None, None, (), "no servable layer")
    shown = next((name for name, layer in servable if layer.properties.category == "color"), servable[0][0])
    thumbnail = links.href(f"/preview/{names}/{path_of(shown)}.png")
    layers = viewer_layers(dataset, tree, base, links, with_meshes, largest)
    scale = dataset.properties.scale
    first, first_layer = servable[0]
    source = str(layers[0]["source"]) if layers else ""
    box = first_layer.properties.bounding_box.box
    link = neuroglancer_link(
        viewer, source, first, first_layer.properties.category, scale.factor, scale.unit, layers, box
    )
    categories = tuple((name, layer.properties.category) for name, layer in servable)
    return DatasetCard(dataset.organization, dataset.name, page_url, link, thumbnail, categories)


def _card(card: DatasetCard) -> str:
    name = escape(card.name)
    title = other_link(card.page_url, name, "dataset-page")
    if card.note is not None:
        return (
            f'<li class="dataset unusable" data-dataset="{name}"><div class="about"><h3>{name}</h3>'
            f'<p class="reason">unavailable: {text(card.note)}</p></div></li>'
        )
    thumbnail = ""
    if card.thumbnail_url is not None:
        thumbnail = f'<img class="thumbnail" src="{escape(card.thumbnail_url)}" alt="preview of {name}" loading="lazy">'
    layers = "".join(
        f'<li class="layer-{escape(category)}">{escape(layer)} <small>{escape(category)}</small></li>'
        for layer, category in card.layers
    )
    viewer = ""
    if card.viewer_url is not None:
        viewer = other_link(card.viewer_url, "Open in Neuroglancer", "open-neuroglancer", new_tab=True)
    return (
        f'<li class="dataset" data-dataset="{name}">{thumbnail}<div class="about"><h3>{title}</h3>'
        f'<ul class="layers">{layers}</ul><p>{other_link(card.page_url, "Dataset page", "dataset-page")} '
        f"{viewer}</p></div></li>"
    )


def render_landing(base_path: str, entries: list[Entry], landing: Landing, title: str) -> bytes:
    """The listing of ``base_path`` with a section per organization of the datasets ``landing`` holds."""
    sections = []
    for organization, cards in landing.groups.items():
        items = "\n".join(_card(card) for card in cards)
        sections.append(
            f'<section class="organization" data-organization="{escape(organization)}">'
            f"<h2>{escape(organization)}</h2>\n"
            f'<ul class="datasets">\n{items}\n</ul></section>'
        )
    note = "" if landing.note is None else f'<p class="token-note" role="note">{text(landing.note)}</p>\n'
    empty = "" if sections or landing.note else '<p class="empty">No datasets to show.</p>\n'
    return (
        page_head(escape(title)) + f"<h1>{escape(title)}<small>Index of {text(base_path)}</small></h1>\n"
        f"{token_note(landing.links)}{note}{viewer_note_markup(landing.viewer_note)}"
        '<ul class="children">\n'
        + "\n".join(listing_items(base_path, entries, landing.links))
        + "\n</ul>\n"
        + "\n".join(sections)
        + f"\n{empty}</body></html>\n"
    ).encode()
