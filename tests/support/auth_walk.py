"""The proxy's ``/auth`` against the routes: every place of the URL table, and hostile spellings of paths to it,
asked both ways with the same credential, exactly as written (no client normalizes a path here).

What agrees (:func:`disagreement`): a grant (204) where the route refuses for no credential's sake (not 401 or
403); a 202 ("left to the routes") where the route refuses for another reason (a 4xx but 401 and 403); a refusal
(401, 403) where the route refuses the same. Two places ask the proxy for more than their route does, by design:
the start page without a credential (its open view, which lists nothing, reaches browsers through the proxy's
error page) and a path no place takes (the router's 404 is kept from anonymous clients); there a 401 may stand for
the route's 200 or 404.
"""

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from gateway.http.urls import PLACES

from .datasets import ORG, OTHER_TOKEN, TOKEN

DATASET = "wk_dataset"
THEIRS = ("other_org", "theirs")
# Paths below every prefix place: each parser meets the shapes of every other one.
TAILS = (
    "/",
    f"/{ORG}",
    f"/{ORG}/",
    f"/{ORG}/{DATASET}/",
    f"/{ORG}/{DATASET}/color_u8/1/.zarray",
    f"/{ORG}/{DATASET}/color_u8/1/0.0.0.0",
    f"/{ORG}/{DATASET}/color_u8/1/c/0/0/0/0",
    f"/{ORG}/{DATASET}/color_u8/info",
    f"/{ORG}/{DATASET}/color_u8.png",
    f"/{ORG}/{DATASET}/segmentation/multires/info",
    f"/{ORG}/{DATASET}",
    f"/{ORG}/nothing_here/",
    "/{}/{}/".format(*THEIRS),
    "/{}/{}/color_u8.png".format(*THEIRS),
    "/{}/{}/color_u8/1/.zarray".format(*THEIRS),
    f"/{THEIRS[0]}/",
)
THEIR_FILE = "/data/zarr/{}/{}/color_u8/1/.zarray".format(*THEIRS)
CREDENTIALS: dict[str, dict[str, str]] = {
    "none": {},
    "token": {"X-Auth-Token": TOKEN},
    "other token": {"X-Auth-Token": OTHER_TOKEN},
    "unknown token": {"X-Auth-Token": "not-a-token"},
}
HOSTILE_CREDENTIALS = ("none", "token", "other token")
PROXY_HEALTH = b'{"status": "ok"}\n'  # deploy/nginx.conf's own /healthz (a path nginx normalizes to it)


def place_paths() -> list[str]:
    """A path to every place of the table: the place's own, and for a prefix every tail below it."""
    paths = []
    for place in PLACES:
        paths.append(place.path)
        if place.below:
            paths += [place.path + tail for tail in TAILS]
    return paths


def hostile(path: str) -> list[str]:
    """Spellings of ``path`` (and of paths that start as it does) that a proxy or a server might read otherwise."""
    plain = path.rstrip("/") or ""
    return [
        plain + "/%2e%2e/%2e%2e/%2e%2e" + THEIR_FILE,  # dot segments, escaped: a public prefix, then a data path
        plain + "/../../.." + THEIR_FILE,
        plain + "/..%2F..%2F.." + THEIR_FILE.replace("/", "%2F"),  # encoded slashes
        "/" + path[1:].replace("/", "%2F", 2),
        "/" + path,  # doubled slashes
        path.replace("/", "//"),
        path + "/./",
        path + "?token=" + TOKEN,  # query tricks: a second carrier, a misspelt one, a decoy
        path + "?TOKEN=" + OTHER_TOKEN,
        path + "?token=" + quote(OTHER_TOKEN) + "&token=",
        path + "?x=" + quote(THEIR_FILE, safe=""),
        path + ";" + THEIR_FILE,
        path + "/" + "a" * 6000,  # overlong
        path + "/%ff%fe",  # not UTF-8
        path + "/%00",
        "/t/" + quote(TOKEN) + path,  # below a path token and a share link
        "/s/s1.not-a-link" + path,
    ]


@dataclass(frozen=True)
class Case:
    method: str
    uri: str
    credential: str

    @property
    def headers(self) -> dict[str, str]:
        return CREDENTIALS[self.credential]


