"""What names one version of a file, in every store."""

from typing import NamedTuple


class FileIdentity(NamedTuple):
    """What identifies one version of a file: any change to its bytes changes this."""

    size: int
    version: str
    mtime: float


# A file a reader consulted and the identity of the version it read (None: the file was absent), so a
# caller can derive a validator (ETag) that is exact for what was read.
FileSource = tuple[str, FileIdentity | None]
