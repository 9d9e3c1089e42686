"""What a loaded dataset is: its layers, their mags and owners, or why it cannot be served.

The values the loader makes and the catalog keeps; everything above the sources (the trees, pages, meshes,
authorization) reads these and needs neither the loader nor the catalog's reload policy.
"""

import functools
import time
from dataclasses import dataclass, field
from typing import Any

from gateway_storage import StorageError, Store
from gateway_storage.faults import Conflict
from gateway_storage.geometry import Vec3

from .mag import MagSource
from .mappings import Found, Mapping, Mappings
from .properties import DataLayer, DatasourceProperties
from .watched import Observed

Owner = tuple[str, str]  # (organization, dataset): the dataset whose directory holds a file


@dataclass
class Layer:
    properties: DataLayer
    mags: dict[Vec3, MagSource]
    problems: list[str] = field(default_factory=list)
    # The datasets whose directories hold its mags' real paths (none for a mag in an extra or remote root):
    # a token reads the layer only if it is granted every one of them.
    owners: set[Owner] = field(default_factory=set)
    # Why its data cannot be reached now (a symlinked volume away when it was loaded), if that is why it has no
    # mag: its chunks are then a storage fault (503), never absent data (404), until a reload finds the volume.
    away: str | None = None
    # The layer whose voxels a mapped layer maps (its name), None for a stored layer.
    mapped_from: str | None = None


@dataclass
class Dataset:
    organization: str
    name: str
    directory: str
    version: str
    properties: DatasourceProperties
    document: dict[str, Any]  # datasource-properties.json as read
    layers: dict[str, Layer]
    # What its load found in each segmentation layer's mapping folders: looked at again with the properties file.
    mapping_folders: list["MappingFolder"] = field(default_factory=list)

    @functools.cached_property
    def owners(self) -> set[Owner]:
        """The datasets whose files its layers read: every document of a dataset (its group, consolidated
        metadata, page) describes all its layers, so a token is granted all of them or none. Its layers are
        complete once it is made, so this is worked out once, not on every request it serves."""
        return {owner for layer in self.layers.values() for owner in layer.owners}


class DatasetUnusable(Conflict, ValueError):
    """A request for a dataset whose properties cannot be used; the message says why.

    Not a 404, which a Zarr client would read as "no data" (zeros), and not a 500: the gateway is
    well, the dataset's metadata is not, and it stays so until someone fixes the file.
    """


@dataclass
class BrokenDataset:
    """A dataset whose properties cannot be used; it is listed with the reason, never served."""

    organization: str
    name: str
    reason: str

    @property
    def owners(self) -> set[Owner]:
        return set()  # it reads no layer

    @property
    def mapping_folders(self) -> list["MappingFolder"]:
        return []  # it serves no layer, mapped or not


# The mapping folders of a dataset in an object store are listed again this often at most (a listing is a request
# there); on a local disk whenever its properties file is looked at.
REMOTE_MAPPINGS_SECONDS = 10.0
# A served Zarr group missing from its folder is taken for removed once it has stayed away this long: one written
# again from nothing (zarr-python's mode "w", webknossos-libs' create after a removal) is away for a moment, and a
# load then would drop its layer (404s that clients fill with zeros); meanwhile its chunks say it is gone (500).
REWRITTEN_GROUP_SECONDS = 2.0


@dataclass
class MappingFolder:
    """The mappings a load found beside one segmentation layer. A mapping added or removed is a layer added or
    removed without an edit of the properties file, so they are looked up again whenever that file is checked
    (a few stats and listings per segmentation layer); so is what each mapping that could not be opened looked
    up (a Zarr group caught before its array's metadata was written), to be served as soon as it can be, and
    whether a served mapping's new version needs another data type (:meth:`Mapping.outdated`). In an object
    store, where each look is a request, at most every REMOTE_MAPPINGS_SECONDS."""

    directory: str  # the layer's
    found: tuple[Found, ...]
    unsettled: bool = False  # one was still being written: it is no layer yet, and looked at again
    refused: list[Observed] = field(default_factory=list)
    served: list[Mapping] = field(default_factory=list)  # the mappings opened: layers whose data type may move
    looked_at: float = field(default_factory=time.monotonic)
    stale: bool = False  # found moved once: so it stays until the dataset is loaded again
    away_since: float | None = None  # when served Zarr groups were first seen missing (nothing else moved)

    def moved(self, mappings: Mappings, store: Store) -> bool:
        if self.unsettled or self.stale:
            return True
        now = time.monotonic()
        if not store.is_local and now < self.looked_at + REMOTE_MAPPINGS_SECONDS:
            return False
        self.looked_at = now
        try:
            self.stale = (
                any(observed.changed(store) for observed in self.refused)
                or self._found_moved(tuple(mappings.find(self.directory)), now)
                or any(mapping.outdated() for mapping in self.served)
            )
        except (OSError, StorageError, ValueError):
            self.stale = True  # the load says what is wrong
        return self.stale

    def _found_moved(self, found: tuple[Found, ...], now: float) -> bool:
        """Whether the mappings found now differ from the load's: anything added or removed, except served Zarr
        groups missing for less than REWRITTEN_GROUP_SECONDS (written again)."""
        if found == self.found:
            self.away_since = None
            return False
        groups = {mapping.path for mapping in self.served if mapping.kind == "zarr"}
        away = [entry for entry in self.found if entry not in found]
        if found != tuple(entry for entry in self.found if entry not in away) or any(
            entry.path not in groups for entry in away
        ):
            return True
        if self.away_since is None:
            self.away_since = now
        return now >= self.away_since + REWRITTEN_GROUP_SECONDS


def problems(loaded: Dataset | BrokenDataset) -> list[str]:
    """Everything that keeps part of a dataset from being served; empty for a healthy one."""
    if isinstance(loaded, BrokenDataset):
        return [loaded.reason]
    return [f"layer {name}: {problem}" for name, layer in loaded.layers.items() for problem in layer.problems]
