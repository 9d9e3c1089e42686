"""The documents of both trees for one dataset, all derived from one description per layer."""

import json
from dataclasses import dataclass

from ..sources.catalog import Dataset
from ..sources.mag import MagSource
from ..sources.properties import mag_name
from ..sources.wkw_source import WkwMagSource
from ..sources.zarr_source import NativeEncoding, ZarrMagSource
from . import native
from .chunks import ServedMag, served_mag, shard_inner_codec
from .codecs import Codec
from .layout import (
    ArrayLayout,
    LayerDescription,
    MagArray,
    array_zarr_json,
    group_zarr_json,
    ome_v04,
    ome_v05,
    zarray,
)


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """How arrays are served: the settings that shape metadata and chunk bytes."""

    codec: Codec = Codec.BLOSC_LZ4
    chunk_edge: int = 32
    sharded: bool = False  # v3 tree only


@dataclass(frozen=True, slots=True)
class LayerView:
    description: LayerDescription
    mags: dict[str, ServedMag]  # by URL name ("1", "2-2-1")


@dataclass(frozen=True, slots=True)
class DatasetView:
    """A dataset as one tree serves it."""

    dataset: Dataset
    version: int  # 2 or 3
    layers: dict[str, LayerView]

    def mag(self, layer: str, name: str) -> ServedMag | None:
        """A mag by its short ("2") or long ("2-2-2") URL name."""
        view = self.layers.get(layer)
        if view is None:
            return None
        parts = name.split("-")
        if len(parts) == 3 and len(set(parts)) == 1:
            name = parts[0]
        return view.mags.get(name)


def _layout(source: MagSource, version: int, options: ServeOptions) -> ArrayLayout:
    """How one mag is served in one tree: WKW as plain chunks or file-sized shards, Zarr as stored if possible."""
    channels = source.channels
    shape = (channels, *source.shape)
    if isinstance(source, WkwMagSource) and version == 3 and options.sharded:
        edge, shard = source.block_len, source.file_voxel_len
        return ArrayLayout(
            shape,
            (channels, edge, edge, edge),
            source.dtype,
            shard_inner_codec(options.codec),
            (channels, shard, shard, shard),
        )
    if isinstance(source, ZarrMagSource) and _servable_as_stored(source.native, channels, version):
        return ArrayLayout(
            shape,
            source.native.chunk_shape,
            source.dtype,
            options.codec,  # type: ignore[union-attr]
            fill_value=source.fill_value,
            native=source.native,
        )
    edge = options.chunk_edge
    return ArrayLayout(shape, (channels, edge, edge, edge), source.dtype, options.codec, fill_value=source.fill_value)


def _servable_as_stored(encoding: NativeEncoding | None, channels: int, version: int) -> bool:
    if encoding is None or encoding.chunk_shape[0] != channels:
        return False
    if version == 2:
        return native.v2_order(encoding) is not None and native.v2_compressor(encoding)[0]
    return native.v3_codecs(encoding) is not None


def dataset_view(dataset: Dataset, version: int, options: ServeOptions) -> DatasetView:
    scale = dataset.properties.scale
    layers = {}
    for name, layer in dataset.layers.items():
        mags = {}
        arrays = []
        for mag, source in layer.mags.items():
            layout = _layout(source, version, options)
            mags[mag_name(mag)] = served_mag(source, layout)
            arrays.append(MagArray(mag, mag_name(mag), layout))
        description = LayerDescription(name, scale.factor, scale.unit, tuple(arrays))
        layers[name] = LayerView(description, mags)
    return DatasetView(dataset, version, layers)


def rewritten_properties(view: DatasetView) -> dict:
    """The dataset's ``datasource-properties.json`` as a Zarr dataset of this tree."""
    document = json.loads(json.dumps(view.dataset.document))
    data_format = "zarr" if view.version == 2 else "zarr3"
    served_layers = []
    for layer in document.get("dataLayers", []):
        layer_view = view.layers.get(layer.get("name"))
        if layer_view is None or not layer_view.mags:
            continue
        layer["dataFormat"] = data_format
        layer.pop("wkwResolutions", None)
        layer["numChannels"] = view.dataset.layers[layer["name"]].properties.channels
        layer["mags"] = [
            {"mag": list(m.mag), "path": f"./{layer['name']}/{m.path}", "axisOrder": {"c": 0, "x": 1, "y": 2, "z": 3}}
            for m in layer_view.description.mags
        ]
        served_layers.append(layer)
    document["dataLayers"] = served_layers
    return document


def layer_attributes_v2(layer: LayerView) -> dict:
    return ome_v04(layer.description)


def layer_zarr_json(layer: LayerView) -> dict:
    return group_zarr_json(ome_v05(layer.description))


def consolidated_v2(view: DatasetView, layer: str | None = None) -> dict:
    """``.zmetadata`` for the dataset group, or for one layer group."""
    metadata: dict[str, dict] = {}
    for name, layer_view in view.layers.items():
        if layer is not None and name != layer:
            continue
        prefix = "" if layer is not None else f"{name}/"
        metadata[f"{prefix}.zgroup"] = {"zarr_format": 2}
        metadata[f"{prefix}.zattrs"] = layer_attributes_v2(layer_view)
        for mag_path, served in layer_view.mags.items():
            metadata[f"{prefix}{mag_path}/.zarray"] = zarray(served.layout)
            metadata[f"{prefix}{mag_path}/.zattrs"] = {}
    if layer is None:
        metadata = {".zgroup": {"zarr_format": 2}, ".zattrs": {}, **metadata}
    return {"zarr_consolidated_format": 1, "metadata": metadata}


def dataset_zarr_json(view: DatasetView) -> dict:
    """The dataset group's ``zarr.json`` with every layer and mag consolidated inline."""
    metadata: dict[str, dict] = {}
    for name, layer_view in view.layers.items():
        metadata[name] = layer_zarr_json(layer_view)
        for mag_path, served in layer_view.mags.items():
            metadata[f"{name}/{mag_path}"] = array_zarr_json(served.layout)
    document = group_zarr_json()
    document["consolidated_metadata"] = {"kind": "inline", "must_understand": False, "metadata": metadata}
    return document
