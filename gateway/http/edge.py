"""The ASGI application: one Starlette app, the only router, whose routes are the places of the URL table
(:mod:`gateway.http.urls`), with the error map applied where each route's handler runs and pure ASGI middleware
in its middleware list.

Around every request, outermost first (:class:`Application` builds the stack of these alone):

- :class:`RequestLog`: the request id, CORS and ``Referrer-Policy`` on every answer, the access log line,
  the metrics (in flight, per route label of the URL table, bytes) in the app's own :class:`RequestStats`;
- :class:`PathTokens`: ``/t/{token}/...`` and a share link's ``/s/{capability}/...`` routed as the path below
  them;
- the front (:class:`gateway.http.kept.KeptAnswers`, when answers are kept): a chunk whose answer is kept,
  given before dispatch;
- :class:`Methods`: a preflight for ``OPTIONS`` and 405 for any method but GET and HEAD, on every path
  alike but ``/share/`` (which takes a POST), before routing, so no route can forget it;
- Starlette's router (a path no route takes: the gateway's refusal, its default app), and each route's
  :class:`Endpoint`: the handler, and the error map (:mod:`gateway.http.errors`) for whatever it raises.

No layer hands another a request's state: what a path token or share link carries is read from the path as sent
(:func:`path_credential`) by each layer that needs it, and the metric label comes from the URL table.
The handlers keep the gateway's own plain :class:`Request` and :class:`Answer` (:mod:`gateway.http.messages`):
a chunk's path builds no framework request or response object (see docs/architecture.md, "The edge").
"""

import asyncio
import itertools
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp

from ..logs import access_log
from ..metrics import CacheWatch, RequestStats
from .auth import TOKEN_HEADER, read_token
from .errors import Browser, HiddenRoots, HttpError, error_answer, prefers_html, refusal
from .messages import SHARE_PREFIX, Answer, Message, Receive, Request, Scope, Send, link_prefix, logged_path
from .pages.links import LinkForm, link_form
from .share import link_id
from .urls import PLACES, TOKEN_PREFIX, RouteLabels, request_path, split_path_token, split_share_link, takes

EXPOSED = "Content-Length, Content-Range, Content-Type, ETag, Last-Modified, Accept-Ranges"
ALLOWED_HEADERS = (
    "Range, If-None-Match, If-Match, If-Range, If-Modified-Since, X-Auth-Token, Authorization, Content-Type"
)
ALLOWED_METHODS = "GET, HEAD, OPTIONS"
# On every answer: CORS for browser viewers, and no Referer to other origins (a page's address may hold ?token=).
_ALWAYS = [
    (b"access-control-allow-origin", b"*"),
    (b"access-control-expose-headers", EXPOSED.encode()),
    (b"referrer-policy", b"no-referrer"),
]
_PROCESS = os.urandom(4).hex()  # request ids of different workers never collide
# A client's (or a proxy's) X-Request-Id is kept only when it is plain, as the shipped proxy keeps it; it lands
# in log lines, so it can hold no separator and no control character.
_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")
Handler = Callable[[Request], Awaitable[Answer]]
_CREDENTIAL_PREFIXES = (TOKEN_PREFIX, SHARE_PREFIX)


@dataclass(frozen=True, slots=True)
class PathCredential:
    """What a ``/t/{token}/`` or ``/s/{capability}/`` path carries, and the path below it that the routes read."""

    below: str
    token: bytes | None = None
    link: bytes | None = None
    link_id: str = ""  # a link's id, as log lines show it (never its capability)


def path_credential(scope: Scope) -> PathCredential | None:
    """The credential of the request's path; None for a path of neither form.

    Read from the path as sent (``raw_path``, which :class:`PathTokens` leaves as it was), so every layer reads
    the same, before and after the path below the credential was routed.
    """
    raw = scope.get("raw_path")
    sent = raw.decode("latin-1") if raw else str(scope["path"])
    if not sent.startswith(_CREDENTIAL_PREFIXES) and "%" not in sent[:3]:  # the cheap test first: most paths
        return None  # (a path that decodes to one of the prefixes spells one of their characters as an escape)
    path = request_path(sent)
    if path.startswith(TOKEN_PREFIX):
        token, below = split_path_token(sent, path)
        return PathCredential(below, token=token)
    if path.startswith(SHARE_PREFIX):
        link, below = split_share_link(sent, path)
        return PathCredential(below, link=link, link_id="" if link is None else link_id(link.decode("latin-1")))
    return None


