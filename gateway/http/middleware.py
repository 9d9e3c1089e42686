"""CORS on every response, and one structured access-log line per request (never with a token)."""

import itertools
import json
import logging
import os
import time

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

access_log = logging.getLogger("gateway.access")

EXPOSED = "Content-Length, Content-Range, Content-Type, ETag, Last-Modified, Accept-Ranges"
_CORS_HEADERS = ((b"access-control-allow-origin", b"*"), (b"access-control-expose-headers", EXPOSED.encode()))
ALLOWED_HEADERS = "Range, If-None-Match, If-Match, If-Range, If-Modified-Since, X-Auth-Token, Content-Type"


_PROCESS_PREFIX = os.urandom(4).hex()


class EdgeMiddleware:
    """Adds CORS headers, answers preflights, passes a request id through, and logs each request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._ids = itertools.count()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_headers = Headers(scope=scope)
        request_id = request_headers.get("x-request-id") or f"{_PROCESS_PREFIX}-{next(self._ids):x}"
        started = time.perf_counter()
        status = 0
        sent = 0

        async def send_with_headers(message: Message) -> None:
            nonlocal status, sent
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [
                    *message.get("headers", ()),
                    *_CORS_HEADERS,
                    (b"x-request-id", request_id.encode()),
                ]
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)

        try:
            if scope["method"] == "OPTIONS" and "access-control-request-method" in request_headers:
                await self._preflight(request_headers, send_with_headers)
            else:
                await self.app(scope, receive, send_with_headers)
        finally:
            if access_log.isEnabledFor(logging.INFO):
                # The path only: the query string may carry a token and is never logged.
                elapsed = (time.perf_counter() - started) * 1000
                access_log.info(
                    f'{{"request_id": {json.dumps(request_id)}, "method": "{scope["method"]}", '
                    f'"path": {json.dumps(scope["path"])}, "status": {status}, "bytes": {sent}, "ms": {elapsed:.3f}}}'
                )

    async def _preflight(self, request_headers: Headers, send: Send) -> None:
        requested = request_headers.get("access-control-request-headers")
        headers = [
            (b"access-control-allow-methods", b"GET, HEAD, OPTIONS"),
            (b"access-control-allow-headers", (requested or ALLOWED_HEADERS).encode()),
            (b"access-control-max-age", b"86400"),
            (b"content-length", b"0"),
        ]
        await send({"type": "http.response.start", "status": 204, "headers": headers})
        await send({"type": "http.response.body", "body": b""})
