"""The ASGI application: a Starlette app whose routes are the trees, meshes, previews, the index and the
operations endpoints, with the error map as its exception handlers and pure ASGI middleware around it.

Around every request, outermost first:

- :class:`RequestLog`: the request id, CORS and ``Referrer-Policy`` on every answer, the access log line,
  the metrics (in flight, per route, bytes);
- :class:`PathTokens`: ``/t/{token}/...`` and a share link's ``/s/{capability}/...`` routed as the path below
  them, the token or capability kept for auth;
- the front (:class:`gateway.http.kept.KeptAnswers`): a chunk whose answer is kept, given before dispatch;
- :class:`TreeRequests`: GET and HEAD below a Zarr tree straight to the trees' endpoint, with the error map
  (the chunk path, which Starlette's stack in front of a route cost about a fifth of its CPU); every other
  request to the Starlette app:
- :class:`Methods`: a preflight for ``OPTIONS`` and 405 for any method but GET and HEAD, on every path
  alike but ``/share/`` (which takes a POST), before routing, so no route can forget it;
- Starlette's router and exception middleware: the handlers (:class:`Endpoint`) and the one error map
  (:mod:`gateway.http.errors`) as the handler of every exception.

The handlers keep the gateway's own plain :class:`Request` and :class:`Answer` (:mod:`gateway.http.messages`):
a chunk's path builds no framework request or response object. Each route is a plain ASGI callable, so
Starlette only matches the path and hands the request on (see docs/architecture.md, "The edge").
"""

import asyncio
import itertools
import os
import re
import time
from collections.abc import Awaitable, Callable, Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.requests import Request as StarletteRequest
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp

from ..logs import access_log
from ..metrics import STATS
from .auth import TOKEN_HEADER, read_token
from .errors import Browser, HiddenRoots, HttpError, error_answer, prefers_html, refusal
from .messages import SHARE_PREFIX, Answer, Exchange, Message, Receive, Request, Scope, Send
from .ops import Ops
from .pages.links import link_form
from .share import link_id
from .urls import SHARE_ROUTE, TOKEN_PREFIX, split_path_token, split_share_link

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
READS = ("GET", "HEAD")  # the methods that read: the trees' shortcut and the kept answers take only these
EXCHANGE = "gateway.exchange"  # the scope key of the request's :class:`Exchange`
Handler = Callable[[Request], Awaitable[Answer]]


def exchange_of(scope: Scope) -> Exchange:
    exchange: Exchange = scope[EXCHANGE]
    return exchange


def browser_of(scope: Scope, root_path: str) -> Browser | None:
    """The request as the error map needs it when it prefers HTML (a browser following a link): its path as
    logged and the credential form of its address, which the error page's links keep; None for every other."""
    headers = scope["headers"]
    if not prefers_html(next((value for name, value in headers if name == b"accept"), None)):
        return None
    exchange = exchange_of(scope)
    lines = [value for name, value in headers if name == TOKEN_HEADER]
    try:
        token = read_token(lines, scope.get("query_string", b""), exchange.path_token)
    except HttpError:  # more than one token, or one spelt otherwise: the page links carry none
        token = None
    in_address = token.value if token is not None and token.in_url else None
    return Browser(exchange.logged_path, link_form(in_address, exchange.path_token is not None, root_path))


class RequestLog:
    """Request ids, the headers every answer carries (CORS, Referrer-Policy), the access log line and the
    metrics of every request (pure ASGI middleware: one wrapper of ``send`` for all of them)."""

    def __init__(self, app: ASGIApp, ops: Ops) -> None:
        self.app = app
        self.ops = ops
        self.stats = STATS
        self._ids = itertools.count()
        self._timer_armed = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        exchange = scope[EXCHANGE] = Exchange(scope["method"], scope["path"])
        given_id = next((value for name, value in scope["headers"] if name == b"x-request-id"), b"")
        request_id = given_id if _REQUEST_ID.fullmatch(given_id) else f"{_PROCESS}-{next(self._ids):x}".encode()
        self.stats.in_flight += 1
        if not self._timer_armed:
            self._timer_armed = True
            asyncio.get_running_loop().call_later(1.0, self._tick)
        sent = 0

        async def logged_send(message: Message) -> None:
            nonlocal sent
            if message["type"] == "http.response.start":
                exchange.status = message["status"]
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
            status = exchange.status
            self.stats.record(exchange.route, exchange.method, status, elapsed, sent)
            self.stats.flush_now_and_then(started)
            # The path only, a path's token as ***: the query string may carry a token and is never logged.
            access_log.write(request_id.decode(), exchange.method, exchange.logged_path, status, sent, elapsed * 1000)

    def _tick(self) -> None:
        """Flush metrics of a worker that has gone quiet, once a second."""
        self.stats.flush()
        self.ops.watch.sync()
        asyncio.get_running_loop().call_later(1.0, self._tick)