def request_of(scope: Scope, receive: Receive | None) -> Request:
    """The gateway's :class:`Request` of an HTTP scope, as routed (below a path token or share link)."""
    raw_headers = scope["headers"]
    client = scope.get("client")
    credential = path_credential(scope)
    request = Request(
        scope["method"],
        scope["path"],
        dict(raw_headers),
        scope.get("query_string", b""),
        receive,
        raw_headers,
        client[0] if client else "",
    )
    if credential is not None:
        request.path_token, request.path_link, request.link_id = credential.token, credential.link, credential.link_id
    return request


def browser_of(scope: Scope, root_path: str) -> Browser | None:
    """The request as the error map needs it when it prefers HTML (a browser following a link): its path as
    logged and the credential form of its address, which the error page's links keep; None for every other."""
    headers = scope["headers"]
    if not prefers_html(next((value for name, value in headers if name == b"accept"), None)):
        return None
    request = request_of(scope, None)
    lines = [value for name, value in headers if name == TOKEN_HEADER]
    try:
        token = read_token(lines, scope.get("query_string", b""), request.path_token)
    except HttpError:  # more than one token, or one spelt otherwise: the page links carry none
        token = None
    in_address = token.value if token is not None and token.in_url else None
    links = link_form(in_address, request.path_token is not None, root_path + link_prefix(request))
    return Browser(request.logged_path, links, LinkForm(root_path))


class RequestLog:
    """Request ids, the headers every answer carries (CORS, Referrer-Policy), the access log line and the
    metrics of every request (pure ASGI middleware: one wrapper of ``send`` for all of them)."""

    def __init__(self, app: ASGIApp, stats: RequestStats, watch: CacheWatch, labels: RouteLabels) -> None:
        self.app = app
        self.stats = stats
        self.watch = watch
        self.labels = labels
        self._ids = itertools.count()
        self._timer_armed = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        given_id = next((value for name, value in scope["headers"] if name == b"x-request-id"), b"")
        request_id = given_id if _REQUEST_ID.fullmatch(given_id) else f"{_PROCESS}-{next(self._ids):x}".encode()
        self.stats.in_flight += 1
        if not self._timer_armed:
            self._timer_armed = True
            asyncio.get_running_loop().call_later(1.0, self._tick)
        status = sent = 0

        async def logged_send(message: Message) -> None:
            nonlocal status, sent
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message["headers"], *_ALWAYS, (b"x-request-id", request_id)]
            else:
                sent += len(message.get("body", b""))
            await send(message)

        try:
            # A streamed body that fails after its first byte raises ResponseAborted (logged and counted
            # already): the server then drops the connection and the client sees a short body, an error.
            await self.app(scope, receive, logged_send)
        finally:
            self.stats.in_flight -= 1
            elapsed = time.perf_counter() - started
            method = scope["method"]
            credential = path_credential(scope)
            path = scope["path"] if credential is None else credential.below
            self.stats.record(self.labels.of(method, path), method, status, elapsed, sent)
            self.stats.flush_now_and_then(started)
            # The path only, a path's token as ***: the query string may carry a token and is never logged.
            if credential is None:
                shown = logged_path(path, None, None, "")
            else:
                shown = logged_path(path, credential.token, credential.link, credential.link_id)
            access_log.write(request_id.decode(), method, shown, status, sent, elapsed * 1000)

    def _tick(self) -> None:
        """Flush metrics of a worker that has gone quiet, once a second."""
        self.stats.flush()
        self.watch.sync()
        asyncio.get_running_loop().call_later(1.0, self._tick)


class Methods:
    """``OPTIONS`` answered as a CORS preflight, any method but GET and HEAD a 405, on every path alike but the
    one that takes a form (POST ``/share/...``, which makes a share link)."""

    def __init__(self, app: ASGIApp, root_path: str = "") -> None:
        self.app = app
        self.root_path = root_path  # of the links of a browser's error page

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or takes(scope["method"], scope["path"]):
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        if method == "OPTIONS":
            await _preflight(scope).send(send)
        else:
            browser = browser_of(scope, self.root_path)
            await refusal(405, f"method {method} is not allowed", {"Allow": ALLOWED_METHODS}, browser).send(send)


