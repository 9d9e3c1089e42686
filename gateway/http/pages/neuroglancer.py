"""Neuroglancer states for the gateway's layers: sources of the served trees and meshes, carried in a link.

The state goes into the link's ``#!`` fragment, percent-encoded whole, so no URL appears literally in a page.
"""

import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from gateway_storage.geometry import Box

from ...sources.units import meters_per_unit
from .links import LinkForm
from .markup import path_of

NEUROGLANCER_SCHEMES = {"zarr": ("zarr2", "zarr"), "zarr3": ("zarr3", "zarr3"), "xarray": ("zarr3", "zarr3")}


def neuroglancer_source(base: str, tree: str, organization: str, dataset: str, layer: str, links: LinkForm) -> str:
    """The layer group as a Neuroglancer source: zarr2:// of the v2 tree, zarr3:// of the v3 tree for the others;
    the page's credential in its path (Neuroglancer cannot be given one any other way for every client in use:
    its zarr sources refuse a query, or in older clients append keys to it, and a link cannot set a header)."""
    scheme, served_tree = NEUROGLANCER_SCHEMES.get(tree, NEUROGLANCER_SCHEMES["zarr3"])
    return f"{scheme}://{base}{links.path_prefix}/data/{served_tree}/{path_of(organization, dataset, layer)}/"


def mesh_source(base: str, organization: str, dataset: str, layer: str, links: LinkForm) -> str:
    """The layer's multi-resolution mesh source (:mod:`gateway.meshes`) in Neuroglancer's pipeline syntax, with
    the credential in the path as for the volume sources."""
    url = f"{base}{links.path_prefix}/data/meshes/{path_of(organization, dataset, layer)}/multires/"
    return f"{url}|neuroglancer-precomputed:"


def neuroglancer_layer(
    source: str, name: str, category: str, meshes: str | None = None, segments: Sequence[int] = ()
) -> dict[str, Any]:
    """One layer of a Neuroglancer state; a segmentation with its mesh source and the segments to show."""
    if category != "segmentation":
        return {"type": "image", "source": source, "name": name}
    layer: dict[str, Any] = {
        "type": "segmentation",
        "source": source if meshes is None else [source, meshes],
        "name": name,
    }
    if segments:
        layer["segments"] = [str(segment) for segment in segments]
    return layer


def neuroglancer_link(
    neuroglancer_url: str,
    source_url: str,
    layer_name: str,
    category: str,
    voxel_size: tuple[float, float, float],
    unit: str,
    layers: Sequence[dict[str, Any]] = (),
    box: Box | None = None,
) -> str:
    """A link that opens Neuroglancer on ``layers`` (by default the one layer), ``layer_name`` selected, its
    x, y, z dimensions the dataset's voxel size, centred on ``box`` (mag-1 voxels).

    Neuroglancer's state holds scales in meters; giving them keeps anisotropic data from looking squashed.
    The position is given, not left to Neuroglancer: it centres the view on the bounds of whichever source
    answers first, and a mesh source, which has none, would put it at the origin's corner.
    """
    meters = meters_per_unit(unit)
    state: dict[str, Any] = {
        "dimensions": {axis: [float(f"{size * meters:.12g}"), "m"] for axis, size in zip("xyz", voxel_size)},
        "layers": list(layers) or [neuroglancer_layer(source_url, layer_name, category)],
        "selectedLayer": {"layer": layer_name},
        "layout": "4panel",
    }
    if box is not None:
        state["position"] = [(low + high) / 2 for low, high in zip(box.lo, box.hi)]
    fragment = quote(json.dumps(state, separators=(",", ":")), safe="")
    return f"{neuroglancer_url.split('#')[0]}#!{fragment}"
