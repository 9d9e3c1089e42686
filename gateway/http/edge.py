"""The ASGI application: every request enters here, once.

For each request the edge builds one :class:`Request`, picks the handler from the
path (the data routes' parsed target, or an operations endpoint), turns any
exception into an answer through the one error map, adds CORS and a request id,
and records the access log line and the metrics, all without a framework in between.
"""

import asyncio
import itertools
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable

from ..logs import access_log
from ..metrics import STATS
from ..precomputed.tree import PRECOMPUTED_PREFIX, parse_precomputed_path
from .data import HTML, Gateway, index_page
from .errors import error_answer, json_error
from .messages import Answer, Message, Receive, Request, Scope, Send
from .ops import Ops
from .urls import DATA_PREFIX, MESH_PREFIX, PREVIEW_PREFIX, TOKEN_PREFIX, parse_data_path, split_path_token

log = logging.getLogger("gateway")

EXPOSED = "Content-Length, Content-Range, Content-Type, ETag, Last-Modified, Accept-Ranges"
ALLOWED_HEADERS = "Range, If-None-Match, If-Match, If-Range, If-Modified-Since, X-Auth-Token, Content-Type"
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


class Edge:
    """Routes: ``/data/...`` to the gateway, the operations endpoints, ``/`` the index; nothing else."""

    def __init__(self, gateway: Gateway, ops: Ops) -> None:
        self.gateway = gateway
        self.ops = ops
        self.pages: dict[str, Handler] = {**ops.routes(), "/": self._index}
        self.stats = STATS
        self._ids = itertools.count()
        self._timer_armed = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        raw_headers = list(scope["headers"])
        client = scope.get("client")
        path, path_token = scope["path"], None
        if path.startswith(TOKEN_PREFIX):  # /t/{token}/data/...: served as the path below the token
            path_token, path = split_path_token(_raw_path(scope), path)
        request = Request(
            scope["method"],
            path,
            dict(raw_headers),
            scope.get("query_string", b""),
            receive=receive,
            header_list=raw_headers,
            client=client[0] if client else "",
            path_token=path_token,
        )
        given_id = request.headers.get(b"x-request-id", b"")
        request_id = given_id if _REQUEST_ID.fullmatch(given_id) else f"{_PROCESS}-{next(self._ids):x}".encode()
        self.stats.in_flight += 1
        if not self._timer_armed:
            self._timer_armed = True
            asyncio.get_running_loop().call_later(1.0, self._tick)
        route, status, sent = "other", 0, 0
        try:
            route, answer = await self._answer(request)
            answer.headers += _ALWAYS
            answer.headers.append((b"x-request-id", request_id))
            status = answer.status
            # A streamed body that fails after its first byte raises ResponseAborted (logged and counted
            # already): the server then drops the connection and the client sees a short body, an error.
            sent = await answer.send(send)
        finally:
            self.stats.in_flight -= 1
            elapsed = time.perf_counter() - started
            self.stats.record(route, request.method, status, elapsed, sent)
            self.stats.flush_now_and_then(started)
            # The path only, a path's token as ***: the query string may carry a token and is never logged.
            access_log.write(request_id.decode(), request.method, request.logged_path, status, sent, elapsed * 1000)

    async def _answer(self, request: Request) -> tuple[str, Answer]:
        """The route label and the answer; every exception is mapped here, in one place."""
        route = "other"
        try:
            method, path = request.method, request.path
            if method == "OPTIONS":
                return "preflight", _options(request)
            if method not in ("GET", "HEAD"):
                return route, json_error(405, f"method {method} is not allowed", {"Allow": ALLOWED_METHODS})
            if path.startswith(MESH_PREFIX):
                route = "mesh"
                return route, await self.gateway.mesh(request)
            if path.startswith(PRECOMPUTED_PREFIX):
                precomputed = parse_precomputed_path(path)
                route = precomputed.route
                return route, await self.gateway.precomputed(precomputed, request)
            if path.startswith(DATA_PREFIX):
                target = parse_data_path(path)
                route = target.route
                return route, await self.gateway.handle(target, request)
            if path.startswith(PREVIEW_PREFIX):
                route = "preview"
                return route, await self.gateway.preview(request)
            handler = self.pages.get(path)
            if handler is None:
                return route, json_error(404, f"nothing at {path}; data is under {DATA_PREFIX}")
            route = "index" if path == "/" else path.strip("/")
            return route, await handler(request)
        except Exception as exc:
            return route, error_answer(exc, request.context)

    async def _index(self, request: Request) -> Answer:
        self.gateway.token(request)  # open to all, but more than one token is refused here as everywhere
        return Answer(200, [], index_page(), HTML)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        message: Message = await receive()
        assert message["type"] == "lifespan.startup"
        async with self.ops.lifespan():
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
        await send({"type": "lifespan.shutdown.complete"})

    def _tick(self) -> None:
        """Flush metrics of a worker that has gone quiet, once a second."""
        self.stats.flush()
        self.ops.watch.sync()
        asyncio.get_running_loop().call_later(1.0, self._tick)


def _raw_path(scope: Scope) -> str:
    """The request path as sent, one character per byte (a server that gives no ``raw_path``: the decoded one)."""
    raw = scope.get("raw_path")
    return raw.decode("latin-1") if raw else str(scope["path"])


def _options(request: Request) -> Answer:
    """A CORS preflight (or a plain OPTIONS): what a browser may send."""
    requested = request.headers.get(b"access-control-request-headers") or ALLOWED_HEADERS.encode()
    headers = [
        (b"allow", ALLOWED_METHODS.encode()),
        (b"access-control-allow-methods", ALLOWED_METHODS.encode()),
        (b"access-control-allow-headers", requested),
        (b"access-control-max-age", b"86400"),
    ]
    return Answer(204, headers)
