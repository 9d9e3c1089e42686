"""Answering with a Resource: validators, conditional requests (RFC 9110 §13) and byte ranges."""

import functools
import json
from email.utils import formatdate, parsedate_to_datetime

import anyio
from starlette.requests import Request
from starlette.responses import Response

from ..zarr.resource import JSON, Resource
from .ranges import TooManyRanges, Unsatisfiable, parse_range


class HttpError(Exception):
    """An answer other than success, with a message for the JSON body."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    body = json.dumps({"error": message, "status": status}).encode()
    return Response(body, status_code=status, media_type=JSON, headers=headers)


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
    if_range = request.headers.get("if-range")
    if if_range is None:
        return True
    if_range = if_range.strip()
    if if_range.startswith('"') or if_range.startswith("W/"):
        return if_range == resource.etag
    return resource.last_modified is not None and _http_date(resource.last_modified) == if_range


async def _read(resource: Resource, start: int, end: int, limiter: anyio.CapacityLimiter) -> bytes:
    if resource.body is not None:
        return resource.body if (start, end) == (0, resource.size) else resource.body[start:end]
    assert resource.reader is not None
    return await anyio.to_thread.run_sync(resource.reader, start, end, limiter=limiter)


async def send_resource(
    request: Request, resource: Resource, cache_control: str, limiter: anyio.CapacityLimiter
) -> Response:
    headers = {"ETag": resource.etag, "Accept-Ranges": "bytes", "Cache-Control": cache_control}
    if resource.last_modified is not None:
        headers["Last-Modified"] = _http_date(resource.last_modified)
    if_match = request.headers.get("if-match")
    if if_match is not None and not _matches(if_match, resource.etag, weak=False):
        raise HttpError(412, "If-Match does not match the current ETag", headers)
    if_none_match = request.headers.get("if-none-match")
    if if_none_match is not None:
        if _matches(if_none_match, resource.etag, weak=True):
            return Response(status_code=304, headers=headers)
    elif _not_modified_since(request.headers.get("if-modified-since"), resource.last_modified):
        return Response(status_code=304, headers=headers)

    head = request.method == "HEAD"
    spans = None
    if _range_applies(request, resource):
        try:
            spans = parse_range(request.headers.get("range"), resource.size)
        except TooManyRanges as exc:
            raise HttpError(400, str(exc), headers) from None
        except Unsatisfiable as exc:
            raise HttpError(416, str(exc), {**headers, "Content-Range": f"bytes */{resource.size}"}) from None

    if spans is None:
        body = b"" if head else await _read(resource, 0, resource.size, limiter)
        headers["Content-Length"] = str(resource.size)
        return Response(body, status_code=200, media_type=resource.media_type, headers=headers)
    if len(spans) == 1:
        start, end = spans[0]
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{resource.size}"
        headers["Content-Length"] = str(end - start)
        body = b"" if head else await _read(resource, start, end, limiter)
        return Response(body, status_code=206, media_type=resource.media_type, headers=headers)
    return await _multipart(resource, spans, headers, head, limiter)


async def _multipart(
    resource: Resource,
    spans: list[tuple[int, int]],
    headers: dict[str, str],
    head: bool,
    limiter: anyio.CapacityLimiter,
) -> Response:
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
    headers["Content-Length"] = str(length)
    chunks = []
    if not head:
        for part_header, start, end in parts:
            chunks += [part_header, await _read(resource, start, end, limiter), b"\r\n"]
        chunks.append(closing)
    media_type = f"multipart/byteranges; boundary={boundary}"
    return Response(b"".join(chunks), status_code=206, media_type=media_type, headers=headers)
