"""The ASGI edge: CORS, request ids, access log and metrics for every request, and the data routes.

Chunk requests are most of the traffic, so ``/data/...`` GET and HEAD go
straight to the gateway's dispatcher without a framework router or
response class in between; everything else (operations, the index,
unsupported methods) goes to a Starlette application.
"""

import asyncio
import itertools
import logging
import os
import time
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..logs import access_log
from ..metrics import STATS, CacheWatch, route_of
from .responses import error_response

if TYPE_CHECKING:
    from .app import Gateway

log = logging.getLogger("gateway")

EXPOSED = "Content-Length, Content-Range, Content-Type, ETag, Last-Modified, Accept-Ranges"
ALLOWED_HEADERS = "Range, If-None-Match, If-Match, If-Range, If-Modified-Since, X-Auth-Token, Content-Type"
_CORS = [(b"access-control-allow-origin", b"*"), (b"access-control-expose-headers", EXPOSED.encode())]
_PROCESS = os.urandom(4).hex()  # request ids of different workers never collide
_MAX_REQUEST_ID = 128


class Edge:
    def __init__(self, gateway: "Gateway", others: ASGIApp, watch: CacheWatch | None = None) -> None:
        self.gateway = gateway
        self.others = others
        self.watch = watch
        self.stats = STATS
        self._ids = itertools.count()
        self._timer_armed = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.others(scope, receive, send)  # lifespan
            return
        started = time.perf_counter()
        headers = scope["gateway.headers"] = dict(scope["headers"])
        given_id = headers.get(b"x-request-id", b"")
        if 0 < len(given_id) <= _MAX_REQUEST_ID and given_id.isascii() and given_id.decode().isprintable():
            request_id = given_id
        else:
            request_id = f"{_PROCESS}-{next(self._ids):x}".encode()
        status = 0
        sent = 0

        async def send_with_cors(message: Message) -> None:
            nonlocal status, sent
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), *_CORS, (b"x-request-id", request_id)]
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)

        method = scope["method"]
        path = scope["path"]
        self.stats.in_flight += 1
        if not self._timer_armed:
            self._timer_armed = True
            asyncio.get_running_loop().call_later(1.0, self._tick)
        try:
            if method == "OPTIONS" and b"access-control-request-method" in headers:
                await _preflight(headers, send_with_cors)
            elif path.startswith("/data/") and method in ("GET", "HEAD"):
                tree, _, rest = path[6:].partition("/")
                scope["path_params"] = {"tree": tree, "rest": rest}
                answer = await self.gateway.handle(Request(scope, receive))
                await answer(scope, receive, send_with_cors)
            else:
                await self.others(scope, receive, send_with_cors)
        except Exception:
            log.exception("unexpected error for %s %s", method, path)
            if not status:
                await error_response(500, "internal error; it has been logged")(scope, receive, send_with_cors)
        finally:
            self.stats.in_flight -= 1
            elapsed = time.perf_counter() - started
            self.stats.record(route_of(path), method, status, elapsed, sent)
            self.stats.flush_now_and_then(started)
            # The path only: the query string may carry a token and is never logged.
            access_log.write(request_id.decode(), method, path, status, sent, elapsed * 1000)

    def _tick(self) -> None:
        """Flush metrics of a worker that has gone quiet, once a second."""
        self.stats.flush()
        if self.watch is not None:
            self.watch.sync()
        asyncio.get_running_loop().call_later(1.0, self._tick)


async def _preflight(headers: dict[bytes, bytes], send: Send) -> None:
    requested = headers.get(b"access-control-request-headers") or ALLOWED_HEADERS.encode()
    answer = [
        (b"access-control-allow-methods", b"GET, HEAD, OPTIONS"),
        (b"access-control-allow-headers", requested),
        (b"access-control-max-age", b"86400"),
        (b"content-length", b"0"),
    ]
    await send({"type": "http.response.start", "status": 204, "headers": answer})
    await send({"type": "http.response.body", "body": b""})
