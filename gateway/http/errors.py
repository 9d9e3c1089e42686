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

from gateway_storage.faults import (
    Abandoned,
    Absent,
    Broken,
    Conflict,
    Fault,
    Invalid,
    Malformed,
    TooLarge,
    Unavailable,
    Unsupported,
)

from ..metrics import count_storage_error
from ..resources import JSON
from .messages import Answer, HttpError, WayIn, raw_headers
from .pages.links import LinkForm
from .pages.markup import HTML
from .pages.refusal import refusal_page

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


INTERNAL = "internal error; it has been logged"  # the whole message of a fault the asker is told nothing of
# The one table: each kind of fault (gateway_storage.faults) and its answer. How a fault is told (its words,
# Retry-After, the storage-error label) are the kind's class attributes, which a class below it may change; a
# counted storage fault is logged too.
RULES: dict[type[BaseException], ErrorRule] = {
    Absent: ErrorRule(404),
    Invalid: ErrorRule(400),
    Conflict: ErrorRule(409),  # e.g. bad properties: listed with the reason, served by nobody
    TooLarge: ErrorRule(413),
    Unavailable: ErrorRule(503),
    Unsupported: ErrorRule(501, logged=True),  # a feature whose extra is not installed (meshes)
    Abandoned: ErrorRule(499),  # nginx's "client closed request": logged as such, sent to nobody
    Broken: ErrorRule(500),
    Malformed: ErrorRule(500, INTERNAL, logged=True),
    Exception: ErrorRule(500, INTERNAL, logged=True),
}
AS_KIND: dict[type[BaseException], type[Fault]] = {OSError: Broken}  # Python's own exceptions that are a kind


def rule_for(exc: BaseException) -> ErrorRule:
    """The answer to ``exc``: its kind's rule (the first kind along its class hierarchy), told as its class says."""
    cls = type(exc)
    rule = _RULES_OF.get(cls)
    if rule is None:
        rule = _RULES_OF[cls] = _rule_of(cls)
    return rule


_RULES_OF: dict[type[BaseException], ErrorRule] = {}  # by class, as found: as many as there are classes


def _rule_of(cls: type[BaseException]) -> ErrorRule:
    for base in cls.__mro__:
        kind = AS_KIND.get(base, base)
        rule = RULES.get(kind)
        if rule is None:
            continue
        told = cls if issubclass(cls, Fault) else kind
        if not issubclass(told, Fault):
            return rule
        retry = None if told.retry_seconds is None else str(told.retry_seconds)
        counted = told.counted_as
        message = rule.message or told.said
        return ErrorRule(rule.status, message, told.prefix, retry, counted, rule.logged or counted is not None)
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
