"""Operations: liveness, readiness, metrics, the proxy's token check, draining on SIGTERM.

- ``/healthz`` answers 200 while the process serves at all (liveness).
- ``/readyz`` answers 200 when the data root is readable and the process is not draining, else 503.
- ``/metrics`` is the Prometheus text exposition (see :mod:`gateway.metrics`).
- ``/auth`` answers a proxy's auth subrequest (nginx ``auth_request``, ingress-nginx ``auth-url``): 204
  when the token (X-Auth-Token header, ``token`` in the query or ``/t/{token}/`` in the path of the
  original URI) or the share link (``/s/{capability}/``) grants what the
  ``X-Original-URI`` header (nginx) or ``X-Original-URL`` (ingress-nginx: a full URL) names, 401
  without a valid token, 403 when the token lacks the grant. The URI's path is looked up in the URL table as the
  router looks it up, and judged by the needs of its place (:data:`gateway.http.urls.PLACES`), which its route
  decides by too, so the proxy lets through only what the gateway would serve anyway, or refuse itself.
- On SIGTERM ``/readyz`` fails at once; ``drain_seconds`` later the server stops accepting connections
  and lets in-flight requests finish (``graceful_timeout``).
"""

import asyncio
import json
import logging
import os
import signal
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import anyio

from gateway_storage import Store
from gateway_storage.cache import CacheCounts
from gateway_storage.faults import Absent, Invalid

from .. import heap, metrics
from ..settings import Settings
from .errors import HiddenRoots, HttpError, json_error
from .handlers.access import Authorizer
from .messages import REDACTED_PATH_TOKEN, REDACTED_SHARE_LINK, Answer, Request, raw_headers
from .urls import OPS_PATHS, PLACES, Places, request_path, split_path_token, split_share_link

log = logging.getLogger("gateway")
NO_STORE = {"Cache-Control": "no-store"}
LEFT_TO_THE_ROUTES = 202  # /auth: go on, the route itself refuses this request (and no proxy caches a 202)


def _json(status: int, document: Mapping[str, object]) -> Answer:
    return Answer(status, raw_headers(NO_STORE), json.dumps(document).encode(), "application/json")


def _original_uri(request: Request) -> str | None:
    """The path and query the proxy is asking about, from ``X-Original-URI`` or a full ``X-Original-URL``."""
    uri = request.header(b"x-original-uri")
    if uri is not None:
        return uri
    url = request.header(b"x-original-url")
    if url is None:
        return None
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


