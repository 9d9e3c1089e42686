"""Writes WKW mags (raw, LZ4, LZ4HC): used to make sample data, checked against the ``wkw`` package."""

import os

import numpy as np

from gateway_storage.geometry import Box, Vec3

from .file import compress_block
from .header import WkwHeader
from .morton import morton_grid
from .region import copy_overlap


def encode_file(header: WkwHeader, cube: np.ndarray, filled: Box | None = None) -> bytes:
    """The bytes of a data file holding ``cube`` (``[c, x, y, z]``, one file's extent).

    ``filled``, where given, holds every voxel of the cube that is not zero. A file holds every block of its
    extent, and a dataset's edge files are mostly empty (98 % of the sample's blocks): the blocks outside
    ``filled`` are one empty block, encoded once.
    """
    side = header.block_len
    header = header.with_data_offset(header.file_data_offset)
    region = filled if filled is not None else Box((0, 0, 0), (header.file_voxel_len,) * 3)
    in_order = np.unravel_index(np.argsort(morton_grid(header.file_len), axis=None), (header.file_len,) * 3)
    empty = compress_block(bytes(header.block_bytes), header.block_type)
    blocks = []
    for bx, by, bz in zip(*(axis.tolist() for axis in in_order)):
        box = Box.sized((bx * side, by * side, bz * side), (side, side, side))
        if region.clip(box) is None:
            blocks.append(empty)
            continue
        block = cube[(slice(None), *box.slices())]
        blocks.append(compress_block(np.asarray(block, dtype=header.dtype).tobytes(order="F"), header.block_type))
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
                filled = copy_overlap(cube, (cx * edge, cy * edge, cz * edge), data, offset)
                path = os.path.join(directory, f"z{cz}", f"y{cy}", f"x{cx}.wkw")
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(encode_file(header, cube, filled))
                written.append(path)
    return written
