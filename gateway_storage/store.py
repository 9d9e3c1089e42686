"""The store protocol: what every place bytes live in (a local root, a bucket) must offer.

Paths are strings in the store's own namespace (absolute local paths, or the URLs of objects). Everything
a source reads goes through a store, so containment in the data root, file versions and the
mapping of store faults to the errors of :mod:`gateway_storage.errors` are decided here and
nowhere else. A new kind of store subclasses :class:`Store` and passes the contract tests in
``tests/test_store_contract.py``.
"""

from abc import ABC, abstractmethod

from .errors import (
    FileChangedError,
    FileUnsettledError,
    OversizedFileError,
    OversizedListingError,
    StorageError,
    TruncatedFileError,
)
from .identity import FileIdentity, ListedFile


class Store(ABC):
    """A root of datasets and the files below it, read by version."""

    is_local: bool = False  # reads are positioned reads of local files: fast enough to run on an event loop
    root: str  # the main root, in the store's namespace

    @abstractmethod
    def join(self, base: str, *parts: str) -> str:
        """``base`` and ``parts`` joined in the store's namespace."""

    @abstractmethod
    def resolve(self, path: str) -> str | None:
        """``path`` in canonical form if it lies inside the data root (or another trusted root), else None."""

    @abstractmethod
    def root_of(self, path: str) -> str:
        """The trusted root a canonical path lies under: paths relative to it are the same on every replica."""

    @abstractmethod
    def locate(self, location: str) -> str | None:
        """The path in this store that an absolute location names (a ``datasource-properties.json`` mag path
        such as ``/mnt/x``, ``file://``, ``s3://bucket/key``, ``https://host/x``), or None if it is not here.

        Not yet checked against the roots: :meth:`resolve` does that.
        """

    def endpoint(self) -> str | None:
        """Where the store is reached when its URL does not say so (an S3-compatible server), for messages."""
        return None

    def relative(self, path: str) -> str:
        """``path`` below its root, without the root: what messages and ETags may name."""
        root = self.root_of(path)
        if not root:
            return path
        return path.removeprefix(root).lstrip("/") if path.startswith(root) else path

    @abstractmethod
    def identity(self, path: str) -> FileIdentity | None:
        """The file's current identity, or None if it does not exist.

        Raises OutsideRootError for a file that lies outside every trusted root.
        """

    def read(
        self, path: str, offset: int, size: int, expected: FileIdentity, *, limit: int, settled: bool = True
    ) -> bytes:
        """Exactly ``size`` bytes at ``offset`` of the version ``expected``, if ``size`` is at most ``limit``.

        ``limit`` is the most the caller's format allows there (a block, a chunk, an index): a size read from
        a crafted index or jump table past it raises OversizedFileError before a byte is read. Raises
        FileChangedError if the file is no longer that version, FileUnsettledError if it was written too
        recently to tell (unless ``settled`` is False: for a few bytes written once, such as a mag header),
        TruncatedFileError if it ends before ``offset + size``, OutsideRootError if it lies outside every
        trusted root and StoreUnavailableError if the store does not answer.
        """
        refuse_oversized(self.relative(path), size, limit)
        return self._read(path, offset, size, expected, settled)

    def read_whole(self, path: str, *, limit: int, settled: bool = False) -> tuple[bytes, FileIdentity] | None:
        """A small file (metadata, a chunk) with its identity, or None if it does not exist.

        A file longer than ``limit`` raises OversizedFileError, judged on its size before it is read. With
        ``settled`` (a chunk file: a writer may rewrite it in place, and a read between two of its write
        calls sees the new length and version with old bytes in it) the settle rule of :meth:`read` applies
        (FileUnsettledError). Without it (a metadata document, parsed whole: a torn copy does not parse, and
        the catalog looks at a dataset with problems again soon) a file is trusted at once.
        """
        found = self._read_whole(path, limit, settled)
        if found is not None:
            refuse_oversized(self.relative(path), len(found[0]), limit)  # a store that did not say its size first
        return found

    @abstractmethod
    def _read(self, path: str, offset: int, size: int, expected: FileIdentity, settled: bool) -> bytes:
        """:meth:`read` once the size is within the caller's limit."""

    def _read_whole(self, path: str, limit: int, settled: bool) -> tuple[bytes, FileIdentity] | None:
        """:meth:`read_whole`: a store that can read a whole file at once overrides this, and must call
        :func:`refuse_oversized` with the file's size before it reads the body."""
        for _ in range(3):
            identity = self.identity(path)
            if identity is None:
                return None
            refuse_oversized(self.relative(path), identity.size, limit)
            try:
                return self._read(path, 0, identity.size, identity, settled), identity
            except FileUnsettledError:
                raise
            except (FileChangedError, TruncatedFileError):
                continue
        raise FileChangedError(f"{self.relative(path)} keeps changing while it is read")

    def require_directory(self, path: str) -> None:
        """Raise StoreUnavailableError if the directory ``path``, which must exist (a mag's, whose chunks are absent
        only inside it), is gone. Object stores have no directories to lose: nothing to check."""
        return None

    @abstractmethod
    def list_directories(self, path: str) -> list[str]:
        """Names of the sub-directories (object prefixes) of ``path``, sorted, hidden ones left out."""

    @abstractmethod
    def is_directory(self, path: str) -> bool:
        """Whether ``path`` is a directory (a prefix with objects below it)."""

    def write(self, path: str, data: bytes) -> None:
        """``data`` as the file ``path`` (inside the root), whole or not at all: a reader sees the old version or the
        new one, never a part (what batch runs publish their results with: the stamp written last)."""
        raise StorageError(f"{self.relative(path)}: this store cannot be written")

    def delete(self, path: str) -> None:
        """Remove the file ``path`` if it is there."""
        raise StorageError(f"{self.relative(path)}: this store cannot be written")

    @abstractmethod
    def list_files(self, path: str, limit: int) -> list[ListedFile] | None:
        """Every file below ``path`` at any depth, each with its path relative to ``path`` and its identity,
        sorted by that path; an empty list for a ``path`` that is not there, None from a store that cannot
        list (a web server without WebDAV: a change there cannot be told from a listing).

        What a caller needs to tell whether any file of a tree may have changed (a data stamp). Past ``limit``
        entries (files and directories) it raises OversizedListingError without looking at more.
        """


def is_absolute_location(location: str) -> bool:
    """Whether a path from a properties file names its place itself (a URL or an absolute path), not relatively."""
    return location.startswith("/") or "://" in location


def is_listed(name: str) -> bool:
    """Whether a directory entry is listed: not empty and not hidden."""
    return bool(name) and not name.startswith(".")


def refuse_overlong(where: str, entries: int, limit: int) -> None:
    """The one bound on every listing: OversizedListingError once ``entries`` are more than ``limit``."""
    if entries > limit:
        raise OversizedListingError(f"{where} holds more than {limit} files and directories, more than are walked")


def refuse_oversized(where: str, size: int, limit: int) -> None:
    """The one bound on every read: OversizedFileError if ``size`` bytes are more than the caller's ``limit``."""
    if size > limit:
        raise OversizedFileError(f"{where}: {size} bytes, more than the {limit} its format allows there")
