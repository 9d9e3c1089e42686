"""What every page writes the same way: escaped text, path segments, links that are not children, resources."""

import functools
from html import escape
from importlib import resources
from urllib.parse import quote

HTML = "text/html; charset=utf-8"


def text(value: str) -> str:
    """Escaped text in which no absolute URL is literal (``//`` as references): fsspec must not see children."""
    return escape(value).replace("/", "&#47;")


def path_of(*segments: str) -> str:
    """Segments joined by "/", each percent-encoded whole."""
    return "/".join(quote(segment, safe="") for segment in segments)


def other_link(href: str, label: str, css_class: str, new_tab: bool = False) -> str:
    """A link that is not a child of the page: ``href = "..."`` (spaces around "=", the same attribute to HTML)
    is not what fsspec's listing parser takes for a child, whatever the URL; ``href`` is a path or an
    absolute URL already escaped where it needs to be, ``label`` markup."""
    target = ' target="_blank" rel="noopener noreferrer"' if new_tab else ""
    return f'<a class="{css_class}" href = "{escape(href)}"{target}>{label}</a>'


def page_head(title: str) -> str:
    """The start of every styled page (listings, the landing and dataset pages, error pages), up to ``<body>``;
    ``title`` is markup."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="referrer" content="no-referrer">'
        f"<title>{title}</title>\n<style>{resource('static/pages.css')}</style></head>\n<body>\n"
    )


@functools.cache
def resource(name: str) -> str:
    """A text file shipped in this package (``static/``, ``snippets/``): read once per process."""
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
