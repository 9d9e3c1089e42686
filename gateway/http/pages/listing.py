"""The plain listing: one ``<a href>`` per child, what fsspec lists and what every page below keeps.

A listing is a page a person opens too (an organization, a layer, an array), so it has the dataset page's
style, a path back up, and links in the page's credential form (:mod:`.links`).
"""

from collections.abc import Iterable
from dataclasses import dataclass
from html import escape
from urllib.parse import quote

from .links import PLAIN, LinkForm
from .markup import other_link, page_head, resource, text

# What a listing holds while it is made, per entry beside its name (the entry, its <li>, the page's text and
# bytes: 320 bytes measured for a 40-character name) and per character of the name (kept four times over):
# what it counts against the worker's memory budget, from the names alone, before the page is made.
LISTING_ENTRY_BYTES = 384
NAME_COPIES = 4
PAGE_BYTES = 16 << 10  # the page around the entries: its head, style and breadcrumbs


def listing_bytes(names: Iterable[str]) -> int:
    """The most a listing (or a page of cards) of entries named ``names`` holds while it is made."""
    return PAGE_BYTES + sum(LISTING_ENTRY_BYTES + NAME_COPIES * len(name) for name in names)


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    is_directory: bool
    note: str | None = None  # shown instead of a link: why the entry cannot be served


def page_bytes(entries: list[Entry]) -> int:
    """:func:`listing_bytes` of a page of ``entries`` (a note counted as part of its name)."""
    return listing_bytes(entry.name + (entry.note or "") for entry in entries)


def render_listing(base_path: str, entries: list[Entry], links: LinkForm = PLAIN) -> bytes:
    """A page for the directory at ``base_path`` (absolute, ending in "/").

    Links are absolute paths: fsspec resolves them against the server whether
    or not the page's URL ended in a slash.
    """
    title = escape(f"Index of {base_path}")
    return (
        page_head(title) + f"<h1>{text(base_path)}<small>Index of {text(base_path)}</small></h1>\n"
        f"{token_note(links)}{breadcrumbs(base_path, links)}"
        '<ul class="children">\n' + "\n".join(listing_items(base_path, entries, links)) + "\n</ul>\n</body></html>\n"
    ).encode()


def listing_items(base_path: str, entries: list[Entry], links: LinkForm = PLAIN) -> list[str]:
    """The ``<li>`` of each entry: a link (a child for fsspec), or the reason it cannot be served."""
    items = []
    for entry in entries:
        label = escape(entry.name + ("/" if entry.is_directory else ""))
        if entry.note is not None:
            items.append(f"<li>{label} &mdash; unavailable: {escape(entry.note)}</li>")
            continue
        href = links.href(quote(base_path + entry.name + ("/" if entry.is_directory else "")))
        items.append(f'<li><a href="{escape(href)}">{label}</a></li>')
    return items


def breadcrumbs(base_path: str, links: LinkForm) -> str:
    """Links to the start page and to each directory above ``base_path``: no page is a dead end."""
    parts = [part for part in base_path.strip("/").split("/") if part]
    crumbs = [other_link(links.href("/"), "start", "up")]
    for depth in range(2, len(parts)):  # from a tree's root: /data/ itself is no page
        crumbs.append(other_link(links.href(quote("/" + "/".join(parts[:depth]) + "/")), text(parts[depth - 1]), "up"))
    return f'<nav class="breadcrumbs">{" / ".join(crumbs)}</nav>\n'


def token_note(links: LinkForm) -> str:
    """The warning a page opened with a credential in its address shows: its links carry it too."""
    return resource("static/token-note.html") if links.in_address else ""
