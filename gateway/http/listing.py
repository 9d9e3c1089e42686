"""HTML directory pages whose links fsspec's HTTP filesystem and browsers both follow.

Every level is a plain listing except a dataset, whose page also helps a person: a card per layer
(a preview, the facts, a Neuroglancer link) and code to read it with each client. That page must
stay a listing for fsspec, which takes every ``<a href>`` and, by default, every absolute URL in
the text below the page's own URL for a child: so the listing is the only list of links to the
dataset's tree, previews live under ``/preview/``, the Neuroglancer state is percent-encoded, and
URLs in the text are written with ``//`` as character references (rendered and copied unchanged).
"""

import ipaddress
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any
from urllib.parse import quote, urlsplit

from gateway_storage.geometry import Vec3, mag_name

from ..sources.catalog import Dataset
from ..sources.units import meters_per_unit
from .urls import TOKEN_PREFIX

TOKEN_PLACEHOLDER = "<token>"
NEUROGLANCER_SCHEMES = {"zarr": ("zarr2", "zarr"), "zarr3": ("zarr3", "zarr3"), "xarray": ("zarr3", "zarr3")}


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    is_directory: bool
    note: str | None = None  # shown instead of a link: why the entry cannot be served


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
class Snippet:
    client: str  # the data-client attribute: zarr-python, tensorstore, webknossos, xarray
    title: str
    code: str


@dataclass(frozen=True, slots=True)
class DatasetPage:
    organization: str
    name: str
    layers: tuple[LayerCard, ...]
    snippets: tuple[Snippet, ...]
    carries_token: bool = False  # the page was asked for with ?token=, and its links carry the token on


def render_listing(base_path: str, entries: list[Entry]) -> bytes:
    """A page for the directory at ``base_path`` (absolute, ending in "/").

    Links are absolute paths: fsspec resolves them against the server whether
    or not the page's URL ended in a slash.
    """
    title = escape(f"Index of {base_path}")
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{title}</title></head>\n<body><h1>{title}</h1>\n<ul>\n"
        + "\n".join(_listing_items(base_path, entries))
        + "\n</ul></body></html>\n"
    ).encode()


def _listing_items(base_path: str, entries: list[Entry]) -> list[str]:
    items = []
    for entry in entries:
        label = escape(entry.name + ("/" if entry.is_directory else ""))
        if entry.note is not None:
            items.append(f"<li>{label} &mdash; unavailable: {escape(entry.note)}</li>")
            continue
        href = quote(base_path + entry.name + ("/" if entry.is_directory else ""))
        items.append(f'<li><a href="{href}">{label}</a></li>')
    return items


# --- the dataset page ------------------------------------------------------------------------------------------


class PublicOrigin:
    """Where clients reach the gateway, for the absolute URLs of a page (snippets, Neuroglancer sources).

    ``public_url`` (a setting) when the operator gave one; else the request's own Host, and
    X-Forwarded-Proto/-Host only when the peer is one of the ``trusted_proxies`` (addresses or networks):
    anyone else's forwarded headers are the client's own words and must not set the host of a page.
    """

    def __init__(self, public_url: str | None, trusted_proxies: Iterable[str]) -> None:
        self.public_url = public_url.rstrip("/") if public_url else None
        self.root_path = urlsplit(self.public_url).path if self.public_url else ""
        self.trusted = tuple(ipaddress.ip_network(proxy, strict=False) for proxy in trusted_proxies)

    def of(self, headers: Mapping[bytes, bytes], client: str) -> tuple[str, str]:
        """The public base (``scheme://host`` and any root path) and the root path alone."""
        if self.public_url is not None:
            return self.public_url, self.root_path
        return public_base(headers, forwarded=self._trusts(client)), ""

    def _trusts(self, client: str) -> bool:
        if not self.trusted or not client:
            return False
        try:
            address = ipaddress.ip_address(client)
        except ValueError:
            return False
        return any(address in network for network in self.trusted)


def public_base(headers: Mapping[str, str] | Mapping[bytes, bytes], forwarded: bool) -> str:
    """``scheme://host`` as the client sees it: Host, or X-Forwarded-Proto/-Host when ``forwarded`` (the peer
    is a trusted proxy, which sets them itself).

    ``headers`` as Starlette gives them (str) or as the ASGI scope holds them (bytes). A value that is not a
    plain host (or http/https) is ignored, so a forged header cannot inject markup or a path into the page's URLs.
    """
    lowered = {_latin1(name).lower(): _latin1(value) for name, value in headers.items()}
    scheme = _first(lowered.get("x-forwarded-proto")).lower() if forwarded else "http"
    if scheme not in ("http", "https"):
        scheme = "http"
    host = _first(lowered.get("x-forwarded-host")) if forwarded else ""
    if not _is_host(host):
        host = lowered.get("host", "").strip()
    if not _is_host(host):
        host = "localhost"
    return f"{scheme}://{host}"


