"""Which files anyone reads below some directories, as the kernel reports it (inotify ``IN_ACCESS``).

A read of a file by any process (the gateway's ``pread`` of a chunk) queues an event that names it; a stat,
or the ``O_PATH`` open the storage kernel checks containment with, queues none. So a test can tell that a
request read no chunk file at all, and that the same watch does see the reads of one that does.
"""

import ctypes
import os
import struct
from pathlib import Path
from types import TracebackType

IN_ACCESS = 0x00000001
IN_ISDIR = 0x40000000  # the event is of a directory (listed): not a file read
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of the name)


class FileReads:
    """The files read below ``directories`` (each directory below them is watched too) since the last look;
    directories listed are not counted."""

    def __init__(self, *directories: Path) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self._watched: dict[int, Path] = {}
        for directory in directories:
            for below, _, _ in os.walk(directory):
                wd = self._libc.inotify_add_watch(self._fd, os.fsencode(below), IN_ACCESS)
                if wd < 0:
                    raise OSError(ctypes.get_errno(), f"inotify_add_watch {below}")
                self._watched[wd] = Path(below)
        self.read_since()  # the listings of the walk above

    def read_since(self) -> set[Path]:
        """The files read since the watch began or since the previous call."""
        read: set[Path] = set()
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return read
            offset = 0
            while offset < len(data):
                wd, mask, _, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size : offset + _EVENT.size + length].rstrip(b"\0")
                offset += _EVENT.size + length
                if mask & IN_ACCESS and not mask & IN_ISDIR and name:
                    read.add(self._watched[wd] / os.fsdecode(name))

    def __enter__(self) -> "FileReads":
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        os.close(self._fd)
