"""Discovering datasets under the data root and loading them, re-reading only what changed."""

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import ValidationError

from gateway_storage import OutsideRootError, StorageError, Store, StoreUnavailableError, is_absolute_location
from gateway_storage.geometry import Vec3, mag_name, mag_names
from wkw_adapter import WkwError

from .documents import MAX_DOCUMENT_BYTES, load_json
from .formats import SourceFormat
from .mag import MagSource, SourceError
from .paths import is_plain_name
from .properties import DataLayer, DatasourceProperties
from .registry import SourceFormats

log = logging.getLogger("gateway.catalog")

PROPERTIES = "datasource-properties.json"
REVALIDATE_SECONDS = 1.0  # a changed datasource-properties.json is noticed within this long
# A dataset or layer found unusable (a mag directory missing, a volume not mounted yet, a symlink being
# repaired, an upload in progress) is loaded again at most this often, even if its properties stay the same.
RELOAD_PROBLEMS_SECONDS = 3.0


@dataclass
class Layer:
    properties: DataLayer
    mags: dict[Vec3, MagSource]
    problems: list[str] = field(default_factory=list)


@dataclass
class Dataset:
    organization: str
    name: str
    directory: str
    version: str
    properties: DatasourceProperties
    document: dict[str, Any]  # datasource-properties.json as read
    layers: dict[str, Layer]


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
    check_at: float  # stat the properties file again
    reload_at: float  # load it again even if the properties file is the same (only when it has problems)


def _validation_message(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'file'}: {e['msg']}" for e in exc.errors())


