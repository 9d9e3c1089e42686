"""The served trees: which names each level of a tree answers, and the documents behind them.

Every tree has the same four levels below ``/data/{tree}/``: organization,
dataset, group, array (then chunk keys). What a group and an array are differs:

- ``zarr`` (Zarr v2) and ``zarr3`` (Zarr v3): a group per layer (OME-NGFF
  multiscales), an array per mag.
- ``xarray`` (Zarr v3): a group per mag, holding an array per layer that has the
  mag, on the dataset's grid at that mag, and coordinate arrays, so that
  ``xr.open_zarr`` of a mag gives one Dataset and ``xr.open_datatree`` of the
  dataset one group per mag.

Dispatch, listings and metric labels all derive from :data:`TREES`.
"""

import dataclasses
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gateway_storage import StoreUnavailableError
from gateway_storage.faults import Absent
from gateway_storage.geometry import Vec3, canonical_mag_name, mag_name

from ..resources import JSON, Resource, bytes_resource
from ..sources.dataset import Dataset
from ..sources.mag import MagSource
from . import native
from .chunks import served_mag
from .codecs import Codec
from .documents import (
    ArrayZarrJson,
    Attributes,
    Document,
    GroupZarrJson,
    ZArray,
    ZGroup,
    ZMetadata,
    group_zarr_json,
    zgroup,
    zmetadata,
)
from .keys import MalformedKey, parse_v2_key, parse_v3_key
from .layout import AXES, ArrayLayout, LayerDescription, MagArray, ome_v04, ome_v05
from .nodes import ArrayNode, CoordinateArray, GroupNode, SourceArray
from .shards import ShardPlans, shard_inner_codec

PROPERTIES = "datasource-properties.json"
V2_METADATA = (".zarray", ".zgroup", ".zattrs", ".zmetadata")
V3_METADATA = ("zarr.json",)
METADATA_NAMES = frozenset((*V2_METADATA, *V3_METADATA, PROPERTIES))


class NodeNotFound(Absent, LookupError):
    """A name that does not exist at a level of a tree (a 404); the message names what does."""


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """How arrays are served: the settings that shape metadata and chunk bytes."""

    codec: Codec = Codec.BLOSC_LZ4
    chunk_edge: int = 32
    sharded: bool = False  # v3 layer trees only


# What rendering a metadata document holds while it is made, counted against the worker's memory budget before
# it is: the document around its arrays, and per array it describes (its attributes, multiscales entry and
# codecs as Python objects, then as JSON text and bytes).
DOCUMENT_BYTES = 16 << 10
DOCUMENT_ARRAY_BYTES = 16 << 10


@dataclass(slots=True)
class DatasetView:
    """A dataset as one tree serves it. ``documents`` memoizes rendered metadata of this view."""

    tree: "Tree"
    dataset: Dataset
    groups: dict[str, GroupNode]
    unusable: dict[str, str]  # names listed at the dataset level with the reason they cannot be served
    problems: dict[str, str]  # groups served in part, with what is wrong with the rest
    documents: dict[tuple[str, ...], Resource] = field(default_factory=dict)

    def group(self, name: str) -> GroupNode:
        found = self.groups.get(self.tree.group_alias(name))
        if found is None:
            where = f"{self.dataset.organization}/{self.dataset.name}"
            reason = self.unusable.get(name)
            layer = self.dataset.layers.get(name)
            if layer is not None and layer.away is not None:
                raise StoreUnavailableError(f"layer {name!r} of {where} cannot be reached: {layer.away}")
            if reason is not None:
                raise NodeNotFound(f"no servable {self.tree.group_kind} {name!r} in {where}: {reason}")
            raise NodeNotFound(
                f"no {self.tree.group_kind} {name!r} in {where}; there are {', '.join(self.groups) or 'none'}"
            )
        return found

    def array(self, group: GroupNode, name: str) -> ArrayNode:
        found = group.arrays.get(self.tree.array_alias(name))
        if found is None:
            detail = self.problems.get(group.name)
            raise NodeNotFound(
                f"no {self.tree.array_kind} {name!r} in {self.tree.group_kind} {group.name!r}; "
                f"there are {', '.join(group.arrays)}" + (f" ({detail})" if detail else "")
            )
        return found

    def document_bytes(self, key: tuple[str, ...]) -> int:
        """What rendering the document ``key`` holds (:data:`DOCUMENT_ARRAY_BYTES` for each array it describes:
        every array of the view at the dataset level, a group's at a group, one at an array), from the nodes
        alone; 0 once it is rendered."""
        if key in self.documents:
            return 0
        if len(key) == 1:
            arrays = sum(len(group.arrays) for group in self.groups.values())
        elif len(key) == 2 and key[0] in self.groups:
            arrays = len(self.groups[key[0]].arrays)
        else:
            arrays = 1
        return DOCUMENT_BYTES + arrays * DOCUMENT_ARRAY_BYTES

    def document(self, key: tuple[str, ...], make: Callable[[], Document]) -> Resource:
        """A metadata document as a JSON resource, rendered once per view (views are rebuilt on change)."""
        found = self.documents.get(key)
        if found is None:
            found = self.documents[key] = bytes_resource(json.dumps(make()).encode(), JSON)
        return found


