"""Answering with a Resource: validators, conditional requests (RFC 9110 §13) and byte ranges."""

import functools
from collections.abc import AsyncIterator, Callable
from email.utils import formatdate, parsedate_to_datetime

import anyio

from ..resources import Resource
from .errors import HttpError, record
from .messages import Answer, RawHeaders, ResponseAborted, raw_headers
from .ranges import Unsatisfiable, parse_range

Headers = dict[bytes, bytes]


def header(headers: Headers, name: bytes) -> str | None:
    """A request header by its lower-case name."""
    value = headers.get(name)
    return None if value is None else value.decode("latin-1")


def _etags(value: str) -> list[str]:
    return [t.strip() for t in value.split(",") if t.strip()]


def _matches(value: str, etag: str, weak: bool) -> bool:
    """Whether an If-Match/If-None-Match list matches; weak comparison ignores a ``W/`` prefix."""
    for candidate in _etags(value):
        if candidate == "*":
            return True
        if weak:
            candidate = candidate.removeprefix("W/")
        if candidate == etag:
            return True
    return False


@functools.lru_cache(maxsize=4096)
def http_date(timestamp: float) -> str:
    return formatdate(timestamp, usegmt=True)


def _not_modified_since(value: str | None, last_modified: float | None) -> bool:
    if value is None or last_modified is None:
        return False
    try:
        return int(last_modified) <= parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return False


def _range_applies(headers: Headers, resource: Resource) -> bool:
    """If-Range: send the range only if the validator still matches (strong comparison)."""
    if_range = header(headers, b"if-range")
    if if_range is None:
        return True
    if_range = if_range.strip()
    if if_range.startswith('"') or if_range.startswith("W/"):
        return if_range == resource.etag
    return resource.last_modified is not None and http_date(resource.last_modified) == if_range


STREAM_PIECE = 1 << 20  # larger reads of a virtual object are sent piece by piece
# A range of a resource with local reads that decodes up to this many bytes is read on the event loop: a
# thread hand-off costs more than such a read (a few positioned reads, see docs/architecture.md).
INLINE_READ_BYTES = 1 << 20


class Reader:
    """Reads ranges of a resource: slices of a body in place, small local reads in place, the rest in a thread."""

    def __init__(self, resource: Resource, limiter: anyio.CapacityLimiter, context: str) -> None:
        self.resource = resource
        self.limiter = limiter
        self.context = context

    async def read(self, start: int, end: int) -> bytes:
        resource = self.resource
        if resource.body is not None:
            return resource.body if (start, end) == (0, resource.size) else resource.body[start:end]
        reader: Callable[[int, int], bytes] | None = resource.reader
        assert reader is not None
        if resource.local_reads and resource.work(start, end) <= INLINE_READ_BYTES:
            return reader(start, end)
        return await anyio.to_thread.run_sync(reader, start, end, limiter=self.limiter)

    async def body(self, start: int, end: int, head: bool) -> tuple[bytes, AsyncIterator[bytes] | None]:
        """The bytes ``[start, end)``: in memory, or a first piece read now and the rest as they are read.

        The first piece is read before anything is sent, so a fault there gets the same status as a
        plain chunk; a fault in a later piece aborts the response (see :class:`ResponseAborted`).
        """
        if head:
            return b"", None
        if self.resource.body is None and end - start > STREAM_PIECE:
            first = await self.read(start, start + STREAM_PIECE)
            return first, self.stream(start + STREAM_PIECE, end)
        return await self.read(start, end), None

    async def stream(self, start: int, end: int) -> AsyncIterator[bytes]:
        """Bytes ``[start, end)`` piece by piece; a fault aborts the response (its status is sent already)."""
        for offset in range(start, end, STREAM_PIECE):
            try:
                piece = await self.read(offset, min(offset + STREAM_PIECE, end))
            except Exception as exc:
                record(exc, f"{self.context} (while streaming, at byte {offset})")
                raise ResponseAborted(str(exc)) from exc
            yield piece


_CONDITIONAL = (b"if-match", b"if-none-match", b"if-modified-since", b"range")


def _validators(etag: str, last_modified: float | None, cache_control: bytes) -> dict[str, str]:
    validators = {"ETag": etag, "Accept-Ranges": "bytes", "Cache-Control": cache_control.decode()}
    if last_modified is not None:
        validators["Last-Modified"] = http_date(last_modified)
    return validators


