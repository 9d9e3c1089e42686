"""The data root's store together with the remote roots an operator allows, as one store.

A ``datasource-properties.json`` may name a mag by URL (a webKnossos remote dataset's public Zarr
arrays on ``https://``, a layer in another bucket). Whoever writes that file could otherwise point the
gateway, with its credentials, at an internal service or another tenant's bucket, so only URLs below
a root the operator listed (``remote_roots``) are read: each is opened as a store of its own and is a
trusted root like the data root.
"""

from collections.abc import Sequence

from .store import Store
from .wrapper import WrapperStore


class RoutedStore(WrapperStore):
    """The main store, and remote stores for the paths they hold; a remote store's paths are URLs.

    A path that no remote store locates is the main store's, so local reads pay one string
    comparison per remote root. A URL that a remote store's origin holds but no root contains goes to
    that store, which refuses it (OutsideRootError).
    """

    def __init__(self, main: Store, remotes: Sequence[Store]) -> None:
        super().__init__(main)
        self.main = main
        self.remotes = tuple(remotes)
        self.is_local = main.is_local and not self.remotes  # reads of a remote root must not block an event loop

    def _for(self, path: str) -> Store:
        located = [remote for remote in self.remotes if remote.locate(path) is not None]
        if not located:
            return self.main
        for store in (self.main, *located):
            if store.locate(path) is not None and store.resolve(path) is not None:
                return store
        return located[0]

    def locate(self, location: str) -> str | None:
        for store in (self.main, *self.remotes):
            found = store.locate(location)
            if found is not None:
                return found
        return None

    def relative(self, path: str) -> str:
        """Below the data root as the main store says; a remote path in full (the same URL on every replica)."""
        store = self._for(path)
        return path if store is not self.main else store.relative(path)
