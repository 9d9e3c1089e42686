"""Writes WKW mags (raw, LZ4, LZ4HC): used to make sample data, checked against the ``wkw`` package."""

import os

import numpy as np

from gateway_storage.geometry import Vec3

from .file import compress_block
from .header import WkwHeader
from .morton import morton_decode
from .region import copy_overlap


def encode_file(header: WkwHeader, cube: np.ndarray) -> bytes:
    """The bytes of a data file holding ``cube`` (``[c, x, y, z]``, one file's extent)."""
    side = header.block_len
    header = header.with_data_offset(header.file_data_offset)
    blocks = []
    for index in range(header.blocks_per_file):
        bx, by, bz = morton_decode(index)
        block = cube[:, bx * side : (bx + 1) * side, by * side : (by + 1) * side, bz * side : (bz + 1) * side]
        raw = np.asarray(block, dtype=header.dtype).tobytes(order="F")
        blocks.append(compress_block(raw, header.block_type))
    parts = [header.encode()]
    if header.block_type.compressed:
        ends = np.cumsum([len(b) for b in blocks], dtype=np.uint64) + np.uint64(header.data_offset)
        parts.append(ends.astype("<u8").tobytes())
    parts.extend(blocks)
    return b"".join(parts)


def write_mag(directory: str, header: WkwHeader, data: np.ndarray, offset: Vec3 = (0, 0, 0)) -> list[str]:
    """Write ``data`` (``[c, x, y, z]``) at voxel ``offset`` into a new mag directory.

    Every file the region touches is written whole; voxels of those files
    outside the region are zero. Returns the data file paths written.
    """
    if data.ndim == 3:
        data = data[None]
    edge = header.file_voxel_len
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "header.wkw"), "wb") as f:
        f.write(header.with_data_offset(0).encode())
    end = [o + s for o, s in zip(offset, data.shape[1:])]
    written = []
    for cz in range(offset[2] // edge, (end[2] - 1) // edge + 1):
        for cy in range(offset[1] // edge, (end[1] - 1) // edge + 1):
            for cx in range(offset[0] // edge, (end[0] - 1) // edge + 1):
                cube = np.zeros((header.num_channels, edge, edge, edge), dtype=header.dtype, order="F")
                copy_overlap(cube, (cx * edge, cy * edge, cz * edge), data, offset)
                path = os.path.join(directory, f"z{cz}", f"y{cy}", f"x{cx}.wkw")
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(encode_file(header, cube))
                written.append(path)
    return written
