"""The benchmark's WKW dataset: LZ4HC uint8 and raw uint16 layers of a large virtual extent, and a segmentation
with an agglomerate mapping (the mapped rows).

Only the files that requests touch exist. The voxels have EM-like statistics so that LZ4HC blocks
compress as real data does; a stamp lets a later run reuse a dataset of the same parameters.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from gateway.sample import smooth_lattice_grid
from gateway_storage import LocalStore
from gateway_storage.geometry import Vec3, mag_name
from wkw_adapter import BlockType, WkwFileCache, WkwHeader, WkwMag, compress_block, morton_decode, write_mag

from .config import (
    BLOCK,
    DATA_CUBE,
    DATA_ORIGIN,
    DATA_VERSION,
    DATASET,
    EXTENT,
    MAPPING,
    ORG,
    SEED,
    SEGMENTATION,
    SMALL_BLOCK,
    SMALL_LAYER,
    Mode,
    log,
)


class _Smooth:
    """Smooth random field: normal values on a coarse lattice, smoothstep-interpolated."""

    def __init__(self, rng: np.random.Generator, edge: int, spacing: int) -> None:
        self.spacing = spacing
        self.lattice = rng.standard_normal((edge // spacing + 3,) * 3).astype(np.float32)

    def slab(self, edge: int, z0: int, depth: int) -> np.ndarray:
        """The field over ``[0, edge) x [0, edge) x [z0, z0 + depth)``, indexed ``[x, y, z]``."""
        ranges = ((0, edge), (0, edge), (z0, depth))
        coords = [np.arange(start, start + count, dtype=np.float64) / self.spacing for start, count in ranges]
        return smooth_lattice_grid(self.lattice, coords)


_FIELDS: dict[str, Any] = {}


def _init_fields(fields: dict[str, Any]) -> None:
    _FIELDS.update(fields)


def _make_slab(bz: int) -> tuple[int, list[bytes], np.ndarray | None]:
    """One z-layer of blocks: LZ4HC-compressed blocks in [by][bx] order, and the voxels the u16 layer needs.

    EM-like statistics: smooth structure with grain, quantised, plus noise whose strength varies
    in space, so LZ4HC blocks of 32 KiB come out at roughly 15-30 KiB.
    """
    edge, keep = _FIELDS["edge"], _FIELDS["keep"]
    z0 = bz * BLOCK
    value = 128.0 + 70.0 * _FIELDS["coarse"].slab(edge, z0, BLOCK) + 25.0 * _FIELDS["fine"].slab(edge, z0, BLOCK)
    amplitude = np.clip(1.6 + 1.5 * _FIELDS["amplitude"].slab(edge, z0, BLOCK), 0.3, 3.5)
    rng = np.random.default_rng([SEED, bz])
    value += amplitude * rng.standard_normal(value.shape, dtype=np.float32)
    slab = np.clip(np.rint(value / 3.0) * 3.0, 0, 255).astype(np.uint8)
    n = edge // BLOCK
    blocks = []
    for by in range(n):
        for bx in range(n):
            raw = slab[bx * BLOCK : (bx + 1) * BLOCK, by * BLOCK : (by + 1) * BLOCK, :].tobytes(order="F")
            blocks.append(compress_block(raw, BlockType.LZ4HC))
    return bz, blocks, (slab[:keep, :keep, :].copy() if z0 < keep else None)


def _write_wkw_file(path: Path, header: WkwHeader, block_at: Callable[[Vec3], bytes]) -> None:
    """A data file from already-encoded blocks (``block_at`` gets the block's position in the file)."""
    header = header.with_data_offset(header.file_data_offset)
    blocks = [block_at(morton_decode(i)) for i in range(header.blocks_per_file)]
    parts = [header.encode()]
    if header.block_type.compressed:
        ends = np.cumsum([len(b) for b in blocks], dtype=np.uint64) + np.uint64(header.data_offset)
        parts.append(ends.astype("<u8").tobytes())
    parts.extend(blocks)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(parts))


