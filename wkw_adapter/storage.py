"""Where WKW bytes come from: a small interface with a local-disk implementation.

The format code only needs "how big and which version is this file" and
"give me these bytes of it", so the same reader works for a local disk and
for object storage.
"""

import os
from typing import NamedTuple, Protocol

from .errors import FileChangedError, TruncatedFileError


class FileIdentity(NamedTuple):
    """What identifies one version of a file: any change to its bytes changes this."""

    size: int
    version: str
    mtime: float


class ByteStore(Protocol):
    def identity(self, path: str) -> FileIdentity | None:
        """The file's current identity, or None if it does not exist."""
        ...

    def read(self, path: str, offset: int, size: int, expected: FileIdentity) -> bytes:
        """Exactly ``size`` bytes at ``offset`` of the version ``expected``.

        Raises FileChangedError if the file is no longer that version and
        TruncatedFileError if it ends before ``offset + size``.
        """
        ...


def _local_identity(st: os.stat_result) -> FileIdentity:
    return FileIdentity(st.st_size, f"{st.st_mtime_ns:x}-{st.st_ino:x}", st.st_mtime)


class LocalStore:
    """Positioned reads from local files; never loads a whole file."""

    def identity(self, path: str) -> FileIdentity | None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return _local_identity(st)

    def read(self, path: str, offset: int, size: int, expected: FileIdentity) -> bytes:
        fd = os.open(path, os.O_RDONLY)
        try:
            if _local_identity(os.fstat(fd)) != expected:
                raise FileChangedError(f"{path} changed while it was being read")
            data = os.pread(fd, size, offset)
            if _local_identity(os.fstat(fd)) != expected:
                raise FileChangedError(f"{path} changed while it was being read")
        finally:
            os.close(fd)
        if len(data) != size:
            raise TruncatedFileError(f"{path}: wanted {size} bytes at {offset}, file has {expected.size} bytes")
        return data
