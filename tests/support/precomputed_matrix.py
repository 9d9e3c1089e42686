"""The precomputed tree's layout matrix (issue 42): layers of every source format, data type, bounding-box
alignment and channel count, each written by its format's own writer, and a covering selection of the cases.

The axes are crossed by :func:`pairwise_cases`, a greedy covering design generated from them: every pair of
values of two axes that some valid case holds appears in at least one case, so every value of every axis does,
without the full product. A case is one layer read through one gateway (its ``chunk_edge``) in one encoding.
"""

import itertools
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tensorstore as ts
import wkw
import zarr

from gateway_storage.geometry import Vec3, mag_name

ORG, DATASET = "matrix_org", "layouts"
MAGS: tuple[Vec3, ...] = ((1, 1, 1), (2, 2, 1))
SOURCE_CHUNK = 32  # every writer's chunk (a WKW block, a Zarr/N5 chunk, a precomputed chunk)
WKW_FILE_LEN = 2  # blocks per WKW file edge: 64³ files
CSEG_TYPES = ("uint32", "uint64")  # what compressed_segmentation encodes
SEGMENTATION_TYPES = ("uint8", "uint16", "uint32", "uint64")  # what webKnossos keeps segment ids in
# The data types of the precomputed format, and those it has not (listed as unusable, never served).
DATA_TYPES = ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "float32")
UNUSABLE_TYPES = ("int64", "float64")

# The bounding box at mag 1 (top left, size): at the origin and whole source chunks (what webKnossos writes for a
# layer of whole chunks); at the origin with a ragged end; on the 8³ blocks of compressed_segmentation but off the
# source's chunks; and on nothing.
ALIGNMENTS: dict[str, tuple[Vec3, Vec3]] = {
    "chunks": ((0, 0, 0), (64, 64, 32)),
    "origin": ((0, 0, 0), (70, 45, 33)),
    "blocks8": ((8, 16, 24), (56, 48, 40)),
    "unaligned": ((5, 11, 3), (61, 37, 29)),
}

AXES: dict[str, tuple[Any, ...]] = {
    "source": ("wkw_raw", "wkw_lz4", "wkw_lz4hc", "zarr_v2", "zarr_v3", "n5", "precomputed"),
    "dtype": DATA_TYPES,
    "edge": (32, 64, 128),  # the gateway's chunk_edge
    "alignment": tuple(ALIGNMENTS),
    "channels": (1, 3),
    "category": ("color", "segmentation"),
    "encoding": ("raw", "compressed_segmentation"),
}

Case = dict[str, Any]


def valid(case: Mapping[str, Any]) -> bool:
    """Whether a (partial) case can exist: a segmentation is one channel of unsigned ids, and only uint32 and
    uint64 segmentations are encoded as compressed_segmentation."""
    segmentation = case.get("category") == "segmentation"
    if segmentation and (case.get("channels", 1) != 1 or case.get("dtype", "uint8") not in SEGMENTATION_TYPES):
        return False
    compressed = case.get("encoding") == "compressed_segmentation"
    return not compressed or (
        case.get("category", "segmentation") == "segmentation" and case.get("dtype", "uint32") in CSEG_TYPES
    )


def pairs_of(case: Mapping[str, Any]) -> set[tuple[str, Any, str, Any]]:
    names = sorted(case)
    return {(a, case[a], b, case[b]) for a, b in itertools.combinations(names, 2)}


def pairwise_cases(axes: Mapping[str, tuple[Any, ...]], required: Iterable[Case] = ()) -> list[Case]:
    """A covering selection of the valid product of ``axes``: the ``required`` cases, then, greedily, the valid
    case that covers most pairs not covered yet, until every pair some valid case holds is covered."""
    names = list(axes)
    everything = [dict(zip(names, values)) for values in itertools.product(*axes.values())]
    candidates = [case for case in everything if valid(case)]
    uncovered = set().union(*(pairs_of(case) for case in candidates))
    chosen: list[Case] = []
    for case in required:
        assert valid(case) and set(case) == set(names), case
        chosen.append(case)
        uncovered -= pairs_of(case)
    while uncovered:
        best = max(candidates, key=lambda case: len(pairs_of(case) & uncovered))
        chosen.append(best)
        uncovered -= pairs_of(best)
    return chosen