class Tree(ABC):
    """One URL tree: its names per level and the documents they answer."""

    name: str
    zarr_format: int
    group_kind: str  # what a group is, for messages
    array_kind: str
    dataset_files: tuple[str, ...]
    group_files: tuple[str, ...]
    array_files: tuple[str, ...]

    @abstractmethod
    def build(self, dataset: Dataset, options: ServeOptions, plans: ShardPlans) -> DatasetView:
        """The dataset as this tree serves it."""

    @abstractmethod
    def dataset_document(self, view: DatasetView, name: str) -> Document: ...

    @abstractmethod
    def group_document(self, view: DatasetView, group: GroupNode, name: str) -> Document: ...

    @abstractmethod
    def array_document(self, node: ArrayNode, name: str) -> Document: ...

    @abstractmethod
    def parse_key(self, key: str, rank: int) -> tuple[int, ...]:
        """Grid indices of a chunk key; :class:`MalformedKey` if it is not one."""

    def array_alias(self, name: str) -> str:
        """The canonical name of an array named ``name`` in a URL."""
        return name

    def group_alias(self, name: str) -> str:
        """The canonical name of a group named ``name`` in a URL."""
        return name

    def misplaced(self, name: str, level: str, files: tuple[str, ...]) -> str:
        """Why a metadata name is a 404 at a level where it does not belong."""
        if name in METADATA_NAMES and name not in (*V2_METADATA, *V3_METADATA) and name not in files:
            return f"{name} exists only at the dataset level of the zarr and zarr3 trees"
        own = V2_METADATA if self.zarr_format == 2 else V3_METADATA
        if name not in own:
            return f"{name} belongs to the other Zarr version's tree; this is the {self.name} tree"
        return f"no {name} at the {level} level of the {self.name} tree; it answers {', '.join(files)}"


# --- the layer trees: a group per layer, an array per mag -------------------------------------------


def _layout(source: MagSource, zarr_format: int, options: ServeOptions, labels: bool = False) -> ArrayLayout:
    """How one mag is served: as file-sized shards, in the source's own encoding, or as plain chunks (``labels``:
    of a segmentation layer)."""
    channels = source.channels
    shape = (channels, *source.shape)
    stored = source.stored_chunk_shape
    cube = source.file_cube_edge
    if zarr_format == 3 and options.sharded and stored is not None and cube is not None:
        return ArrayLayout(shape, stored, source.dtype, shard_inner_codec(options.codec), (channels, cube, cube, cube))
    encoding = source.native
    if encoding is not None and encoding.chunk_shape[0] == channels:
        servable = (
            native.v2_order(encoding) is not None and native.v2_compressor(encoding)[0]
            if zarr_format == 2
            else native.v3_codecs(encoding) is not None
        )
        if servable:
            return ArrayLayout(
                shape, encoding.chunk_shape, source.dtype, options.codec, fill_value=source.fill_value, native=encoding
            )
    edge = options.chunk_edge
    chunks = (channels, edge, edge, edge)
    return ArrayLayout(shape, chunks, source.dtype, options.codec, fill_value=source.fill_value, labels=labels)


