"""A store that notes what a catalog load looked at, so that the load is done again only once some of it changes.

A dataset whose properties cannot be used, or whose layers cannot all be served, must not be loaded
again and again while nothing about it changes (a 20,000-layer file with one broken layer would cost
seconds of work every few seconds). What a load found depends only on the files, directories and
symlinks it looked up: the identities of those, taken again, tell whether loading once more could find
anything new (a volume mounted, a symlink repaired, a header fixed, an upload finished).
"""

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
    """``inner``, noting in ``observed`` what it is asked: the view one catalog load looks through, made for that
    load and dropped with it (the mags it opens keep ``inner``, so their chunk reads never pass here)."""

    def __init__(self, inner: Store, observed: Observed) -> None:
        super().__init__(inner)
        self.observed = observed

    def _note(self, path: str, version: str | None) -> None:
        self.observed.files.setdefault(path, version)

    def resolve(self, path: str) -> str | None:
        resolved = self.inner.resolve(path)
        self.observed.resolutions.setdefault(path, resolved)
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
        self.observed.directories.setdefault(path, found)
        return found
