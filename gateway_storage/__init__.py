"""The storage kernel: where bytes live and how they are read safely, for every format and every store.

File identity, the store protocol, the local store (root containment, the settle rule), the S3
store, the storage errors and a byte-bounded cache. It imports nothing of the rest of the project:
formats (``wkw_adapter``) and sources (``gateway.sources``) are built on it.
"""

from collections.abc import Sequence

from .cache import ByteLRU
from .errors import (
    FileChangedError,
    FileUnsettledError,
    OutsideRootError,
    StorageError,
    StoreUnavailableError,
    TruncatedFileError,
)
from .identity import FileIdentity, FileSource
from .local import LocalStore, resolve_inside
from .store import Store, is_listed


def open_store(root: str, extra_roots: Sequence[str] = (), settle_seconds: float = 0.0) -> Store:
    """A local path or ``file://`` URL (with its extra trusted roots), or an ``s3://bucket/prefix`` URL.

    Objects in a bucket are replaced whole and read with If-Match, so neither option applies there.
    """
    if root.startswith("s3://"):
        from .s3 import S3Store  # boto3 is only needed, and only imported, for a bucket

        return S3Store(root)
    return LocalStore(root.removeprefix("file://"), extra_roots, settle_seconds)


__all__ = [
    "ByteLRU",
    "FileChangedError",
    "FileIdentity",
    "FileSource",
    "FileUnsettledError",
    "LocalStore",
    "OutsideRootError",
    "StorageError",
    "Store",
    "StoreUnavailableError",
    "TruncatedFileError",
    "is_listed",
    "open_store",
    "resolve_inside",
]
