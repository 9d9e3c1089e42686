"""Where clients reach the gateway: the public origin of a page's absolute URLs, and whom to trust for it.

A forwarded header is a client's own word unless a proxy the operator names set it; only then may it set the
scheme and host that pages write into snippets and viewer sources.
"""

import ipaddress
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit


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
