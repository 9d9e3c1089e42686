"""The dataset page: its listing, a card per layer (a preview, the facts, a Neuroglancer link) and code to read it
with each client. Style and script are the package's ``static/pages.css`` and ``static/copy.js``, inlined."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape

from gateway_storage.geometry import Vec3, mag_name

from ...sources.dataset import Dataset
from .links import LinkForm
from .listing import Entry, breadcrumbs, listing_items, page_bytes, token_note
from .markup import other_link, page_head, path_of, resource, text
from .neuroglancer import mesh_source, neuroglancer_layer, neuroglancer_link, neuroglancer_source
from .share import ShareForm, render_share_form
from .snippets import Snippet, snippets

# A layer's card while the dataset page is made (its viewer links, snippets and mags as text and bytes): 4.5 KiB
# measured per layer of a dataset of 1,000.
LAYER_CARD_BYTES = 8 << 10


def dataset_page_bytes(entries: list[Entry]) -> int:
    """The most a dataset page of ``entries`` holds while it is made: its listing, and a card per layer."""
    return page_bytes(entries) + LAYER_CARD_BYTES * sum(entry.is_directory for entry in entries)


@dataclass(frozen=True, slots=True)
class LayerCard:
    """Everything a layer's card shows."""

    name: str
    category: str  # color | segmentation
    dtype: str  # of one channel, as the arrays declare it
    channels: int
    top_left: Vec3  # of the bounding box, in mag-1 voxels
    size: Vec3
    voxel_size: tuple[float, float, float]
    unit: str
    mags: tuple[str, ...]  # URL names, finest first
    preview_url: str
    neuroglancer_url: str


@dataclass(frozen=True, slots=True)
class DatasetPage:
    organization: str
    name: str
    layers: tuple[LayerCard, ...]
    snippets: tuple[Snippet, ...]
    links: LinkForm  # the page's credential form, which its links keep
    viewer_note: str | None = None  # why the viewer link may show nothing (an https viewer, an http gateway)
    share: ShareForm | None = None  # where its share form posts; None: no form (no key, or a link's own page)


def viewer_layers(
    dataset: Dataset,
    tree: str,
    base: str,
    links: LinkForm,
    with_meshes: bool,
    largest: Mapping[str, Sequence[int]] | None = None,
) -> list[dict[str, object]]:
    """Every servable layer of ``dataset`` for one Neuroglancer state: images under segmentations, each
    segmentation with its meshes (when the gateway serves meshes) and a few of its largest segments selected,
    so that the 3-D view shows something at once."""
    servable = sorted(
        ((name, layer) for name, layer in dataset.layers.items() if layer.mags),
        key=lambda item: item[1].properties.category == "segmentation",
    )
    return [
        neuroglancer_layer(
            neuroglancer_source(base, tree, dataset.organization, dataset.name, name, links),
            name,
            layer.properties.category,
            mesh_source(base, dataset.organization, dataset.name, name, links)
            if with_meshes and layer.properties.dtype.kind in "ui"
            else None,
            (largest or {}).get(name, ()),
        )
        for name, layer in servable
    ]


# A card's viewer link opens every layer of a dataset of a few layers, and only its own layer of a larger one:
# so the page grows with its layers, not with their square (999 layers would make 168 MB of links).
LINK_LAYERS = 16


