"""Neuroglancer served by the gateway itself, at ``/neuroglancer/``: same origin as the data, so no mixed content,
no CORS and no internet needed.

The client is the one the ``neuroglancer`` package ships prebuilt (the ``viewer`` extra). It is built for that
package's Python server: it must be served under ``<prefix>/v/<viewer token>/`` and then talks to
``<prefix>/events/<token>`` (an event stream of server-side state), and posts to ``state``, ``action``,
``volume_response`` and ``credentials``. The gateway is a viewer without server-side state: the state lives in
the address's ``#!`` fragment, so the page it serves gives a bare address an empty fragment before the client
starts (with a fragment the client keeps its state there and posts none), the event stream stays open and says
nothing, and the posting routes are not served (the client ignores their failure).
"""

import importlib.util
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import anyio

from ... import extras
from ...resources import Resource, bytes_resource
from ..messages import Answer, HttpError, Receive
from ..urls import VIEWER_PREFIX
from .links import LinkForm
from .markup import HTML

PUBLIC_NEUROGLANCER = "https://neuroglancer-demo.appspot.com/"
PREFIX = VIEWER_PREFIX  # where the client is served: the edge hands it every path below
VIEWER_TOKEN = "gateway"  # the one viewer "token" in the client's /v/<token>/ address
PAGE = f"{PREFIX}/v/{VIEWER_TOKEN}/"
EVENTS = f"{PREFIX}/events/{VIEWER_TOKEN}"
MEDIA_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".map": "application/json",
    ".wasm": "application/wasm",  # WebAssembly.instantiateStreaming requires it
    ".html": HTML,
}
IMMUTABLE = b"public, max-age=31536000, immutable"  # the client's file names carry a hash of their content
REVALIDATE = b"no-cache"  # the page: a newer package's page names newer files
HEARTBEAT_SECONDS = 20.0  # a comment on the event stream this often, well inside a proxy's read timeout
STREAM_SECONDS = 600.0  # then the stream ends and the client opens another at once (a worker must not be held)
# Event streams a worker holds open at once. They need no token (the client's page has none to give them), so
# anyone could open thousands; past this a new one is a 503 the client retries with its own backoff (its state
# is in its address, so a viewer without a stream still works). One open viewer tab holds one stream.
MAX_EVENT_STREAMS = 128
STREAMS_RETRY_SECONDS = 30  # the longest wait of the client's own backoff
# Run before the client's scripts: a bare address gets an empty state in its fragment (see the module's doc).
_STATE_IN_ADDRESS = '<script>if (!location.hash) { history.replaceState(null, "", "#!%7B%7D"); }</script>'
_TRUSTWORTHY_HOSTS = ("localhost", "127.", "[::1]")  # which an https page may read over http (and *.localhost)


def viewer_url(setting: str, own_client: bool, links: LinkForm) -> str:
    """The Neuroglancer that pages link to: the setting when given, else the gateway's own (below the page's
    credential path, as a proxy checks a credential on every path), else the public demo."""
    if setting:
        return setting
    return f"{links.root_path}{links.path_prefix}{PAGE}" if own_client else PUBLIC_NEUROGLANCER


def mixed_content_note(viewer: str, page_base: str) -> str | None:
    """Why the viewer cannot show this gateway's data, when it cannot: an https viewer reading an http gateway
    that the browser does not treat as potentially trustworthy (blocked as mixed content)."""
    if urlsplit(viewer).scheme != "https" or urlsplit(page_base).scheme != "http":
        return None
    host = (urlsplit(page_base).hostname or "").lower()
    if host.startswith(_TRUSTWORTHY_HOSTS) or host.endswith(".localhost") or host == "::1":
        return None
    return (
        f"The Neuroglancer links open {viewer}, an https page, and this gateway answers over plain http at "
        f"{page_base}: browsers block an https page from reading http data (mixed content) unless the data is on "
        "localhost, so the viewer's panels would stay black. Install the viewer extra (pip install "
        "'zarr-gateway[viewer]') to have the gateway serve Neuroglancer itself, or serve the gateway over https."
    )


