"""Discovering datasets under the data root and loading them, re-reading only what changed."""

import dataclasses
import errno
import functools
import logging
import posixpath
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import ValidationError

from gateway_storage import (
    FileIdentity,
    FileUnsettledError,
    OutsideRootError,
    OversizedFileError,
    StorageError,
    Store,
    StoreUnavailableError,
    is_absolute_location,
)
from gateway_storage.geometry import Vec3, mag_name, mag_names
from gateway_storage.local import DATASET_DEPTH
from wkw_adapter import WkwError

from ..extras import MissingExtraError
from .documents import load_json
from .formats import SourceFormat
from .mag import MagSource, SourceError
from .mappings import Found, MappedMag, Mappings, mapped_dtype, mapped_name
from .paths import is_plain_name
from .properties import DataLayer, DatasourceProperties
from .registry import SourceFormats
from .watched import Observed

log = logging.getLogger("gateway.catalog")

PROPERTIES = "datasource-properties.json"
REVALIDATE_SECONDS = 1.0  # a changed datasource-properties.json is noticed within this long
# A dataset or layer found unusable (a mag directory missing, a volume not mounted yet, a symlink being
# repaired, an upload in progress) is looked at again this often: loaded again once something the load
# looked up (a file, a directory, a symlink) has changed, never while all of it stays the same.
RELOAD_PROBLEMS_SECONDS = 3.0
# The mapping folders of a dataset in an object store are listed again this often at most (a listing is a request
# there); on a local disk whenever its properties file is looked at.
REMOTE_MAPPINGS_SECONDS = 10.0
# The work one load may do, so that no properties file, however written, holds a catalog thread for long
# (real webKnossos datasets have a few layers of up to about twenty mags, and a file of a few kilobytes).
MAX_PROPERTIES_BYTES = 4 << 20
MAX_LAYERS = 1000
MAX_MAGS = 4096  # in all layers together
LOCK_STRIPES = 64  # loads of one dataset wait for each other; those of different datasets mostly do not

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


class DatasetUnusable(ValueError):
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


@dataclass
class MappingFolder:
    """The mappings a load found beside one segmentation layer. A mapping added or removed is a layer added or
    removed without an edit of the properties file, so they are looked up again whenever that file is checked
    (a few stats and listings per segmentation layer); so is what each mapping that could not be opened looked
    up (a Zarr group caught before its array's metadata was written), to be served as soon as it can be. In an
    object store, where each look is a request, at most every REMOTE_MAPPINGS_SECONDS."""

    directory: str  # the layer's
    found: tuple[Found, ...]
    unsettled: bool = False  # one was still being written: it is no layer yet, and looked at again
    refused: list[Observed] = field(default_factory=list)
    looked_at: float = field(default_factory=time.monotonic)

    def moved(self, mappings: Mappings, store: Store) -> bool:
        if self.unsettled:
            return True
        now = time.monotonic()
        if not store.is_local and now < self.looked_at + REMOTE_MAPPINGS_SECONDS:
            return False
        self.looked_at = now
        try:
            return any(observed.changed(store) for observed in self.refused) or (
                tuple(mappings.find(self.directory)) != self.found
            )
        except (OSError, StorageError, ValueError):
            return True  # the load says what is wrong


def _problems(loaded: Dataset | BrokenDataset) -> list[str]:
    """Everything that keeps part of a dataset from being served; empty for a healthy one."""
    if isinstance(loaded, BrokenDataset):
        return [loaded.reason]
    return [f"layer {name}: {problem}" for name, layer in loaded.layers.items() for problem in layer.problems]


@dataclass(frozen=True, slots=True)
class _Loaded:
    """A dataset as last loaded, and when to look at it again."""

    version: str  # of its datasource-properties.json
    dataset: Dataset | BrokenDataset
    problems: list[str]
    observed: Observed  # what the load looked up
    check_at: float  # stat the properties file again
    reload_at: float  # look at everything the load looked up again (only when it has problems)


def _validation_message(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'file'}: {e['msg']}" for e in exc.errors())


