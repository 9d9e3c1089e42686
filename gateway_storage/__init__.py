"""The storage kernel: where bytes live and how they are read safely, for every format and every store.

File identity, the store protocol, the local store (root containment, the settle rule), the object
stores (S3, GCS, Azure, HTTPS), the anchored view of a mag directory (a missing file is absent only in a
directory that is there), the storage errors and a byte-bounded cache. It imports nothing of the
rest of the project: formats (``wkw_adapter``) and sources (``gateway.sources``) are built on it.
"""

import importlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .anchored import AnchoredStore
from .cache import ByteLRU
from .errors import (
    FileChangedError,
    FileUnsettledError,
    OutsideRootError,
    OversizedFileError,
    OversizedListingError,
    StorageError,
    StoreUnavailableError,
    TruncatedFileError,
)
from .identity import FileIdentity, FileSource, ListedFile
from .local import LocalStore, resolve_inside
from .routed import RoutedStore
from .store import Store, is_absolute_location, is_listed
from .wrapper import WrapperStore


@dataclass(frozen=True, slots=True)
class StoreKind:
    """A kind of network store: the class (in .remote) that reads it and the pip extra of the library it needs.

    One class serves a data root and a remote root alike: its paths are the URLs of the objects.
    """

    class_name: str  # imported only when such a store is opened
    extra: str  # as in ``pip install 'zarr-gateway[extra]'``

    def open(
        self, url: str, timeout: float = 10.0, max_attempts: int = 4, headers: Mapping[str, str] | None = None
    ) -> Store:
        kind: type = getattr(importlib.import_module(".remote", __name__), self.class_name)
        store: Store = kind(url, timeout=timeout, max_attempts=max_attempts, headers=headers)
        return store


# Every store that is not a local directory, by the scheme of its URL: the one table to add a store to.
STORE_KINDS: dict[str, StoreKind] = {
    "s3": StoreKind("S3Store", "s3"),
    "gs": StoreKind("GCSStore", "gcs"),
    "az": StoreKind("AzureStore", "azure"),
    "https": StoreKind("HTTPSStore", "https"),
}


def store_kind(url: str) -> StoreKind | None:
    """The kind of network store a URL names, or None for a local path (or ``file://`` URL)."""
    scheme, separator, _ = url.partition("://")
    return STORE_KINDS.get(scheme) if separator else None


def headers_for(url: str, headers: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """The HTTP headers a store at ``url`` sends: those of every URL prefix (a key) its root lies below.

    Below means at a path boundary: headers meant for ``https://host`` never reach ``https://host.evil``.
    """
    found: dict[str, str] = {}
    for prefix in sorted(headers, key=len):
        if url == prefix.rstrip("/") or url.startswith(prefix.rstrip("/") + "/"):
            found.update(headers[prefix])
    return found


def read_headers_file(path: str) -> dict[str, dict[str, str]]:
    """``{"<URL prefix>": {"<header>": "<value>"}}`` from a JSON file; ValueError naming what is wrong."""
    try:
        with open(path) as handle:
            document = json.load(handle)
    except OSError as exc:
        raise ValueError(f"headers file {path!r} cannot be read: {exc.strerror}") from None
    except ValueError as exc:
        raise ValueError(f"headers file {path!r} is not JSON: {exc}") from None
    if not isinstance(document, dict) or not all(
        isinstance(prefix, str)
        and store_kind(prefix) is not None
        and isinstance(headers, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
        for prefix, headers in document.items()
    ):
        raise ValueError(
            f"headers file {path!r} must hold a JSON object of store URL prefixes, each an object of header "
            'names and string values: {"https://host/prefix": {"Authorization": "Bearer ..."}}'
        )
    return document


def open_store(
    root: str,
    extra_roots: Sequence[str] = (),
    settle_seconds: float = 0.0,
    remote_roots: Sequence[str] = (),
    timeout: float = 10.0,
    max_attempts: int = 4,
    headers: Mapping[str, Mapping[str, str]] | None = None,
    own_files: Sequence[str] = (),
) -> Store:
    """The data root (a local path or ``file://`` URL with its extra trusted roots, or a store URL of
    :data:`STORE_KINDS`) and the remote roots mag paths may name; ``headers`` by URL prefix (see
    :func:`headers_for`); ``own_files`` the server's own files, never served however linked.

    Objects in a bucket are replaced whole and read by version, so neither extra roots nor the settle
    time apply there.
    """
    kind = store_kind(root)
    main = (
        kind.open(root, timeout, max_attempts, headers_for(root, headers or {}))
        if kind is not None
        else LocalStore(root.removeprefix("file://"), extra_roots, settle_seconds, own_files=own_files)
    )
    remotes = [open_remote_root(url, timeout, max_attempts, headers_for(url, headers or {})) for url in remote_roots]
    return RoutedStore(main, remotes) if remotes else main


def remote_schemes() -> list[str]:
    return list(STORE_KINDS)  # every kind of store can be a remote root


def open_remote_root(
    url: str, timeout: float = 10.0, max_attempts: int = 4, headers: Mapping[str, str] | None = None
) -> Store:
    kind = store_kind(url)
    if kind is None:
        raise ValueError(f"remote root {url!r} is not a URL of {', '.join(f'{s}://' for s in remote_schemes())}")
    return kind.open(url, timeout, max_attempts, headers)


__all__ = [
    "STORE_KINDS",
    "AnchoredStore",
    "ByteLRU",
    "FileChangedError",
    "FileIdentity",
    "FileSource",
    "FileUnsettledError",
    "ListedFile",
    "LocalStore",
    "OutsideRootError",
    "OversizedFileError",
    "OversizedListingError",
    "RoutedStore",
    "StorageError",
    "Store",
    "StoreKind",
    "StoreUnavailableError",
    "TruncatedFileError",
    "WrapperStore",
    "headers_for",
    "is_absolute_location",
    "is_listed",
    "open_remote_root",
    "open_store",
    "read_headers_file",
    "remote_schemes",
    "resolve_inside",
    "store_kind",
]
