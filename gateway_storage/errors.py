"""Errors of the storage kernel: the bytes could not be read as asked, whatever their format.

Every one of them means "the store could not give these bytes now", never "the data is absent":
callers must not turn them into zeros.
"""

from typing import ClassVar

from .faults import Broken, Unavailable


class StorageError(Broken):
    """Base class: a file or object that cannot be read correctly from its store."""


class FileChangedError(Unavailable, StorageError):
    """The file was replaced or rewritten while it was being read; retry."""

    said: ClassVar[str | None] = "the data file is being rewritten; retry"
    counted_as: ClassVar[str | None] = "changed"


class FileUnsettledError(FileChangedError):
    """The file was written too recently to trust what was read: a writer may still be rewriting it in place.

    Size, modification time and inode cannot tell apart the versions a file passes through while one
    write call is still copying bytes into it, so such a file is not served until it has been quiet
    for the store's settle time. ``retry_after`` is how many seconds that is from now.
    """

    said = "the data file was written moments ago and may still be being written; retry"
    counted_as = None  # not counted, nor logged: every read of a fresh file would be

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class TruncatedFileError(StorageError):
    """The file ends before the bytes asked for (or before a structure its format declares)."""


class OversizedFileError(StorageError):
    """A file, or a span of one, larger than what its format lets the caller read there: refused before a byte
    is read (a sparse or planted file of any size costs a stat, never its size in memory)."""


class OversizedListingError(OversizedFileError):
    """A directory tree holding more entries than the caller walks: refused once the bound is passed, so a
    planted tree of any size costs at most the bound in lookups."""


class StoreUnavailableError(Unavailable, StorageError, OSError):
    """The store did not answer (timeout, connection refused, 5xx after retries): try again later."""

    prefix = "the store did not answer: "
    retry_seconds = 2
    counted_as = "unavailable"


class OutsideRootError(StorageError, PermissionError):
    """A file whose real location (after symlinks) lies outside the store's roots: never read."""
