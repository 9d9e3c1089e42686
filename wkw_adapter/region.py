"""Copying the overlap of two boxes of voxels."""

import numpy as np

from gateway_storage.geometry import Box, Vec3


def copy_overlap(dst: np.ndarray, dst_origin: Vec3, src: np.ndarray, src_origin: Vec3) -> None:
    """Copy the voxels where ``src`` and ``dst`` (both ``[c, x, y, z]``) overlap in space."""
    _, *dst_size = dst.shape
    _, *src_size = src.shape
    overlap = Box.sized(dst_origin, (dst_size[0], dst_size[1], dst_size[2])).clip(
        Box.sized(src_origin, (src_size[0], src_size[1], src_size[2]))
    )
    if overlap is None:
        return
    dst[(slice(None), *overlap.shifted(dst_origin).slices())] = src[
        (slice(None), *overlap.shifted(src_origin).slices())
    ]
