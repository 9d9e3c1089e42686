"""The one place where exceptions become HTTP answers: status, headers, message, storage-error metric.

Rules that protect data (docs/architecture.md, "Data safety"): 404 only for what
is absent by design; a client's mistake is a 4xx that says what was wrong; a
storage fault is a 5xx, never a 404 that a client would turn into fill values.
The map applies wherever bytes are produced, including bytes read while a
response streams.
"""

import json
import logging
from dataclasses import dataclass

from wkw_adapter import FileChangedError, FileUnsettledError, StoreUnavailableError, WkwError

from ..meshes.errors import MeshExtraMissing, MeshInputError, MeshNotFound, MeshTooLarge, SegmentIndexRequired
from ..meshes.index import SegmentIndexCorrupt
from ..metrics import count_storage_error
from ..previews import NoPreviewError
from ..sources.mag import ChunkNotFound
from ..zarr.keys import MalformedKey
from ..zarr.resource import JSON
from ..zarr.trees import NodeNotFound
from .messages import Answer, raw_headers
from .ranges import TooManyRanges

log = logging.getLogger("gateway")


class HttpError(Exception):
    """An answer other than success decided by the HTTP layer itself, with a message for the JSON body."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


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
    MalformedKey: ErrorRule(400),
    TooManyRanges: ErrorRule(400),
    MeshNotFound: ErrorRule(404),
    MeshInputError: ErrorRule(400),
    SegmentIndexRequired: ErrorRule(409),
    MeshTooLarge: ErrorRule(413),
    MeshExtraMissing: ErrorRule(501, logged=True),
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


def json_error(status: int, message: str, headers: dict[str, str] | None = None) -> Answer:
    body = json.dumps({"error": message, "status": status}).encode()
    return Answer(status, raw_headers(headers or {}), body, JSON)


def error_answer(exc: BaseException, context: str) -> Answer:
    """The answer to ``exc`` raised while serving ``context`` (method and path), counted and logged as mapped."""
    if isinstance(exc, HttpError):  # the HTTP layer's own decision: nothing to map
        return json_error(exc.status, exc.message, exc.headers)
    rule = record(exc, context)
    message = rule.message if rule.message is not None else f"{rule.prefix}{exc}"
    headers = {"Retry-After": rule.retry_after} if rule.retry_after else None
    return json_error(rule.status, message, headers)


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
