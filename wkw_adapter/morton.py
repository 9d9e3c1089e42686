"""Morton (Z-order) numbering of the blocks inside a WKW file."""

import numpy as np


def _spread(value: int) -> int:
    """Bit i of ``value`` at bit 3i."""
    spread = 0
    for bit in range(value.bit_length()):
        spread |= ((value >> bit) & 1) << (3 * bit)
    return spread


_SPREAD = tuple(_spread(v) for v in range(1024))  # every block coordinate inside a file (at most 2^10 a side)


def morton_encode(x: int, y: int, z: int) -> int:
    """Interleave bits: bit i of x goes to bit 3i, of y to 3i+1, of z to 3i+2."""
    if x < 1024 and y < 1024 and z < 1024:  # a table look-up: this runs for every block read
        return _SPREAD[x] | _SPREAD[y] << 1 | _SPREAD[z] << 2
    code = 0
    bit = 0
    while x or y or z:
        code |= (x & 1) << (3 * bit) | (y & 1) << (3 * bit + 1) | (z & 1) << (3 * bit + 2)
        x >>= 1
        y >>= 1
        z >>= 1
        bit += 1
    return code


def morton_decode(code: int) -> tuple[int, int, int]:
    """Inverse of :func:`morton_encode`."""
    coords = [0, 0, 0]
    bit = 0
    while code:
        for axis in range(3):
            coords[axis] |= (code & 1) << bit
            code >>= 1
        bit += 1
    return coords[0], coords[1], coords[2]


def morton_grid(side: int) -> np.ndarray:
    """Morton number of every block of a ``side``^3 cube, indexed ``[x, y, z]``."""
    axis = np.arange(side, dtype=np.uint64)
    spread = np.zeros(side, dtype=np.uint64)
    for bit in range(max(side - 1, 1).bit_length()):
        spread |= ((axis >> np.uint64(bit)) & np.uint64(1)) << np.uint64(3 * bit)
    grid: np.ndarray = (
        spread[:, None, None] | (spread[None, :, None] << np.uint64(1)) | (spread[None, None, :] << np.uint64(2))
    )
    return grid