def build_dataset_page(
    dataset: Dataset,
    tree: str,
    base: str,
    links: LinkForm,
    neuroglancer_url: str,
    needs_token: bool,
    largest: Mapping[str, Sequence[int]] | None = None,
    with_meshes: bool = True,
    viewer_note: str | None = None,
) -> DatasetPage:
    """The page of a dataset as tree ``tree`` lists it.

    ``base`` is the public ``scheme://host`` (see :func:`gateway.http.origin.public_base`) followed by any root
    path; ``links`` the page's credential form (image and viewer URLs cannot send headers, so they carry the
    credential of the page's address, and its root path); ``needs_token`` says whether the gateway checks tokens
    (the snippets then show a placeholder); ``largest`` names a few of the largest segments of segmentation layers,
    for the viewer to select; ``with_meshes`` whether the viewer links carry mesh sources.
    """
    scale = dataset.properties.scale
    layers = viewer_layers(dataset, tree, base, links, with_meshes, largest)
    cards = []
    for name, layer in dataset.layers.items():
        if not layer.mags:
            continue  # listed with its reason, no card
        properties = layer.properties
        bbox = properties.bounding_box
        preview = f"/preview/{path_of(dataset.organization, dataset.name, name)}.png"
        source = neuroglancer_source(base, tree, dataset.organization, dataset.name, name, links)
        cards.append(
            LayerCard(
                name=name,
                category=properties.category,
                dtype=properties.dtype.name,
                channels=properties.channels,
                top_left=bbox.top_left,
                size=bbox.size,
                voxel_size=scale.factor,
                unit=scale.unit,
                mags=tuple(mag_name(mag) for mag in sorted(layer.mags, key=max)),
                preview_url=links.href(preview),
                neuroglancer_url=neuroglancer_link(
                    neuroglancer_url,
                    source,
                    name,
                    properties.category,
                    scale.factor,
                    scale.unit,
                    layers if len(layers) <= LINK_LAYERS else [shown for shown in layers if shown["name"] == name],
                    bbox.box,
                ),
            )
        )
    code: tuple[Snippet, ...] = ()
    if cards:
        first = cards[0]
        code = snippets(base, dataset.organization, dataset.name, first.name, first.mags[0], needs_token)
    return DatasetPage(dataset.organization, dataset.name, tuple(cards), code, links, viewer_note)


def _number(value: float) -> str:
    return f"{value:g}"


def _card(card: LayerCard) -> str:
    top_left = ", ".join(map(str, card.top_left))
    size = " &times; ".join(map(str, card.size))
    voxel = " &times; ".join(_number(v) for v in card.voxel_size)
    facts = [
        ("Category", escape(card.category)),
        ("Data type", escape(card.dtype)),
        ("Channels", str(card.channels)),
        ("Bounding box", f"top-left ({top_left}), size {size} (mag-1 voxels)"),
        ("Voxel size", f"{voxel} {escape(card.unit)}"),
        ("Mags", escape(", ".join(card.mags))),
    ]
    rows = "\n".join(f"<dt>{term}</dt><dd>{value}</dd>" for term, value in facts)
    name = escape(card.name)
    link = other_link(card.neuroglancer_url, "Open in Neuroglancer", "open-neuroglancer", new_tab=True)
    return (
        f'<section class="layer" id="layer-{name}" data-layer="{name}">\n<h2>{name}</h2>\n<div class="card">\n'
        f'<img class="preview" src="{escape(card.preview_url)}" alt="preview of {name}">\n'
        f'<div class="about">\n<dl class="facts">\n{rows}\n</dl>\n'
        f"<p>{link}</p>\n</div>\n</div>\n</section>"
    )


def _snippet(snippet: Snippet) -> str:
    client = escape(snippet.client)
    return (
        f'<div class="snippet-box"><h3>{escape(snippet.title)}</h3>'
        f'<button type="button" class="copy" data-copies="snippet-{client}">Copy</button>\n'
        f'<pre class="snippet" id="snippet-{client}" data-client="{client}">{text(snippet.code)}</pre></div>'
    )


def viewer_note_markup(note: str | None) -> str:
    return "" if note is None else f'<p class="viewer-note" role="note">{text(note)}</p>\n'


def render_dataset_page(base_path: str, entries: list[Entry], page: DatasetPage) -> bytes:
    """The dataset's listing (the same links as ``render_listing``) with its layer cards and snippets."""
    title = escape(f"{page.organization}/{page.name}")
    cards = "\n".join(_card(card) for card in page.layers)
    code = ""
    if page.snippets:
        code = (
            '<section class="snippets">\n<h2>Read it from code</h2>\n'
            + "\n".join(_snippet(snippet) for snippet in page.snippets)
            + "\n</section>\n"
        )
    return (
        page_head(title) + f"<h1>{title}<small>Index of {text(base_path)}</small></h1>\n"
        f"{token_note(page.links)}{viewer_note_markup(page.viewer_note)}{breadcrumbs(base_path, page.links)}"
        '<ul class="children">\n' + "\n".join(listing_items(base_path, entries, page.links)) + "\n</ul>\n"
        f"{cards}\n{code}{render_share_form(page.share)}<script>{resource('static/copy.js')}</script>\n</body></html>\n"
    ).encode()
