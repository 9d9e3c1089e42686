"""The one place where exceptions become HTTP answers: status, headers, message, storage-error metric.

Rules that protect data (docs/architecture.md, "Data safety"): 404 only for what
is absent by design; a client's mistake is a 4xx that says what was wrong; a
storage fault is a 5xx, never a 404 that a client would turn into fill values.
The map applies wherever bytes are produced, including bytes read while a
response streams. No message names where the data lives on the server: every
body built here, and every reason a page shows, says paths relative to the data
root (:class:`HiddenRoots`, built once by the composition root).

An error is a JSON body for every client, and an HTML page for a request that prefers HTML to JSON (a browser
following a link: :func:`prefers_html`), with the same status, headers and message: content negotiation, so
``Vary: Accept`` on both.
"""

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

from gateway_storage import FileChangedError, FileUnsettledError, StorageError, StoreUnavailableError
from wkw_adapter import WkwError

from ..extras import MissingExtraError
from ..meshes.errors import (
    MeshInputError,
    MeshNotFound,
    MeshTooLarge,
    MeshTooSlow,
    SegmentIndexRequired,
    StoredMeshesRequired,
)
from ..meshes.index import SegmentIndexCorrupt
from ..metrics import count_storage_error
from ..previews import NoPreviewError, PreviewTooLarge
from ..resources import JSON
from ..sources.dataset import DatasetUnusable
from ..sources.mag import ChunkNotFound
from ..zarr.keys import MalformedKey
from ..zarr.trees import NodeNotFound
from .budget import OverBudget
from .messages import Answer, ClientGone, HttpError, WayIn, raw_headers
from .pages.links import LinkForm
from .pages.markup import HTML
from .pages.refusal import refusal_page
from .ranges import PositionTooLong, TooManyRanges

log = logging.getLogger("gateway")
__all__ = [
    "NOTHING_HIDDEN",
    "RULES",
    "Browser",
    "ErrorRule",
    "HiddenRoots",
    "HttpError",
    "error_answer",
    "json_error",
    "prefers_html",
    "record",
    "refusal",
]


@dataclass(frozen=True, slots=True)
class ErrorRule:
    status: int
    message: str | None = None  # None: the exception's own text, prefixed by ``prefix``
    prefix: str = ""
    retry_after: str | None = None
    storage_error: str | None = None  # the label of zarr_gateway_storage_errors_total to count
    logged: bool = False


# Looked up along the exception's class hierarchy, most specific first.
RULES: dict[type[BaseException], ErrorRule] = {
    NodeNotFound: ErrorRule(404),
    NoPreviewError: ErrorRule(404),
    ChunkNotFound: ErrorRule(404),
    ClientGone: ErrorRule(499),  # nginx's "client closed request": logged as such, sent to nobody
    MalformedKey: ErrorRule(400),
    DatasetUnusable: ErrorRule(409),  # bad properties: listed with the reason, served by nobody
    TooManyRanges: ErrorRule(400),
    PositionTooLong: ErrorRule(400),
    MeshNotFound: ErrorRule(404),
    MeshInputError: ErrorRule(400),
    SegmentIndexRequired: ErrorRule(409),
    StoredMeshesRequired: ErrorRule(409),
    MeshTooLarge: ErrorRule(413),
    MeshTooSlow: ErrorRule(503, retry_after="10"),
    PreviewTooLarge: ErrorRule(413),
    OverBudget: ErrorRule(413),  # what a request would build is more than the worker's whole memory budget
    MissingExtraError: ErrorRule(501, logged=True),  # a feature whose extra is not installed (meshes)
    SegmentIndexCorrupt: ErrorRule(500, prefix="segment index fault: ", storage_error="fault", logged=True),
    FileUnsettledError: ErrorRule(  # not logged: every read of a fresh file would be
        503, "the data file was written moments ago and may still be being written; retry", retry_after="1"
    ),
    FileChangedError: ErrorRule(
        503, "the data file is being rewritten; retry", retry_after="1", storage_error="changed", logged=True
    ),
    StoreUnavailableError: ErrorRule(
        503, prefix="the store did not answer: ", retry_after="2", storage_error="unavailable", logged=True
    ),
    StorageError: ErrorRule(500, prefix="storage fault: ", storage_error="fault", logged=True),  # outside the root too
    WkwError: ErrorRule(500, prefix="storage fault: ", storage_error="fault", logged=True),
    OSError: ErrorRule(500, prefix="storage fault: ", storage_error="fault", logged=True),
    Exception: ErrorRule(500, "internal error; it has been logged", logged=True),
}


