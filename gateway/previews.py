"""Small PNG previews of a layer, so a person sees what a dataset holds before opening a viewer.

A preview is the middle Z slice of the bounding box from a coarse mag: colour data contrast-stretched,
segmentations coloured by id. It is cached by what makes it change (the identities of the files read,
or the voxels themselves where the reader cannot name its files), and that key is also its ETag, so
every replica answers alike. A damaged file raises the storage error unchanged: the HTTP layer answers
5xx for that image alone.
"""

import io
from collections.abc import Mapping

import numpy as np
from PIL import Image

from gateway_storage import ByteLRU
from gateway_storage.geometry import Vec3

from .sources.mag import MagSource
from .zarr.resource import Resource, bytes_resource, make_etag

PNG = "image/png"
MAX_EDGE = 256  # long edge of a preview in pixels
MIN_EDGE = 128  # a coarser mag is chosen only while its XY extent still gives this many pixels
MAX_READ_EDGE = 1024  # a slice wider than this at the coarsest mag is previewed by its central window
LOW_PERCENTILE, HIGH_PERCENTILE = 1.0, 99.0
_RENDERING_VERSION = "preview-1"  # part of every cache key and ETag: bump it when the rendering changes


class NoPreviewError(LookupError):
    """The layer has no mag to read or an empty bounding box: there is nothing to show."""


def choose_mag(mags: Mapping[Vec3, MagSource]) -> MagSource:
    """The coarsest mag whose XY extent still gives ``MIN_EDGE`` pixels, else the one with the largest extent."""
    if not mags:
        raise NoPreviewError("the layer has no usable mag")
    sources = sorted(mags.values(), key=lambda s: (s.mag[0] * s.mag[1], s.mag))
    large_enough = [s for s in sources if _long_xy_edge(s) >= MIN_EDGE]
    if large_enough:
        return large_enough[-1]
    return max(sources, key=lambda s: (_long_xy_edge(s), -s.mag[0] * s.mag[1]))


def _long_xy_edge(source: MagSource) -> int:
    return max(source.bbox.size[:2])


def preview_box(source: MagSource) -> tuple[Vec3, Vec3]:
    """The box the preview reads, in the mag's voxels: the middle Z slice, at most ``MAX_READ_EDGE`` a side."""
    lo, hi = source.bbox.lo, source.bbox.hi
    if source.bbox.is_empty:
        raise NoPreviewError("the layer's bounding box is empty")
    xy_lo, xy_hi = [], []
    for axis in (0, 1):
        extent = hi[axis] - lo[axis]
        start = lo[axis] + max(0, (extent - MAX_READ_EDGE) // 2)
        xy_lo.append(start)
        xy_hi.append(min(hi[axis], start + MAX_READ_EDGE))
    z = (lo[2] + hi[2] - 1) // 2
    return (xy_lo[0], xy_lo[1], z), (xy_hi[0], xy_hi[1], z + 1)


def segment_colors(ids: np.ndarray) -> np.ndarray:
    """RGBA per id: a stable hash of the id to a bright colour; id 0 is transparent black."""
    x = ids.astype(np.uint64)
    x = x * np.uint64(0x9E3779B97F4A7C15)  # splitmix64's finaliser; uint64 arithmetic wraps
    x ^= x >> np.uint64(30)
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x = x * np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    out = np.zeros((*ids.shape, 4), dtype=np.uint8)
    for channel, shift in enumerate((0, 16, 32)):
        byte = (x >> np.uint64(shift)) & np.uint64(0xFF)
        out[..., channel] = (48 + byte * np.uint64(207) // np.uint64(255)).astype(np.uint8)  # never near-black
    out[..., 3] = 255
    out[ids == 0] = 0
    return out


def stretch_contrast(plane: np.ndarray) -> np.ndarray:
    """One channel to uint8, its 1st..99th percentile spread over 0..255; NaN and infinities are black."""
    values = plane.astype(np.float64)
    finite = np.isfinite(values)
    if not finite.any():
        return np.zeros(plane.shape, dtype=np.uint8)
    low, high = np.percentile(values[finite], [LOW_PERCENTILE, HIGH_PERCENTILE])
    span = high - low if high > low else 1.0
    scaled = np.clip((values - low) / span, 0.0, 1.0) * 255.0
    scaled[~finite] = 0.0
    pixels: np.ndarray = np.rint(scaled).astype(np.uint8)
    return pixels


def render_image(slice_cxy: np.ndarray, category: str) -> Image.Image:
    """A ``[c, x, y]`` slice as an image (x across, y down), no longer than ``MAX_EDGE`` on its long edge."""
    if category == "segmentation":
        image = Image.fromarray(np.ascontiguousarray(segment_colors(slice_cxy[0].T)), "RGBA")
        resample = Image.Resampling.NEAREST  # ids must not be blended into colours of no segment
    else:
        planes = [stretch_contrast(slice_cxy[c].T) for c in range(min(3, slice_cxy.shape[0]))]
        if len(planes) == 1:
            image = Image.fromarray(planes[0], "L")
        else:
            planes += [np.zeros_like(planes[0])] * (3 - len(planes))  # two channels: red and green
            image = Image.fromarray(np.ascontiguousarray(np.stack(planes, axis=-1)), "RGB")
        resample = Image.Resampling.BOX
    long_edge = max(image.size)
    if long_edge > MAX_EDGE:
        width, height = (max(1, round(edge * MAX_EDGE / long_edge)) for edge in image.size)
        image = image.resize((width, height), resample)
    return image


def encode_png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG", compress_level=6)
    return buffer.getvalue()


class Previews:
    """Preview images of layers, cached by the identities of what they were made from.

    Each call reads the slice (a few blocks of a coarse mag: this is also what finds damaged files),
    then reuses the PNG when the files read are unchanged. Blocking: call it off the event loop.
    """

    def __init__(self, max_bytes: int) -> None:
        self.cache: ByteLRU[Resource] = ByteLRU(max_bytes)

    def preview(self, mags: Mapping[Vec3, MagSource], category: str) -> Resource:
        """The PNG preview of a layer given its mags; raises the storage error of a damaged file unchanged."""
        source = choose_mag(mags)
        lo, hi = preview_box(source)
        region = source.read_box(lo, hi)
        if region.sources is None:
            origin: object = region.data.tobytes()  # the reader cannot name its files: the voxels decide
            last_modified = None
        else:
            origin = sorted({(source.relative(path), identity) for path, identity in region.sources}, key=repr)
            mtimes = [identity.mtime for _, identity in region.sources if identity is not None]
            last_modified = max(mtimes, default=None)
        etag = make_etag(_RENDERING_VERSION, source.location_key, source.mag, lo, hi, category, origin)
        cached = self.cache.get(etag)
        if cached is not None:
            return cached
        png = encode_png(render_image(region.data[..., 0], category))
        resource = bytes_resource(png, PNG, etag, last_modified)
        self.cache.put(etag, resource, len(png))
        return resource
