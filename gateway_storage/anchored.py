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

from .identity import FileIdentity
from .store import Store
from .wrapper import WrapperStore


class AnchoredStore(WrapperStore):
    """``inner``, where a file below ``directory`` is absent only once ``directory`` is known to be there
    (else the inner store's StoreUnavailableError, with the reason)."""

    def __init__(self, inner: Store, directory: str) -> None:
        super().__init__(inner)
        self.directory = directory
        self._below = directory.rstrip("/") + "/"

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
