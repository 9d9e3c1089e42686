"""The page's credential form: how every link a page writes carries the credential the page was opened with.

A browser follows a link with nothing but its address (and the cookies of the origin), so a page opened with a
credential in its address must write that credential into each link to the gateway's own pages and files, in
the same form, or the click ends in a 401. Viewers' sources are a second kind of link: a viewer appends file
names to a source URL and drops or refuses a query, so a source carries a credential in its path.

One class per form; every page asks its form and never the token itself. A form that travels outside the
address (a header, a cookie) writes links as they are.
"""

from dataclasses import dataclass
from urllib.parse import quote

from ..urls import TOKEN_PREFIX


@dataclass(frozen=True, slots=True)
class LinkForm:
    """Links as they are: the page's credential, if any, does not travel in its address (a header, a cookie).

    ``root_path`` is the path a proxy in front serves the gateway under (see :mod:`gateway.http.origin`).
    """

    root_path: str = ""

    @property
    def in_address(self) -> bool:
        """Whether the page's address, and so each of its links, carries a credential (the page then says so)."""
        return False

    def href(self, path: str) -> str:
        """The public address of ``path`` (a path of the gateway, from its root, already percent-encoded)."""
        return self.root_path + path

    @property
    def path_prefix(self) -> str:
        """What goes between the root path and ``/data/`` (or ``/neuroglancer/``) in a viewer's address and its
        sources, which carry no query: the credential as a path segment, or nothing."""
        return ""


@dataclass(frozen=True, slots=True)
class TokenInAddress(LinkForm):
    """A page opened with a token in its address: viewer sources put it in their path."""

    token: str = ""

    @property
    def in_address(self) -> bool:
        return True

    @property
    def path_prefix(self) -> str:
        return token_segment(self.token)


@dataclass(frozen=True, slots=True)
class QueryToken(TokenInAddress):
    """A page opened with ``?token=``: its links keep the query."""

    def href(self, path: str) -> str:
        return f"{self.root_path}{path}?token={quote(self.token, safe='')}"


@dataclass(frozen=True, slots=True)
class PathToken(TokenInAddress):
    """A page opened below ``/t/{token}/``: every link stays below it."""

    def href(self, path: str) -> str:
        return f"{self.root_path}{self.path_prefix}{path}"


def token_segment(token: str) -> str:
    """``/t/{token}``, the token percent-encoded whole (a ``/`` in it stays inside the one segment)."""
    return f"{TOKEN_PREFIX}{quote(token, safe='')}"


PLAIN = LinkForm()  # links as they are, at the gateway's root


def link_form(token: str | None, in_path: bool, root_path: str = "") -> LinkForm:
    """The credential form of a page: how the request's credential came in its address (``token`` None: it did
    not, or there is none), which every link of the page keeps. The one place that decides it: a new kind of
    credential adds its case here and its :class:`LinkForm` beside the others."""
    if token is None:
        return LinkForm(root_path)
    return PathToken(root_path, token) if in_path else QueryToken(root_path, token)
