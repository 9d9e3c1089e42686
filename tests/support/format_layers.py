"""A layer of every format a mag can be stored in, each written by its own writer (``wkw``, zarr-python,
tensorstore): uint8 voxels in chunks of ``EDGE``³, and no file for a chunk of zeros (the fill value), as
those writers leave it. For the tests that must hold for every source format alike."""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import tensorstore as ts
import wkw
import zarr

EDGE = 32


@dataclass(frozen=True)
class Format:
    """How a layer of one format is written into its mag directory, and which file holds its first chunk."""

    data_format: str  # as datasource-properties.json names it
    write: Callable[[Path, np.ndarray], None]  # (mag directory, x-y-z voxels)
    origin_file: str  # below the mag directory: the chunk (a WKW cube, a shard) at the origin


def _write_wkw(mag: Path, data: np.ndarray) -> None:
    """One block per file, and no file for a block of zeros."""
    with wkw.Dataset.create(str(mag), wkw.Header(np.uint8, block_len=EDGE, file_len=1)) as dataset:
        for corner in np.ndindex(*(n // EDGE for n in data.shape)):
            block = data[tuple(slice(i * EDGE, (i + 1) * EDGE) for i in corner)]
            if block.any():
                dataset.write(tuple(i * EDGE for i in corner), np.ascontiguousarray(block))


def _zarr_writer(zarr_format: Literal[2, 3]) -> Callable[[Path, np.ndarray], None]:
    def write(mag: Path, data: np.ndarray) -> None:
        array = zarr.create_array(
            str(mag), shape=data.shape, chunks=(EDGE,) * 3, dtype="uint8", zarr_format=zarr_format, compressors=None
        )
        array[...] = data

    return write


def _write_n5(mag: Path, data: np.ndarray) -> None:
    metadata: dict[str, Any] = {"dimensions": list(data.shape), "blockSize": [EDGE] * 3, "dataType": "uint8"}
    metadata["compression"] = {"type": "raw"}
    spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(mag)}, "metadata": metadata}
    ts.open(spec, create=True).result()[...] = data


def _precomputed_writer(sharded: bool) -> Callable[[Path, np.ndarray], None]:
    def write(mag: Path, data: np.ndarray) -> None:
        scale: dict[str, Any] = {
            "key": mag.name,
            "size": list(data.shape),
            "resolution": [1.0] * 3,
            "voxel_offset": [0, 0, 0],
            "chunk_size": [EDGE] * 3,
            "encoding": "raw",
        }
        if sharded:  # one chunk per shard (for up to 8 chunks): a chunk's id, its Morton code, is its shard's number
            scale["sharding"] = {
                "@type": "neuroglancer_uint64_sharded_v1",
                "preshift_bits": 0,
                "hash": "identity",
                "minishard_bits": 0,
                "shard_bits": 3,
                "minishard_index_encoding": "raw",
                "data_encoding": "raw",
            }
        spec = {
            "driver": "neuroglancer_precomputed",
            "kvstore": {"driver": "file", "path": str(mag.parent)},  # the volume: its info, a directory per scale
            "multiscale_metadata": {"type": "image", "data_type": "uint8", "num_channels": 1},
            "scale_metadata": scale,
        }
        ts.open(spec, create=True, open=True).result()[...] = data[..., None]

    return write


FORMATS = {
    "wkw": Format("wkw", _write_wkw, "z0/y0/x0.wkw"),
    "zarr_v2": Format("zarr", _zarr_writer(2), "0.0.0"),
    "zarr_v3": Format("zarr3", _zarr_writer(3), "c/0/0/0"),
    "n5": Format("n5", _write_n5, "0/0/0"),
    "precomputed": Format("neuroglancerPrecomputed", _precomputed_writer(False), f"0-{EDGE}_0-{EDGE}_0-{EDGE}"),
    "precomputed_sharded": Format("neuroglancerPrecomputed", _precomputed_writer(True), "0.shard"),
}
