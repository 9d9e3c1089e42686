"""What names one version of a file, in every store."""

from typing import NamedTuple


class FileIdentity(NamedTuple):
    """What identifies one version of a file: any change to its bytes changes this."""

    size: int
    version: str
    mtime: float
    # When the file last changed in any way (seconds since the epoch): the inode's change time on a local disk
    # (which no writer can set back), the last modification in an object store. A version seen within a clock
    # tick of its change may still be rewritten without another version (same size, time and inode).
    changed: float = 0.0


# A file a reader consulted and the identity of the version it read (None: the file was absent), so a
# caller can derive a validator (ETag) that is exact for what was read.
FileSource = tuple[str, FileIdentity | None]


class ListedFile(NamedTuple):
    """A file found below a directory: its path relative to that directory (``/``-separated) and its identity."""

    path: str
    identity: FileIdentity
