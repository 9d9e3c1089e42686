"""Operations: liveness, readiness, metrics, the proxy's token check, draining on SIGTERM, token reloads.

- ``/healthz`` answers 200 while the process serves at all (liveness).
- ``/readyz`` answers 200 when the data root is readable and the process is not draining, else 503.
- ``/metrics`` is the Prometheus text exposition (see :mod:`gateway.metrics`).
- ``/auth`` answers a proxy's auth subrequest (nginx ``auth_request``, ingress-nginx ``auth-url``): 204
  when the token (X-Auth-Token header, or ``token`` in the query of the original URI) grants the dataset
  named by the ``X-Original-URI`` header (nginx) or ``X-Original-URL`` (ingress-nginx: a full URL), 401
  without a valid token, 403 when the token lacks the grant. It decides exactly as the data routes
  do, so the proxy lets through only what the gateway would serve anyway.
- On SIGTERM ``/readyz`` fails at once; ``drain_seconds`` later the server stops accepting connections
  and lets in-flight requests finish (``graceful_timeout``).
"""

import asyncio
import json
import logging
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import anyio

from .. import metrics
from .auth import Grant, Tokens, TokensFileError
from .data import Gateway
from .errors import json_error
from .messages import Answer, Request, raw_headers

log = logging.getLogger("gateway")
NO_STORE = {"Cache-Control": "no-store"}


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


class ReloadingTokens:
    """The tokens of a file, read again when the file changes (checked at most every ``interval`` s).

    A changed file that cannot be used is reported and the tokens read before stay in force.
    """

    def __init__(self, path: Path, tokens: Tokens, interval: float) -> None:
        self.path = path
        self.interval = interval
        self._tokens = tokens
        self._stamp = self._stat()
        self._checked = time.monotonic()
        self._lock = threading.Lock()

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def grant(self, token: str) -> Grant | None:
        if self.interval > 0 and time.monotonic() - self._checked >= self.interval:
            self._refresh()
        return self._tokens.grant(token)

    def _refresh(self) -> None:
        with self._lock:
            self._checked = time.monotonic()
            stamp = self._stat()
            if stamp == self._stamp:
                return
            self._stamp = stamp
            try:
                self._tokens = Tokens.load(self.path)
            except TokensFileError as exc:
                log.error("%s; the tokens read before stay in force", exc)
                return
            log.info("tokens file %r changed: its tokens are now in force", str(self.path))


def _decide(grant: Grant, original_uri: str) -> tuple[int, str]:
    """Whether ``grant`` may read what ``original_uri`` names, as the data routes would decide it."""
    raw_path = original_uri.partition("?")[0]
    if not raw_path.startswith("/"):
        return 403, "the original URI is not a path"
    path = unquote(raw_path)  # as uvicorn decodes the path the data routes see
    segments = [s for s in path.split("/") if s]
    if any(s in (".", "..") or "\\" in s or "\0" in s for s in segments):
        return 403, "path segments '.' and '..' are not allowed"
    if segments[:1] != ["data"] or len(segments) < 3:
        return 204, ""  # the index and the tree roots: listings are filtered per token by the gateway
    organization = segments[2]
    if len(segments) == 3:
        if grant.allows_organization(organization):
            return 204, ""
        return 403, f"the token does not grant access to organization {organization}"
    if grant.allows(organization, segments[3]):
        return 204, ""
    return 403, f"the token does not grant access to {organization}/{segments[3]}"


class Ops:
    """The operations endpoints of one app, and its draining state."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.settings = gateway.settings
        self.draining = False
        if gateway.tokens is not None and self.settings.tokens_file is not None:
            gateway.tokens = ReloadingTokens(  # type: ignore[assignment]
                self.settings.tokens_file, gateway.tokens, self.settings.tokens_reload_seconds
            )
        self.watch = metrics.CacheWatch(gateway.caches_by_name)

    def routes(self) -> dict[str, Callable[[Request], Awaitable[Answer]]]:
        return {"/healthz": self.healthz, "/readyz": self.readyz, "/metrics": self.metrics, "/auth": self.auth}

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
        root = self.settings.root
        storage = self.gateway.storage

        def probe() -> str | None:
            if not storage.is_local:  # object storage: one small listing must answer
                try:
                    storage.is_directory(storage.root)
                except Exception as exc:
                    return f"data root {root!r} cannot be reached: {exc}"
                return None
            try:
                with os.scandir(root) as entries:
                    next(entries, None)
            except OSError as exc:
                return f"data root {str(root)!r} is not readable: {exc.strerror or exc}"
            return None

        with anyio.move_on_after(5):
            return await anyio.to_thread.run_sync(probe, abandon_on_cancel=True)
        return f"data root {str(root)!r} did not answer within 5 s"

    async def metrics(self, request: Request) -> Answer:
        metrics.STATS.flush()
        self.watch.sync()
        body, content_type = metrics.exposition()
        return Answer(200, raw_headers(NO_STORE), body, content_type)

    async def auth(self, request: Request) -> Answer:
        tokens = self.gateway.tokens
        if tokens is None:
            return Answer(204, [])  # no tokens file: every dataset is readable
        original = _original_uri(request)
        if original is None:
            return json_error(
                400, "X-Original-URI or X-Original-URL is missing: /auth answers a proxy's auth subrequest", NO_STORE
            )
        values = parse_qs(original.partition("?")[2]).get("token")
        token = request.header(b"x-auth-token") or (values[-1] if values else None)
        if not token:
            return json_error(
                401, "a token is required: send it as the X-Auth-Token header or the token query parameter", NO_STORE
            )
        grant = tokens.grant(token)
        if grant is None:
            return json_error(401, "the token is not valid", NO_STORE)
        status, message = _decide(grant, original)
        if status == 204:
            # A grant may be cached by the proxy for as long as it is configured to (no Cache-Control here:
            # no-store would forbid it); refusals are never cached, so a new grant works at once.
            return Answer(204, [])
        return json_error(status, message, NO_STORE)

    # --- draining -----------------------------------------------------------------------------

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        self._hook_sigterm(asyncio.get_running_loop())
        try:
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
