"""The registry of source formats: every ``dataFormat`` the gateway serves, and the one place to add one."""

from gateway_storage import Store
from gateway_storage.cache import CacheCounts

from .formats import SourceFormat
from .mappings import Mappings
from .n5_source import N5Format
from .precomputed_source import PrecomputedFormat
from .wkw_source import WkwFormat
from .zarr_source import ZarrFormat

MAPPING_CACHE_WEIGHT = 1  # the pieces of agglomerate mappings, beside the formats' caches

FORMATS: tuple[type[SourceFormat], ...] = (WkwFormat, ZarrFormat, N5Format, PrecomputedFormat)


class SourceFormats:
    """The formats of one store, each given its share (``cache_weight``) of ``cache_bytes`` for its caches.

    Their mags read through ``store`` itself; a catalog load hands them the view it looks through.
    """

    def __init__(self, store: Store, cache_bytes: int, kinds: tuple[type[SourceFormat], ...] = FORMATS) -> None:
        self.store = store
        weights = sum(kind.cache_weight for kind in kinds) + MAPPING_CACHE_WEIGHT
        formats = [kind(self.store, cache_bytes * kind.cache_weight // weights) for kind in kinds]
        self.mappings = Mappings(self.store, cache_bytes * MAPPING_CACHE_WEIGHT // weights)
        self._by_name = {name: f for f in formats for name in f.data_formats}
        self.formats = tuple(formats)

    def for_data_format(self, name: str) -> SourceFormat | None:
        return self._by_name.get(name)

    @property
    def caches(self) -> dict[str, CacheCounts]:
        return {"mapping_pieces": self.mappings.pieces} | {
            label: lru for f in self.formats for label, lru in f.caches.items()
        }