@dataclass(frozen=True)
class LayerSpec:
    """One layer of the matrix's dataset: what a case reads, through whichever gateway and tree."""

    source: str
    dtype: str
    alignment: str
    channels: int
    category: str

    @property
    def name(self) -> str:
        return f"{self.source}_{self.dtype}_{self.alignment}_c{self.channels}_{self.category[:3]}"

    def box(self, mag: Vec3) -> tuple[Vec3, Vec3]:
        """The bounding box in the voxels of ``mag``, worked out here rather than by the code under test."""
        top_left, size = ALIGNMENTS[self.alignment]
        lo = (top_left[0] // mag[0], top_left[1] // mag[1], top_left[2] // mag[2])
        end = [t + s for t, s in zip(top_left, size)]
        hi = (-(-end[0] // mag[0]), -(-end[1] // mag[1]), -(-end[2] // mag[2]))
        return lo, hi


def layer_of(case: Case) -> LayerSpec:
    return LayerSpec(case["source"], case["dtype"], case["alignment"], case["channels"], case["category"])


def voxels(spec: LayerSpec, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """``(c, x, y, z)`` voxels over the whole range of the data type: segment ids from a palette of 40 (some
    past 2**32 for uint64) in blocks of 2³ with noise, random values for images (negative ones for signed)."""
    dtype = np.dtype(spec.dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    if spec.category == "segmentation":
        palette = rng.integers(1, info.max, size=40, dtype=dtype, endpoint=True)
        coarse = palette[rng.integers(0, 40, size=tuple(-(-s // 2) for s in shape))]
        labels = coarse.repeat(2, 1).repeat(2, 2).repeat(2, 3)[tuple(slice(0, s) for s in shape)]
        noise = rng.random(shape) < 0.1
        labels[noise] = palette[rng.integers(0, 40, size=int(noise.sum()))]
        return np.ascontiguousarray(labels)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


# --- writers: (mag directory, (c, x, y, z) voxels over [0, hi) with zeros outside the box, spec, mag) ----------

Writer = Callable[[Path, np.ndarray, LayerSpec, Vec3], None]


def _wkw_writer(block_type: int) -> Writer:
    def write(mag_dir: Path, data: np.ndarray, spec: LayerSpec, mag: Vec3) -> None:
        """Whole files written at the origin (a compressed WKW file is written whole), as webKnossos lays out
        a layer; files of zeros beyond the box are not written."""
        file_edge = SOURCE_CHUNK * WKW_FILE_LEN
        padded_shape = (data.shape[0], *(-(-n // file_edge) * file_edge for n in data.shape[1:]))
        padded = np.zeros(padded_shape, dtype=data.dtype)
        padded[tuple(slice(0, n) for n in data.shape)] = data
        header = wkw.Header(
            np.dtype(spec.dtype),
            num_channels=spec.channels,
            block_len=SOURCE_CHUNK,
            file_len=WKW_FILE_LEN,
            block_type=block_type,
        )
        with wkw.Dataset.create(str(mag_dir), header) as dataset:
            for corner in np.ndindex(*(n // file_edge for n in padded_shape[1:])):
                window = tuple(slice(i * file_edge, (i + 1) * file_edge) for i in corner)
                cube = padded[(slice(None), *window)]
                if cube.any():
                    dataset.write(tuple(i * file_edge for i in corner), np.ascontiguousarray(cube))

    return write


def _write_zarr_v2(mag_dir: Path, data: np.ndarray, spec: LayerSpec, mag: Vec3) -> None:
    chunks = (data.shape[0], SOURCE_CHUNK, SOURCE_CHUNK, SOURCE_CHUNK)
    array = zarr.create_array(str(mag_dir), shape=data.shape, chunks=chunks, dtype=spec.dtype, zarr_format=2)
    array[...] = data


def _write_zarr_v3(mag_dir: Path, data: np.ndarray, spec: LayerSpec, mag: Vec3) -> None:
    """Sharded, with the dimension names webknossos-libs gives its arrays."""
    chunks = (data.shape[0], SOURCE_CHUNK, SOURCE_CHUNK, SOURCE_CHUNK)
    shards = (data.shape[0], 2 * SOURCE_CHUNK, 2 * SOURCE_CHUNK, 2 * SOURCE_CHUNK)
    array = zarr.create_array(
        str(mag_dir),
        shape=data.shape,
        chunks=chunks,
        shards=shards,
        dtype=spec.dtype,
        zarr_format=3,
        dimension_names=["c", "x", "y", "z"],
    )
    array[...] = data


def _write_n5(mag_dir: Path, data: np.ndarray, spec: LayerSpec, mag: Vec3) -> None:
    """Dimensions x, y, z, c (N5 lists the fastest first), named by the ``axes`` attribute."""
    shape = (*data.shape[1:], data.shape[0])
    metadata: dict[str, Any] = {"dimensions": list(shape), "blockSize": [SOURCE_CHUNK] * 3 + [data.shape[0]]}
    metadata |= {"dataType": spec.dtype, "compression": {"type": "gzip"}, "axes": ["x", "y", "z", "c"]}
    opened = ts.open(
        {"driver": "n5", "kvstore": {"driver": "file", "path": str(mag_dir)}, "metadata": metadata}, create=True
    )
    opened.result()[...] = np.moveaxis(data, 0, -1)


def _write_precomputed(mag_dir: Path, data: np.ndarray, spec: LayerSpec, mag: Vec3) -> None:
    """A scale of the layer's volume over the box only (its ``voxel_offset``), as tensorstore writes it; a
    segmentation's scale in compressed_segmentation."""
    lo, hi = spec.box(mag)
    scale: dict[str, Any] = {
        "key": mag_dir.name,
        "size": [h - low for low, h in zip(lo, hi)],
        "resolution": [float(m) for m in mag],
        "voxel_offset": list(lo),
        "chunk_size": [SOURCE_CHUNK] * 3,
        "encoding": "raw",
    }
    if spec.category == "segmentation" and spec.dtype in CSEG_TYPES:
        scale |= {"encoding": "compressed_segmentation", "compressed_segmentation_block_size": [8, 8, 8]}
    kind = "segmentation" if spec.category == "segmentation" else "image"
    opened = ts.open(
        {
            "driver": "neuroglancer_precomputed",
            "kvstore": {"driver": "file", "path": str(mag_dir.parent)},
            "multiscale_metadata": {"type": kind, "data_type": spec.dtype, "num_channels": spec.channels},
            "scale_metadata": scale,
        },
        create=True,
        open=True,
    ).result()
    inside = data[(slice(None), *(slice(a, b) for a, b in zip(lo, hi)))]
    opened[...] = np.moveaxis(inside, 0, -1)
    mag_dir.mkdir(exist_ok=True)  # a scale none of whose chunks is written yet


WRITERS: dict[str, tuple[str, Writer]] = {  # source: (dataFormat, writer)
    "wkw_raw": ("wkw", _wkw_writer(wkw.Header.BLOCK_TYPE_RAW)),
    "wkw_lz4": ("wkw", _wkw_writer(wkw.Header.BLOCK_TYPE_LZ4)),
    "wkw_lz4hc": ("wkw", _wkw_writer(wkw.Header.BLOCK_TYPE_LZ4HC)),
    "zarr_v2": ("zarr", _write_zarr_v2),
    "zarr_v3": ("zarr3", _write_zarr_v3),
    "n5": ("n5", _write_n5),
    "precomputed": ("neuroglancerPrecomputed", _write_precomputed),
}


def _element_class(dtype: str) -> str:
    return {"float32": "float", "float64": "double"}.get(dtype, dtype)


def _layer_entry(spec: LayerSpec) -> dict[str, Any]:
    top_left, size = ALIGNMENTS[spec.alignment]
    data_format, _ = WRITERS[spec.source]
    mags = []
    for mag in MAGS:
        entry: dict[str, Any] = {"mag": list(mag), "path": f"./{spec.name}/{mag_name(mag)}"}
        if spec.source == "zarr_v2":
            entry["axisOrder"] = {"c": 0, "x": 1, "y": 2, "z": 3}
        mags.append(entry)
    layer: dict[str, Any] = {
        "name": spec.name,
        "category": spec.category,
        "boundingBox": {"topLeft": list(top_left), "width": size[0], "height": size[1], "depth": size[2]},
        "elementClass": _element_class(spec.dtype),
        "dataFormat": data_format,
        "numChannels": spec.channels,
        "mags": mags,
    }
    if spec.category == "segmentation":
        layer["largestSegmentId"] = int(np.iinfo(spec.dtype).max)
    return layer


Truth = dict[tuple[str, Vec3], np.ndarray]  # (layer, mag): (c, x, y, z) over [0, box end), zeros outside the box


def write_dataset(directory: Path, specs: Iterable[LayerSpec], seed: int) -> Truth:
    """Every layer's mags, each by its format's writer, and ``datasource-properties.json`` naming them; returns
    what each mag must read as (for WKW, the ``wkw`` package's own read of what was written)."""
    rng = np.random.default_rng(seed)
    truth: Truth = {}
    layers = []
    for spec in specs:
        _, write = WRITERS[spec.source]
        for mag in MAGS:
            lo, hi = spec.box(mag)
            data = np.zeros((spec.channels, *hi), dtype=spec.dtype)
            window = (slice(None), *(slice(a, b) for a, b in zip(lo, hi)))
            data[window] = voxels(spec, data[window].shape, rng)
            mag_dir = directory / spec.name / mag_name(mag)
            write(mag_dir, data, spec, mag)
            if spec.source.startswith("wkw"):
                with wkw.Dataset.open(str(mag_dir)) as written:
                    read: np.ndarray = written.read((0, 0, 0), hi)
                np.testing.assert_array_equal(read, data)  # the writer kept what it was given
                data = read
            truth[(spec.name, mag)] = data
        layers.append(_layer_entry(spec))
    document = {
        "id": {"name": directory.name, "team": ""},
        "scale": {"factor": [4.0, 4.0, 40.0], "unit": "nanometer"},
        "dataLayers": layers,
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "datasource-properties.json").write_text(json.dumps(document, indent=1))
    return truth
