"""What names one version of a file, in every store."""

from typing import NamedTuple


class FileIdentity(NamedTuple):
    """What identifies one version of a file: any change to its bytes changes this."""

    size: int
    version: str
    mtime: float
