"""The page a browser gets back from a dataset page's share form: the new link, its id and its expiry."""

from html import escape

from .markup import other_link, page_head, text


def render_share_link(organization: str, dataset: str, link: str, link_id: str, expires: str) -> bytes:
    """The page a browser gets back from the form: the link to copy, its id (to revoke it) and its expiry."""
    title = escape(f"Share link for {organization}/{dataset}")
    return (
        page_head(title) + f"<h1>{title}</h1>\n"
        f'<section class="share-link"><p><input class="link" readonly size="80" value="{escape(link)}"></p>\n'
        f"<p>{other_link(link, 'Open the shared page', 'open-link', new_tab=True)}</p>\n"
        f'<p>Id <code class="link-id">{escape(link_id)}</code> (an operator revokes it with '
        f"<code>zarr-gateway share --revoke={escape(link_id)}</code>); expires {text(expires)}.</p></section>\n"
        "</body></html>\n"
    ).encode()
