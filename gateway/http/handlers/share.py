"""``POST /share/{organization}/{dataset}``: a new share link, for a caller whose own grant reads the dataset.

The form of a dataset page posts here (``expires`` in seconds, ``tree`` the page's tree); a script may too,
with its token. The answer is the link as JSON, or as a page for a browser's form. A link cannot make links.
"""

import json
import logging
import time
from dataclasses import dataclass
from urllib.parse import parse_qs

from ..messages import SHARE_PREFIX, Answer, HttpError, Request, raw_headers
from ..origin import PublicOrigin
from ..pages.markup import HTML, path_of
from ..pages.share_link import render_share_link
from ..share import ShareKey
from ..urls import SHARE_NEEDS, TREE_ROUTES, parse_share_path
from .access import Authorizer

log = logging.getLogger("gateway")
MAX_FORM_BYTES = 4096
DEFAULT_TREE = "zarr3"
NO_STORE = {"Cache-Control": "no-store"}


def share_url(base: str, capability: str, tree: str, organization: str, dataset: str) -> str:
    """The link to hand out: the dataset's page in ``tree``, below the capability's prefix."""
    return f"{base}{SHARE_PREFIX}{capability}/data/{tree}/{path_of(organization, dataset)}/"


def expiry_text(expires: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))


async def _form(request: Request) -> dict[str, str]:
    """The form fields of the body (``application/x-www-form-urlencoded``) over those of the query."""
    body = b""
    receive = request.receive
    while receive is not None:
        message = await receive()
        body += message.get("body", b"")
        if len(body) > MAX_FORM_BYTES:
            raise HttpError(413, f"a share request's form holds at most {MAX_FORM_BYTES} bytes")
        if message["type"] != "http.request" or not message.get("more_body"):
            break
    fields: dict[str, str] = {}
    for source in (request.query_string, body):
        for name, values in parse_qs(source.decode("latin-1")).items():
            if name != "token":
                fields[name] = values[-1]
    return fields


def _seconds(text: str | None, most: int) -> int:
    if text is None:
        return min(24 * 3600, most)
    if not text.isdigit() or not 0 < int(text) <= most:
        raise HttpError(400, f"expires is the link's lifetime in whole seconds, from 1 to {most}")
    return int(text)


@dataclass(frozen=True, slots=True)
class ShareHandler:
    """Makes links with ``key`` (None: the gateway makes none), at most ``max_seconds`` long."""

    access: Authorizer
    key: ShareKey | None
    max_seconds: int
    origin: PublicOrigin

    async def __call__(self, request: Request) -> Answer:
        organization, name = parse_share_path(request.path)
        if request.method not in SHARE_NEEDS.methods:
            raise HttpError(405, "a share link is made with POST", {"Allow": ", ".join(SHARE_NEEDS.methods)})
        _, decision = await self.access.admit(SHARE_NEEDS, request)  # 401 or 403 as for its data; 403 for a link
        if self.key is None:
            raise HttpError(404, "this gateway makes no share links (no share_key_file is set)")
        await self.access.datasets.served(decision)  # 404 as for its data
        form = await _form(request)
        seconds = _seconds(form.get("expires"), self.max_seconds)
        tree = form.get("tree", DEFAULT_TREE)
        if tree not in TREE_ROUTES:
            raise HttpError(400, f"unknown tree {tree!r}; there are {', '.join(TREE_ROUTES)}")
        claims, capability = self.key.issue(organization, name, seconds)
        base, _ = self.origin.of(request.headers, request.client)
        link = share_url(base, capability, tree, organization, name)
        log.info("share link %s made for %s/%s, expires %s", claims.id, organization, name, expiry_text(claims.expires))
        if b"text/html" in request.headers.get(b"accept", b""):
            body = render_share_link(organization, name, link, claims.id, expiry_text(claims.expires))
            return Answer(201, raw_headers(NO_STORE), body, HTML)
        document = {"link": link, "id": claims.id, "expires": claims.expires, "expires_at": expiry_text(claims.expires)}
        return Answer(201, raw_headers(NO_STORE), json.dumps(document).encode(), "application/json")
