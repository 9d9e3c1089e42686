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
