"""Loading one dataset: its properties parsed, its mags opened through the formats, its owners and mapped layers
found. Pure given a store: everything is looked up through the store handed to :meth:`Loader.load`, so what a
load found depends on nothing else, and the catalog, which hands it a recorder, knows what to look at again."""

import logging
from typing import Any

import numpy as np
from pydantic import ValidationError

from gateway_storage import (
    FileIdentity,
    FileUnsettledError,
    OversizedFileError,
    StorageError,
    Store,
    StoreUnavailableError,
)
from gateway_storage.geometry import mag_name
from wkw_adapter import WkwError

from ..extras import MissingExtraError
from . import discovery
from .dataset import BrokenDataset, Dataset, Layer, MappingFolder
from .discovery import PROPERTIES
from .documents import load_json
from .mag import MagSource, SourceError
from .mappings import Found, MappedMag, Mapping, mapped_dtype, mapped_name
from .paths import is_plain_name
from .properties import DataLayer, DatasourceProperties
from .registry import SourceFormats
from .watched import Observed, WatchedStore

log = logging.getLogger("gateway.catalog")

# The work one load may do, so that no properties file, however written, holds a catalog thread for long
# (real webKnossos datasets have a few layers of up to about twenty mags, and a file of a few kilobytes).
MAX_PROPERTIES_BYTES = 4 << 20
MAX_LAYERS = 1000
MAX_MAGS = 4096  # in all layers together


def _validation_message(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'file'}: {e['msg']}" for e in exc.errors())


class Loader:
    """Loads datasets with the source formats (which own the caches their mags share)."""

    def __init__(self, formats: SourceFormats) -> None:
        self.formats = formats

    def load(
        self, files: Store, organization: str, name: str, directory: str, identity: FileIdentity
    ) -> Dataset | BrokenDataset:
        """The dataset as its files hold it now, everything looked up through ``files`` (a view made for the load:
        the catalog's recorder), with any fault it did not foresee confined to this one dataset.

        Whatever a dataset's files hold, the dataset is served or listed with a reason; it never turns
        its organization's listing or its neighbours into errors.
        """
        try:
            return self._load(files, organization, name, directory, identity)
        except StoreUnavailableError:
            raise
        except Exception as exc:
            log.warning("dataset %s/%s could not be loaded", organization, name, exc_info=exc)
            return BrokenDataset(organization, name, f"it could not be loaded ({type(exc).__name__}: {exc})")

    def _load(
        self, files: Store, organization: str, name: str, directory: str, identity: FileIdentity
    ) -> Dataset | BrokenDataset:
        """The dataset as its files hold it now, everything looked up through ``files``."""
        path = files.join(directory, PROPERTIES)
        if files.resolve(path) is None:
            return BrokenDataset(organization, name, f"{PROPERTIES} points outside the data root")
        try:
            # the very version whose size was checked: a file grown since is a changed file, not a bigger read
            document = load_json(
                files.read(path, 0, identity.size, identity, limit=MAX_PROPERTIES_BYTES, settled=False)
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
        layers = {layer.name: self._load_layer(files, directory, layer) for layer in properties.data_layers}
        folders: list[MappingFolder] = []
        mapped = self._mapped_layers(files, directory, layers, folders)
        if mapped:
            entries = {entry.get("name"): entry for entry in document["dataLayers"] if isinstance(entry, dict)}
            document = {
                **document,
                "dataLayers": [*document["dataLayers"], *(_mapped_entry(entries, m) for m in mapped.values())],
            }
            layers.update(mapped)
        return Dataset(organization, name, directory, identity.version, properties, document, layers, folders)

    def _load_layer(self, files: Store, directory: str, layer: DataLayer) -> Layer:
        loaded = Layer(layer, {})
        source_format = self.formats.for_data_format(layer.data_format)
        if source_format is None:
            loaded.problems.append(f"dataFormat {layer.data_format!r} is not served here")
            return loaded
        for entry in layer.mag_entries():
            mag_directory = discovery.mag_directory(files, directory, layer.name, entry.mag, entry.path, source_format)
            if mag_directory is None:
                away = discovery.away(files, directory, layer.name, entry.path)
                loaded.away = loaded.away or away
                loaded.problems.append(f"mag {mag_name(entry.mag)}: {away or discovery.not_found(files, entry.path)}")
                continue
            try:
                owner = discovery.owner_of(files, mag_directory)
            except SourceError as exc:
                loaded.problems.append(f"mag {mag_name(entry.mag)}: {exc}")
                continue
            if owner is not None:
                loaded.owners.add(owner)  # before it is opened: even a mag that cannot be served was found there
            try:
                source: MagSource = source_format.open_mag(entry.mag, mag_directory, layer, entry.axis_order, files)
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

    def _mapped_layers(
        self, files: Store, directory: str, layers: dict[str, Layer], folders: list[MappingFolder]
    ) -> dict[str, Layer]:
        """A layer per mapping beside each segmentation layer (``<layer>__<mapping>``); a mapping that cannot be
        served is a layer listed with the reason, one whose name cannot be a layer name a problem of its source.
        What was found is noted in ``folders``."""
        mapped: dict[str, Layer] = {}
        for name, layer in layers.items():
            if layer.properties.category != "segmentation" or not layer.mags:
                continue
            folder = files.join(directory, name)
            try:
                found = self.formats.mappings.find(folder, files)
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
                observed = Observed()  # what opening it looks up, noted by the load's own recorder too
                try:
                    loaded, mapping = self._mapped_layer(WatchedStore(files, observed), target, layer, entry)
                except FileUnsettledError:
                    noted.unsettled = True  # not a layer yet, nor a problem: looked at again once it has settled
                    continue
                mapped[target] = loaded
                if mapping is not None:
                    noted.served.append(mapping)
                if loaded.problems:
                    noted.refused.append(observed)
        return mapped

    def _mapped_layer(self, files: Store, target: str, layer: Layer, found: Found) -> tuple[Layer, Mapping | None]:
        """The mapped layer (a name of markup: listed, refused) with its mapping, or one listed with why it cannot
        be served (and no mapping); FileUnsettledError for a mapping file still being written (not a fault of the
        data: it is a layer once it has settled)."""
        source_dtype = layer.properties.dtype
        properties = layer.properties.model_copy(update={"name": target, "largest_segment_id": None})
        loaded = Layer(properties, {}, owners=set(layer.owners), mapped_from=layer.properties.name)
        try:
            real = files.resolve(found.path)
            if real is None:
                raise SourceError("it lies outside the data root")
            owner = discovery.owner_of(files, real)
            if owner is not None:
                loaded.owners.add(owner)
            mapping = self.formats.mappings.open(found, source_dtype, files)
            dtype = mapped_dtype(source_dtype, mapping)
        except (StoreUnavailableError, FileUnsettledError):
            raise
        except (OSError, StorageError, SourceError, MissingExtraError) as exc:
            loaded.problems.append(f"mapping {found.name!r} ({found.kind}): {exc}")
            return loaded, None
        loaded.properties = properties.model_copy(update={"element_class": dtype.name})
        loaded.mags = {mag: MappedMag(source, mapping, dtype) for mag, source in layer.mags.items()}
        return loaded, mapping


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
