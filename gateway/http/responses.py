"""Answering with a Resource: validators, conditional requests (RFC 9110 §13) and byte ranges."""

import functools
import json
from collections.abc import AsyncIterator
from email.utils import formatdate, parsedate_to_datetime

import anyio
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from ..zarr.resource import JSON, Resource
from .ranges import TooManyRanges, Unsatisfiable, parse_range


class HttpError(Exception):
    """An answer other than success, with a message for the JSON body."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


RawHeaders = list[tuple[bytes, bytes]]


def raw_headers(headers: dict[str, str]) -> RawHeaders:
    return [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]


class Answer:
    """A complete HTTP answer with raw headers: cheaper than a framework response on the chunk path.

    It is an ASGI application, so Starlette endpoints may return it as well.
    """

    __slots__ = ("body", "headers", "pieces", "status")

    def __init__(
        self,
        status: int,
        headers: RawHeaders,
        body: bytes = b"",
        media_type: str | None = None,
        pieces: AsyncIterator[bytes] | None = None,
    ) -> None:
        if media_type is not None:
            headers.append((b"content-type", media_type.encode("latin-1")))
        if status != 304 and not any(name == b"content-length" for name, _ in headers):
            headers.append((b"content-length", str(len(body)).encode()))
        self.status = status
        self.headers = headers
        self.body = body
        self.pieces = pieces  # a large body, sent as it is read instead of held whole in memory

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        if self.pieces is not None:
            async for piece in self.pieces:
                await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": self.body})


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Answer:
    body = json.dumps({"error": message, "status": status}).encode()
    return Answer(status, raw_headers(headers or {}), body, JSON)


def header(request: Request, name: bytes) -> str | None:
    """A request header by its lower-case name, from one dict of the raw headers built per request."""
    headers = request.scope.get("gateway.headers")
    if headers is None:
        headers = request.scope["gateway.headers"] = dict(request.scope["headers"])
    value = headers.get(name)
    return None if value is None else value.decode("latin-1")


def _etags(header: str) -> list[str]:
    return [t.strip() for t in header.split(",") if t.strip()]


def _matches(header: str, etag: str, weak: bool) -> bool:
    """Whether an If-Match/If-None-Match list matches; weak comparison ignores a ``W/`` prefix."""
    for candidate in _etags(header):
        if candidate == "*":
            return True
        if weak:
            candidate = candidate.removeprefix("W/")
        if candidate == etag:
            return True
    return False


@functools.lru_cache(maxsize=4096)
def _http_date(timestamp: float) -> str:
    return formatdate(timestamp, usegmt=True)


def _not_modified_since(header: str | None, last_modified: float | None) -> bool:
    if header is None or last_modified is None:
        return False
    try:
        return int(last_modified) <= parsedate_to_datetime(header).timestamp()
    except (TypeError, ValueError):
        return False


def _range_applies(request: Request, resource: Resource) -> bool:
    """If-Range: send the range only if the validator still matches (strong comparison)."""
    if_range = header(request, b"if-range")
    if if_range is None:
        return True
    if_range = if_range.strip()
    if if_range.startswith('"') or if_range.startswith("W/"):
        return if_range == resource.etag
    return resource.last_modified is not None and _http_date(resource.last_modified) == if_range


STREAM_PIECE = 4 << 20  # larger reads of a virtual object are sent piece by piece


async def _pieces(resource: Resource, start: int, end: int, limiter: anyio.CapacityLimiter) -> AsyncIterator[bytes]:
    for offset in range(start, end, STREAM_PIECE):
        yield await _read(resource, offset, min(offset + STREAM_PIECE, end), limiter)


async def _body(
    resource: Resource, start: int, end: int, head: bool, limiter: anyio.CapacityLimiter
) -> tuple[bytes, AsyncIterator[bytes] | None]:
    """The bytes ``[start, end)``: in memory, or as pieces when they must be read and are large."""
    if head:
        return b"", None
    if resource.body is None and end - start > STREAM_PIECE:
        return b"", _pieces(resource, start, end, limiter)
    return await _read(resource, start, end, limiter), None


async def _read(resource: Resource, start: int, end: int, limiter: anyio.CapacityLimiter) -> bytes:
    if resource.body is not None:
        return resource.body if (start, end) == (0, resource.size) else resource.body[start:end]
    assert resource.reader is not None
    return await anyio.to_thread.run_sync(resource.reader, start, end, limiter=limiter)


async def send_resource(
    request: Request, resource: Resource, cache_control: str, limiter: anyio.CapacityLimiter
) -> Answer:
    validators = {"ETag": resource.etag, "Accept-Ranges": "bytes", "Cache-Control": cache_control}
    if resource.last_modified is not None:
        validators["Last-Modified"] = _http_date(resource.last_modified)
    if_match = header(request, b"if-match")
    if if_match is not None and not _matches(if_match, resource.etag, weak=False):
        raise HttpError(412, "If-Match does not match the current ETag", validators)
    if_none_match = header(request, b"if-none-match")
    if if_none_match is not None:
        if _matches(if_none_match, resource.etag, weak=True):
            return Answer(304, raw_headers(validators))
    elif _not_modified_since(header(request, b"if-modified-since"), resource.last_modified):
        return Answer(304, raw_headers(validators))

    head = request.method == "HEAD"
    spans = None
    if _range_applies(request, resource):
        try:
            spans = parse_range(header(request, b"range"), resource.size)
        except TooManyRanges as exc:
            raise HttpError(400, str(exc), validators) from None
        except Unsatisfiable as exc:
            raise HttpError(416, str(exc), {**validators, "Content-Range": f"bytes */{resource.size}"}) from None

    headers = [
        (b"etag", resource.etag.encode()),
        (b"accept-ranges", b"bytes"),
        (b"cache-control", cache_control.encode("latin-1")),
    ]
    if resource.last_modified is not None:
        headers.append((b"last-modified", validators["Last-Modified"].encode()))
    if spans is None:
        headers.append((b"content-length", str(resource.size).encode()))
        body, pieces = await _body(resource, 0, resource.size, head, limiter)
        return Answer(200, headers, body, resource.media_type, pieces)
    if len(spans) == 1:
        start, end = spans[0]
        headers.append((b"content-range", f"bytes {start}-{end - 1}/{resource.size}".encode()))
        headers.append((b"content-length", str(end - start).encode()))
        body, pieces = await _body(resource, start, end, head, limiter)
        return Answer(206, headers, body, resource.media_type, pieces)
    return await _multipart(resource, spans, headers, head, limiter)


async def _multipart(
    resource: Resource,
    spans: list[tuple[int, int]],
    headers: RawHeaders,
    head: bool,
    limiter: anyio.CapacityLimiter,
) -> Answer:
    """Several ranges as ``multipart/byteranges``; the boundary derives from the ETag, so replicas agree."""
    boundary = "zarr-gateway-" + resource.etag.strip('"')
    parts = []
    for start, end in spans:
        part_header = (
            f"--{boundary}\r\nContent-Type: {resource.media_type}\r\n"
            f"Content-Range: bytes {start}-{end - 1}/{resource.size}\r\n\r\n"
        ).encode()
        parts.append((part_header, start, end))
    closing = f"--{boundary}--\r\n".encode()
    length = sum(len(h) + (e - s) + 2 for h, s, e in parts) + len(closing)
    headers.append((b"content-length", str(length).encode()))
    chunks = []
    if not head:
        for part_header, start, end in parts:
            chunks += [part_header, await _read(resource, start, end, limiter), b"\r\n"]
        chunks.append(closing)
    return Answer(206, headers, b"".join(chunks), f"multipart/byteranges; boundary={boundary}")
