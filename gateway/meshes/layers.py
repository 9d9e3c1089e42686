"""The segmentation layers meshes are made of: each one's grid, voxel size and data stamp, kept per dataset version."""

import threading
import time

from ..sources.catalog import Dataset, Layer
from ..sources.units import meters_per_unit
from .cache import LayerKey
from .errors import MeshInputError, MeshNotFound
from .geometry import MeshGrid
from .index import data_stamp, segment_dtype

STAMP_SECONDS = 5.0  # the data's stamp (a walk of its mag directories) is taken again at most this often


class LayerMeshes:
    """One segmentation layer: its grid, its voxel size in nanometers, and the stamp of its data."""

    def __init__(self, dataset: Dataset, layer: Layer) -> None:
        self.dataset = dataset
        self.layer = layer
        self.name = layer.properties.name
        self.key = LayerKey(dataset.organization, dataset.name, dataset.version, self.name)
        self.grid = MeshGrid(layer.mags)
        scale = dataset.properties.scale
        nm = meters_per_unit(scale.unit) / 1e-9
        self.voxel_nm: tuple[float, float, float] = (scale.factor[0] * nm, scale.factor[1] * nm, scale.factor[2] * nm)
        self._stamp: tuple[str | None, float] | None = None
        self._lock = threading.Lock()

    @property
    def title(self) -> str:
        return f"{self.dataset.organization}/{self.dataset.name}/{self.name}"

    def stamp(self, local: bool) -> str:
        """The data's current stamp, taken again once ``STAMP_SECONDS`` have passed. Off a local file system
        the data cannot be walked cheaply: the stamp is then the time slot, so caches expire instead."""
        now = time.monotonic()
        with self._lock:
            if self._stamp is not None and now < self._stamp[1]:
                cached = self._stamp[0]
                return cached if cached is not None else f"unchecked-{int(now // STAMP_SECONDS)}"
        stamp = data_stamp(self.layer.mags, local)
        with self._lock:
            self._stamp = (stamp, now + STAMP_SECONDS)
        return stamp if stamp is not None else f"unchecked-{int(now // STAMP_SECONDS)}"


class MeshLayers:
    """The segmentation layers asked for so far, each made again when its dataset is reloaded."""

    def __init__(self) -> None:
        self._layers: dict[tuple[str, str, str], LayerMeshes] = {}

    def layer(self, dataset: Dataset, name: str) -> LayerMeshes:
        """The layer's meshes; a 400 for a layer that has none by its nature, a 404 for no such layer."""
        layer = dataset.layers.get(name)
        if layer is None:
            raise MeshNotFound(f"no layer {name!r} in {dataset.organization}/{dataset.name}")
        if layer.properties.category != "segmentation":
            raise MeshInputError(
                f"layer {name!r} is a {layer.properties.category} layer: only segmentations have meshes"
            )
        if not layer.mags:
            raise MeshNotFound(f"layer {name!r} has no servable mag: {'; '.join(layer.problems)}")
        segment_dtype(next(iter(layer.mags.values())))
        key = (dataset.organization, dataset.name, name)
        meshes = self._layers.get(key)
        if meshes is None or meshes.dataset is not dataset:
            meshes = self._layers[key] = LayerMeshes(dataset, layer)
        return meshes