class Catalog:
    """The datasets under one root. Safe to share between threads; holds only caches."""

    def __init__(self, storage: Store, formats: SourceFormats) -> None:
        self.storage = storage
        self.formats = formats
        self._loaded: dict[tuple[str, str], _Loaded] = {}
        self._lock = threading.Lock()

    def organizations(self) -> list[str]:
        return [name for name in self.storage.list_directories(self.storage.root) if is_plain_name(name)]

    def datasets(self, organization: str) -> list[Dataset | BrokenDataset]:
        if not is_plain_name(organization):
            return []
        found = []
        for name in self.storage.list_directories(self.storage.join(self.storage.root, organization)):
            dataset = self.dataset(organization, name)
            if dataset is not None:
                found.append(dataset)
        return found

    def dataset(self, organization: str, name: str) -> Dataset | BrokenDataset | None:
        """The dataset, a BrokenDataset saying why it cannot be served, or None if there is none.

        A healthy dataset costs one stat of its properties file per REVALIDATE_SECONDS; one with
        problems is also loaded again every RELOAD_PROBLEMS_SECONDS, so data that appears late (a
        volume mounted after start-up, a repaired symlink, an upload) is served without a restart.
        """
        if not (is_plain_name(organization) and is_plain_name(name)):
            return None
        key = (organization, name)
        now = time.monotonic()
        cached = self._loaded.get(key)
        if cached is not None and now < cached.check_at:
            return cached.dataset  # its properties file was checked less than REVALIDATE_SECONDS ago
        directory = self.storage.join(self.storage.root, organization, name)
        path = self.storage.join(directory, PROPERTIES)
        try:
            identity = self.storage.identity(path)
        except OutsideRootError:  # a dataset or organization directory symlinked out of the root
            return BrokenDataset(organization, name, f"{PROPERTIES} points outside the data root")
        if identity is None:
            return None
        unchanged = cached is not None and cached.version == identity.version
        if cached is not None and unchanged and (not cached.problems or now < cached.reload_at):
            loaded, problems, reload_at = cached.dataset, cached.problems, cached.reload_at
        else:
            loaded = self._load_guarded(organization, name, directory, path)
            problems = _problems(loaded)
            reload_at = now + RELOAD_PROBLEMS_SECONDS
            if cached is None or problems != cached.problems:  # said once, not at every reload
                self._report(organization, name, loaded, problems, cached)
        with self._lock:
            self._loaded[key] = _Loaded(identity.version, loaded, problems, now + REVALIDATE_SECONDS, reload_at)
        return loaded

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

    def _load_guarded(self, organization: str, name: str, directory: str, path: str) -> Dataset | BrokenDataset:
        """:meth:`_load`, with any fault it did not foresee confined to this one dataset.

        Whatever a dataset's files hold, the dataset is served or listed with a reason; it never turns
        its organization's listing or its neighbours into errors.
        """
        try:
            return self._load(organization, name, directory, path)
        except StoreUnavailableError:
            raise
        except Exception as exc:
            log.warning("dataset %s/%s could not be loaded", organization, name, exc_info=exc)
            return BrokenDataset(organization, name, f"it could not be loaded ({type(exc).__name__}: {exc})")

    def _load(self, organization: str, name: str, directory: str, path: str) -> Dataset | BrokenDataset:
        if self.storage.resolve(path) is None:
            return BrokenDataset(organization, name, f"{PROPERTIES} points outside the data root")
        try:
            found = self.storage.read_whole(path, limit=MAX_DOCUMENT_BYTES)
            if found is None:
                return BrokenDataset(organization, name, f"{PROPERTIES} vanished while it was read")
            document = load_json(found[0])
        except StoreUnavailableError:
            raise  # transient: answered 503 and never remembered as a broken dataset
        except (OSError, StorageError, WkwError, ValueError) as exc:
            return BrokenDataset(organization, name, f"{PROPERTIES} is not readable JSON: {exc}")
        if not isinstance(document, dict):
            return BrokenDataset(organization, name, f"{PROPERTIES} is a JSON {type(document).__name__}, not an object")
        try:
            properties = DatasourceProperties.model_validate(document)
        except ValidationError as exc:
            return BrokenDataset(organization, name, f"{PROPERTIES} is invalid: {_validation_message(exc)}")
        layers = {layer.name: self._load_layer(directory, layer) for layer in properties.data_layers}
        return Dataset(organization, name, directory, found[1].version, properties, document, layers)

    def _load_layer(self, directory: str, layer: DataLayer) -> Layer:
        loaded = Layer(layer, {})
        source_format = self.formats.for_data_format(layer.data_format)
        if source_format is None:
            loaded.problems.append(f"dataFormat {layer.data_format!r} is not served here")
            return loaded
        for entry in layer.mag_entries():
            mag_directory = self._mag_directory(directory, layer.name, entry.mag, entry.path, source_format)
            if mag_directory is None:
                loaded.problems.append(f"mag {mag_name(entry.mag)}: {self._not_found(entry.path)}")
                continue
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

    def _not_found(self, path: str | None) -> str:
        """Why a mag directory was not found: a URL the operator did not allow is said to be one."""
        located = self.storage.locate(path) if path is not None and is_absolute_location(path) else None
        if path is not None and "://" in path and (located is None or self.storage.resolve(located) is None):
            # a local path is not echoed: it would tell every reader where the server's files lie
            named = "its file:// path" if path.startswith("file://") else path
            return f"{named} is outside the data root and every remote root the gateway allows (setting remote_roots)"
        return "directory not found or outside the data root"

    def _mag_directory(
        self, directory: str, layer: str, mag: Vec3, path: str | None, source_format: SourceFormat
    ) -> str | None:
        storage = self.storage
        if path is not None and is_absolute_location(path):
            located = storage.locate(path)  # a local path, or a URL of the data root's store or a remote root
            candidates = [] if located is None else [located]
        elif path is not None:
            candidates = [storage.join(directory, path.removeprefix("./"))]
        else:
            candidates = [storage.join(directory, layer, name) for name in mag_names(mag)]
        for candidate in candidates:
            resolved = storage.resolve(candidate)
            if resolved is not None and source_format.holds_mag(resolved):
                return resolved
        return None
