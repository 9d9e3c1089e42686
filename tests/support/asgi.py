"""An application called in-process with one ASGI scope, its answer collected: what tests that compare two
applications' answers exactly send and read."""

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

App = Callable[[MutableMapping[str, Any], Any, Any], Awaitable[None]]


async def call(
    app: App, method: str, path: str, headers: list[tuple[bytes, bytes]], query: bytes = b""
) -> dict[str, Any]:
    """``app``'s answer to one request from 127.0.0.1 (a fixed request id): status, raw headers, whole body."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1:8000"), *headers, (b"x-request-id", b"fixed-id")],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }
    messages: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        messages.append(dict(message))

    await app(scope, receive, send)
    start, *body = messages
    return {"status": start["status"], "headers": start["headers"], "body": b"".join(m.get("body", b"") for m in body)}
