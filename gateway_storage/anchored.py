"""A store seen from one directory that must be there: below it, a missing file is absent only while the
directory is.

A format says a chunk is absent (it reads as the fill value) when its file is missing. That holds only in
a directory that exists: the files of a volume that went, or of a mag directory that was deleted, are
missing too, and answering those as absent would give clients zeros for data that is still stored. So
every source reads its mag through an :class:`AnchoredStore` of its mag directory, and no lookup below
that directory answers "not there" (an identity of None, a whole read of None) before
:meth:`Store.require_directory` has found the directory present. The one decision is made here, for every
format and every way of reading; a source cannot learn that a file is absent without it.
"""

from .identity import FileIdentity, ListedFile
from .store import Store


class AnchoredStore(Store):
    """``inner``, where a file below ``directory`` is absent only once ``directory`` is known to be there
    (else the inner store's StoreUnavailableError, with the reason)."""

    def __init__(self, inner: Store, directory: str) -> None:
        self.inner = inner
        self.directory = directory
        self._below = directory.rstrip("/") + "/"
        self.root = inner.root
        self.is_local = inner.is_local

    def _absent(self, path: str) -> None:
        """Called for a file found missing: raises unless that is what its format means by absent."""
        if path.startswith(self._below):
            self.inner.require_directory(self.directory)

    def identity(self, path: str) -> FileIdentity | None:
        identity = self.inner.identity(path)
        if identity is None:
            self._absent(path)
        return identity

    def _read_whole(self, path: str, limit: int, settled: bool) -> tuple[bytes, FileIdentity] | None:
        found = self.inner._read_whole(path, limit, settled)
        if found is None:
            self._absent(path)
        return found

    def _read(self, path: str, offset: int, size: int, expected: FileIdentity, settled: bool) -> bytes:
        return self.inner._read(path, offset, size, expected, settled)

    def join(self, base: str, *parts: str) -> str:
        return self.inner.join(base, *parts)

    def resolve(self, path: str) -> str | None:
        return self.inner.resolve(path)

    def root_of(self, path: str) -> str:
        return self.inner.root_of(path)

    def locate(self, location: str) -> str | None:
        return self.inner.locate(location)

    def endpoint(self) -> str | None:
        return self.inner.endpoint()

    def relative(self, path: str) -> str:
        return self.inner.relative(path)

    def require_directory(self, path: str) -> None:
        self.inner.require_directory(path)

    def list_directories(self, path: str) -> list[str]:
        return self.inner.list_directories(path)

    def is_directory(self, path: str) -> bool:
        return self.inner.is_directory(path)

    def write(self, path: str, data: bytes) -> None:
        self.inner.write(path, data)

    def delete(self, path: str) -> None:
        self.inner.delete(path)

    def list_files(self, path: str, limit: int) -> list[ListedFile] | None:
        return self.inner.list_files(path, limit)
