"""A local (or network-mounted) directory as a store: root containment, the settle rule, positioned reads."""

import contextlib
import os
import resource
import stat
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence

from .errors import (
    FileChangedError,
    FileUnsettledError,
    OutsideRootError,
    StoreUnavailableError,
    TruncatedFileError,
)
from .identity import FileIdentity, ListedFile
from .store import Store, is_listed, refuse_overlong, refuse_oversized

# Where Linux names the file an open descriptor refers to: the real path of exactly the inode opened,
# so a check of it cannot be raced by a rename or a symlink swapped in between (unlike realpath).
_FD_PATHS = "/proc/self/fd"
_HAS_FD_PATHS = os.path.isdir(_FD_PATHS) and hasattr(os, "O_PATH")
_DELETED = " (deleted)"


def _local_identity(st: os.stat_result) -> FileIdentity:
    # ctime as well as mtime: a writer can set mtime back (rsync -t, cp -p, utime) but never ctime.
    return FileIdentity(st.st_size, f"{st.st_mtime_ns:x}-{st.st_ctime_ns:x}-{st.st_ino:x}", st.st_mtime, st.st_ctime)


def _under(root: str, real: str) -> bool:
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def resolve_inside(roots: str | Sequence[str], path: str) -> str | None:
    """``path`` with every symlink resolved, or None if that lies outside every root (real paths)."""
    real = os.path.realpath(path)
    for root in (roots,) if isinstance(roots, str) else roots:
        if _under(root, real):
            return real
    return None


# A dataset's directory is ``<root>/<organization>/<dataset>``: the files below it are that dataset's, and
# a token granted the dataset may read them (authorization follows the files, not only the URL).
DATASET_DEPTH = 2


def owner_directory(root: str, path: str) -> str:
    """The directory whose files ``path`` (below ``root``, as written) may really be: that of the dataset it
    lies in, or the path itself if it lies shallower. Read from the path as written: a ``..`` component
    names a directory that no real path lies below, so such a path owns nothing and reads nothing."""
    parts = [part for part in path[len(root) :].split("/") if part]
    return "/".join([root.rstrip("/"), *parts[:DATASET_DEPTH]])


def _descriptor_path(fd: int, path: str) -> str:
    """The real path of the file open as ``fd`` (where ``/proc`` cannot say: of ``path``, resolved now)."""
    if _HAS_FD_PATHS:
        return os.readlink(f"{_FD_PATHS}/{fd}").removesuffix(_DELETED)
    return os.path.realpath(path)


