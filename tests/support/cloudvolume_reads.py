"""CloudVolume reading layers of the gateway's precomputed tree, and the reads every source format's test makes
against its truth: the whole volume and cutouts across chunk and volume edges, voxel for voxel."""

from collections.abc import Sequence
from typing import Any

import numpy as np
from cloudvolume import CloudVolume

Corner = tuple[int, ...]


def open_volume(url: str, **options: Any) -> CloudVolume:
    """A layer of the precomputed tree (its URL) as CloudVolume opens it: plain HTTP, one request at a time, no
    cache, and an absent chunk raised (``EmptyVolumeException``) unless ``fill_missing=True`` is given."""
    options.setdefault("fill_missing", False)
    return CloudVolume(f"precomputed://{url}", use_https=False, progress=False, parallel=1, cache=False, **options)


def read_box(url: str, mip: int, lo: Sequence[int], hi: Sequence[int], **options: Any) -> np.ndarray[Any, Any]:
    """Voxels ``[lo, hi)`` at ``mip`` as CloudVolume reads them: ``[x, y, z, c]``, the channel axis last."""
    return np.asarray(open_volume(url, mip=mip, **options)[lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]])


def boxes_across_edges(lo: Corner, hi: Corner, chunk: int = 32) -> list[tuple[Corner, Corner]]:
    """The whole box ``[lo, hi)``; one from 3 voxels before the end of its first chunk (the grid starts at
    ``lo``) to the volume's end, cutting its last chunk short; one from the volume's start to 13 voxels into
    its second chunk. Along an axis too short for that, the whole extent."""
    late = tuple(a + chunk - 3 if b - a > chunk else a for a, b in zip(lo, hi))
    early = tuple(min(a + chunk + 13, b) for a, b in zip(lo, hi))
    return [(lo, hi), (late, hi), (lo, early)]


def assert_reads_exactly(
    url: str, mip: int, truth: np.ndarray[Any, Any], lo: Corner, hi: Corner, label: str, chunk: int = 32
) -> None:
    """CloudVolume reads each box of :func:`boxes_across_edges` (chunks of ``chunk``) at ``mip`` as ``truth``
    holds it.

    ``truth`` is ``[c, x, y, z]`` in the mag's voxels from the origin (the reference reader's read of the
    source); CloudVolume's answer is compared with it moved to channel last, data type included.
    """
    volume = open_volume(url, mip=mip)
    for a, b in boxes_across_edges(lo, hi, chunk):
        read = np.asarray(volume[a[0] : b[0], a[1] : b[1], a[2] : b[2]])
        want = np.moveaxis(truth[(slice(None), *(slice(x, y) for x, y in zip(a, b)))], 0, -1)
        where = f"{label}, mip {mip}, [{a}, {b})"
        assert read.dtype == want.dtype, (where, read.dtype, want.dtype)
        np.testing.assert_array_equal(read, want, err_msg=where)
