"""The clients users read with (tensorstore, zarr-python), opened on a served array's URL."""

from collections.abc import Iterator, Mapping
from types import EllipsisType
from typing import Any, Literal, cast

import numpy as np

Region = tuple[slice, ...] | EllipsisType


def read_tensorstore(
    url: str, zarr_format: int = 3, headers: Mapping[str, str] | None = None, region: Region = ...
) -> np.ndarray[Any, Any]:
    """``region`` of the array at ``url`` (all of it by default), read by tensorstore's zarr or zarr3 driver."""
    import tensorstore as ts

    kvstore: dict[str, Any] = {"driver": "http", "base_url": url + "/"}
    if headers:
        kvstore["headers"] = [f"{k}: {v}" for k, v in headers.items()]
    spec = {"driver": "zarr3" if zarr_format == 3 else "zarr", "kvstore": kvstore}
    store = ts.open(spec, read=True).result()
    data: np.ndarray[Any, Any] = store[region].read().result()
    return data


def read_zarr_python(
    url: str, zarr_format: int | None = None, headers: Mapping[str, str] | None = None, region: Region = ...
) -> np.ndarray[Any, Any]:
    """``region`` of the array at ``url`` (all of it by default), read by zarr-python over fsspec's HTTP."""
    import zarr

    version = cast(Literal[2, 3] | None, zarr_format)
    options = {"headers": dict(headers)} if headers else None
    array = zarr.open_array(url, mode="r", zarr_format=version, storage_options=options)
    data: np.ndarray[Any, Any] = np.asarray(array[region])
    return data


def read_webknossos_mags(layer: Any) -> Iterator[tuple[tuple[int, int, int], np.ndarray[Any, Any], Region]]:
    """Each mag of a webknossos-libs layer read whole: its mag, its data (channel first) and its region in the mag."""
    for mag_view in layer.mags.values():
        bbox = layer.bounding_box.align_with_mag(mag_view.mag, ceil=True)
        data = mag_view.read(absolute_bounding_box=bbox)
        if data.ndim == 3:
            data = data[np.newaxis]
        in_mag = bbox.in_mag(mag_view.mag)
        region = (slice(None), *(slice(a, b) for a, b in zip(in_mag.topleft, in_mag.bottomright)))
        yield mag_view.mag.to_tuple(), data, region