@dataclass(frozen=True, slots=True)
class Reply:
    """What a viewer route answers: a resource with its caching, or a whole answer (a redirect, the stream)."""

    resource: Resource | None = None
    cache_control: bytes = REVALIDATE
    answer: Answer | None = None


class NeuroglancerClient:
    """The prebuilt client's files, by name: a request names one of them or nothing (no path is resolved)."""

    def __init__(self, directory: Path) -> None:
        self.files = {path.name: path for path in directory.iterdir() if path.is_file()}
        self._resources: dict[str, Resource] = {}  # at most the client's own files (about 16 MB)
        # the event streams this worker holds open: each leaves the set once its answer is done with
        self._streams: weakref.WeakSet[AsyncIterator[bytes]] = weakref.WeakSet()

    @classmethod
    def installed(cls) -> "NeuroglancerClient | None":
        """The client of the installed ``neuroglancer`` package, found without importing it; None without it."""
        if not extras.VIEWER.available:
            return None
        spec = importlib.util.find_spec("neuroglancer")
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        for location in locations:
            directory = Path(location) / "static" / "client"
            if (directory / "index.html").is_file():
                return cls(directory)
        return None

    async def reply(self, path: str, receive: Receive | None, draining: Callable[[], bool]) -> Reply | None:
        """The answer to ``path`` (below :data:`PREFIX`); None for a path that names nothing here (a 404)."""
        if path in (PREFIX, f"{PREFIX}/"):  # a redirect keeps the fragment: the state comes along
            location = "v/gateway/" if path.endswith("/") else "neuroglancer/v/gateway/"
            return Reply(answer=Answer(302, [(b"location", location.encode()), (b"cache-control", REVALIDATE)]))
        if path == EVENTS:
            return Reply(answer=self._event_stream(receive, draining))
        if path == PAGE:
            return Reply(await self._resource("index.html"), REVALIDATE)
        name = path.removeprefix(PAGE)
        if name == path or name not in self.files or name == "index.html":
            return None
        return Reply(await self._resource(name), IMMUTABLE)

    def _event_stream(self, receive: Receive | None, draining: Callable[[], bool]) -> Answer:
        if len(self._streams) >= MAX_EVENT_STREAMS:
            raise HttpError(
                503,
                f"this worker holds {MAX_EVENT_STREAMS} viewer event streams open already; the viewer works without "
                "one (its state is in its address) and retries",
                {"Retry-After": str(STREAMS_RETRY_SECONDS)},
            )
        answer = event_stream(receive, draining)
        assert answer.pieces is not None
        self._streams.add(answer.pieces)
        return answer

    async def _resource(self, name: str) -> Resource:
        resource = self._resources.get(name)
        if resource is None:
            body = await anyio.to_thread.run_sync(self.files[name].read_bytes)
            if name == "index.html":
                body = body.replace(b"<head>", b"<head>" + _STATE_IN_ADDRESS.encode(), 1)
            media_type = MEDIA_TYPES.get(Path(name).suffix, "application/octet-stream")
            resource = self._resources[name] = bytes_resource(body, media_type)
        return resource


def event_stream(receive: Receive | None, draining: Callable[[], bool]) -> Answer:
    """The server-sent events of a viewer without server-side state: open, then only comments, until the client
    leaves, the worker drains, or :data:`STREAM_SECONDS` pass (the client then reconnects)."""
    headers = [
        (b"content-type", b"text/event-stream"),
        (b"cache-control", b"no-cache"),
        (b"x-accel-buffering", b"no"),  # nginx passes each comment on rather than buffering the stream
    ]
    return Answer(200, headers, b": the viewer's state is in its address\n\n", pieces=_comments(receive, draining))


async def _comments(receive: Receive | None, draining: Callable[[], bool]) -> AsyncIterator[bytes]:
    deadline = anyio.current_time() + STREAM_SECONDS
    while anyio.current_time() < deadline and not draining():
        with anyio.move_on_after(HEARTBEAT_SECONDS):
            while receive is not None and (await receive())["type"] != "http.disconnect":
                pass
            if receive is not None:
                return  # the client left
            await anyio.sleep(HEARTBEAT_SECONDS)
        yield b":\n\n"
