"""Change notification of local files, where the file system delivers it: inotify on local disks.

Whoever keeps something made from files (the answer cache) may trust it without a stat while no change has been
reported in the directories of those files. That holds only where the kernel itself sees every write: local disk
file systems. On NFS, SMB, FUSE mounts and object stores a change made elsewhere is never reported, so none is
assumed there (:meth:`Changes.watch` says False and the caller keeps checking by interval).

Events are read on the event loop as its selector reports the descriptor readable, in the same turn as a request
that arrives after the write, and before that request's handler runs: a change made before a request was sent is
known when it is answered. Reading the event queue is no file I/O on data; the watches are added in threads.
"""

import asyncio
import logging
import os
import threading
import time
import weakref

log = logging.getLogger("gateway")

# File systems whose changes the kernel sees as they are made (every writer goes through this kernel). Not
# overlay: a change to a lower layer made beneath it is not reported through it.
NOTIFYING_FILE_SYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "f2fs", "zfs"})
# What a directory's watch reports: a file in it written, closed after writing, its attributes or links changed
# (a truncate, a touch, an unlink of a file still open), a name created, deleted or renamed over, the directory
# itself deleted or moved.
_MODIFY, _ATTRIB, _CLOSE_WRITE = 0x2, 0x4, 0x8
_MOVED_FROM, _MOVED_TO, _CREATE, _DELETE, _DELETE_SELF, _MOVE_SELF = 0x40, 0x80, 0x100, 0x200, 0x400, 0x800
_ONLYDIR = 0x01000000
WATCHED = _MODIFY | _ATTRIB | _CLOSE_WRITE | _MOVED_FROM | _MOVED_TO | _CREATE | _DELETE | _DELETE_SELF | _MOVE_SELF
_IGNORED = 0x8000
MAX_WATCHES = 32768  # past this many directories, files are checked by interval only (the kernel may allow fewer)
MAX_WATCHED_FILES = 1 << 17  # files remembered as watched whole (a few MiB); past it the oldest are forgotten


def _mounts() -> list[tuple[str, str]]:
    """Mount points and their file system types, longest mount point first."""
    found = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as lines:
            for line in lines:
                fields = line.split()
                if " - " in line and len(fields) > 4:
                    fstype = line.split(" - ", 1)[1].split()[0]
                    found.append((fields[4].replace("\\040", " "), fstype))
    except OSError:
        return []
    return sorted(found, key=lambda mount: len(mount[0]), reverse=True)


class Changes:
    """Counts the changes reported in watched local directories: ``epoch`` grows with every batch of them."""

    def __init__(self) -> None:
        self.epoch = 0
        self._inotify: object | None = None
        self._fd = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._failed = False
        self._watches: dict[str, int] = {}  # directory -> watch descriptor
        self._directories: dict[int, str] = {}
        self._files: dict[str, float] = {}  # file -> time.monotonic() once every directory of it was watched
        self._lock = threading.Lock()
        self._mounts = _mounts()

    def _open(self) -> bool:
        """The inotify instance, opened on first use (closed when this object goes); False where there is none."""
        if self._inotify is not None:
            return True
        try:
            from inotify_simple import INotify

            inotify = INotify(nonblocking=True)
        except (ImportError, OSError) as exc:  # not Linux, or no inotify instance left
            log.info("no change notification (%s): kept answers are checked by interval", exc)
            return False
        weakref.finalize(self, inotify.close)
        self._inotify = inotify
        self._fd = inotify.fileno()
        return True

    @property
    def listening(self) -> bool:
        """Whether events are read: on an event loop that can watch a descriptor."""
        return self._loop is not None and not self._loop.is_closed()

    def listen(self) -> None:
        """Read events on the running loop from now on (called on it; once per loop)."""
        loop = asyncio.get_running_loop()
        if loop is self._loop or self._failed or not self._open():
            return
        try:
            loop.add_reader(self._fd, self._drain)
        except (NotImplementedError, RuntimeError):  # a loop that cannot watch descriptors: none is trusted
            self._failed = True
            return
        with self._lock:
            self._loop = loop
            self.epoch += 1  # events may have been missed while no loop read them

    def notifying(self, path: str) -> bool:
        """Whether the file system holding ``path`` (a real path) reports every change to the kernel here."""
        for mount, fstype in self._mounts:
            if path == mount or path.startswith(mount.rstrip("/") + "/"):
                return fstype in NOTIFYING_FILE_SYSTEMS
        return False

    def watch(self, path: str, root: str) -> bool:
        """Watch every directory from that of the local file ``path`` up to its trusted ``root`` (a change of any
        name on the way, a directory re-pointed or renamed, is reported in its parent), and that of its real path
        if a link leads elsewhere; False when some change would not be reported. File work: call it in a thread,
        before looking at the file, so that no change after the look goes unreported."""
        if not self.listening or not os.path.isabs(path) or not os.path.isabs(root):
            return False
        directories = []
        directory = os.path.dirname(path)
        while directory != root:
            directories.append(directory)
            above = os.path.dirname(directory)
            if len(above) < len(root) or above == directory:
                return False  # not below its root
            directory = above
        directories += [root, os.path.dirname(os.path.realpath(path))]
        if not all(self._watch_directory(directory) for directory in directories):
            return False
        with self._lock:  # (a watch dropped meanwhile forgets every file: see _drain)
            if path not in self._files and all(directory in self._watches for directory in directories):
                if len(self._files) >= MAX_WATCHED_FILES:
                    del self._files[next(iter(self._files))]
                self._files[path] = time.monotonic()
        return True

    def watched_before(self, path: str, moment: float) -> bool:
        """Whether every change of ``path`` made after ``moment`` (a ``time.monotonic()``) is reported: its
        directories were all watched by :meth:`watch` before then, and still are. No file work: a look up."""
        since = self._files.get(path)
        return since is not None and since < moment and self.listening

    def _watch_directory(self, directory: str) -> bool:
        if directory in self._watches:
            return True
        if not self.notifying(os.path.realpath(directory)):
            return False
        with self._lock:
            if directory in self._watches:
                return True
            if len(self._watches) >= MAX_WATCHES or self._inotify is None:
                return False
            try:
                descriptor = self._inotify.add_watch(directory, WATCHED | _ONLYDIR)  # type: ignore[attr-defined]
            except OSError:
                return False
            self._watches[directory] = descriptor
            self._directories[descriptor] = directory
        return True

    def _drain(self) -> None:
        """Read every event queued: a change in a watched directory moves the epoch on."""
        from inotify_simple import parse_events

        try:
            data = os.read(self._fd, 1 << 16)
        except BlockingIOError:
            return
        events = parse_events(data)
        if not events:
            return
        with self._lock:
            self.epoch += 1
            for event in events:
                directory = self._directories.get(event.wd)
                if event.mask & _IGNORED and directory is not None:  # the directory went: watched again when looked at
                    del self._directories[event.wd]
                    self._watches.pop(directory, None)
                    self._files.clear()  # which files were under it is not known: each is watched again