def _latin1(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


def _first(value: str | None) -> str:
    """The first of a comma-separated list that proxies append to."""
    return (value or "").split(",")[0].strip()


def _is_host(host: str) -> bool:
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-:[]_")
    return bool(host) and all(character in allowed for character in host)


def _path(*segments: str) -> str:
    return "/".join(quote(segment, safe="") for segment in segments)


def _with_token(url: str, token: str | None) -> str:
    return url if token is None else f"{url}?token={quote(token, safe='')}"


def _token_path(token: str | None) -> str:
    """The ``/t/{token}`` path that carries ``token`` to every file below a viewer's source URL, or nothing.

    Neuroglancer cannot be given a token any other way for every client in use: its zarr sources refuse a
    query (or, in older clients, append keys to it), and a link cannot set a header.
    """
    return "" if token is None else f"{TOKEN_PREFIX}{quote(token, safe='')}"


def neuroglancer_source(base: str, tree: str, organization: str, dataset: str, layer: str, token: str | None) -> str:
    """The layer group as a Neuroglancer source: zarr2:// of the v2 tree, zarr3:// of the v3 tree for the others."""
    scheme, served_tree = NEUROGLANCER_SCHEMES.get(tree, NEUROGLANCER_SCHEMES["zarr3"])
    return f"{scheme}://{base}{_token_path(token)}/data/{served_tree}/{_path(organization, dataset, layer)}/"


def mesh_source(base: str, organization: str, dataset: str, layer: str, token: str | None) -> str:
    """The layer's multi-resolution mesh source (:mod:`gateway.meshes`) in Neuroglancer's pipeline syntax, with
    a token in the path as for the volume sources."""
    url = f"{base}{_token_path(token)}/data/meshes/{_path(organization, dataset, layer)}/multires/"
    return f"{url}|neuroglancer-precomputed:"


def neuroglancer_layer(
    source: str, name: str, category: str, meshes: str | None = None, segments: Sequence[int] = ()
) -> dict[str, Any]:
    """One layer of a Neuroglancer state; a segmentation with its mesh source and the segments to show."""
    if category != "segmentation":
        return {"type": "image", "source": source, "name": name}
    layer: dict[str, Any] = {
        "type": "segmentation",
        "source": source if meshes is None else [source, meshes],
        "name": name,
    }
    if segments:
        layer["segments"] = [str(segment) for segment in segments]
    return layer


def neuroglancer_link(
    neuroglancer_url: str,
    source_url: str,
    layer_name: str,
    category: str,
    voxel_size: tuple[float, float, float],
    unit: str,
    layers: Sequence[dict[str, Any]] = (),
) -> str:
    """A link that opens Neuroglancer on ``layers`` (by default the one layer), ``layer_name`` selected, its
    x, y, z dimensions the dataset's voxel size.

    Neuroglancer's state holds scales in meters; giving them keeps anisotropic data from looking squashed.
    The JSON is percent-encoded whole, so no URL appears literally in the page.
    """
    meters = meters_per_unit(unit)
    state = {
        "dimensions": {axis: [float(f"{size * meters:.12g}"), "m"] for axis, size in zip("xyz", voxel_size)},
        "layers": list(layers) or [neuroglancer_layer(source_url, layer_name, category)],
        "selectedLayer": {"layer": layer_name},
        "layout": "4panel",
    }
    fragment = quote(json.dumps(state, separators=(",", ":")), safe="")
    return f"{neuroglancer_url.split('#')[0]}#!{fragment}"


def snippets(
    public_base: str, organization: str, dataset: str, first_layer: str, finest_mag: str, needs_token: bool
) -> tuple[Snippet, ...]:
    """Code that reads this dataset with each client, with ``<token>`` where the gateway needs a token."""
    layer_path = _path(organization, dataset, first_layer)
    zarr_url = f"{public_base}/data/zarr/{layer_path}/{finest_mag}"
    zarr3_url = f"{public_base}/data/zarr3/{layer_path}/{finest_mag}/"
    dataset_url = f"{public_base}/data/zarr/{_path(organization, dataset)}"
    xarray_url = f"{public_base}/data/xarray/{_path(organization, dataset)}"
    layer_literal = json.dumps(first_layer)
    mag_literal = json.dumps(finest_mag)
    token = json.dumps(TOKEN_PLACEHOLDER)
    zarr_options = f', storage_options={{"headers": {{"X-Auth-Token": {token}}}}}' if needs_token else ""
    ts_headers = f'\n        "headers": ["X-Auth-Token: {TOKEN_PLACEHOLDER}"],' if needs_token else ""
    upath_options = f', headers={{"X-Auth-Token": {token}}}' if needs_token else ""
    xarray_options = f'\noptions = {{"headers": {{"X-Auth-Token": {token}}}}}' if needs_token else ""
    xarray_kwargs = ", storage_options=options" if needs_token else ""
    return (
        Snippet(
            "zarr-python",
            "zarr-python (Zarr v2 tree)",
            f"""import zarr

url = "{zarr_url}"
array = zarr.open_array(url, mode="r"{zarr_options})
print(array.shape, array.dtype)  # axes c, x, y, z
x, y, z = (n // 2 for n in array.shape[1:])
cutout = array[0, x : x + 64, y : y + 64, z]
print(cutout)
""",
        ),
        Snippet(
            "tensorstore",
            "tensorstore (Zarr v3 tree)",
            f"""import tensorstore as ts

spec = {{
    "driver": "zarr3",
    "kvstore": {{
        "driver": "http",
        "base_url": "{zarr3_url}",{ts_headers}
    }},
}}
array = ts.open(spec, read=True).result()
print(array.domain)  # axes c, x, y, z
x, y, z = (n // 2 for n in array.shape[1:])
cutout = array[0, x : x + 64, y : y + 64, z].read().result()
print(cutout)
""",
        ),
        Snippet(
            "webknossos",
            "webknossos-libs",
            f"""import webknossos as wk
from upath import UPath

url = "{dataset_url}"
dataset = wk.Dataset.open(UPath(url{upath_options}))
layer = dataset.get_layer({layer_literal})
mag = layer.get_mag({mag_literal})
corner = wk.BoundingBox(layer.bounding_box.topleft, (256, 256, 1))
box = layer.bounding_box.intersected_with(corner).align_with_mag(mag.mag, ceil=True)
cutout = mag.read(absolute_bounding_box=box)
print(layer.bounding_box, cutout.shape, cutout.dtype)
""",
        ),
        Snippet(
            "xarray",
            "xarray",
            f"""import xarray as xr
{xarray_options}
mag = xr.open_zarr("{xarray_url}/{finest_mag}"{xarray_kwargs})  # every layer at mag {finest_mag}
print(mag)
tree = xr.open_datatree("{xarray_url}/", engine="zarr"{xarray_kwargs})  # every layer and mag
print(tree)
""",
        ),
    )


def build_dataset_page(
    dataset: Dataset,
    tree: str,
    base: str,
    token: str | None,
    neuroglancer_url: str,
    needs_token: bool,
    root_path: str = "",
    largest: Mapping[str, Sequence[int]] | None = None,
) -> DatasetPage:
    """The page of a dataset as tree ``tree`` lists it.

    ``base`` is the public ``scheme://host`` (see ``public_base``) followed by any root path; ``token`` is the
    one the page was requested with in its address (it goes into image and viewer URLs, which cannot send
    headers); ``needs_token`` says whether the gateway checks tokens (the snippets then show a placeholder);
    ``largest`` names a few of the largest segments of segmentation layers, for the viewer to select.
    """
    scale = dataset.properties.scale
    servable = {name: layer for name, layer in dataset.layers.items() if layer.mags}  # the others get no card
    sources = {
        name: neuroglancer_source(base, tree, dataset.organization, dataset.name, name, token) for name in servable
    }
    # Every link opens every layer, images under segmentations, each segmentation with its meshes and a few of
    # its largest segments selected, so that the 3-D view shows something at once.
    viewer_layers = [
        neuroglancer_layer(
            sources[name],
            name,
            layer.properties.category,
            mesh_source(base, dataset.organization, dataset.name, name, token)
            if layer.properties.dtype.kind in "ui"
            else None,
            (largest or {}).get(name, ()),
        )
        for name, layer in sorted(servable.items(), key=lambda item: item[1].properties.category == "segmentation")
    ]
    cards = []
    for name, layer in servable.items():
        properties = layer.properties
        bbox = properties.bounding_box
        preview = f"{root_path}/preview/{_path(dataset.organization, dataset.name, name)}.png"
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
                preview_url=_with_token(preview, token),
                neuroglancer_url=neuroglancer_link(
                    neuroglancer_url, sources[name], name, properties.category, scale.factor, scale.unit, viewer_layers
                ),
            )
        )
    code: tuple[Snippet, ...] = ()
    if cards:
        first = cards[0]
        code = snippets(base, dataset.organization, dataset.name, first.name, first.mags[0], needs_token)
    return DatasetPage(dataset.organization, dataset.name, tuple(cards), code, token is not None)


