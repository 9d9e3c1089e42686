"""What a source format is to the catalog: which ``dataFormat`` names it serves, how its mag directories
are recognized, how a mag is opened, and the caches its mags share.

Each format subclasses :class:`SourceFormat` beside its :class:`MagSource` and is listed in
:mod:`gateway.sources.registry`; nothing outside ``gateway/sources/`` names a format.
"""

from abc import ABC, abstractmethod

from gateway_storage import OutsideRootError, Store
from gateway_storage.cache import CacheCounts
from gateway_storage.geometry import Vec3

from .mag import MagSource
from .properties import DataLayer


class SourceFormat(ABC):
    """One storage format of mags, opened from one store with one share of the cache budget."""

    data_formats: tuple[str, ...]  # the dataFormat values of datasource-properties.json it serves
    cache_weight = 1  # its share of the formats' cache budget, relative to the others' (0: it keeps no cache)

    def __init__(self, store: Store, cache_bytes: int) -> None:
        self.store = store  # what its mags read through once open
        self.cache_bytes = cache_bytes

    @abstractmethod
    def holds_mag(self, directory: str, through: Store | None = None) -> bool:
        """Whether ``directory`` (inside the root) holds a mag of this format: its directory marker, looked up
        through ``through`` (the catalog's recorder of a load) or else the format's store."""

    def _holds_file(self, directory: str, name: str, through: Store | None) -> bool:
        """Whether ``directory`` holds the file ``name`` inside the root (a marker that is a symlink out of
        the root does not count: that mag is not served)."""
        store = through or self.store
        try:
            return store.identity(store.join(directory, name)) is not None
        except OutsideRootError:
            return False

    @abstractmethod
    def open_mag(
        self,
        mag: Vec3,
        directory: str,
        layer: DataLayer,
        axis_order: dict[str, int] | None,
        through: Store | None = None,
    ) -> MagSource:
        """The source of one mag; raises for a mag that cannot be served, with the reason. Opening reads through
        ``through`` where given (the catalog's recorder of a load); the mag keeps the format's store."""

    @property
    @abstractmethod
    def caches(self) -> dict[str, CacheCounts]:
        """This format's bounded caches by metric name (``zarr_gateway_cache_*{cache}``)."""
