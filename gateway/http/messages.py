"""A request and its answer as the handlers see them: plain objects over the ASGI scope and messages.

Cheaper than a framework's request and response classes on the chunk path (see :mod:`gateway.http.edge`).
"""

import enum
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import parse_qs, quote

import anyio

from gateway_storage.faults import Abandoned, Fault

# The ASGI interface (asgiref's specification) as the edge types it: no framework is needed for four aliases.
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]  # an ASGI application (or a layer of one)
T = TypeVar("T")
RawHeaders = list[tuple[bytes, bytes]]
REDACTED_PATH_TOKEN = "/t/***"  # what log lines and messages show for the token of a /t/{token}/ path
SHARE_PREFIX = "/s/"  # /s/{capability}/data/... : a share link (gateway.http.share), logged as /s/{its id}
REDACTED_SHARE_LINK = SHARE_PREFIX + "***"  # a share link path that names nothing


def without_path_token(path: str) -> str:
    """``path`` cut after its first ``/t/`` or ``/s/`` (any letter case), ``***`` in place of the rest: a decoded
    path that spells a token or link path another way (``//t/``, ``/./t/``, ``/x/../s/``, ``/%74/``) shows no
    token or capability either."""
    if "/t/" not in path and "/T/" not in path and "/s/" not in path and "/S/" not in path:  # the cheap test first
        return path
    lowered = path.lower()
    cut = min(at for at in (lowered.find("/t/"), lowered.find(SHARE_PREFIX)) if at >= 0)
    return path[:cut] + (REDACTED_PATH_TOKEN if lowered[cut + 1] == "t" else REDACTED_SHARE_LINK)


class ClientGone(Abandoned):
    """The client disconnected before its answer was ready: the work it waited for was skipped."""


class HttpError(Fault):
    """An answer other than success decided by the HTTP layer itself, with a message for the JSON body.

    Defined here, beside the plain request and answer, so that deciding one (:mod:`gateway.http.auth`,
    also used at start-up) imports nothing of the metrics, which must be set up first.
    """

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}
        self.ways_in: frozenset[WayIn] = frozenset()  # a 401's: the credentials beyond tokens this gateway takes


class WayIn(enum.Enum):
    """A credential a gateway may take beside tokens, as a refusal (401) tells a person who has none."""

    SIGN_IN = "sign-in"  # an OpenID issuer is configured: /login
    SHARE_LINK = "share link"  # a share key is configured: /s/{capability}/


class ResponseAborted(Abandoned):
    """A streamed body failed after its first byte: the server must drop the connection, so the
    client sees a short body (an error), never a complete-looking one."""


def logged_path(path: str, token: bytes | None, link: bytes | None, link_id: str) -> str:
    """A path as log lines and messages show it: whatever may be a token after a ``/t/`` as ``***``.

    The one place they take it from: the path below a ``/t/{token}/`` the routes read is shown after ``/t/***``,
    below a share link after ``/s/{its id}``, and any other path is cut after a ``/t/`` it holds, however spelt.
    """
    below = without_path_token(path)
    if link is not None:
        return f"{SHARE_PREFIX}{link_id}{below}"
    return below if token is None else REDACTED_PATH_TOKEN + below


@dataclass(slots=True)
class Request:
    method: str
    path: str  # as routed: below a path token or share link
    headers: dict[bytes, bytes]  # lower-case names; a repeated header keeps its last value
    query_string: bytes
    receive: Receive | None = None  # the ASGI channel that says when the client disconnects
    header_list: "RawHeaders" = field(default_factory=list)  # every line as received, repeats included
    client: str = ""  # the peer's address: a proxy's when one is in front
    path_token: bytes | None = None  # the token of a /t/{token}/ path; ``path`` is then the path below it
    path_link: bytes | None = None  # the capability of a /s/{capability}/ path; ``path`` is then the path below it
    link_id: str = ""  # that link's id, as log lines show it (never its capability)

    @property
    def logged_path(self) -> str:
        return logged_path(self.path, self.path_token, self.path_link, self.link_id)

    @property
    def context(self) -> str:
        """What a log line says about the request: method and path, never the query nor a path's token."""
        return f"{self.method} {self.logged_path}"

    def header(self, name: bytes) -> str | None:
        value = self.headers.get(name)
        return None if value is None else value.decode("latin-1")

    def header_lines(self, name: bytes) -> list[bytes]:
        """Every value of header ``name``: where one value must not hide another (tokens)."""
        return [value for key, value in self.header_list if key == name]

    def query(self, name: str) -> str | None:
        """The last value of query parameter ``name``; never for the token, which only auth.read_token reads."""
        if not self.query_string:
            return None
        values = parse_qs(self.query_string.decode("latin-1")).get(name)
        return values[-1] if values else None

    async def unless_client_leaves(self, work: Callable[[], Awaitable[T]]) -> T:
        """``work``'s result; :class:`ClientGone` if the client disconnects first.

        The disconnect cancels the work, so a chunk still waiting for a thread or for the memory
        budget is never produced for nobody. (Work already running in a thread finishes; its answer
        is dropped.)
        """
        receive = self.receive
        if receive is None:
            return await work()
        done: list[T] = []
        failed: list[Exception] = []
        async with anyio.create_task_group() as group:

            async def watch() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass  # a GET's empty body; only the disconnect matters
                group.cancel_scope.cancel()

            group.start_soon(watch)
            try:
                done.append(await work())
            except Exception as exc:  # raised as itself below, not wrapped in the task group's ExceptionGroup
                failed.append(exc)
            group.cancel_scope.cancel()
        if failed:
            raise failed[0]
        if not done:
            raise ClientGone(f"the client of {self.context} disconnected before its answer was ready")
        return done[0]


def raw_headers(headers: dict[str, str]) -> RawHeaders:
    return [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]


_NOTHING_MORE_YET: Message = {"type": "http.response.body", "body": b"", "more_body": True}


def link_prefix(request: Request) -> str:
    """The share link path ``request`` came under (``/s/{capability}``), or "": pages and error pages keep
    their links below it. Quoted, as a refused link's capability may hold any byte."""
    link = request.path_link
    return "" if link is None else SHARE_PREFIX + quote(link.decode("latin-1"), safe="")


class Answer:
    """Status, raw headers and a body held in memory or sent piece by piece as it is read."""

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
        if status != 304 and pieces is None and not any(name == b"content-length" for name, _ in headers):
            headers.append((b"content-length", str(len(body)).encode()))
        self.status = status
        self.headers = headers
        self.body = body
        self.pieces = pieces  # after ``body``: a large body, sent as it is read instead of held whole

    async def send(self, send: Send) -> None:
        """Send the answer: its head and body, or its first piece and the rest as they are read."""
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        if self.pieces is None:
            await send({"type": "http.response.body", "body": self.body})
            return
        first, self.body = self.body, b""  # a streamed answer is sent once: its first piece is not held past its send
        await send({"type": "http.response.body", "body": first, "more_body": True})
        del first
        while True:
            # Nothing more is read while the client has not taken what was sent: an empty message waits for the
            # server's write buffer to drain (uvicorn waits at the start of a send, not after its write), so a
            # reader that stalls holds one piece of the worker's memory, not that piece and the next one read.
            await send(_NOTHING_MORE_YET)
            piece = await anext(self.pieces, None)
            if piece is None:
                break
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