def _preflight(scope: Scope) -> Answer:
    """A CORS preflight (or a plain OPTIONS): what a browser may send."""
    requested = next((v for n, v in scope["headers"] if n == b"access-control-request-headers"), None)
    headers = [
        (b"allow", ALLOWED_METHODS.encode()),
        (b"access-control-allow-methods", ALLOWED_METHODS.encode()),
        (b"access-control-allow-headers", requested or ALLOWED_HEADERS.encode()),
        (b"access-control-max-age", b"86400"),
    ]
    return Answer(204, headers)


class PathTokens:
    """``/t/{token}/data/...`` and ``/s/{capability}/data/...`` are routed as ``/data/...``; the path as sent stays
    in ``raw_path``, where :func:`path_credential` reads the token or capability for auth and the log line."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(_CREDENTIAL_PREFIXES):
            credential = path_credential(scope)
            if credential is not None:
                sent = scope.get("raw_path") or quote(scope["path"]).encode()  # a server that gives no raw path
                scope = {**scope, "path": credential.below, "raw_path": sent}
        await self.app(scope, receive, send)


class ErrorAnswers:
    """The error map (:func:`errors.error_answer`) as the edge applies it: with the request's path as logged, the
    data root hidden, and a page for a browser."""

    def __init__(self, roots: HiddenRoots, root_path: str) -> None:
        self.roots = roots
        self.root_path = root_path

    def answer(self, exc: Exception, scope: Scope, request: Request) -> Answer:
        return error_answer(exc, request.context, self.roots, browser_of(scope, self.root_path))

    async def not_found(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The router's answer to a path no route takes: the gateway's refusal (the router's default app)."""
        shown = request_of(scope, receive).logged_path
        browser = browser_of(scope, self.root_path)
        await refusal(404, f"nothing at {shown}; data is under /data/", None, browser).send(send)


class Endpoint:
    """A gateway handler as a plain ASGI app: the gateway's own :class:`Request` in, its :class:`Answer` out, and
    for whatever the handler raises the error map's answer. A fault after the answer's head is out is raised on:
    the server drops the connection, and the client sees a short body."""

    __slots__ = ("errors", "handler")

    def __init__(self, handler: Handler, errors: ErrorAnswers) -> None:
        self.handler = handler
        self.errors = errors

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = request_of(scope, receive)
        try:
            answer = await self.handler(request)
        except Exception as exc:
            answer = self.errors.answer(exc, scope, request)
        await answer.send(send)


def routes_of(handlers: Mapping[str, Handler], errors: ErrorAnswers) -> list[BaseRoute]:
    """The places of the URL table that have a handler, in its order: an exact path as a ``Route``, a prefix as a
    ``Route`` for the prefix itself and a ``Mount`` below it."""
    unknown = set(handlers) - {place.path for place in PLACES}
    assert not unknown, f"handlers of no place of the URL table: {sorted(unknown)}"
    routes: list[BaseRoute] = []
    for place in PLACES:
        handler = handlers.get(place.path)
        if handler is not None:
            endpoint = Endpoint(handler, errors)
            routes += [Route(place.path, endpoint), *([Mount(place.path, endpoint)] if place.below else [])]
    return routes


def labels_of(handlers: Mapping[str, Handler]) -> RouteLabels:
    """The metric labels of the places served."""
    return RouteLabels(place for place in PLACES if place.path in handlers)


class Application(Starlette):
    """Starlette with the stack the gateway needs: its middleware list around the router, and no more.

    Starlette's own error and exception middleware are left out: every route's :class:`Endpoint` answers what its
    handler raises by the error map, the router answers a path no route takes with the gateway's refusal (its
    default app), and a fault of the middleware itself is the server's to answer (a 500 and a log line). Their
    wrappers of every request and of every message sent cost a dispatched request about 5 µs.
    """

    def build_middleware_stack(self) -> ASGIApp:
        app: ASGIApp = self.router
        for cls, args, kwargs in reversed(self.user_middleware):
            app = cls(app, *args, **kwargs)
        return app


def application(
    routes: Sequence[BaseRoute],
    middleware: Sequence[Middleware],
    errors: ErrorAnswers,
    lifespan: Callable[[Starlette], AbstractAsyncContextManager[None]],
) -> Starlette:
    """The Starlette app: ``middleware`` in the order given (outermost first), the router over ``routes``, whose
    answer to a path no route takes is the gateway's refusal, never a redirect to the path with or without a
    trailing slash (the URL table says what each place takes, and ``/auth`` decides by nothing else)."""
    app = Application(routes=routes, middleware=middleware, lifespan=lifespan)
    app.router.default = errors.not_found
    app.router.redirect_slashes = False
    return app