class Ops:
    """The operations endpoints of one app, and its draining state."""

    def __init__(
        self,
        settings: Settings,
        storage: Store,
        roots: HiddenRoots,
        access: Authorizer,
        caches_by_name: Callable[[], dict[str, CacheCounts]],
        stats: metrics.RequestStats,
    ) -> None:
        self.settings = settings
        self.stats = stats  # the app's tally of its requests, flushed at every scrape
        self.storage = storage
        self.roots = roots
        self.access = access
        self.places = Places(PLACES)  # what /auth looks the original URI up in, as the router does
        self.draining = False
        self.watch = metrics.CacheWatch(caches_by_name)

    def routes(self) -> dict[str, Callable[[Request], Awaitable[Answer]]]:
        handlers = (self.healthz, self.readyz, self.metrics, self.auth)
        return dict(zip(OPS_PATHS, handlers, strict=True))

    # --- endpoints ----------------------------------------------------------------------------

    async def healthz(self, request: Request) -> Answer:
        return _json(200, {"status": "ok"})

    async def readyz(self, request: Request) -> Answer:
        if self.draining:
            return _json(503, {"status": "draining"})
        problem = await self._root_problem()
        if problem:
            log.warning("not ready: %s", problem)
            return _json(503, {"status": "not ready", "problem": problem})
        return _json(200, {"status": "ready"})

    async def _root_problem(self) -> str | None:
        """Why the data root cannot be read, if it cannot; named "the data root", never by its location."""
        root = self.settings.root
        storage = self.storage

        def probe() -> str | None:
            if not storage.is_local:  # object storage: one small listing must answer
                try:
                    storage.is_directory(storage.root)
                except Exception as exc:
                    return f"the data root cannot be reached: {exc}"
                return None
            try:
                with os.scandir(root) as entries:
                    next(entries, None)
            except OSError as exc:
                return f"the data root is not readable: {exc.strerror or type(exc).__name__}"
            return None

        with anyio.move_on_after(5):
            problem = await anyio.to_thread.run_sync(probe, abandon_on_cancel=True)
            return None if problem is None else self.roots.relative(problem)
        return "the data root did not answer within 5 s"

    async def metrics(self, request: Request) -> Answer:
        self.stats.flush()
        metrics.PROBE.flush()
        self.watch.sync()
        body, content_type = metrics.exposition()
        return Answer(200, raw_headers(NO_STORE), body, content_type)

    async def auth(self, request: Request) -> Answer:
        """The needs of the original URI's place, decided as its route decides them (``Authorizer.admit``).

        Only 401 and 403 refuse: a proxy's auth subrequest can pass on no other refusal (nginx turns any
        other answer into a 500). What the route refuses for another reason (more than one token, a
        malformed path: 400; a path that names nothing: 404; a method it does not take, from
        ``X-Original-Method``: 405) is let through with 202, so that the client gets the gateway's own answer;
        such a request reaches no data. Both shipped proxies cache only 204 (and the compose proxy 401/403), so
        a 202, which decided nothing about the token, is never reused for another request.
        """
        original = _original_uri(request)
        if original is None:
            if self.access.open:
                return Answer(204, [])  # no tokens file: every dataset is readable
            return json_error(
                400, "X-Original-URI or X-Original-URL is missing: /auth answers a proxy's auth subrequest", NO_STORE
            )
        raw_path, _, query = original.partition("?")
        if not raw_path.startswith("/"):
            return json_error(403, "the original URI is not a path", NO_STORE)
        try:
            path_token, path = split_path_token(raw_path, request_path(raw_path))
            path_link, path = split_share_link(raw_path, path)
            if path in (REDACTED_PATH_TOKEN, REDACTED_SHARE_LINK):  # a /t/ or /s/ path that names nothing: a 404
                return Answer(LEFT_TO_THE_ROUTES, raw_headers(NO_STORE))
            needs = self.places.needs(path)
            if request.header(b"x-original-method") not in (None, *needs.methods):
                return Answer(LEFT_TO_THE_ROUTES, raw_headers(NO_STORE))
            await self.access.admit(needs, request, path, (query.encode("latin-1"), path_token, path_link))
        except HttpError as exc:
            if exc.status in (401, 403):
                return json_error(exc.status, exc.message, NO_STORE)
            return Answer(LEFT_TO_THE_ROUTES, raw_headers(NO_STORE))
        except (Absent, Invalid):  # the route's refusal of the path (a name that is not there, a malformed one)
            return Answer(LEFT_TO_THE_ROUTES, raw_headers(NO_STORE))
        # A grant may be cached by the proxy for as long as it is configured to (no Cache-Control here:
        # no-store would forbid it); refusals are never cached, so a new grant works at once.
        return Answer(204, [])

    # --- draining -----------------------------------------------------------------------------

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        self._hook_sigterm(asyncio.get_running_loop())
        heap.freeze_long_lived()  # full collections walk only what is made from now on (see gateway/heap.py)
        heap.tune_allocator()  # chunks' arrays reuse the heap instead of being mapped afresh each time
        try:
            async with metrics.loop_lag_probe():  # the worker's event loop lag, in /metrics
                yield
        finally:
            metrics.process_exit()

    def _hook_sigterm(self, loop: asyncio.AbstractEventLoop) -> None:
        """Put draining in front of the server's own SIGTERM handler (uvicorn's graceful shutdown)."""
        if threading.current_thread() is not threading.main_thread():
            return  # e.g. a test client: no signals there
        previous = signal.getsignal(signal.SIGTERM)
        if not callable(previous):
            return
        delay = self.settings.drain_seconds

        def on_sigterm(sig: int, frame: Any) -> None:
            again = self.draining
            self.draining = True
            if again or delay <= 0:
                previous(sig, frame)
                return
            loop.call_soon_threadsafe(self._drain, delay, previous, sig)

        signal.signal(signal.SIGTERM, on_sigterm)

    def _drain(self, delay: float, stop: Any, sig: int) -> None:
        log.info("SIGTERM: /readyz fails from now; new connections are refused in %s s", delay)
        asyncio.get_running_loop().call_later(delay, stop, sig, None)
