"""A store that notes what a catalog load looked at, so that the load is done again only once some of it changes.

A dataset whose properties cannot be used, or whose layers cannot all be served, must not be loaded
again and again while nothing about it changes (a 20,000-layer file with one broken layer would cost
seconds of work every few seconds). What a load found depends only on the files, directories and
symlinks it looked up: the identities of those, taken again, tell whether loading once more could find
anything new (a volume mounted, a symlink repaired, a header fixed, an upload finished).
"""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from gateway_storage import FileIdentity, OutsideRootError, Store, WrapperStore

_OUTSIDE = "<outside>"  # a file that lies outside the roots (or its dataset's directory): the same until it moves


@dataclass
class Observed:
    """What one load looked up: each file's version, each directory's existence, each path's resolution."""

    files: dict[str, str | None] = field(default_factory=dict)
    directories: dict[str, bool] = field(default_factory=dict)
    resolutions: dict[str, str | None] = field(default_factory=dict)

    def changed(self, store: Store) -> bool:
        """Whether anything looked up has changed since (a stat per file, directory and symlink)."""
        return (
            any(_version(store, path) != version for path, version in self.files.items())
            or any(store.is_directory(path) != found for path, found in self.directories.items())
            or any(store.resolve(path) != resolved for path, resolved in self.resolutions.items())
        )


def _version(store: Store, path: str) -> str | None:
    try:
        identity = store.identity(path)
    except OutsideRootError:
        return _OUTSIDE
    return None if identity is None else identity.version


class WatchedStore(WrapperStore):
    """``inner``, noting for a thread inside :meth:`watching` what it looks up; otherwise just ``inner``."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self._local = threading.local()

    @contextmanager
    def watching(self) -> Iterator[Observed]:
        """What this thread looks up through the store until the block ends (the first version seen of each)."""
        observed, before = Observed(), getattr(self._local, "observed", None)
        self._local.observed = observed
        try:
            yield observed
        finally:
            self._local.observed = before

    def _observed(self) -> Observed | None:
        observed: Observed | None = getattr(self._local, "observed", None)
        return observed

    def _note(self, path: str, version: str | None) -> None:
        observed = self._observed()
        if observed is not None:
            observed.files.setdefault(path, version)

    def resolve(self, path: str) -> str | None:
        resolved = self.inner.resolve(path)
        observed = self._observed()
        if observed is not None:
            observed.resolutions.setdefault(path, resolved)
        return resolved

    def identity(self, path: str) -> FileIdentity | None:
        try:
            identity = self.inner.identity(path)
        except OutsideRootError:
            self._note(path, _OUTSIDE)
            raise
        self._note(path, None if identity is None else identity.version)
        return identity

    def _read(self, path: str, offset: int, size: int, expected: FileIdentity, settled: bool) -> bytes:
        self._note(path, expected.version)
        return self.inner._read(path, offset, size, expected, settled)

    def _read_whole(self, path: str, limit: int, settled: bool) -> tuple[bytes, FileIdentity] | None:
        try:
            found = self.inner._read_whole(path, limit, settled)
        except OutsideRootError:
            self._note(path, _OUTSIDE)
            raise
        self._note(path, None if found is None else found[1].version)
        return found

    def is_directory(self, path: str) -> bool:
        found = self.inner.is_directory(path)
        observed = self._observed()
        if observed is not None:
            observed.directories.setdefault(path, found)
        return found