def rule_for(exc: BaseException) -> ErrorRule:
    for cls in type(exc).__mro__:
        rule = RULES.get(cls)
        if rule is not None:
            return rule
    return RULES[Exception]


class HiddenRoots:
    """The server's own locations of the data, longest first, each with what a client is shown instead.

    Built once by the composition root from the settings; every message and reason a client sees passes
    through :meth:`relative`.
    """

    def __init__(self, root: str = "", extra_roots: Iterable[str] = ()) -> None:
        found: dict[str, str] = {}
        for location, shown in [(root, ""), *((extra, "<extra root>/") for extra in extra_roots)]:
            plain = location.removeprefix("file://").rstrip("/")
            if not plain:
                continue
            forms = {plain} if plain.startswith("s3://") else {plain, os.path.abspath(plain), os.path.realpath(plain)}
            for form in forms:
                found.setdefault(form + "/", shown)
                found.setdefault(form, shown.rstrip("/") or "<data root>")
        self.replacements = tuple(sorted(found.items(), key=lambda item: -len(item[0])))

    def relative(self, text: str) -> str:
        """``text`` with every location under the data root relative to it, and the root itself unnamed."""
        for location, shown in self.replacements:
            if location in text:
                text = text.replace(location, shown)
        return text


NOTHING_HIDDEN = HiddenRoots()  # for answers made where no root is known (unit tests of the map)


@dataclass(frozen=True, slots=True)
class Browser:
    """A request that prefers HTML: its errors are pages, whose links keep the credential form of its address."""

    path: str  # as log lines show it: no token
    links: LinkForm


def prefers_html(accept: bytes | None) -> bool:
    """Whether an ``Accept`` header ranks ``text/html`` (named, not by a wildcard) above JSON, as browsers send
    for a page; ``*/*``, no header, or JSON first (zarr-python, tensorstore, curl, an image tag) is JSON."""
    if not accept or b"text/html" not in accept:  # the cheap test first: every data client
        return False
    html = json = 0.0
    for part in accept.decode("latin-1").lower().split(","):
        kind, *parameters = (piece.strip() for piece in part.split(";"))
        quality = 1.0
        for parameter in parameters:
            name, _, value = parameter.partition("=")
            if name.strip() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        if kind == "text/html":
            html = max(html, quality)
        elif kind in ("application/json", "application/*", "*/*"):
            json = max(json, quality)
    return html > json


def json_error(status: int, message: str, headers: dict[str, str] | None = None) -> Answer:
    body = json.dumps({"error": message, "status": status}).encode()
    return Answer(status, raw_headers({**(headers or {}), "Vary": "Accept"}), body, JSON)


def refusal(
    status: int,
    message: str,
    headers: dict[str, str] | None,
    browser: Browser | None,
    ways_in: frozenset[WayIn] = frozenset(),
) -> Answer:
    """An error answer: JSON, or for a browser the page that says the same (:mod:`gateway.http.pages.refusal`),
    a 401's with the ways in beside tokens that the gateway takes."""
    if browser is None:
        return json_error(status, message, headers)
    page = refusal_page(status, message, browser.path, browser.links, ways_in)
    return Answer(status, raw_headers({**(headers or {}), "Vary": "Accept"}), page, HTML)


def error_answer(
    exc: BaseException, context: str, roots: HiddenRoots = NOTHING_HIDDEN, browser: Browser | None = None
) -> Answer:
    """The answer to ``exc`` raised while serving ``context`` (method and path), counted and logged as mapped;
    its message names no location of ``roots``; a page when ``browser`` asked."""
    if isinstance(exc, HttpError):  # the HTTP layer's own decision: nothing to map
        return refusal(exc.status, roots.relative(exc.message), exc.headers, browser, exc.ways_in)
    rule = record(exc, context)
    message = rule.message if rule.message is not None else f"{rule.prefix}{exc}"
    headers = {"Retry-After": rule.retry_after} if rule.retry_after else None
    return refusal(rule.status, roots.relative(message), headers, browser)


def record(exc: BaseException, context: str) -> ErrorRule:
    """Count and log ``exc`` as the map says; for failures after the response has started too."""
    rule = rule_for(exc)
    if rule.storage_error is not None:
        count_storage_error(rule.storage_error)
    if rule.logged:
        if rule.status == 500 and rule.storage_error is None:
            log.exception("unexpected error for %s", context, exc_info=exc)
        else:
            log.error("%s for %s: %s", type(exc).__name__, context, exc)
    return rule
