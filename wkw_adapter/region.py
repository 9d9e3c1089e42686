"""Copying the overlap of two boxes of voxels."""

import numpy as np

from gateway_storage.geometry import Box, Vec3


def copy_overlap(dst: np.ndarray, dst_origin: Vec3, src: np.ndarray, src_origin: Vec3) -> Box | None:
    """Copy the voxels where ``src`` and ``dst`` (both ``[c, x, y, z]``) overlap in space; that overlap in
    ``dst``'s own coordinates, or ``None`` where they do not meet."""
    _, *dst_size = dst.shape
    _, *src_size = src.shape
    overlap = Box.sized(dst_origin, (dst_size[0], dst_size[1], dst_size[2])).clip(
        Box.sized(src_origin, (src_size[0], src_size[1], src_size[2]))
    )
    if overlap is None:
        return None
    in_dst = overlap.shifted(dst_origin)
    dst[(slice(None), *in_dst.slices())] = src[(slice(None), *overlap.shifted(src_origin).slices())]
    return in_dst
