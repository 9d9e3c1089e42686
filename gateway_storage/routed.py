"""The data root's store together with the remote roots an operator allows, as one store.

A ``datasource-properties.json`` may name a mag by URL (a webKnossos remote dataset's public Zarr
arrays on ``https://``, a layer in another bucket). Whoever writes that file could otherwise point the
gateway, with its credentials, at an internal service or another tenant's bucket, so only URLs below
a root the operator listed (``remote_roots``) are read: each is opened as a store of its own and is a
trusted root like the data root.
"""

from collections.abc import Sequence

from .identity import FileIdentity, ListedFile
from .store import Store


class RoutedStore(Store):
    """The main store, and remote stores for the paths they hold; a remote store's paths are URLs.

    A path that no remote store locates is the main store's, so local reads pay one string
    comparison per remote root. A URL that a remote store's origin holds but no root contains goes to
    that store, which refuses it (OutsideRootError).
    """

    def __init__(self, main: Store, remotes: Sequence[Store]) -> None:
        self.main = main
        self.remotes = tuple(remotes)
        self.root = main.root
        self.is_local = main.is_local and not self.remotes  # reads of a remote root must not block an event loop

    def _store(self, path: str) -> Store:
        located = [remote for remote in self.remotes if remote.locate(path) is not None]
        if not located:
            return self.main
        for store in (self.main, *located):
            if store.locate(path) is not None and store.resolve(path) is not None:
                return store
        return located[0]

    def join(self, base: str, *parts: str) -> str:
        return self._store(base).join(base, *parts)

    def resolve(self, path: str) -> str | None:
        return self._store(path).resolve(path)

    def root_of(self, path: str) -> str:
        return self._store(path).root_of(path)

    def locate(self, location: str) -> str | None:
        for store in (self.main, *self.remotes):
            found = store.locate(location)
            if found is not None:
                return found
        return None

    def relative(self, path: str) -> str:
        """Below the data root as the main store says; a remote path in full (the same URL on every replica)."""
        store = self._store(path)
        return path if store is not self.main else store.relative(path)

    def identity(self, path: str) -> FileIdentity | None:
        return self._store(path).identity(path)

    def _read(self, path: str, offset: int, size: int, expected: FileIdentity, settled: bool) -> bytes:
        return self._store(path)._read(path, offset, size, expected, settled)

    def _read_whole(self, path: str, limit: int, settled: bool) -> tuple[bytes, FileIdentity] | None:
        return self._store(path)._read_whole(path, limit, settled)

    def require_directory(self, path: str) -> None:
        self._store(path).require_directory(path)

    def list_directories(self, path: str) -> list[str]:
        return self._store(path).list_directories(path)

    def is_directory(self, path: str) -> bool:
        return self._store(path).is_directory(path)

    def write(self, path: str, data: bytes) -> None:
        self._store(path).write(path, data)

    def delete(self, path: str) -> None:
        self._store(path).delete(path)

    def list_files(self, path: str, limit: int) -> list[ListedFile] | None:
        return self._store(path).list_files(path, limit)