class Catalog:
    """The datasets under one root. Safe to share between threads; holds only caches.

    Its methods do file system (or network) work: callers on an event loop run them in a thread.
    """

    def __init__(self, storage: Store, formats: SourceFormats) -> None:
        self.storage = storage
        self.formats = formats
        self._files = formats.store  # loads read through it, so that what they looked up is known
        self._loaded: dict[tuple[str, str], _Loaded] = {}
        self._lock = threading.Lock()
        self._loading = [threading.Lock() for _ in range(LOCK_STRIPES)]

    def organizations(self) -> list[str]:
        return [name for name in self.storage.list_directories(self.storage.root) if is_plain_name(name)]

    def dataset_names(self, organization: str) -> list[str]:
        """The names of the datasets of ``organization`` (directories with a properties file), loading none:
        what a listing filtered by grants, or an organization's authorization, needs."""
        if not is_plain_name(organization):
            return []
        directory = self.storage.join(self.storage.root, organization)
        return [
            name
            for name in self.storage.list_directories(directory)
            if is_plain_name(name) and self._has_properties(self.storage.join(directory, name, PROPERTIES))
        ]

    def _has_properties(self, path: str) -> bool:
        try:
            return self.storage.identity(path) is not None
        except OutsideRootError:
            return True  # listed as a dataset that cannot be served

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
            identity = self.storage.identity(self.storage.join(self.storage.root, organization, name, PROPERTIES))
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
        directory = self.storage.join(self.storage.root, organization, name)
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
            with self._files.watching() as observed:
                loaded = self._load_guarded(organization, name, directory, path, identity)
            problems = _problems(loaded)
            reload_at = now + RELOAD_PROBLEMS_SECONDS
            if cached is None or problems != cached.problems:  # said once, not at every reload
                self._report(organization, name, loaded, problems, cached)
        with self._lock:
            self._loaded[key] = _Loaded(
                identity.version, loaded, problems, observed, now + REVALIDATE_SECONDS, reload_at
            )
        return loaded

    def _mappings_moved(self, dataset: Dataset | BrokenDataset) -> bool:
        """Whether the mappings beside a dataset's layers are no longer those it was loaded with."""
        return any(folder.moved(self.formats.mappings, self._files.inner) for folder in dataset.mapping_folders)

    def _should_reload(self, cached: _Loaded, now: float) -> bool:
        """Whether a dataset whose properties file is unchanged must be loaded again: only one with
        problems, and only once something its load looked up is no longer as it was."""
        return bool(cached.problems) and now >= cached.reload_at and cached.observed.changed(self._files.inner)

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

    def _load_guarded(
        self, organization: str, name: str, directory: str, path: str, identity: FileIdentity
    ) -> Dataset | BrokenDataset:
        """:meth:`_load`, with any fault it did not foresee confined to this one dataset.

        Whatever a dataset's files hold, the dataset is served or listed with a reason; it never turns
        its organization's listing or its neighbours into errors.
        """
        try:
            return self._load(organization, name, directory, path, identity)
        except StoreUnavailableError:
            raise
        except Exception as exc:
            log.warning("dataset %s/%s could not be loaded", organization, name, exc_info=exc)
            return BrokenDataset(organization, name, f"it could not be loaded ({type(exc).__name__}: {exc})")

    def _load(
        self, organization: str, name: str, directory: str, path: str, identity: FileIdentity
    ) -> Dataset | BrokenDataset:
        if self._files.resolve(path) is None:
            return BrokenDataset(organization, name, f"{PROPERTIES} points outside the data root")
        try:
            # the very version whose size was checked: a file grown since is a changed file, not a bigger read
            document = load_json(
                self._files.read(path, 0, identity.size, identity, limit=MAX_PROPERTIES_BYTES, settled=False)
            )
        except StoreUnavailableError:
            raise  # transient: answered 503 and never remembered as a broken dataset
        except OversizedFileError as exc:  # the kernel's bound, checked before a byte is read
            return BrokenDataset(organization, name, f"{PROPERTIES} is too large: {exc}")
        except (OSError, StorageError, WkwError, ValueError) as exc:
            return BrokenDataset(organization, name, f"{PROPERTIES} is not readable JSON: {exc}")
        if not isinstance(document, dict):
            return BrokenDataset(organization, name, f"{PROPERTIES} is a JSON {type(document).__name__}, not an object")
        too_much = _too_much(document)
        if too_much is not None:
            return BrokenDataset(organization, name, f"{PROPERTIES} {too_much}")
        try:
            properties = DatasourceProperties.model_validate(document)
        except ValidationError as exc:
            return BrokenDataset(organization, name, f"{PROPERTIES} is invalid: {_validation_message(exc)}")
        layers = {layer.name: self._load_layer(directory, layer) for layer in properties.data_layers}
        folders: list[MappingFolder] = []
        mapped = self._mapped_layers(directory, layers, folders)
        if mapped:
            entries = {entry.get("name"): entry for entry in document["dataLayers"] if isinstance(entry, dict)}
            document = {
                **document,
                "dataLayers": [*document["dataLayers"], *(_mapped_entry(entries, m) for m in mapped.values())],
            }
            layers.update(mapped)
        return Dataset(organization, name, directory, identity.version, properties, document, layers, folders)

    def _mapped_layers(
        self, directory: str, layers: dict[str, Layer], folders: list[MappingFolder]
    ) -> dict[str, Layer]:
        """A layer per mapping beside each segmentation layer (``<layer>__<mapping>``); a mapping that cannot be
        served is a layer listed with the reason, one whose name cannot be a layer name a problem of its source.
        What was found is noted in ``folders``."""
        mapped: dict[str, Layer] = {}
        for name, layer in layers.items():
            if layer.properties.category != "segmentation" or not layer.mags:
                continue
            folder = self._files.join(directory, name)
            try:
                found = self.formats.mappings.find(folder)
            except (OSError, StorageError) as exc:
                if isinstance(exc, StoreUnavailableError):
                    raise
                layer.problems.append(f"its mappings cannot be listed: {exc}")
                continue
            noted = MappingFolder(folder, tuple(found))
            folders.append(noted)
            for entry in found:
                target = mapped_name(name, entry.name)
                if not is_plain_name(target) or target in layers or target in mapped:
                    why = "is a layer's name already" if is_plain_name(target) else "is no plain name"
                    layer.problems.append(f"mapping {entry.name!r} is not served: its layer name {why}")
                    continue
                try:
                    with self._files.watching() as observed:
                        loaded = self._mapped_layer(target, layer, entry)  # a name of markup: listed, refused
                except FileUnsettledError:
                    noted.unsettled = True  # not a layer yet, nor a problem: looked at again once it has settled
                    continue
                mapped[target] = loaded
                if loaded.problems:
                    noted.refused.append(observed)
        return mapped

    def _mapped_layer(self, target: str, layer: Layer, found: Found) -> Layer:
        """The mapped layer, or one listed with why it cannot be served; FileUnsettledError for a mapping file
        still being written (not a fault of the data: it is a layer once it has settled)."""
        source_dtype = layer.properties.dtype
        properties = layer.properties.model_copy(update={"name": target, "largest_segment_id": None})
        loaded = Layer(properties, {}, owners=set(layer.owners), mapped_from=layer.properties.name)
        try:
            real = self._files.resolve(found.path)
            if real is None:
                raise SourceError("it lies outside the data root")
            owner = self._owner(real)
            if owner is not None:
                loaded.owners.add(owner)
            mapping = self.formats.mappings.open(found, source_dtype)
            dtype = mapped_dtype(source_dtype, mapping)
        except (StoreUnavailableError, FileUnsettledError):
            raise
        except (OSError, StorageError, SourceError, MissingExtraError) as exc:
            loaded.problems.append(f"mapping {found.name!r} ({found.kind}): {exc}")
            return loaded
        loaded.properties = properties.model_copy(update={"element_class": dtype.name})
        loaded.mags = {mag: MappedMag(source, mapping, dtype) for mag, source in layer.mags.items()}
        return loaded

    def _load_layer(self, directory: str, layer: DataLayer) -> Layer:
        loaded = Layer(layer, {})
        source_format = self.formats.for_data_format(layer.data_format)
        if source_format is None:
            loaded.problems.append(f"dataFormat {layer.data_format!r} is not served here")
            return loaded
        for entry in layer.mag_entries():
            mag_directory = self._mag_directory(directory, layer.name, entry.mag, entry.path, source_format)
            if mag_directory is None:
                away = self._away(directory, layer.name, entry.path)
                loaded.away = loaded.away or away
                loaded.problems.append(f"mag {mag_name(entry.mag)}: {away or self._not_found(entry.path)}")
                continue
            try:
                owner = self._owner(mag_directory)
            except SourceError as exc:
                loaded.problems.append(f"mag {mag_name(entry.mag)}: {exc}")
                continue
            if owner is not None:
                loaded.owners.add(owner)  # before it is opened: even a mag that cannot be served was found there
            try:
                source: MagSource = source_format.open_mag(entry.mag, mag_directory, layer, entry.axis_order)
            except StoreUnavailableError:
                raise  # transient: the layer must not be remembered as unusable
            except (OSError, StorageError, WkwError, SourceError) as exc:
                loaded.problems.append(f"mag {mag_name(entry.mag)}: {exc}")
                continue
            if np.dtype(source.dtype.name) != layer.dtype or source.channels != layer.channels:
                loaded.problems.append(
                    f"mag {mag_name(entry.mag)}: the data holds {source.channels} x {source.dtype.name}, "
                    f"but elementClass {layer.element_class!r} means {layer.channels} x {layer.dtype}"
                )
                continue
            loaded.mags[entry.mag] = source
        return loaded

    def _owner(self, real: str) -> Owner | None:
        """The dataset whose directory holds the real path ``real``; None for an operator's extra root or a
        remote root (trusted as a whole). A path of the data root that lies in no dataset is not served."""
        storage = self._files
        if storage.root_of(real) != storage.root:
            return None
        parts = [part for part in storage.relative(real).split("/") if part][:DATASET_DEPTH]
        if len(parts) < DATASET_DEPTH:
            raise SourceError("its directory lies in no dataset's directory")
        return parts[0], parts[1]

    def _away(self, directory: str, layer: str, path: str | None) -> str | None:
        """Why a mag directory that was not found is away rather than absent, from the store: a symlink on its
        way below the dataset's directory whose target is gone (a volume not mounted); None if nothing says so.
        Looked up through the watched store, so the dataset is loaded again once the volume is back."""
        if path is not None and is_absolute_location(path):
            return None
        current = self._files.join(directory, path.removeprefix("./") if path else layer)
        while current.startswith(directory + "/"):
            try:
                self._files.identity(current)
            except StoreUnavailableError as exc:
                return f"{exc} (a volume that is away?)"
            except (OSError, StorageError, ValueError):  # ValueError: a name no file can have (a NUL, a surrogate)
                pass
            current = posixpath.dirname(current)
        return None

    def _not_found(self, path: str | None) -> str:
        """Why a mag directory was not found: a URL the operator did not allow is said to be one."""
        located = self._files.locate(path) if path is not None and is_absolute_location(path) else None
        if path is not None and "://" in path and (located is None or self._files.resolve(located) is None):
            # a local path is not echoed: it would tell every reader where the server's files lie
            named = "its file:// path" if path.startswith("file://") else path
            return f"{named} is outside the data root and every remote root the gateway allows (setting remote_roots)"
        return "directory not found or outside the data root"

    def _mag_directory(
        self, directory: str, layer: str, mag: Vec3, path: str | None, source_format: SourceFormat
    ) -> str | None:
        storage = self._files
        if path is not None and is_absolute_location(path):
            located = storage.locate(path)  # a local path, or a URL of the data root's store or a remote root
            candidates = [] if located is None else [located]
        elif path is not None:
            candidates = [storage.join(directory, path.removeprefix("./"))]
        else:
            candidates = [storage.join(directory, layer, name) for name in mag_names(mag)]
        # A path from the properties that no file can have (a NUL, an unpaired surrogate, too long for the system)
        # holds no mag: that mag's problem, not the whole dataset's.
        for candidate in candidates:
            try:
                resolved = storage.resolve(candidate)
            except ValueError:  # a NUL or an unpaired surrogate (UnicodeEncodeError)
                continue
            try:
                if resolved is not None and source_format.holds_mag(resolved):
                    return resolved
            except OSError as exc:
                if exc.errno != errno.ENAMETOOLONG:
                    raise  # a storage fault, not a name
        return None