class LayerTree(Tree):
    group_kind = "layer"
    array_kind = "mag"

    def build(self, dataset: Dataset, options: ServeOptions, plans: ShardPlans) -> DatasetView:
        scale = dataset.properties.scale
        groups: dict[str, GroupNode] = {}
        unusable: dict[str, str] = {}
        problems: dict[str, str] = {}
        for name, layer in dataset.layers.items():
            if not layer.mags:
                unusable[name] = "; ".join(layer.problems) or "no usable mag"
                continue
            arrays: dict[str, ArrayNode] = {}
            described = []
            for mag, source in layer.mags.items():
                layout = _layout(source, self.zarr_format, options, layer.properties.category == "segmentation")
                sharded = plans if layout.shard_shape is not None else None
                arrays[mag_name(mag)] = SourceArray(served_mag(source, layout), AXES, plans=sharded)
                described.append(MagArray(mag, mag_name(mag), layout))
            description = LayerDescription(name, scale.factor, scale.unit, tuple(described))
            groups[name] = GroupNode(name, self.layer_attributes(description), arrays)
            if layer.problems:
                problems[name] = "; ".join(layer.problems)
        return DatasetView(self, dataset, groups, unusable, problems)

    @abstractmethod
    def layer_attributes(self, layer: LayerDescription) -> Attributes: ...

    def array_alias(self, name: str) -> str:
        return canonical_mag_name(name)

    def rewritten_properties(self, view: DatasetView) -> dict[str, Any]:
        """The dataset's ``datasource-properties.json`` as a Zarr dataset of this tree."""
        document: dict[str, Any] = json.loads(json.dumps(view.dataset.document))
        served_layers = []
        for layer in document.get("dataLayers", []):
            group = view.groups.get(layer.get("name"))
            if group is None:
                continue
            layer["dataFormat"] = "zarr" if self.zarr_format == 2 else "zarr3"
            layer.pop("wkwResolutions", None)
            layer["numChannels"] = view.dataset.layers[layer["name"]].properties.channels
            layer["mags"] = [
                {
                    "mag": list(mag),
                    "path": f"./{layer['name']}/{mag_name(mag)}",
                    "axisOrder": {"c": 0, "x": 1, "y": 2, "z": 3},
                }
                for mag in view.dataset.layers[layer["name"]].mags
            ]
            served_layers.append(layer)
        document["dataLayers"] = served_layers
        return document


class ZarrV2Tree(LayerTree):
    name = "zarr"
    zarr_format = 2
    dataset_files = (PROPERTIES, ".zgroup", ".zattrs", ".zmetadata")
    group_files = (".zgroup", ".zattrs", ".zmetadata")
    array_files = (".zarray", ".zattrs")

    def layer_attributes(self, layer: LayerDescription) -> Attributes:
        return ome_v04(layer)

    def parse_key(self, key: str, rank: int) -> tuple[int, ...]:
        return parse_v2_key(key, rank)

    def dataset_document(self, view: DatasetView, name: str) -> Document:
        if name == PROPERTIES:
            return self.rewritten_properties(view)
        if name == ".zmetadata":
            return self.consolidated(view, None)
        return zgroup() if name == ".zgroup" else {}

    def group_document(self, view: DatasetView, group: GroupNode, name: str) -> Document:
        if name == ".zmetadata":
            return self.consolidated(view, group)
        return zgroup() if name == ".zgroup" else group.attributes

    def array_document(self, node: ArrayNode, name: str) -> Document:
        return node.zarray() if name == ".zarray" else node.v2_attributes()

    def consolidated(self, view: DatasetView, only: GroupNode | None) -> ZMetadata:
        """``.zmetadata`` of the dataset group, or of one layer group."""
        metadata: dict[str, ZArray | ZGroup | Attributes] = {}
        if only is None:
            metadata = {".zgroup": zgroup(), ".zattrs": {}}
        for group in view.groups.values():
            if only is not None and group is not only:
                continue
            prefix = "" if only is not None else f"{group.name}/"
            metadata[f"{prefix}.zgroup"] = zgroup()
            metadata[f"{prefix}.zattrs"] = group.attributes
            for array_name, node in group.arrays.items():
                metadata[f"{prefix}{array_name}/.zarray"] = node.zarray()
                metadata[f"{prefix}{array_name}/.zattrs"] = node.v2_attributes()
        return zmetadata(metadata)


class ZarrV3Tree(LayerTree):
    name = "zarr3"
    zarr_format = 3
    dataset_files = (PROPERTIES, "zarr.json")
    group_files = ("zarr.json",)
    array_files = ("zarr.json",)

    def layer_attributes(self, layer: LayerDescription) -> Attributes:
        return ome_v05(layer)

    def parse_key(self, key: str, rank: int) -> tuple[int, ...]:
        return parse_v3_key(key, rank)

    def dataset_document(self, view: DatasetView, name: str) -> Document:
        if name == PROPERTIES:
            return self.rewritten_properties(view)
        return _consolidated_dataset(view.groups.values())

    def group_document(self, view: DatasetView, group: GroupNode, name: str) -> Document:
        return _consolidated_group(group)

    def array_document(self, node: ArrayNode, name: str) -> Document:
        return node.zarr_json()


