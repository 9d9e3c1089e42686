"""The share form of a dataset page (the page that shows the new link is :mod:`.share_link`).

The form posts to ``/share/{organization}/{dataset}`` with the page's own credential form (a ``/t/{token}``
path, or nothing: a header or a cookie the browser sends itself), so only a person the page was granted to
can make a link from it.
"""

from dataclasses import dataclass
from html import escape

from ..urls import SHARE_ROUTE
from .markup import path_of
from .neuroglancer import token_path

DAY = 24 * 3600


@dataclass(frozen=True, slots=True)
class ShareForm:
    """Where a dataset page's share form posts, and the longest link it may ask for."""

    action: str
    tree: str
    max_seconds: int


def share_form(root_path: str, token: str | None, organization: str, dataset: str, tree: str, most: int) -> ShareForm:
    action = f"{root_path}{token_path(token)}{SHARE_ROUTE}{path_of(organization, dataset)}"
    return ShareForm(action, tree, most)


def render_share_form(form: ShareForm | None) -> str:
    """The form's markup, or nothing where the page cannot make links (no key, or the page is a link's own)."""
    if form is None:
        return ""
    default = min(DAY, form.max_seconds)
    return (
        '<section class="share">\n<h2>Share</h2>\n'
        f'<form class="share-form" method="post" action="{escape(form.action)}">'
        f'<input type="hidden" name="tree" value="{escape(form.tree)}">'
        "<label>A read-only link to this dataset, valid for "
        f'<input type="number" name="expires" min="1" max="{form.max_seconds}" value="{default}" required> '
        'seconds</label> <button type="submit">Make a share link</button></form>\n'
        "<p>Anyone with the link reads this dataset, and nothing else, until it expires or an operator revokes "
        "it.</p>\n</section>\n"
    )
