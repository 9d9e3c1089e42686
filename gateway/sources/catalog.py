"""Discovering datasets under the data root and loading them, re-reading only what changed."""

import json
import logging
import os
import threading
from dataclasses import dataclass, field

from pydantic import ValidationError

from wkw_adapter import WkwError, WkwFileCache

from .paths import inside, is_plain_name
from .properties import DataLayer, DatasourceProperties, mag_name
from .wkw_source import WkwMagSource

log = logging.getLogger("gateway.catalog")

PROPERTIES = "datasource-properties.json"
Vec3 = tuple[int, int, int]


@dataclass
class Layer:
    properties: DataLayer
    mags: dict[Vec3, WkwMagSource]
    problems: list[str] = field(default_factory=list)


@dataclass
class Dataset:
    organization: str
    name: str
    directory: str
    version: str
    properties: DatasourceProperties
    document: dict
    layers: dict[str, Layer]


@dataclass
class BrokenDataset:
    """A dataset whose properties cannot be used; it is listed with the reason, never served."""

    organization: str
    name: str
    reason: str


def _validation_message(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'file'}: {e['msg']}" for e in exc.errors())


class Catalog:
    """The datasets under one root. Safe to share between threads; holds only caches."""

    def __init__(self, root: str, files: WkwFileCache) -> None:
        self.root = os.path.realpath(root)
        self.files = files
        self._loaded: dict[tuple[str, str], tuple[str, Dataset | BrokenDataset]] = {}
        self._lock = threading.Lock()

    def _subdirectories(self, path: str) -> list[str]:
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [e.name for e in entries if is_plain_name(e.name) and e.is_dir()]

    def organizations(self) -> list[str]:
        return self._subdirectories(self.root)

    def datasets(self, organization: str) -> list[Dataset | BrokenDataset]:
        found = []
        for name in self._subdirectories(os.path.join(self.root, organization)):
            dataset = self.dataset(organization, name)
            if dataset is not None:
                found.append(dataset)
        return found

    def dataset(self, organization: str, name: str) -> Dataset | BrokenDataset | None:
        """The dataset, a BrokenDataset saying why it cannot be served, or None if there is none."""
        if not (is_plain_name(organization) and is_plain_name(name)):
            return None
        directory = os.path.join(self.root, organization, name)
        path = os.path.join(directory, PROPERTIES)
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        version = f"{st.st_size:x}-{st.st_mtime_ns:x}-{st.st_ino:x}"
        key = (organization, name)
        with self._lock:
            cached = self._loaded.get(key)
        if cached is not None and cached[0] == version:
            return cached[1]
        loaded = self._load(organization, name, directory, path, version)
        if isinstance(loaded, BrokenDataset):
            log.warning("dataset %s/%s cannot be served: %s", organization, name, loaded.reason)
        with self._lock:
            self._loaded[key] = (version, loaded)
        return loaded

    def _load(self, organization: str, name: str, directory: str, path: str, version: str) -> Dataset | BrokenDataset:
        if inside(self.root, path) is None:
            return BrokenDataset(organization, name, f"{PROPERTIES} points outside the data root")
        try:
            with open(path, "rb") as f:
                document = json.load(f)
        except (OSError, ValueError) as exc:
            return BrokenDataset(organization, name, f"{PROPERTIES} is not readable JSON: {exc}")
        try:
            properties = DatasourceProperties.model_validate(document)
        except ValidationError as exc:
            return BrokenDataset(organization, name, f"{PROPERTIES} is invalid: {_validation_message(exc)}")
        layers = {layer.name: self._load_layer(directory, layer) for layer in properties.data_layers}
        for layer in layers.values():
            for problem in layer.problems:
                log.warning("dataset %s/%s layer %s: %s", organization, name, layer.properties.name, problem)
        return Dataset(organization, name, directory, version, properties, document, layers)

    def _load_layer(self, directory: str, layer: DataLayer) -> Layer:
        loaded = Layer(layer, {})
        if layer.data_format != "wkw":
            loaded.problems.append(f"dataFormat {layer.data_format!r} is not served yet")
            return loaded
        for entry in layer.mag_entries():
            mag_directory = self._mag_directory(directory, layer.name, entry.mag, entry.path)
            if mag_directory is None:
                loaded.problems.append(f"mag {mag_name(entry.mag)}: directory not found or outside the data root")
                continue
            try:
                source = WkwMagSource(entry.mag, mag_directory, layer.bounding_box, self.files)
            except (OSError, WkwError) as exc:
                loaded.problems.append(f"mag {mag_name(entry.mag)}: {exc}")
                continue
            if source.dtype != layer.dtype or source.channels != layer.channels:
                loaded.problems.append(
                    f"mag {mag_name(entry.mag)}: header.wkw holds {source.channels} x {source.dtype}, "
                    f"but elementClass {layer.element_class!r} means {layer.channels} x {layer.dtype}"
                )
                continue
            loaded.mags[entry.mag] = source
        return loaded

    def _mag_directory(self, directory: str, layer: str, mag: Vec3, path: str | None) -> str | None:
        if path is not None:
            path = path.removeprefix("file://")
            candidates = [path if os.path.isabs(path) else os.path.join(directory, path)]
        else:
            long_name = "-".join(map(str, mag))
            candidates = [os.path.join(directory, layer, n) for n in dict.fromkeys([mag_name(mag), long_name])]
        for candidate in candidates:
            real = inside(self.root, candidate)
            if real is not None and os.path.isdir(real):
                return real
        return None
