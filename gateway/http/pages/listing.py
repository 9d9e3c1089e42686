"""The plain listing: one ``<a href>`` per child, what fsspec lists and what every page below keeps."""

from dataclasses import dataclass
from html import escape
from urllib.parse import quote


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    is_directory: bool
    note: str | None = None  # shown instead of a link: why the entry cannot be served


def render_listing(base_path: str, entries: list[Entry]) -> bytes:
    """A page for the directory at ``base_path`` (absolute, ending in "/").

    Links are absolute paths: fsspec resolves them against the server whether
    or not the page's URL ended in a slash.
    """
    title = escape(f"Index of {base_path}")
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{title}</title></head>\n<body><h1>{title}</h1>\n<ul>\n"
        + "\n".join(listing_items(base_path, entries))
        + "\n</ul></body></html>\n"
    ).encode()


def listing_items(base_path: str, entries: list[Entry]) -> list[str]:
    """The ``<li>`` of each entry: a link (a child for fsspec), or the reason it cannot be served."""
    items = []
    for entry in entries:
        label = escape(entry.name + ("/" if entry.is_directory else ""))
        if entry.note is not None:
            items.append(f"<li>{label} &mdash; unavailable: {escape(entry.note)}</li>")
            continue
        href = quote(base_path + entry.name + ("/" if entry.is_directory else ""))
        items.append(f'<li><a href="{href}">{label}</a></li>')
    return items