def _write_mag_header(directory: Path, header: WkwHeader) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "header.wkw").write_bytes(header.with_data_offset(0).encode())


def _shifted(blocks: dict[Vec3, bytes], corner: Vec3) -> Callable[[Vec3], bytes]:
    """The blocks of a file whose first block is ``corner`` of ``blocks``, by position in the file."""

    def block_at(position: Vec3) -> bytes:
        return blocks[(corner[0] + position[0], corner[1] + position[1], corner[2] + position[2])]

    return block_at


REGION = 64  # the ids of one region of the labels lie in a window of the id space ...
WINDOW = 20_000  # ... this wide, spread over the whole mapping
SEGMENT_BLOCK = 8  # labels come in blocks of this edge, one id each
PER_AGGLOMERATE = 50  # consecutive segments joined into one agglomerate


def segmentation_labels(box: Vec3, entries: int) -> np.ndarray:
    """Labels of ``box`` voxels (uint32) for a mapping of ``entries`` entries: ids in 8³ blocks, those of each 64³
    region in a window of WINDOW ids at a random place in the mapping, as a blockwise watershed numbers
    supervoxels."""
    rng = np.random.default_rng(SEED + 43)
    blocks = tuple(s // SEGMENT_BLOCK for s in box)
    regions = tuple(s // REGION for s in box)
    bases = rng.integers(1, max(2, entries - WINDOW), size=regions, dtype=np.int64)
    per = REGION // SEGMENT_BLOCK
    base = np.repeat(np.repeat(np.repeat(bases, per, 0), per, 1), per, 2)
    ids = (base + rng.integers(0, WINDOW, size=blocks)).astype(np.uint32)
    return np.repeat(np.repeat(np.repeat(ids, SEGMENT_BLOCK, 0), SEGMENT_BLOCK, 1), SEGMENT_BLOCK, 2)


def agglomerate_of(segments: np.ndarray) -> np.ndarray:
    """The agglomerate file's entries at ``segments``: PER_AGGLOMERATE consecutive segments each, 0 stays 0."""
    wide = segments.astype(np.uint64)
    return np.where(wide == 0, np.uint64(0), wide // np.uint64(PER_AGGLOMERATE) + np.uint64(1))


def write_agglomerate_file(path: Path, entries: int) -> None:
    """An HDF5 agglomerate file of ``entries`` entries (contiguous uint64, as webKnossos writes it), written in
    pieces (10⁸ entries are 800 MB), with its ``agglomerate_to_segments_offsets`` (whose length declares the
    agglomerates, so the mapped layer of uint32 labels is uint32; its members would be the segments in order, as
    ``agglomerate_of`` never decreases, and are left out: nothing here reads them)."""
    import h5py

    path.parent.mkdir(parents=True, exist_ok=True)
    largest = int(agglomerate_of(np.asarray([entries - 1]))[0])
    first = (np.arange(largest + 2, dtype=np.int64) - 1) * PER_AGGLOMERATE  # agglomerate a >= 2 starts there
    with h5py.File(path, "w") as f:
        table = f.create_dataset("segment_to_agglomerate", shape=(entries,), dtype=np.uint64)
        step = 1 << 22
        for start in range(0, entries, step):
            stop = min(entries, start + step)
            table[start:stop] = agglomerate_of(np.arange(start, stop, dtype=np.uint64))
        offsets = np.minimum(np.maximum(first, 1), entries).astype(np.uint64)
        offsets[0] = 0  # agglomerate 0 is segment 0 alone
        f.create_dataset("agglomerate_to_segments_offsets", data=offsets)


def _write_segmentation(dataset_dir: Path, mode: Mode) -> None:
    """The labels (WKW, LZ4HC) and their agglomerate file of ``mode.seg_entries`` entries."""
    header = WkwHeader.create(np.dtype(np.uint32), 1, BlockType.LZ4HC, block_len=BLOCK, file_len=8)
    layer = dataset_dir / SEGMENTATION
    write_mag(str(layer / "1"), header, segmentation_labels(mode.seg_box, mode.seg_entries)[None], DATA_ORIGIN)
    write_agglomerate_file(layer / "agglomerates" / f"{MAPPING}.hdf5", mode.seg_entries)


def _write_small_files(dataset_dir: Path, color: Path, edge: int) -> int:
    """The small-file layer: the color layer's first ``edge``³ voxels of data, one LZ4HC 8³ block per file."""
    voxels = WkwMag(str(color), WkwFileCache(LocalStore())).read_region(DATA_ORIGIN, (edge, edge, edge))
    header = WkwHeader.create(np.dtype(np.uint8), 1, BlockType.LZ4HC, block_len=SMALL_BLOCK, file_len=1)
    return len(write_mag(str(dataset_dir / SMALL_LAYER / "1"), header, voxels, DATA_ORIGIN))


def build_dataset(root: Path, mode: Mode) -> dict[str, Any]:
    """Write the dataset under ``root`` unless one of the same parameters is there; return its facts."""
    dataset_dir = root / ORG / DATASET
    stamp_path = root / ".bench-stamp.json"
    shape = asdict(mode)  # what the data depends on: not the durations of the load
    for key in (
        "warmup",
        "duration",
        "rounds",
        "rss_requests",
        "rss_segment",
        "rss_cap",
        "profile",
        "zipf_draws",
        "workers",
    ):
        shape.pop(key)
    stamp = json.loads(json.dumps({"version": DATA_VERSION, "mode": shape}))
    if stamp_path.exists():
        try:
            old = json.loads(stamp_path.read_text())
        except ValueError:
            old = None
        if old is not None and old.get("stamp") == stamp:
            log(f"reusing the dataset in {root}")
            facts: dict[str, Any] = old["facts"]
            return facts
    if root.exists():
        shutil.rmtree(root)
    dataset_dir.mkdir(parents=True)
    started = time.monotonic()
    edge = mode.data_edge
    u16_edge = BLOCK * mode.u16_file_len
    rng = np.random.default_rng(SEED)
    fields = {
        "edge": edge,
        "keep": u16_edge,
        "coarse": _Smooth(rng, edge, 24),
        "fine": _Smooth(rng, edge, 6),
        "amplitude": _Smooth(rng, edge, 160),
    }
    n = edge // BLOCK
    compressed: dict[Vec3, bytes] = {}
    u16_slabs: dict[int, np.ndarray] = {}
    log(f"generating {edge}³ voxels of uint8 and compressing them with LZ4HC")
    context = multiprocessing.get_context("fork")
    workers = max(1, min(os.cpu_count() or 1, 4))
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_fields, initargs=(fields,)) as pool:
        for bz, blocks, voxels in pool.map(_make_slab, range(n)):
            for i, data in enumerate(blocks):
                compressed[(i % n, i // n, bz)] = data
            if voxels is not None:
                u16_slabs[bz] = voxels
    zero = compress_block(bytes(BLOCK**3), BlockType.LZ4HC)

    def block(position: Vec3) -> bytes:
        return compressed.get(position, zero)

    u8_header = WkwHeader.create(np.dtype(np.uint8), 1, BlockType.LZ4HC, block_len=BLOCK, file_len=32)
    color = dataset_dir / "color"
    _write_mag_header(color / "1", u8_header)
    data_file = color / "1" / f"z{DATA_CUBE[2]}" / f"y{DATA_CUBE[1]}" / f"x{DATA_CUBE[0]}.wkw"
    _write_wkw_file(data_file, u8_header, block)
    # The mag tensorstore reads whole: EXTENT / ts_mag voxels, one file holding the same blocks.
    ts_dir = color / mag_name(mode.ts_mag)
    _write_mag_header(ts_dir, u8_header)
    (ts_dir / "z0" / "y0").mkdir(parents=True)
    shutil.copyfile(data_file, ts_dir / "z0" / "y0" / "x0.wkw")

    # Many small files over the same voxels (for the RSS run), from the same compressed blocks.
    many_len = mode.many_file_len
    many_header = WkwHeader.create(np.dtype(np.uint8), 1, BlockType.LZ4HC, block_len=BLOCK, file_len=many_len)
    many = dataset_dir / "many" / "1"
    _write_mag_header(many, many_header)
    files_per_side = n // many_len
    base = [o // (BLOCK * many_len) for o in DATA_ORIGIN]
    for fz in range(files_per_side):
        for fy in range(files_per_side):
            for fx in range(files_per_side):
                path = many / f"z{base[2] + fz}" / f"y{base[1] + fy}" / f"x{base[0] + fx}.wkw"
                _write_wkw_file(path, many_header, _shifted(compressed, (fx * many_len, fy * many_len, fz * many_len)))
    many_files = files_per_side**3
    small_files = _write_small_files(dataset_dir, color / "1", mode.small_edge)

    # Raw uint16: one file, written by the adapter's own writer.
    voxels = np.concatenate([u16_slabs[bz] for bz in sorted(u16_slabs)], axis=2)
    data16 = voxels.astype(np.uint16) * np.uint16(257) + (voxels.astype(np.uint16) & 7)
    u16_header = WkwHeader.create(np.dtype(np.uint16), 1, BlockType.RAW, block_len=BLOCK, file_len=mode.u16_file_len)
    write_mag(str(dataset_dir / "color16" / "1"), u16_header, data16[None], DATA_ORIGIN)
    del voxels, data16
    log(f"writing {mode.seg_box} labels and an agglomerate file of {mode.seg_entries:,} entries")
    _write_segmentation(dataset_dir, mode)

    box = {"topLeft": [0, 0, 0], "width": EXTENT[0], "height": EXTENT[1], "depth": EXTENT[2]}

    def layer(name: str, element_class: str, mags: list[Vec3]) -> dict[str, Any]:
        return {
            "name": name,
            "category": "color",
            "boundingBox": dict(box),
            "elementClass": element_class,
            "dataFormat": "wkw",
            "numChannels": 1,
            "mags": [{"mag": list(m), "path": f"./{name}/{mag_name(m)}"} for m in mags],
        }

    properties = {
        "id": {"name": DATASET, "team": ORG},
        "scale": {"factor": [11.24, 11.24, 28.0], "unit": "nanometer"},
        "dataLayers": [
            layer("color", "uint8", [(1, 1, 1), mode.ts_mag]),
            layer("color16", "uint16", [(1, 1, 1)]),
            layer("many", "uint8", [(1, 1, 1)]),
            layer(SMALL_LAYER, "uint8", [(1, 1, 1)]),
            {**layer(SEGMENTATION, "uint32", [(1, 1, 1)]), "category": "segmentation"},
        ],
        "version": 1,
    }
    (dataset_dir / "datasource-properties.json").write_text(json.dumps(properties, indent=2) + "\n")
    sizes = [len(b) for b in compressed.values()]
    disk = sum(p.stat().st_size for p in root.rglob("*.wkw"))
    facts = {
        "blocks": len(sizes),
        "mean_block_kib": float(np.mean(sizes) / 1024),
        "min_block_kib": float(np.min(sizes) / 1024),
        "max_block_kib": float(np.max(sizes) / 1024),
        "many_files": many_files,
        "small_files": small_files,
        "agglomerate_entries": mode.seg_entries,
        "disk_bytes": disk,
        "virtual_bytes": EXTENT[0] * EXTENT[1] * EXTENT[2] * 8,  # 2 x uint8, uint16 and uint32 layers at mag 1
        "seconds": round(time.monotonic() - started, 1),
    }
    stamp_path.write_text(json.dumps({"stamp": stamp, "facts": facts}))
    log(
        f"dataset written in {facts['seconds']} s: {disk / 2**20:.0f} MiB of files, "
        f"LZ4HC blocks {facts['min_block_kib']:.1f}-{facts['max_block_kib']:.1f} KiB "
        f"(mean {facts['mean_block_kib']:.1f})"
    )
    return facts
