"""Where WKW bytes come from: a small interface with a local-disk implementation.

The format code only needs "how big and which version is this file" and
"give me these bytes of it", so the same reader works for a local disk and
for object storage.
"""

import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from .errors import FileChangedError, FileUnsettledError, TruncatedFileError


class FileIdentity(NamedTuple):
    """What identifies one version of a file: any change to its bytes changes this."""

    size: int
    version: str
    mtime: float


class StoreUnavailableError(OSError):
    """The store did not answer (timeout, connection refused, 5xx after retries): try again later."""


class ByteStore(Protocol):
    is_local: bool  # reads are positioned reads of local files: fast enough to run on an event loop

    def identity(self, path: str) -> FileIdentity | None:
        """The file's current identity, or None if it does not exist."""
        ...

    def root_of(self, path: str) -> str:
        """The root ``path`` lies under: paths made relative to it are the same on every replica."""
        ...

    def read(self, path: str, offset: int, size: int, expected: FileIdentity, settled: bool = True) -> bytes:
        """Exactly ``size`` bytes at ``offset`` of the version ``expected``.

        Raises FileChangedError if the file is no longer that version, FileUnsettledError if it was
        written too recently to tell (unless ``settled`` is False: for a few bytes written once, such
        as a mag header) and TruncatedFileError if it ends before ``offset + size``.
        """
        ...


def _local_identity(st: os.stat_result) -> FileIdentity:
    # ctime as well as mtime: a writer can set mtime back (rsync -t, cp -p, utime) but never ctime.
    return FileIdentity(st.st_size, f"{st.st_mtime_ns:x}-{st.st_ctime_ns:x}-{st.st_ino:x}", st.st_mtime)


class OutsideRootError(PermissionError):
    """A file whose real path (after symlinks) lies outside the store's root: never read."""


def _under(root: str, real: str) -> bool:
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def resolve_inside(roots: str | Sequence[str], path: str) -> str | None:
    """``path`` with every symlink resolved, or None if that lies outside every root (real paths)."""
    real = os.path.realpath(path)
    for root in (roots,) if isinstance(roots, str) else roots:
        if _under(root, real):
            return real
    return None


class LocalStore:
    """Positioned reads from local files; never loads a whole file.

    With a ``root``, files whose real path (symlinks resolved) lies outside
    it and outside every one of ``extra_roots`` are refused. Directories are
    resolved once and remembered; the file itself is checked on every lookup,
    cheaply unless it is a symlink.

    With ``settle_seconds`` > 0, bytes are only returned from a file whose
    last data write is at least that old when the read starts
    (FileUnsettledError otherwise). Linux stamps mtime and ctime with the
    same instant when a write call starts, before it copies a byte, and a
    later write in the same clock tick stamps nothing new: so a read that
    overlaps a write call can return a mix of old and new bytes while size,
    mtime and inode stay those of one version. Once a file is settled, any
    new write stamps a new time, which the check after each read sees. A
    rename, utime or chmod after the last write moves ctime past mtime: that
    file's writer had finished, and it is trusted at once.
    """

    is_local = True
    _MAX_CHECKED_DIRECTORIES = 1 << 16

    def __init__(
        self,
        root: str | None = None,
        max_open_files: int = 256,
        extra_roots: Sequence[str] = (),
        settle_seconds: float = 0.0,
    ) -> None:
        self.root = None if root is None else os.path.realpath(root)
        self.roots: tuple[str, ...] = () if self.root is None else (self.root, *map(os.path.realpath, extra_roots))
        self.max_open_files = max_open_files
        self.settle_ns = round(settle_seconds * 1e9)
        self._checked_directories: set[str] = set()
        self._handles: OrderedDict[tuple[str, str], _OpenFile] = OrderedDict()
        self._lock = threading.Lock()

    def root_of(self, path: str) -> str:
        """The trusted root a real path lies under (the longest that matches); the main root if none does.

        Paths made relative to it are the same on every replica, wherever each mounts its roots.
        """
        found = [root for root in self.roots if _under(root, path)]
        return max(found, key=len) if found else (self.root or "")

    def _check_inside(self, path: str) -> None:
        directory = os.path.dirname(path)
        if directory not in self._checked_directories:
            if resolve_inside(self.roots, directory) is None:
                raise OutsideRootError(f"{path} resolves outside the data root")
            if len(self._checked_directories) >= self._MAX_CHECKED_DIRECTORIES:
                self._checked_directories.clear()
            self._checked_directories.add(directory)

    def identity(self, path: str) -> FileIdentity | None:
        try:
            if self.root is None:
                return _local_identity(os.stat(path))
            self._check_inside(path)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                if resolve_inside(self.roots, path) is None:
                    raise OutsideRootError(f"{path} resolves outside the data root")
                st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return _local_identity(st)

    def read(self, path: str, offset: int, size: int, expected: FileIdentity, settled: bool = True) -> bytes:
        """See :class:`ByteStore`."""
        handle = self._handle(path, expected)
        started = time.time_ns()  # the vDSO clock: no system call
        data = os.pread(handle.fd, size, offset)
        # Checked after the read: the bytes are those of the identified version, or nothing.
        st = os.fstat(handle.fd)
        if _local_identity(st) != expected:
            self._forget(path, expected)
            raise FileChangedError(f"{path} changed while it was being read")
        if settled and self.settle_ns and st.st_ctime_ns == st.st_mtime_ns:
            quiet_ns = started - st.st_mtime_ns  # negative for a time stamp in the future (clock skew)
            if quiet_ns < self.settle_ns:
                raise FileUnsettledError(
                    f"{path} was written {max(quiet_ns, 0) / 1e9:.3f} s ago and may still be being rewritten",
                    (self.settle_ns - quiet_ns) / 1e9,
                )
        if len(data) != size:
            raise TruncatedFileError(f"{path}: wanted {size} bytes at {offset}, file has {expected.size} bytes")
        return data

    def _handle(self, path: str, expected: FileIdentity) -> "_OpenFile":
        """An open descriptor of exactly the version ``expected``, kept for the next reads.

        Opening and closing a file per read costs more than the read itself.
        A descriptor is closed when the last user drops it, so eviction never
        pulls a descriptor from under a read in another thread.
        """
        key = (path, expected.version)
        with self._lock:
            handle = self._handles.get(key)
            if handle is not None:
                self._handles.move_to_end(key)
                return handle
        handle = _OpenFile(path)
        if _local_identity(os.fstat(handle.fd)) != expected:
            raise FileChangedError(f"{path} changed while it was being opened")
        with self._lock:
            self._handles[key] = handle
            while len(self._handles) > self.max_open_files:
                self._handles.popitem(last=False)
        return handle

    def _forget(self, path: str, expected: FileIdentity) -> None:
        with self._lock:
            self._handles.pop((path, expected.version), None)


class _OpenFile:
    """A read-only descriptor, closed when the last reference to it goes."""

    __slots__ = ("fd",)

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def __del__(self) -> None:
        os.close(self.fd)