class LocalStore(Store):
    """Positioned reads from local files below a root; never loads a whole file.

    With a ``root``, a file whose real location (symlinks resolved) lies
    outside it and outside every one of ``extra_roots`` is refused
    (OutsideRootError). The check is made on a descriptor of the file itself
    (the real path ``/proc`` names for it), whenever a version of a file is
    looked up or opened that is not already open, so no symlink planted or
    swapped in, at any component of the path and at any time, lets a byte
    from outside through; a version already open is the very inode that was
    found inside. ``extra_roots`` are further
    directories that layers may be symlinked to (a second volume, as
    webKnossos data roots often have). Without a root (a tool reading a path
    its user gave) nothing is refused.

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

    ``own_files`` are the server's own files (its tokens file, settings): a hard link to one inside the root
    has no other path to give it away, so a file of several links is compared with each of them, by device
    and inode, when it is opened, and refused if it is one; the kernel's ``protected_hardlinks`` is not
    relied on.
    """

    is_local = True

    def __init__(
        self,
        root: str | None = None,
        extra_roots: Sequence[str] = (),
        settle_seconds: float = 0.0,
        max_open_files: int | None = None,
        own_files: Sequence[str] = (),
    ) -> None:
        self.contained = root is not None
        self.own_files = tuple(own_files)
        self.root = "" if root is None else os.path.realpath(root)
        self.roots: tuple[str, ...] = (self.root, *map(os.path.realpath, extra_roots)) if root is not None else ()
        self.max_open_files = open_files_kept() if max_open_files is None else max_open_files
        self.settle_ns = round(settle_seconds * 1e9)
        self._handles: OrderedDict[tuple[str, str], _OpenFile] = OrderedDict()
        self._lock = threading.Lock()

    # --- names ---------------------------------------------------------------------------------

    def join(self, base: str, *parts: str) -> str:
        return os.path.join(base, *parts)

    def resolve(self, path: str) -> str | None:
        return resolve_inside(self.roots, path) if self.contained else os.path.realpath(path)

    def locate(self, location: str) -> str | None:
        path = location.removeprefix("file://")
        return path if path.startswith("/") else None

    def root_of(self, path: str) -> str:
        """The trusted root a real path lies under (the longest that matches); the main root if none does.

        Paths made relative to it are the same on every replica, wherever each mounts its roots.
        """
        found = [root for root in self.roots if _under(root, path)]
        return max(found, key=len) if found else self.root

    def confines(self, path: str) -> tuple[str, ...]:
        """Where the file named ``path`` may really lie: a file below a dataset's directory in that very
        directory (its owner, the dataset a token must be granted) or an extra root; a file of an extra
        root in the extra roots; anything else in the roots. So a chunk, header or metadata file swapped
        for a symlink into another dataset is refused when it is opened, like one that leads out of the root.
        """
        extra = self.roots[1:]
        holders = [root for root in self.roots if _under(root, path)]
        if not holders:
            return self.roots
        if max(holders, key=len) == self.root:
            return (owner_directory(self.root, path), *extra)
        return extra

    def _check_inside(self, fd: int, path: str) -> None:
        if self.contained:
            self._check_confined(path, _descriptor_path(fd, path))

    def _check_confined(self, path: str, real: str) -> None:
        if any(_under(directory, real) for directory in self.confines(path)):
            return
        if any(_under(root, real) for root in self.roots):
            raise OutsideRootError(f"{self.relative(path)} resolves outside its dataset's directory")
        raise OutsideRootError(f"{self.relative(path)} resolves outside the data root")

    # --- reads ---------------------------------------------------------------------------------

    def identity(self, path: str) -> FileIdentity | None:
        """See :meth:`Store.identity`: a version already open was checked when it was opened, any other now."""
        try:
            if not self.contained:
                return _local_identity(os.stat(path))
            known = _local_identity(os.stat(path))
            if (path, known.version) in self._handles:
                return known  # the very inode, unchanged, that was found inside the roots when it was opened
            if not _HAS_FD_PATHS:
                self._check_confined(path, os.path.realpath(path))
                return known
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)  # no read access is asked for: cheap, and never blocks
            try:
                self._check_inside(fd, path)
                return _local_identity(os.fstat(fd))
            finally:
                os.close(fd)
        except (FileNotFoundError, NotADirectoryError):
            self._check_absent(path)
            return None

    def _check_not_own(self, opened: os.stat_result, path: str) -> None:
        """Refuse a file that is a hard link to one of the server's own files (looked up now: they may have
        been replaced since start-up). Only a file of several links can be one, so others cost nothing."""
        if opened.st_nlink < 2:
            return
        for own in self.own_files:
            try:
                found = os.stat(own)
            except OSError:
                continue
            if (found.st_dev, found.st_ino) == (opened.st_dev, opened.st_ino):
                raise OutsideRootError(f"{self.relative(path)} is a hard link to one of the server's own files")

    def _check_absent(self, path: str) -> None:
        """Raise StoreUnavailableError unless a missing ``path`` may be absent as a format means it.

        A dangling symlink (a chunk linked to a file that went) or a data root that is not there is a fault of
        the storage, never absent data that reads as zeros. A mag's own directory is checked by the source that
        finds a chunk absent (:meth:`require_directory`): a volume that is not mounted yet leaves its layers
        unservable with a reason, one that went makes their chunks faults.
        """
        if not self.contained:
            return
        try:
            if stat.S_ISLNK(os.lstat(path).st_mode):  # it is there, yet not found: its target is gone
                raise StoreUnavailableError(f"{self.relative(path)} is a symlink whose target is gone")
        except (FileNotFoundError, NotADirectoryError):
            pass
        if _under(self.root, path) and not os.path.isdir(self.root):
            raise StoreUnavailableError("the data root is not there (not mounted?)")

    def require_directory(self, path: str) -> None:
        """See :meth:`Store.require_directory`."""
        if not os.path.isdir(path):
            self._check_absent(path)
            raise StoreUnavailableError(f"{self.relative(path)} is not there (a volume that is not mounted?)")

    def _read(self, path: str, offset: int, size: int, expected: FileIdentity, settled: bool) -> bytes:
        """See :meth:`Store.read`."""
        handle = self._handle(path, expected)
        started = time.time_ns()  # the vDSO clock: no system call
        data = os.pread(handle.fd, size, offset)
        # Checked after the read: the bytes are those of the identified version, or nothing.
        st = os.fstat(handle.fd)
        if _local_identity(st) != expected:
            self._forget(path, expected)
            raise FileChangedError(f"{self.relative(path)} changed while it was being read")
        if settled:
            self._check_settled(path, st, started)
        if len(data) != size:
            raise TruncatedFileError(
                f"{self.relative(path)}: wanted {size} bytes at {offset}, file has {expected.size} bytes"
            )
        return data

    def _check_settled(self, path: str, st: os.stat_result, started: int) -> None:
        """The settle rule, on the file's status taken after a read that started at ``started`` (ns): raise
        FileUnsettledError if its last data write may still have been under way then."""
        if self.settle_ns and st.st_ctime_ns == st.st_mtime_ns:
            quiet_ns = started - st.st_mtime_ns  # negative for a time stamp in the future (clock skew)
            if quiet_ns < self.settle_ns:
                raise FileUnsettledError(
                    f"{self.relative(path)} was written {max(quiet_ns, 0) / 1e9:.3f} s ago "
                    "and may still be being rewritten",
                    (self.settle_ns - quiet_ns) / 1e9,
                )

    def _read_whole(self, path: str, limit: int, settled: bool) -> tuple[bytes, FileIdentity] | None:
        """See :meth:`Store.read_whole`: one open, checked, sized, read and checked again (no descriptor is kept)."""
        for _ in range(3):
            try:
                handle = _OpenFile(path)
            except (FileNotFoundError, NotADirectoryError):
                self._check_absent(path)
                return None
            self._check_inside(handle.fd, path)
            self._check_not_own(handle.opened, path)
            before = handle.opened
            refuse_oversized(self.relative(path), before.st_size, limit)
            started = time.time_ns()
            data = os.pread(handle.fd, before.st_size, 0)
            identity = _local_identity(before)
            after = os.fstat(handle.fd)
            if len(data) == before.st_size and _local_identity(after) == identity:
                if settled:
                    self._check_settled(path, after, started)
                return data, identity
        raise FileChangedError(f"{self.relative(path)} keeps changing while it is read")

    def _handle(self, path: str, expected: FileIdentity) -> "_OpenFile":
        """An open descriptor of exactly the version ``expected``, kept for the next reads.

        Opening and closing a file per read costs more than the read itself.
        A descriptor is closed when the last user drops it, so eviction never
        pulls a descriptor from under a read in another thread. Every new
        version is checked to lie inside the roots on the descriptor opened.
        """
        key = (path, expected.version)
        with self._lock:
            handle = self._handles.get(key)
            if handle is not None:
                self._handles.move_to_end(key)
                return handle
        handle = _OpenFile(path)
        self._check_inside(handle.fd, path)
        self._check_not_own(handle.opened, path)
        if _local_identity(handle.opened) != expected:
            raise FileChangedError(f"{self.relative(path)} changed while it was being opened")
        with self._lock:
            self._handles[key] = handle
            while len(self._handles) > self.max_open_files:
                self._handles.popitem(last=False)
        return handle

    def _forget(self, path: str, expected: FileIdentity) -> None:
        with self._lock:
            self._handles.pop((path, expected.version), None)

    # --- directories ---------------------------------------------------------------------------

    def list_directories(self, path: str) -> list[str]:
        try:
            entries = list(os.scandir(path))
        except (FileNotFoundError, NotADirectoryError):
            self._check_absent(path)
            return []
        return sorted(e.name for e in entries if is_listed(e.name) and e.is_dir())

    def is_directory(self, path: str) -> bool:
        return os.path.isdir(path)

    def write(self, path: str, data: bytes) -> None:
        """See :meth:`Store.write`: a temporary file beside it, renamed into place, readable by the gateway's user."""
        if self.resolve(path) is None:
            raise OutsideRootError(f"{self.relative(path)} lies outside the data root")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=f".{os.path.basename(path)}.")
        try:
            with os.fdopen(descriptor, "wb") as out:
                out.write(data)
            os.chmod(temporary, 0o644)  # readable by the gateway's user, as the data files are
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise

    def delete(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def list_files(self, path: str, limit: int) -> list[ListedFile] | None:
        """See :meth:`Store.list_files`: one ``scandir`` per directory and one ``stat`` per file (symlinks to
        files followed, so a change of the target shows; links to directories not walked); the identity holds
        inode, ctime, mtime and size, so a rewrite that puts size and mtime back is still seen."""
        found: list[ListedFile] = []
        pending, entries, where = [""], 0, self.relative(path)
        while pending:
            below = pending.pop()
            try:
                with os.scandir(os.path.join(path, below) if below else path) as listing:
                    for entry in listing:
                        entries += 1
                        refuse_overlong(where, entries, limit)
                        relative = f"{below}/{entry.name}" if below else entry.name
                        try:
                            if entry.is_dir(follow_symlinks=False):
                                pending.append(relative)
                            elif entry.is_file():
                                found.append(ListedFile(relative, _local_identity(entry.stat())))
                        except FileNotFoundError:
                            continue  # gone, or a link whose target went: not a file of the data now
            except (FileNotFoundError, NotADirectoryError):
                continue
        found.sort()
        return found


MOST_OPEN_FILES = 4096  # descriptors a store keeps open at most: a chunk of many small files fits (a 64³ chunk of
# WKW cubes of one 8³ block each reads 512 files), so making it again reopens and rechecks none of them


def open_files_kept() -> int:
    """How many descriptors a store keeps open: :data:`MOST_OPEN_FILES`, or a quarter of the process's limit of
    open files where that is less (its sockets and every other file need the rest)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MOST_OPEN_FILES
    return max(16, min(MOST_OPEN_FILES, soft // 4))


class _OpenFile:
    """A read-only descriptor of a regular file, closed when the last reference to it goes.

    Opened without blocking and refused unless it is a regular file: a FIFO planted in the root would
    otherwise hold a thread for ever in ``open`` or ``read``.
    """

    __slots__ = ("fd", "opened")

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        self.opened = os.fstat(self.fd)
        if not stat.S_ISREG(self.opened.st_mode):
            raise OSError(f"{os.path.basename(path)} is not a regular file")

    def __del__(self) -> None:
        fd = getattr(self, "fd", None)  # None: the open itself failed
        if fd is not None:
            os.close(fd)
