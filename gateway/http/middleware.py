"""CORS on every response, and one structured access-log line per request (never with a token)."""

import json
import logging
import time
import uuid

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

access_log = logging.getLogger("gateway.access")

EXPOSED = "Content-Length, Content-Range, Content-Type, ETag, Last-Modified, Accept-Ranges"
ALLOWED_HEADERS = "Range, If-None-Match, If-Match, If-Range, If-Modified-Since, X-Auth-Token, Content-Type"


class EdgeMiddleware:
    """Adds CORS headers, answers preflights, passes a request id through, and logs each request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_headers = Headers(scope=scope)
        request_id = request_headers.get("x-request-id") or uuid.uuid4().hex
        started = time.perf_counter()
        status = 0
        sent = 0

        async def send_with_headers(message: Message) -> None:
            nonlocal status, sent
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = MutableHeaders(scope=message)
                headers["Access-Control-Allow-Origin"] = "*"
                headers["Access-Control-Expose-Headers"] = EXPOSED
                headers["X-Request-Id"] = request_id
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)

        try:
            if scope["method"] == "OPTIONS" and "access-control-request-method" in request_headers:
                await self._preflight(request_headers, send_with_headers)
            else:
                await self.app(scope, receive, send_with_headers)
        finally:
            access_log.info(
                json.dumps(
                    {
                        "request_id": request_id,
                        "method": scope["method"],
                        "path": scope["path"],  # the query string may carry a token: never logged
                        "status": status,
                        "bytes": sent,
                        "ms": round((time.perf_counter() - started) * 1000, 3),
                    }
                )
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
