"""A crawler that follows, from one page, every link a browser can reach on the gateway's own origin, as a click
does (the address alone, plus what the session sends by itself: a cookie, or a header the test gives it)."""

from collections import deque
from dataclasses import dataclass, field
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import requests

# What Chromium sends when it follows a link to a page: the gateway answers it as a browser.
BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"


class _Links(HTMLParser):
    """The addresses a page leads a browser to: its links (``<a href>``, whatever their spacing) and images."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value for name, value in attrs if value}
        if tag in ("a", "link") and "href" in values:
            self.found.append(values["href"])
        elif tag in ("img", "script") and "src" in values:
            self.found.append(values["src"])


@dataclass
class Walk:
    """What a walk met: the status of each address (path and query) and the page each was first linked from."""

    statuses: dict[str, int] = field(default_factory=dict)
    linked_from: dict[str, str] = field(default_factory=dict)

    def failures(self) -> dict[str, tuple[int, str]]:
        """The addresses answered with anything but a success, with the page that linked them."""
        return {
            address: (status, self.linked_from.get(address, ""))
            for address, status in self.statuses.items()
            if status >= 400
        }


def walk(
    session: requests.Session,
    origin: str,
    starts: list[str],
    limit: int = 3000,
    headers: dict[str, str] | None = None,
) -> Walk:
    """Follow every same-origin link from ``origin`` + each of ``starts`` breadth first (a viewer's state after
    ``#`` is no part of the address a browser fetches); each address once, ``limit`` at most (the walk fails past
    it)."""
    seen = Walk()
    queue = deque(starts)
    host = urlsplit(origin).netloc
    while queue:
        address = queue.popleft()
        if address in seen.statuses:
            continue
        assert len(seen.statuses) < limit, f"more than {limit} addresses: the walk does not end"
        answer = session.get(
            origin + address, headers={"Accept": BROWSER_ACCEPT, **(headers or {})}, timeout=300, allow_redirects=True
        )
        seen.statuses[address] = answer.status_code
        if answer.status_code >= 400 or not answer.headers.get("content-type", "").startswith("text/html"):
            continue
        page = _Links()
        page.feed(answer.text)
        for link in page.found:
            absolute = urlsplit(urljoin(answer.url, link))
            if absolute.netloc != host or absolute.scheme not in ("http", "https"):
                continue  # another site (the public Neuroglancer, documentation)
            target = absolute.path + (f"?{absolute.query}" if absolute.query else "")
            seen.linked_from.setdefault(target, address)
            queue.append(target)
    return seen
