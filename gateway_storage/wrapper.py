"""A store that is another store but for what it changes: every method of :class:`Store` forwarded once, here.

In the manner of zarr-python's ``WrapperStore``: a view of a store (a mag directory that must be there, a
recorder of what a load looked at, the roots an operator allows beside the data root) subclasses
:class:`WrapperStore` and states only what it changes, so a method added to the protocol is forwarded by
every view at once, and no view can forget one.
"""

from .identity import FileIdentity, ListedFile
from .store import Store


class WrapperStore(Store):
    """``inner``, unchanged: each path is handed to the store :meth:`_for` names (``inner`` unless a subclass
    routes paths elsewhere), and the bound on every read stays :class:`Store`'s."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.root = inner.root
        self.is_local = inner.is_local

    def _for(self, path: str) -> Store:
        """The store that answers for ``path``."""
        return self.inner

    def join(self, base: str, *parts: str) -> str:
        return self._for(base).join(base, *parts)

    def resolve(self, path: str) -> str | None:
        return self._for(path).resolve(path)

    def root_of(self, path: str) -> str:
        return self._for(path).root_of(path)

    def locate(self, location: str) -> str | None:
        return self.inner.locate(location)

    def endpoint(self) -> str | None:
        return self.inner.endpoint()

    def relative(self, path: str) -> str:
        return self._for(path).relative(path)

    def identity(self, path: str) -> FileIdentity | None:
        return self._for(path).identity(path)

    def _read(self, path: str, offset: int, size: int, expected: FileIdentity, settled: bool) -> bytes:
        return self._for(path)._read(path, offset, size, expected, settled)

    def _read_whole(self, path: str, limit: int, settled: bool) -> tuple[bytes, FileIdentity] | None:
        return self._for(path)._read_whole(path, limit, settled)

    def require_directory(self, path: str) -> None:
        self._for(path).require_directory(path)

    def list_directories(self, path: str) -> list[str]:
        return self._for(path).list_directories(path)

    def is_directory(self, path: str) -> bool:
        return self._for(path).is_directory(path)

    def write(self, path: str, data: bytes) -> None:
        self._for(path).write(path, data)

    def delete(self, path: str) -> None:
        self._for(path).delete(path)

    def list_files(self, path: str, limit: int) -> list[ListedFile] | None:
        return self._for(path).list_files(path, limit)