def _consolidated_dataset(groups: Iterable[GroupNode]) -> GroupZarrJson:
    """The dataset group's ``zarr.json`` with every group and array below it consolidated inline.

    The entries are flat paths, as zarr-python writes them: a group's entry carries an empty consolidated block
    (its members follow as entries of their own), an array's entry is its ``zarr.json``.
    """
    metadata: dict[str, ArrayZarrJson | GroupZarrJson] = {}
    for group in groups:
        metadata[group.name] = group_zarr_json(group.attributes, members={})
        for array_name, node in group.arrays.items():
            metadata[f"{group.name}/{array_name}"] = node.zarr_json()
    return group_zarr_json(members=metadata)


def _consolidated_group(group: GroupNode) -> GroupZarrJson:
    """A group's ``zarr.json`` with its arrays consolidated inline."""
    members: dict[str, ArrayZarrJson | GroupZarrJson] = {name: node.zarr_json() for name, node in group.arrays.items()}
    return group_zarr_json(group.attributes, members)


# --- the xarray tree: a group per mag, an array per layer on the dataset's grid ---------------------


class XarrayTree(Tree):
    name = "xarray"
    zarr_format = 3
    group_kind = "mag"
    array_kind = "variable"
    dataset_files = ("zarr.json",)
    group_files = ("zarr.json",)
    array_files = ("zarr.json",)

    def build(self, dataset: Dataset, options: ServeOptions, plans: ShardPlans) -> DatasetView:
        scale = dataset.properties.scale
        plain = ServeOptions(options.codec, options.chunk_edge, sharded=False)
        by_mag: dict[Vec3, dict[str, MagSource]] = {}
        for layer_name, layer in dataset.layers.items():
            for mag, source in layer.mags.items():
                by_mag.setdefault(mag, {})[layer_name] = source
        groups: dict[str, GroupNode] = {}
        problems: dict[str, str] = {}
        for mag in sorted(by_mag):
            sources = by_mag[mag]
            x, y, z = (max(source.shape[axis] for source in sources.values()) for axis in range(3))
            grid = (x, y, z)
            arrays: dict[str, ArrayNode] = {}
            for axis, axis_name in enumerate(AXES[1:]):
                step = scale.factor[axis] * mag[axis]
                arrays[axis_name] = CoordinateArray(axis_name, grid[axis], step, {"units": scale.unit})
            # A layer named like a coordinate would replace it, and every variable is indexed by the coordinates.
            coordinates = {*arrays, *(f"c_{name}" for name, source in sources.items() if source.channels > 1)}
            clashing = [name for name in sources if name in coordinates]
            if clashing:
                problems[mag_name(mag)] = "; ".join(
                    f"layer {name!r} is not served here: its name is a coordinate's" for name in clashing
                )
            for layer_name, source in sources.items():
                if layer_name in clashing:
                    continue
                category = dataset.layers[layer_name].properties.category
                own = _layout(source, 3, plain, category == "segmentation")
                layout = dataclasses.replace(own, shape=(source.channels, *grid), shard_shape=None)
                channel = f"c_{layer_name}"
                names = (channel, *AXES[1:]) if source.channels > 1 else AXES[1:]
                if source.channels > 1:
                    arrays[channel] = CoordinateArray(channel, source.channels, 1, {})
                attributes = {"long_name": layer_name, "category": category}
                arrays[layer_name] = SourceArray(served_mag(source, layout), names, attributes)
            groups[mag_name(mag)] = GroupNode(mag_name(mag), {}, arrays)
        return DatasetView(self, dataset, groups, {}, problems)

    def parse_key(self, key: str, rank: int) -> tuple[int, ...]:
        return parse_v3_key(key, rank)

    def group_alias(self, name: str) -> str:
        return canonical_mag_name(name)

    def dataset_document(self, view: DatasetView, name: str) -> Document:
        return _consolidated_dataset(view.groups.values())

    def group_document(self, view: DatasetView, group: GroupNode, name: str) -> Document:
        return _consolidated_group(group)

    def array_document(self, node: ArrayNode, name: str) -> Document:
        return node.zarr_json()


TREES: dict[str, Tree] = {"zarr": ZarrV2Tree(), "zarr3": ZarrV3Tree(), "xarray": XarrayTree()}

__all__ = ["METADATA_NAMES", "PROPERTIES", "TREES", "DatasetView", "MalformedKey", "NodeNotFound", "Tree"]
