"""The catalog: the datasets under one root as last loaded, and when to look at them again.

A cache with its reload policy: a dataset's properties file is stat'ed at most once per REVALIDATE_SECONDS
(with its mapping folders), a dataset with problems is looked at every RELOAD_PROBLEMS_SECONDS and loaded again
only once something its last load looked up has changed, and loads of one dataset wait for each other (lock
stripes). Finding datasets is :mod:`discovery`'s, loading one :mod:`loader`'s; the values are :mod:`dataset`'s.
"""

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass

from gateway_storage import OutsideRootError, Store

from . import discovery
from .dataset import BrokenDataset, Dataset
from .dataset import problems as dataset_problems
from .discovery import PROPERTIES
from .loader import Loader
from .paths import is_plain_name
from .registry import SourceFormats
from .watched import Observed, WatchedStore

log = logging.getLogger("gateway.catalog")

REVALIDATE_SECONDS = 1.0  # a changed datasource-properties.json is noticed within this long
# A dataset or layer found unusable (a mag directory missing, a volume not mounted yet, a symlink being
# repaired, an upload in progress) is looked at again this often: loaded again once something the load
# looked up (a file, a directory, a symlink) has changed, never while all of it stays the same.
RELOAD_PROBLEMS_SECONDS = 3.0
LOCK_STRIPES = 64  # loads of one dataset wait for each other; those of different datasets mostly do not


@dataclass(frozen=True, slots=True)
class _Loaded:
    """A dataset as last loaded, and when to look at it again."""

    version: str  # of its datasource-properties.json
    dataset: Dataset | BrokenDataset
    problems: list[str]
    observed: Observed  # what the load looked up
    check_at: float  # stat the properties file again
    reload_at: float  # look at everything the load looked up again (only when it has problems)


