"""Copying the overlap of two boxes of voxels."""

import numpy as np

from gateway_storage.geometry import Vec3


def copy_overlap(dst: np.ndarray, dst_origin: Vec3, src: np.ndarray, src_origin: Vec3) -> None:
    """Copy the voxels where ``src`` and ``dst`` (both ``[c, x, y, z]``) overlap in space."""
    lo = [max(d, s) for d, s in zip(dst_origin, src_origin)]
    hi = [min(d + n, s + m) for d, s, n, m in zip(dst_origin, src_origin, dst.shape[1:], src.shape[1:])]
    if any(h <= low for low, h in zip(lo, hi)):
        return
    dst_sel = tuple(slice(low - o, h - o) for low, h, o in zip(lo, hi, dst_origin))
    src_sel = tuple(slice(low - o, h - o) for low, h, o in zip(lo, hi, src_origin))
    dst[(slice(None), *dst_sel)] = src[(slice(None), *src_sel)]