def _mapped_entry(entries: dict[Any, dict[str, Any]], layer: Layer) -> dict[str, Any]:
    """A mapped layer's entry in the served properties: its source layer's, renamed, with the mapped data type,
    without what describes the source's ids only (largest id, attached mappings)."""
    source = layer.mapped_from
    entry = {k: v for k, v in entries.get(source, {}).items() if k not in ("largestSegmentId", "attachments")}
    return {**entry, "name": layer.properties.name, "elementClass": layer.properties.element_class}


def _too_much(document: dict[str, Any]) -> str | None:
    """Why a properties document asks for more work than one load may do (MAX_LAYERS, MAX_MAGS), if it does:
    told from the parsed JSON, before any of it is validated or opened."""
    layers = document.get("dataLayers")
    if not isinstance(layers, list):
        return None  # validation says what is wrong
    if len(layers) > MAX_LAYERS:
        return f"lists {len(layers)} layers, more than the {MAX_LAYERS} a dataset may have here"
    mags = sum(_mag_count(layer) for layer in layers)
    if mags > MAX_MAGS:
        return f"lists {mags} mags, more than the {MAX_MAGS} a dataset may have here (in all its layers)"
    return None


def _mag_count(layer: object) -> int:
    if not isinstance(layer, dict):
        return 0
    mags = layer.get("mags") or layer.get("wkwResolutions")
    return len(mags) if isinstance(mags, list) else 0
