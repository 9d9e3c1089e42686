"""Labels made coarser on the fly, by mode: a box too costly to mesh at its mag, and the levels of detail past a
layer's coarsest stored mag.

Each coarse voxel takes the most frequent non-zero label of the voxels it covers (tinybrain's ``sparse`` mode
pooling), so that a sheet one voxel thick survives instead of losing every tie to the background. Coarse voxel
``k`` of a factor ``f`` covers the voxels ``[k * f, (k + 1) * f)``: the same grid wherever a box starts, so the
boxes of one level meet.
"""

import numpy as np

from gateway_storage.geometry import Box, Vec3

from ..extras import MESHES
from ..sources.mag import MagSource, Region


def mode_downsample(labels: np.ndarray, factor: Vec3) -> np.ndarray:
    """``labels`` ``(x, y, z)`` whose shape is a multiple of ``factor`` (powers of two per axis), made coarser by
    ``factor``: one halving per step, each axis halved while its factor is not reached."""
    MESHES.require("meshes")
    import tinybrain

    steps = max(f.bit_length() - 1 for f in factor)
    coarse = labels
    for step in range(steps):
        halving = tuple(2 if f >> (step + 1) else 1 for f in factor)
        # tinybrain reads its input's memory in Fortran order whatever its flags say: a C-ordered array comes out
        # transposed in place, so every input is made Fortran-ordered first (a copy only where it is not).
        coarse = tinybrain.downsample_segmentation(np.asfortranarray(coarse), halving, sparse=True)[0]
    return coarse


class ModeDownsampled(MagSource):
    """A mag the layer does not store: a stored mag's labels made ``factor`` times coarser when read.

    What the levels of detail past the coarsest stored mag are meshed from; reading a box reads (and decodes)
    ``factor`` times as many voxels per axis of ``stored``, which :meth:`decoded_bytes` says.
    """

    kind = "mode-downsampled"

    def __init__(self, stored: MagSource, factor: Vec3) -> None:  # no MagSource.__init__: it opens no files
        self.stored = stored
        self.factor = factor
        self.mag = (stored.mag[0] * factor[0], stored.mag[1] * factor[1], stored.mag[2] * factor[2])
        lo, hi = stored.bbox.lo, stored.bbox.hi
        self.bbox = Box(
            (lo[0] // factor[0], lo[1] // factor[1], lo[2] // factor[2]),
            (-(-hi[0] // factor[0]), -(-hi[1] // factor[1]), -(-hi[2] // factor[2])),
        )
        self.dtype = stored.dtype
        self.channels = stored.channels
        self.fill_value = stored.fill_value

    def _stored_box(self, lo: Vec3, hi: Vec3) -> tuple[Vec3, Vec3]:
        f = self.factor
        return (lo[0] * f[0], lo[1] * f[1], lo[2] * f[2]), (hi[0] * f[0], hi[1] * f[1], hi[2] * f[2])

    def decoded_bytes(self, shape: Vec3) -> int:
        f = self.factor
        return self.stored.decoded_bytes((shape[0] * f[0], shape[1] * f[1], shape[2] * f[2]))

    def read_box(self, lo: Vec3, hi: Vec3) -> Region:
        region = self.stored.read_box(*self._stored_box(lo, hi))
        coarse = np.stack([mode_downsample(channel, self.factor) for channel in region.data])
        return Region(np.asfortranarray(coarse), region.sources)