def _text(value: str) -> str:
    """Escaped text in which no absolute URL is literal (``//`` as references): fsspec must not see children."""
    return escape(value).replace("/", "&#47;")


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
    return (
        f'<section class="layer" id="layer-{name}" data-layer="{name}">\n<h2>{name}</h2>\n<div class="card">\n'
        f'<img class="preview" src="{escape(card.preview_url)}" alt="preview of {name}">\n'
        f'<div class="about">\n<dl class="facts">\n{rows}\n</dl>\n'
        f'<p><a class="open-neuroglancer" href="{escape(card.neuroglancer_url)}" target="_blank" '
        'rel="noopener noreferrer">'
        "Open in Neuroglancer</a></p>\n</div>\n</div>\n</section>"
    )


def _snippet(snippet: Snippet) -> str:
    client = escape(snippet.client)
    return (
        f'<div class="snippet-box"><h3>{escape(snippet.title)}</h3>'
        f'<button type="button" class="copy" data-copies="snippet-{client}">Copy</button>\n'
        f'<pre class="snippet" id="snippet-{client}" data-client="{client}">{_text(snippet.code)}</pre></div>'
    )


_STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 60em; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h1 small { font-weight: normal; color: #666; font-size: 0.6em; display: block; }
ul.children { columns: 2; padding-left: 1.2em; }
section.layer { border: 1px solid #ccc; border-radius: 8px; margin: 1.2em 0; padding: 0.6em 1em 1em; }
section.layer h2 { margin: 0 0 0.5em; font-size: 1.2em; }
.card { display: flex; gap: 1.5em; align-items: flex-start; flex-wrap: wrap; }
img.preview { width: 256px; max-width: 100%; image-rendering: pixelated; background: #000; border-radius: 4px; }
dl.facts { display: grid; grid-template-columns: max-content auto; gap: 0.2em 1em; margin: 0 0 0.8em; }
dl.facts dt { color: #666; } dl.facts dd { margin: 0; }
a.open-neuroglancer { display: inline-block; padding: 0.3em 0.8em; border-radius: 4px; background: #1f5fbf;
  color: #fff; text-decoration: none; }
.snippet-box { position: relative; margin: 1em 0; } .snippet-box h3 { font-size: 1em; margin: 0 0 0.3em; }
pre.snippet { background: #f4f4f4; border: 1px solid #ddd; border-radius: 4px; padding: 0.8em; overflow-x: auto; }
button.copy { position: absolute; right: 0.5em; top: 2em; }
p.token-note { background: #fff4d6; border: 1px solid #e0b84c; border-radius: 4px; padding: 0.6em 0.8em; }
"""

# Copies the snippet's text; navigator.clipboard needs a secure context, so plain http pages select and copy.
_SCRIPT = """
document.addEventListener("click", function (event) {
  var button = event.target.closest ? event.target.closest("button.copy") : null;
  if (!button) { return; }
  var pre = document.getElementById(button.getAttribute("data-copies"));
  var text = pre.textContent;
  function report(ok) {
    button.textContent = ok ? "Copied" : "Press Ctrl+C";
    setTimeout(function () { button.textContent = "Copy"; }, 1500);
  }
  function selectAndCopy() {
    var range = document.createRange();
    range.selectNodeContents(pre);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (error) { ok = false; }
    report(ok);
  }
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(function () { report(true); }, selectAndCopy);
  } else {
    selectAndCopy();
  }
});
"""


_TOKEN_NOTE = (
    '<p class="token-note" role="note"><strong>This page was opened with a token in its address.</strong> '
    "Its preview images and Neuroglancer links carry that token: whoever gets a link copied from this page, "
    "or this page's address, reads what the token grants. Share links without the token, and let each "
    "person use their own.</p>\n"
)


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
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="referrer" content="no-referrer">'
        f"<title>{title}</title>\n<style>{_STYLE}</style></head>\n<body>\n"
        f"<h1>{title}<small>Index of {_text(base_path)}</small></h1>\n"
        f"{_TOKEN_NOTE if page.carries_token else ''}"
        '<ul class="children">\n' + "\n".join(_listing_items(base_path, entries)) + "\n</ul>\n"
        f"{cards}\n{code}<script>{_SCRIPT}</script>\n</body></html>\n"
    ).encode()