def cases() -> Iterator[Case]:
    """Every place's paths with every credential and a form's POST of each; the hostile spellings of each place's
    own path and of two below it (a file of a dataset granted to TOKEN, the dataset of OTHER_TOKEN) with a few."""
    for path in place_paths():
        for credential in CREDENTIALS:
            yield Case("GET", path, credential)
        yield Case("POST", path, "token")
    for place in PLACES:
        seeds = [place.path]
        if place.below:
            seeds += [place.path + TAILS[4], place.path + TAILS[12]]
        for seed in seeds:
            for uri in hostile(seed):
                for credential in HOSTILE_CREDENTIALS:
                    yield Case("GET", uri, credential)


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


def exchange(url: str, method: str, target: str, headers: dict[str, str]) -> Reply:
    """One request with ``target`` as the request line's target, byte for byte, on a connection of its own."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {urlsplit(url).netloc}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if method == "POST":
        lines.append("Content-Length: 0")
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    with socket.create_connection((urlsplit(url).hostname, urlsplit(url).port), timeout=30) as connection:
        connection.sendall(raw)
        received = b""
        while chunk := connection.recv(65536):
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    fields = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    return Reply(int(status_line.split(" ")[1]), fields, body)


def auth_of(gateway_url: str, case: Case) -> Reply:
    """The gateway's ``/auth`` for ``case``, asked as nginx asks it (the URI as sent, the method, the credential)."""
    headers = {"X-Original-URI": case.uri, "X-Original-Method": case.method, **case.headers}
    return exchange(gateway_url, "GET", "/auth", headers)


def disagreement(case: Case, auth: int, route: Reply) -> str | None:
    """Why ``/auth``'s answer ``auth`` does not agree with the route's answer ``route`` to ``case``; None if it does."""
    refuses_for_credential = route.status in (401, 403)
    if auth == 204 and not refuses_for_credential:
        return None
    if auth == 202 and 400 <= route.status < 500 and not refuses_for_credential:
        return None
    if auth in (401, 403) and route.status == auth:
        return None
    nowhere = route.status == 404 and b"nothing at" in route.body  # the router's own answer: no place takes it
    open_start = route.status == 200 and case.uri.partition("?")[0] == "/" and case.credential == "none"
    if auth == 401 and (nowhere or open_start):
        return None
    shown = f"{case.method} {case.uri[:150]} ({case.credential})"
    return f"{shown}: /auth {auth}, the route {route.status} {route.body[:150]!r}"


def proxy_disagreement(case: Case, auth: int, route: Reply, through: Reply) -> str | None:
    """Why the proxy's answer ``through`` to ``case`` is not what the gateway's ``/auth`` (``auth``) and route
    (``route``) decide; None if it is. An answer that comes from a gateway (it carries the gateway's
    ``Referrer-Policy``) was let through and must be the route's own; one that the proxy gives itself is its
    refusal: for the credential, exactly where /auth refuses, and otherwise one of its own (a malformed
    request, too long a URL, an internal location), which reaches no route."""
    shown = f"{case.method} {case.uri[:150]} ({case.credential}): /auth {auth}, the route {route.status}"
    if "referrer-policy" in through.headers:
        nowhere = route.status == 404 and b"nothing at" in route.body  # to an open location once nginx normalized it
        if through.status == route.status and (auth in (202, 204) or nowhere):
            return None
        return f"{shown}, let through by the proxy: {through.status} {through.body[:150]!r}"
    if through.status in (401, 403):
        if through.status == auth or (auth == 202 and 400 <= route.status < 500):
            return None  # refused as /auth refuses; or a refusal the token-check cache holds for the dataset's scope
        return f"{shown}, refused by the proxy: {through.status}"
    if through.status in (400, 414) and b'"status": ' + str(through.status).encode() in through.body:
        return None  # the proxy's own refusals of malformed requests (a path above the root, %00 too), as JSON
    if through.status in (404, 405) or (through.status == 200 and through.body == PROXY_HEALTH):
        return None  # an internal location, a method the proxy refuses, and its own health check
    return f"{shown}, answered by the proxy itself: {through.status} {through.body[:150]!r}"
