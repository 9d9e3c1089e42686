"""Errors raised for WKW data that cannot be trusted: the format's own faults.

Every one of them means "the bytes on storage are wrong", never "the data is
absent": callers must not turn them into zeros. Faults of the store itself (a
file changed, truncated, outside the root, a store that does not answer) are
the storage kernel's errors (:mod:`gateway_storage.errors`).
"""

from gateway_storage.faults import Broken


class WkwError(Broken):
    """Base class: a WKW file or directory that cannot be read correctly."""


class HeaderError(WkwError):
    """The 16-byte header has a wrong magic, version or field."""


class JumpTableError(WkwError):
    """The jump table of a compressed file is not increasing or points past the file."""


class BlockDecodeError(WkwError):
    """A compressed block does not decode to exactly one block of voxels."""