def _decided_by_validators(
    headers: Headers, validators: dict[str, str], etag: str, last_modified: float | None
) -> Answer | None:
    """The answer the request's conditions give from the validators alone (a 304; a 412 raised), else None."""
    if_match = headers.get(b"if-match")
    if if_match is not None and not _matches(if_match.decode("latin-1"), etag, weak=False):
        raise HttpError(412, "If-Match does not match the current ETag", validators)
    if_none_match = headers.get(b"if-none-match")
    if if_none_match is not None:
        if _matches(if_none_match.decode("latin-1"), etag, weak=True):
            return Answer(304, raw_headers(validators))
    elif _not_modified_since(header(headers, b"if-modified-since"), last_modified):
        return Answer(304, raw_headers(validators))
    return None


def answer_by_validators(
    headers: Headers, etag: str, last_modified: float | None, cache_control: bytes
) -> Answer | None:
    """What a conditional request gets from validators known before the body is made (a 304, a 412 raised),
    or None where the body is needed: revalidation before work."""
    return _decided_by_validators(headers, _validators(etag, last_modified, cache_control), etag, last_modified)


def _whole_head(resource: Resource, cache_control: bytes) -> tuple[tuple[bytes, bytes], ...]:
    """The head lines of ``resource``'s whole 200 (its body held): built once per resource and Cache-Control."""
    built = resource.whole_head
    if built is not None and built[0] == cache_control:
        return built[1]
    lines: tuple[tuple[bytes, bytes], ...] = (
        (b"etag", resource.etag.encode()),
        (b"accept-ranges", b"bytes"),
        (b"cache-control", cache_control),
        (b"content-length", str(resource.size).encode()),
        (b"content-type", resource.media_type.encode()),
    )
    if resource.last_modified is not None:
        lines += ((b"last-modified", http_date(resource.last_modified).encode()),)
    resource.whole_head = (cache_control, lines)
    return lines


async def send_resource(
    headers: Headers, method: str, resource: Resource, cache_control: bytes, reader: Reader
) -> Answer:
    if resource.body is not None and not any(name in headers for name in _CONDITIONAL):
        # The common case, a whole object held in memory and no condition: nothing to decide.
        return Answer(200, list(_whole_head(resource, cache_control)), b"" if method == "HEAD" else resource.body)
    validators = _validators(resource.etag, resource.last_modified, cache_control)
    decided = _decided_by_validators(headers, validators, resource.etag, resource.last_modified)
    if decided is not None:
        return decided
    last_modified = validators.get("Last-Modified")

    head = method == "HEAD"
    spans = None
    range_header = headers.get(b"range")
    if range_header is not None and _range_applies(headers, resource):
        try:
            spans = parse_range(range_header.decode("latin-1"), resource.size)
        except Unsatisfiable as exc:
            raise HttpError(416, str(exc), {**validators, "Content-Range": f"bytes */{resource.size}"}) from None

    out = [
        (b"etag", resource.etag.encode()),
        (b"accept-ranges", b"bytes"),
        (b"cache-control", cache_control),
    ]
    if last_modified is not None:
        out.append((b"last-modified", last_modified.encode()))
    if spans is None:
        out.append((b"content-length", str(resource.size).encode()))
        body, pieces = await reader.body(0, resource.size, head)
        return Answer(200, out, body, resource.media_type, pieces)
    if len(spans) == 1:
        start, end = spans[0]
        out.append((b"content-range", f"bytes {start}-{end - 1}/{resource.size}".encode()))
        out.append((b"content-length", str(end - start).encode()))
        body, pieces = await reader.body(start, end, head)
        return Answer(206, out, body, resource.media_type, pieces)
    return await _multipart(resource, spans, out, head, reader)


async def _multipart(
    resource: Resource, spans: list[tuple[int, int]], out: RawHeaders, head: bool, reader: Reader
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
    out.append((b"content-length", str(length).encode()))
    if head:
        return Answer(206, out, b"", f"multipart/byteranges; boundary={boundary}")
    # Streamed part by part, piece by piece, as one range is: only the first piece is read before the
    # status is sent (so a fault there gets its own status), and no part is ever held whole.
    first_header, first_start, first_end = parts[0]
    first_piece_end = min(first_end, first_start + STREAM_PIECE)
    first = first_header + await reader.read(first_start, first_piece_end)

    async def rest() -> AsyncIterator[bytes]:
        async for piece in reader.stream(first_piece_end, first_end):
            yield piece
        yield b"\r\n"
        for part_header, start, end in parts[1:]:
            yield part_header
            async for piece in reader.stream(start, end):
                yield piece
            yield b"\r\n"
        yield closing

    return Answer(206, out, first, f"multipart/byteranges; boundary={boundary}", rest())
