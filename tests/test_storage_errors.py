"""The storage kernel's errors keep the answers they had when they lived in wkw_adapter.

Every one is a storage fault (5xx, counted), never a 404 that a client would turn into fill values.
"""

import json

import pytest

from gateway.http.errors import error_answer, rule_for
from gateway.sources.zarr_source import ChunkDecodeError
from gateway_storage import (
    FileChangedError,
    FileUnsettledError,
    OutsideRootError,
    StorageError,
    StoreUnavailableError,
    TruncatedFileError,
)
from wkw_adapter import WkwError


@pytest.mark.parametrize(
    ("exc", "status", "retry_after", "metric", "message"),
    [
        (FileChangedError("a.wkw changed"), 503, "1", "changed", "being rewritten; retry"),
        (FileUnsettledError("a.wkw written 0.1 s ago", 0.9), 503, "1", None, "written moments ago"),
        (StoreUnavailableError("timeout"), 503, "2", "unavailable", "the store did not answer: timeout"),
        (TruncatedFileError("a.wkw: wanted 8 bytes"), 500, None, "fault", "storage fault: a.wkw: wanted 8 bytes"),
        (
            OutsideRootError("org/ds/l/1/c/0 resolves outside the data root"),
            500,
            None,
            "fault",
            "storage fault: org/ds/l/1/c/0 resolves outside the data root",
        ),
        (StorageError("anything else"), 500, None, "fault", "storage fault: anything else"),
        (ChunkDecodeError("org/ds/l/1: bad blosc"), 500, None, "fault", "storage fault: org/ds/l/1: bad blosc"),
    ],
)
def test_storage_errors_are_answered_as_before(
    exc: Exception, status: int, retry_after: str | None, metric: str | None, message: str
) -> None:
    rule = rule_for(exc)
    assert (rule.status, rule.retry_after, rule.storage_error) == (status, retry_after, metric)
    body = json.loads(error_answer(exc, "GET /data/x").body)
    assert body["status"] == status and message in body["error"]


def test_storage_errors_are_not_wkw_errors() -> None:
    """A changed S3 object of a Zarr array is a storage fault, not a WKW one."""
    for cls in (FileChangedError, FileUnsettledError, TruncatedFileError, StoreUnavailableError, OutsideRootError):
        assert issubclass(cls, StorageError) and not issubclass(cls, WkwError)
    assert issubclass(StoreUnavailableError, OSError) and issubclass(OutsideRootError, PermissionError)