class Catalog:
    """The datasets under one root. Safe to share between threads; holds only caches.

    Its methods do file system (or network) work: callers on an event loop run them in a thread.
    """

    def __init__(self, storage: Store, formats: SourceFormats) -> None:
        self.storage = storage
        self.formats = formats
        self.loader = Loader(formats)
        self._loaded: dict[tuple[str, str], _Loaded] = {}
        self._lock = threading.Lock()
        self._loading = [threading.Lock() for _ in range(LOCK_STRIPES)]

    def organizations(self) -> list[str]:
        return discovery.organizations(self.storage)

    def dataset_names(self, organization: str) -> list[str]:
        """The names of the datasets of ``organization``, loading none (:func:`discovery.dataset_names`)."""
        return discovery.dataset_names(self.storage, organization)

    def datasets(self, organization: str) -> list[Dataset | BrokenDataset]:
        if not is_plain_name(organization):
            return []
        found = []
        for name in self.storage.list_directories(self.storage.join(self.storage.root, organization)):
            dataset = self.dataset(organization, name)
            if dataset is not None:
                found.append(dataset)
        return found

    def fresh(self, organization: str, name: str) -> Dataset | BrokenDataset | None:
        """The dataset as loaded, if it was looked at less than REVALIDATE_SECONDS ago (no file work at all:
        cheap enough for an event loop); None if :meth:`dataset` must look."""
        cached = self._loaded.get((organization, name))
        return cached.dataset if cached is not None and time.monotonic() < cached.check_at else None

    def unchanged(self, organization: str, name: str) -> Dataset | BrokenDataset | None:
        """The dataset as last loaded, if one stat of its properties file shows that it still holds (and no
        look at its problems is due); None when :meth:`dataset` must decide. It never loads, so callers may
        run it where short file work runs, and leave loads to threads of their own."""
        key = (organization, name)
        cached = self._loaded.get(key)
        now = time.monotonic()
        if cached is None or (cached.problems and now >= cached.reload_at):
            return None
        if now < cached.check_at:
            return cached.dataset
        try:
            identity = self.storage.identity(self.storage.join(self._directory(organization, name), PROPERTIES))
        except OutsideRootError:
            return None
        if identity is None or identity.version != cached.version or self._mappings_moved(cached.dataset):
            return None
        with self._lock:
            if self._loaded.get(key) is cached:  # not replaced by a load meanwhile
                self._loaded[key] = dataclasses.replace(cached, check_at=now + REVALIDATE_SECONDS)
        return cached.dataset

    def dataset(self, organization: str, name: str) -> Dataset | BrokenDataset | None:
        """The dataset, a BrokenDataset saying why it cannot be served, or None if there is none.

        A healthy dataset costs one stat of its properties file per REVALIDATE_SECONDS. One with problems
        is looked at again every RELOAD_PROBLEMS_SECONDS, and loaded again only if something its last load
        looked up has changed: data that appears late (a volume mounted after start-up, a repaired symlink,
        an upload) is served without a restart, and a broken dataset costs stats, not loads.
        """
        if not (is_plain_name(organization) and is_plain_name(name)):
            return None
        with self._loading[hash((organization, name)) % LOCK_STRIPES]:  # one load of a dataset at a time
            return self._current(organization, name)

    def _current(self, organization: str, name: str) -> Dataset | BrokenDataset | None:
        key = (organization, name)
        now = time.monotonic()
        cached = self._loaded.get(key)
        if cached is not None and now < cached.check_at:
            return cached.dataset  # its properties file was checked less than REVALIDATE_SECONDS ago
        directory = self._directory(organization, name)
        path = self.storage.join(directory, PROPERTIES)
        try:
            identity = self.storage.identity(path)
        except OutsideRootError:  # a dataset or organization directory symlinked out of the root or its place
            return BrokenDataset(organization, name, f"{PROPERTIES} points outside the data root or its dataset")
        if identity is None:
            return None
        unchanged = (
            cached is not None and cached.version == identity.version and not self._mappings_moved(cached.dataset)
        )
        if cached is not None and unchanged and not self._should_reload(cached, now):
            loaded, problems, observed, reload_at = cached.dataset, cached.problems, cached.observed, cached.reload_at
            if now >= reload_at:
                reload_at = now + RELOAD_PROBLEMS_SECONDS
        else:
            observed = Observed()  # what this load looks up, through a view of the store made for it alone
            loaded = self.loader.load(WatchedStore(self.storage, observed), organization, name, directory, identity)
            problems = dataset_problems(loaded)
            reload_at = now + RELOAD_PROBLEMS_SECONDS
            if cached is None or problems != cached.problems:  # said once, not at every reload
                self._report(organization, name, loaded, problems, cached)
        with self._lock:
            self._loaded[key] = _Loaded(
                identity.version, loaded, problems, observed, now + REVALIDATE_SECONDS, reload_at
            )
        return loaded

    def _directory(self, organization: str, name: str) -> str:
        return discovery.dataset_directory(self.storage, organization, name)

    def _mappings_moved(self, dataset: Dataset | BrokenDataset) -> bool:
        """Whether the mappings beside a dataset's layers are no longer those it was loaded with."""
        return any(folder.moved(self.formats.mappings, self.storage) for folder in dataset.mapping_folders)

    def _should_reload(self, cached: _Loaded, now: float) -> bool:
        """Whether a dataset whose properties file is unchanged must be loaded again: only one with
        problems, and only once something its load looked up is no longer as it was."""
        return bool(cached.problems) and now >= cached.reload_at and cached.observed.changed(self.storage)

    @staticmethod
    def _report(
        organization: str, name: str, loaded: Dataset | BrokenDataset, problems: list[str], before: _Loaded | None
    ) -> None:
        if isinstance(loaded, BrokenDataset):
            log.warning("dataset %s/%s cannot be served: %s", organization, name, loaded.reason)
            return
        for problem in problems:
            log.warning("dataset %s/%s %s", organization, name, problem)
        if before is not None and before.problems and not problems:
            log.info("dataset %s/%s: every layer can be served now", organization, name)
