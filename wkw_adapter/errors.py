"""Errors raised for WKW data that cannot be trusted.

Every one of them means "the bytes on storage are wrong", never "the data is
absent": callers must not turn them into zeros.
"""


class WkwError(Exception):
    """Base class: a WKW file or directory that cannot be read correctly."""


class HeaderError(WkwError):
    """The 16-byte header has a wrong magic, version or field."""


class TruncatedFileError(WkwError):
    """The file ends before a structure or block it declares."""


class JumpTableError(WkwError):
    """The jump table of a compressed file is not increasing or points past the file."""


class BlockDecodeError(WkwError):
    """A compressed block does not decode to exactly one block of voxels."""


class FileChangedError(WkwError):
    """The file was replaced or rewritten while it was being read; retry."""


class FileUnsettledError(FileChangedError):
    """The file was written too recently to trust what was read: a writer may still be rewriting it in place.

    Size, modification time and inode cannot tell apart the versions a file passes through while one
    write call is still copying bytes into it, so such a file is not served until it has been quiet
    for the store's settle time. ``retry_after`` is how many seconds that is from now.
    """

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after