class Methods:
    """``OPTIONS`` answered as a CORS preflight, any method but GET and HEAD a 405, on every path alike but the
    one that takes a form (POST ``/share/...``, which makes a share link)."""

    def __init__(self, app: ASGIApp, root_path: str = "") -> None:
        self.app = app
        self.root_path = root_path  # of the links of a browser's error page

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope.get("method")
        if method in READS or scope["type"] != "http" or (method == "POST" and scope["path"].startswith(SHARE_ROUTE)):
            await self.app(scope, receive, send)
        elif method == "OPTIONS":
            exchange_of(scope).route = "preflight"
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
    """``/t/{token}/data/...`` and ``/s/{capability}/data/...`` are routed as ``/data/...``; the token or the
    capability is kept for :func:`auth.read_token`, and a link's id for the log line."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(TOKEN_PREFIX):
            exchange = exchange_of(scope)
            exchange.path_token, exchange.path = split_path_token(_raw_path(scope), scope["path"])
            scope = {**scope, "path": exchange.path}
        elif scope["type"] == "http" and scope["path"].startswith(SHARE_PREFIX):
            exchange = exchange_of(scope)
            exchange.path_link, exchange.path = split_share_link(_raw_path(scope), scope["path"])
            if exchange.path_link is not None:
                exchange.link_id = link_id(exchange.path_link.decode("latin-1"))
            scope = {**scope, "path": exchange.path}
        await self.app(scope, receive, send)


def _raw_path(scope: Scope) -> str:
    """The request path as sent, one character per byte (a server that gives no ``raw_path``: the decoded one)."""
    raw = scope.get("raw_path")
    return raw.decode("latin-1") if raw else str(scope["path"])


class Endpoint:
    """A gateway handler as a plain ASGI app: the gateway's own :class:`Request` in, its :class:`Answer` out.

    ``route`` is the metric label; None when the handler sets it itself (the trees: chunk, metadata, listing).
    Exceptions go to the app's exception handlers, the error map.
    """

    __slots__ = ("handler", "route")

    def __init__(self, handler: Handler, route: str | None) -> None:
        self.handler = handler
        self.route = route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = request_of(scope, receive)
        if self.route is not None:
            request.exchange.route = self.route
        answer = await self.handler(request)
        await answer.send(send)


def request_of(scope: Scope, receive: Receive) -> Request:
    """The gateway's :class:`Request` of an HTTP scope (below the edge's middleware, which made its exchange)."""
    exchange = exchange_of(scope)
    raw_headers = scope["headers"]
    client = scope.get("client")
    return Request(
        scope["method"],
        exchange.path,
        dict(raw_headers),
        scope.get("query_string", b""),
        exchange,
        receive,
        raw_headers,
        client[0] if client else "",
    )


class TreeRequests:
    """GET and HEAD below a Zarr tree's prefix straight to the trees' endpoint, with the one error map; every
    other request to the Starlette app.

    The chunk path is most of a gateway's traffic, and Starlette's stack in front of a route (its error
    middleware, the exception middleware, the router's matching and child scope) cost it about a fifth of
    its CPU in a full benchmark run (docs/architecture.md, "What Starlette costs per request"). The trees
    stay Starlette routes too (for every other method, and for anything that walks the routes); this only
    takes their GET and HEAD past the router, as a Mount of the same endpoint would have them answered.
    """

    def __init__(
        self, app: ASGIApp, trees: Endpoint, prefixes: Sequence[str], roots: HiddenRoots, root_path: str
    ) -> None:
        self.app = app
        self.trees = trees
        self.prefixes = tuple(prefixes)
        self.roots = roots
        self.root_path = root_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in READS or not scope["path"].startswith(self.prefixes):
            await self.app(scope, receive, send)
            return
        try:
            await self.trees(scope, receive, send)
        except Exception as exc:
            exchange = exchange_of(scope)
            if exchange.status:
                raise  # the head is out: the server drops the connection, and the client sees a short body
            await error_answer(exc, exchange.context, self.roots, browser_of(scope, self.root_path)).send(send)


def _error_map(roots: HiddenRoots, root_path: str) -> Callable[[StarletteRequest, Exception], Awaitable[Response]]:
    """The error map (:func:`errors.error_answer`) as Starlette's handler of every exception."""

    async def mapped(request: StarletteRequest, exc: Exception) -> Response:
        exchange = exchange_of(request.scope)
        browser = browser_of(request.scope, root_path)
        if isinstance(exc, HTTPException):  # the router's own: a path no route takes
            message = f"nothing at {exchange.logged_path}; data is under /data/"
            answer = refusal(exc.status_code, message, None, browser)
        else:
            answer = error_answer(exc, exchange.context, roots, browser)
        response = Response(answer.body, answer.status)
        response.raw_headers = answer.headers
        return response

    return mapped


Front = Callable[[ASGIApp], ASGIApp]  # a layer put in front of dispatch (the kept answers), given what is behind it


class Edge:
    """The application: :class:`RequestLog` and :class:`PathTokens` around ``front`` (the kept answers, if given)
    and :class:`TreeRequests`, which hands the trees' GET and HEAD to their endpoint and everything else to the
    Starlette app."""

    def __init__(
        self,
        starlette: Starlette,
        ops: Ops,
        trees: Endpoint,
        prefixes: Sequence[str],
        roots: HiddenRoots,
        front: Front | None = None,
        root_path: str = "",
    ) -> None:
        self._parts = (starlette, ops, trees, roots, root_path)
        dispatch: ASGIApp = TreeRequests(starlette, trees, prefixes, roots, root_path)
        self.app = RequestLog(PathTokens(dispatch if front is None else front(dispatch)), ops)

    def through_starlette(self) -> "Edge":
        """The same application with every request routed by Starlette (and no kept answer given before
        dispatch): what the shortcuts must answer alike."""
        starlette, ops, trees, roots, root_path = self._parts
        return Edge(starlette, ops, trees, (), roots, root_path=root_path)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def build_edge(
    routes: Sequence[BaseRoute],
    ops: Ops,
    roots: HiddenRoots,
    trees: Endpoint,
    tree_prefixes: Sequence[str],
    front: Front | None = None,
    root_path: str = "",
) -> Edge:
    """The Starlette app over ``routes`` with the middleware above and the error map, behind the trees' shortcut.

    The map handles every exception in an exception middleware of its own: given to the app under the
    key Exception, Starlette would hand it to its outermost error middleware, which answers and then
    raises again (a traceback and no access line for a mapped 500).
    """
    mapped = _error_map(roots, root_path)
    starlette = Starlette(
        routes=routes,
        middleware=[
            Middleware(Methods, root_path=root_path),
            Middleware(ExceptionMiddleware, handlers={Exception: mapped}),
        ],
        exception_handlers={HTTPException: mapped},  # the router's 404 in place of Starlette's plain text
        lifespan=lambda app: ops.lifespan(),
    )
    return Edge(starlette, ops, trees, tree_prefixes, roots, front, root_path)


def endpoint_routes(paths: dict[str, Endpoint], mounts: dict[str, Endpoint]) -> list[BaseRoute]:
    """Exact paths as ``Route``s, prefixes as a ``Route`` for the prefix itself and a ``Mount`` below it."""
    routes: list[BaseRoute] = []
    for prefix, endpoint in mounts.items():
        routes += [Route(prefix, endpoint), Mount(prefix, endpoint)]
    routes += [Route(path, endpoint) for path, endpoint in paths.items()]
    return routes
