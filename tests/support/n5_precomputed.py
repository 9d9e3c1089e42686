"""N5 and Neuroglancer precomputed layers written by tensorstore, their properties by webknossos-libs, and what
each mag must read as (tensorstore reading the source directly).

N5 raw, gzip, blosc, zlib, zstd and bzip2; precomputed raw, jpeg, png, a 3-channel volume, sharded scales with
both hashes, and a ``compressed_segmentation`` segmentation. test_n5_precomputed serves them through the Zarr
trees, test_precomputed_sources through the precomputed tree.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import tensorstore as ts

from gateway_storage.geometry import Box, Vec3, mag_name, vec3

ORG, DATASET = "formats_org", "formats"
MAGS = ((1, 1, 1), (2, 2, 1))
TOP_LEFT = (4, 6, 2)  # the bounding box at mag 1: chunks at its low faces straddle it
SIZE = (100, 70, 40)
N5_BLOCK = (32, 32, 16)
PC_CHUNK = (32, 32, 16)


def box_at(mag: tuple[int, int, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    lo = tuple(t // m for t, m in zip(TOP_LEFT, mag))
    hi = tuple(-(-(t + s) // m) for t, s, m in zip(TOP_LEFT, SIZE, mag))
    return lo, hi


Expected = dict[tuple[str, Vec3], np.ndarray]  # the expected fixture: (layer, mag) to the voxels it must read as


@dataclass(frozen=True)
class LayerSpec:
    name: str
    data_format: str  # n5 or neuroglancerPrecomputed
    dtype: str
    category: Literal["color", "segmentation"] = "color"
    channels: int = 1
    compression: dict[str, Any] | None = None  # N5
    encoding: str = "raw"  # precomputed
    sharding: tuple[str | None, ...] = (None, None)  # precomputed, per mag: None or the hash

    @property
    def is_n5(self) -> bool:
        return self.data_format == "n5"


LAYERS = [
    LayerSpec("n5_raw", "n5", "uint16", compression={"type": "raw"}),
    LayerSpec("n5_gzip", "n5", "uint8", compression={"type": "gzip"}),
    LayerSpec("n5_blosc", "n5", "uint32", compression={"type": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1}),
    LayerSpec("n5_zlib", "n5", "uint16", compression={"type": "gzip", "useZlib": True}),
    LayerSpec("n5_zstd", "n5", "int16", compression={"type": "zstd", "level": 3}),
    LayerSpec("n5_bzip2", "n5", "uint16", compression={"type": "bzip2"}),
    LayerSpec("pc_raw", "neuroglancerPrecomputed", "uint8"),
    LayerSpec("pc_jpeg", "neuroglancerPrecomputed", "uint8", encoding="jpeg"),
    LayerSpec("pc_png", "neuroglancerPrecomputed", "uint16", encoding="png"),
    LayerSpec("pc_rgb", "neuroglancerPrecomputed", "uint8", channels=3),
    LayerSpec("pc_sharded", "neuroglancerPrecomputed", "uint16", sharding=("identity", "murmurhash3_x86_128")),
    LayerSpec(
        "pc_segmentation",
        "neuroglancerPrecomputed",
        "uint32",
        category="segmentation",
        encoding="compressed_segmentation",
        sharding=(None, "identity"),
    ),
]
BY_NAME = {spec.name: spec for spec in LAYERS}


def layer_voxels(spec: LayerSpec, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if spec.category == "segmentation":  # blocky labels, as a segmentation is
        coarse = rng.integers(0, 2**31, size=tuple(-(-s // 4) for s in shape), dtype=np.uint32)
        full = coarse.repeat(4, 0).repeat(4, 1).repeat(4, 2)
        return full[tuple(slice(0, s) for s in shape)].astype(spec.dtype)
    if spec.encoding in ("jpeg", "png"):  # smooth: what images are, and a lossy encoding keeps something of it
        x, y, z = np.meshgrid(*(np.arange(s) for s in shape[:3]), indexing="ij")
        smooth = ((x * 2 + y * 3 + z) % 256).astype(spec.dtype)
        return np.broadcast_to(smooth[..., None], shape).copy()
    info = np.iinfo(spec.dtype)
    return rng.integers(max(info.min, -(2**31)), min(info.max, 2**31), size=shape, dtype=spec.dtype, endpoint=True)


def sharding_document(hash_name: str) -> dict[str, Any]:
    return {
        "@type": "neuroglancer_uint64_sharded_v1",
        "preshift_bits": 1,
        "hash": hash_name,
        "minishard_bits": 2,
        "shard_bits": 2,
        "minishard_index_encoding": "gzip",
        "data_encoding": "gzip",
    }


def _write_n5(directory: Path, spec: LayerSpec, shape: tuple[int, ...], rng: np.random.Generator) -> None:
    metadata: dict[str, Any] = {"dimensions": list(shape), "blockSize": list(N5_BLOCK), "dataType": spec.dtype}
    metadata["compression"] = spec.compression
    array = ts.open(
        {"driver": "n5", "kvstore": {"driver": "file", "path": str(directory)}, "metadata": metadata}, create=True
    )
    array.result()[...] = layer_voxels(spec, shape, rng)


def _write_precomputed(
    volume: Path, spec: LayerSpec, mag: tuple[int, int, int], sharding: str | None, rng: np.random.Generator
) -> None:
    lo, hi = box_at(mag)
    scale: dict[str, Any] = {
        "key": mag_name(mag),
        "size": [h - low for low, h in zip(lo, hi)],
        "resolution": [float(m) for m in mag],
        "voxel_offset": list(lo),
        "chunk_size": list(PC_CHUNK),
        "encoding": spec.encoding,
    }
    if spec.encoding == "compressed_segmentation":
        scale["compressed_segmentation_block_size"] = [8, 8, 8]
    if sharding is not None:
        scale["sharding"] = sharding_document(sharding)
    kind = "segmentation" if spec.category == "segmentation" else "image"
    multiscale = {"type": kind, "data_type": spec.dtype, "num_channels": spec.channels}
    array = ts.open(
        {
            "driver": "neuroglancer_precomputed",
            "kvstore": {"driver": "file", "path": str(volume)},
            "multiscale_metadata": multiscale,
            "scale_metadata": scale,
        },
        create=True,
        open=True,
    ).result()
    shape = (*scale["size"], spec.channels)
    array[...] = (
        layer_voxels(spec, shape[:3], rng)[..., None]
        if spec.category == "segmentation"
        else layer_voxels(spec, shape, rng)
    )


def source_array(root: Path, dataset: str, spec: LayerSpec, mag: tuple[int, int, int]) -> np.ndarray:
    """What tensorstore reads from the source itself, as served: ``(c, x, y, z)`` over ``[0, bbox end)``,
    zero outside the bounding box."""
    lo, hi = box_at(mag)
    out = np.zeros((spec.channels, *hi), dtype=spec.dtype)
    window = Box(vec3(lo), vec3(hi)).slices()
    directory = root / ORG / dataset / spec.name
    if spec.is_n5:
        opened = ts.open({"driver": "n5", "kvstore": {"driver": "file", "path": str(directory / mag_name(mag))}})
        out[(0, *window)] = opened.result()[window].read().result()
    else:
        kvstore = {"driver": "file", "path": str(directory)}
        spec_json = {"driver": "neuroglancer_precomputed", "kvstore": kvstore, "scale_metadata": {"key": mag_name(mag)}}
        data = ts.open(spec_json).result()[(*window, slice(None))].read().result()
        out[(slice(None), *window)] = np.moveaxis(data, 3, 0)
    return out


def _write_properties_with_webknossos(dataset_dir: Path, specs: list[LayerSpec]) -> None:
    """The properties as webknossos-libs writes them for existing N5 and precomputed mags.

    webknossos-libs cannot create those arrays, only record them: a layer of that ``data_format`` and a mag
    for the files already there (its ``_add_mag_for_existing_files``, what ``add_layer_for_existing_files``
    calls for each mag of the formats it detects on its own).
    """
    import webknossos as wk
    from upath import UPath

    staging = dataset_dir.parent / f".{dataset_dir.name}-data"
    dataset_dir.rename(staging)  # webknossos-libs creates a dataset only in an empty directory
    dataset = wk.Dataset(dataset_dir, voxel_size=(11.24, 11.24, 28.0))
    for child in staging.iterdir():
        child.rename(dataset_dir / child.name)
    staging.rmdir()
    for spec in specs:
        kwargs: dict[str, Any] = {"largest_segment_id": 2**31} if spec.category == "segmentation" else {}
        layer = dataset.add_layer(
            spec.name,
            spec.category,
            dtype=spec.dtype,
            num_channels=spec.channels,
            data_format=spec.data_format,
            **kwargs,
        )
        for mag in MAGS:
            layer._add_mag_for_existing_files(mag_name(mag), UPath(dataset_dir / spec.name / mag_name(mag)), True)
        layer.bounding_box = wk.BoundingBox(TOP_LEFT, SIZE)


def write_dataset(dataset_dir: Path, specs: list[LayerSpec], seed: int) -> None:
    rng = np.random.default_rng(seed)
    for spec in specs:
        for mag, sharding in zip(MAGS, spec.sharding):
            _, hi = box_at(mag)
            if spec.is_n5:
                _write_n5(dataset_dir / spec.name / mag_name(mag), spec, hi, rng)
            else:
                _write_precomputed(dataset_dir / spec.name, spec, mag, sharding, rng)
                (dataset_dir / spec.name / mag_name(mag)).mkdir(exist_ok=True)  # a scale with no chunk yet
    _write_properties_with_webknossos(dataset_dir, specs)
