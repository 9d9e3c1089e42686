"""Small PNG previews of a layer, so a person sees what a dataset holds before opening a viewer.

A preview is the middle Z slice of the bounding box from a coarse mag: colour data contrast-stretched,
segmentations coloured by id. Its ETag is made from what makes it change, known before a byte is read:
the identities of the files its read covers (``MagSource.files_covering``, a stat each), so that every
replica answers alike and a revalidation (304) in any worker, one that never made the preview too, costs
those stats and no read or decode. Where a reader cannot name its files the voxels themselves decide, and
a preview kept is read again after ``RECHECK_SECONDS``.

What one preview may cost is known before a byte is read: the bytes its read decodes and the stored
chunks it touches (``MagSource.decoded_bytes``). Past either bound a coarser mag or a smaller central
window is read, and where none fits the answer is a 413 with the reason. A preview made is kept while its
files are the versions stat'ed. A damaged file raises the storage error unchanged: the HTTP layer answers
5xx for that image alone. The work runs in the threads of the limiter it is given (the one the meshes
use), never in those that serve chunks.
"""

import io
import time
from collections.abc import Mapping
from dataclasses import dataclass

import anyio
import numpy as np
from PIL import Image

from gateway_storage import ByteLRU, FileChangedError, FileSource
from gateway_storage.faults import Absent, TooLarge
from gateway_storage.geometry import Vec3

from .metrics import count_preview
from .resources import Resource, bytes_resource, make_etag
from .sources.mag import MagSource

PNG = "image/png"
MAX_EDGE = 256  # long edge of a preview in pixels
MIN_EDGE = 128  # a coarser mag is chosen only while its XY extent still gives this many pixels
MAX_READ_EDGE = 1024  # a slice wider than this at the coarsest mag is previewed by its central window
# Where the chosen mag's slice would decode too much, these smaller central windows are tried (after coarser mags).
READ_EDGES = (MAX_READ_EDGE, 512, 256, 128, 64)
MAX_DECODED_BYTES = 64 << 20  # decoded by the read of one preview (whole stored chunks, as the source counts)
MAX_CHUNKS = 4096  # stored chunks one preview's read touches: each costs a lookup and a decoder call
RECHECK_SECONDS = 5.0  # a preview whose reader cannot name its files is read again after this long
LOW_PERCENTILE, HIGH_PERCENTILE = 1.0, 99.0
_RENDERING_VERSION = "preview-1"  # part of every cache key and ETag: bump it when the rendering changes


class NoPreviewError(Absent, LookupError):
    """The layer has no mag to read or an empty bounding box: there is nothing to show."""


class PreviewTooLarge(TooLarge, ValueError):
    """Every slice a preview could read decodes more, or touches more chunks, than one preview may: a 413."""


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


def preview_box(source: MagSource, edge: int = MAX_READ_EDGE) -> tuple[Vec3, Vec3]:
    """The box the preview reads, in the mag's voxels: the middle Z slice, at most ``edge`` a side (centred)."""
    lo, hi = source.bbox.lo, source.bbox.hi
    if source.bbox.is_empty:
        raise NoPreviewError("the layer's bounding box is empty")
    xy_lo, xy_hi = [], []
    for axis in (0, 1):
        extent = hi[axis] - lo[axis]
        start = lo[axis] + max(0, (extent - edge) // 2)
        xy_lo.append(start)
        xy_hi.append(min(hi[axis], start + edge))
    z = (lo[2] + hi[2] - 1) // 2
    return (xy_lo[0], xy_lo[1], z), (xy_hi[0], xy_hi[1], z + 1)


@dataclass(frozen=True, slots=True)
class ReadCost:
    """What reading a box of a mag costs, known before the read."""

    decoded_bytes: int
    chunks: int

    @classmethod
    def of(cls, source: MagSource, lo: Vec3, hi: Vec3) -> "ReadCost":
        shape = (hi[0] - lo[0], hi[1] - lo[1], hi[2] - lo[2])
        decoded = source.decoded_bytes(shape)
        return cls(decoded, -(-decoded // max(1, source.decoded_bytes((1, 1, 1)))))

    @property
    def fits(self) -> bool:
        return self.decoded_bytes <= MAX_DECODED_BYTES and self.chunks <= MAX_CHUNKS


def plan_read(mags: Mapping[Vec3, MagSource]) -> tuple[MagSource, Vec3, Vec3]:
    """The mag and box a preview reads: :func:`choose_mag`'s full slice if its cost fits, else the slice of a
    coarser mag, else a smaller central window; a 413 with the reason where nothing fits."""
    chosen = choose_mag(mags)
    area = chosen.mag[0] * chosen.mag[1]
    coarser = sorted(
        (s for s in mags.values() if s.mag[0] * s.mag[1] > area), key=lambda s: (s.mag[0] * s.mag[1], s.mag)
    )
    cheapest: ReadCost | None = None
    for edge in READ_EDGES:
        for source in (chosen, *coarser):
            lo, hi = preview_box(source, edge)
            cost = ReadCost.of(source, lo, hi)
            if cost.fits:
                return source, lo, hi
            cheapest = cost if cheapest is None or cost.decoded_bytes < cheapest.decoded_bytes else cheapest
    assert cheapest is not None
    raise PreviewTooLarge(
        f"the layer's stored chunks are too large or too many to preview: the cheapest slice decodes "
        f"{cheapest.decoded_bytes} bytes in {cheapest.chunks} chunks, more than the {MAX_DECODED_BYTES} bytes "
        f"or {MAX_CHUNKS} chunks one preview may"
    )


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


@dataclass(frozen=True, slots=True)
class PreviewKey:
    """One preview's read: the mag's place, the box and the rendering."""

    location: str
    mag: Vec3
    lo: Vec3
    hi: Vec3
    category: str


@dataclass(frozen=True, slots=True)
class PlannedPreview:
    """A preview before its read: what it reads, and its validators where the stats of its files decide them.

    ``files`` are the files the read covers with the identities a stat gave just now (None: absent); None
    where the source cannot name them, and then the ETag is known only from the voxels read.
    """

    source: MagSource
    key: PreviewKey
    files: tuple[FileSource, ...] | None
    etag: str | None
    last_modified: float | None

    @property
    def working_bytes(self) -> int:
        """The most memory making it holds, from the metadata: the chunks its read decodes, the slice it
        reads, and the image made of it (what it holds of the worker's memory budget)."""
        shape = (self.key.hi[0] - self.key.lo[0], self.key.hi[1] - self.key.lo[1], self.key.hi[2] - self.key.lo[2])
        voxels = shape[0] * shape[1] * shape[2] * self.source.channels * self.source.dtype.itemsize
        return self.source.decoded_bytes(shape) + 2 * voxels


@dataclass(frozen=True, slots=True)
class MadePreview:
    resource: Resource
    made_at: float  # time.monotonic()


class Previews:
    """Preview images of layers, kept by the identities of the files they were made from.

    :meth:`plan` (stats, no read) and :meth:`make` are blocking; :meth:`planned` and :meth:`answer` run
    them in a thread of the limiter given. What a preview answers depends only on its files, so its ETag
    is known from a stat of each before anything is read: a revalidation costs those stats in any worker,
    whether or not it made the preview before.
    """

    def __init__(self, max_bytes: int, limiter: anyio.CapacityLimiter | None = None) -> None:
        self.cache: ByteLRU[MadePreview] = ByteLRU(max_bytes)
        self.limiter = limiter if limiter is not None else anyio.CapacityLimiter(1)

    async def planned(self, mags: Mapping[Vec3, MagSource], category: str) -> PlannedPreview:
        return await anyio.to_thread.run_sync(self.plan, mags, category, limiter=self.limiter)

    async def answer(self, planned: PlannedPreview) -> Resource:
        return await anyio.to_thread.run_sync(self.make, planned, limiter=self.limiter)

    def preview(self, mags: Mapping[Vec3, MagSource], category: str) -> Resource:
        """The PNG preview of a layer given its mags: :meth:`plan`, then :meth:`make`."""
        return self.make(self.plan(mags, category))

    def plan(self, mags: Mapping[Vec3, MagSource], category: str) -> PlannedPreview:
        """What a preview of the layer reads (:func:`plan_read`) and, from a stat of each file that read
        covers, its ETag; raises the storage error of a file that cannot be looked up unchanged."""
        source, lo, hi = plan_read(mags)
        key = PreviewKey(source.location_key, source.mag, lo, hi, category)
        paths = source.files_covering(lo, hi)
        if paths is None:
            return PlannedPreview(source, key, None, None, None)
        files = tuple((path, source.storage.identity(path)) for path in paths)
        mtimes = [identity.mtime for _, identity in files if identity is not None]
        return PlannedPreview(source, key, files, _etag(key, source, files), max(mtimes, default=None))

    def make(self, planned: PlannedPreview) -> Resource:
        """The PNG of a planned preview: kept while its files are the versions planned, else read and made.

        The read must find the versions the plan stat'ed (else its voxels are not what the ETag names): a
        file rewritten in between raises :class:`FileChangedError` (a 503, retried in a moment). A damaged
        file raises its storage error unchanged.
        """
        key, source = planned.key, planned.source
        made = self.cache.get(key)
        if made is not None and (
            made.resource.etag == planned.etag
            or (planned.files is None and time.monotonic() - made.made_at < RECHECK_SECONDS)
        ):
            count_preview("kept")
            return made.resource
        region = source.read_box(key.lo, key.hi)
        if planned.files is None:
            # the reader cannot name its files: the voxels decide
            etag = make_etag(_RENDERING_VERSION, *_described(key, source), region.data.tobytes())
            last_modified = None
        else:
            read = dict(region.sources) if region.sources is not None else None
            for path, identity in planned.files:
                now = read[path] if read is not None and path in read else source.storage.identity(path)
                if now != identity:
                    raise FileChangedError(f"{source.relative(path)} changed while its preview was read")
            etag, last_modified = _etag(key, source, planned.files), planned.last_modified
        if made is not None and made.resource.etag == etag:
            resource = made.resource  # read again (the files could not be named), and unchanged
            count_preview("kept")
        else:
            png = encode_png(render_image(region.data[..., 0], key.category))
            resource = bytes_resource(png, PNG, etag, last_modified)
            count_preview("made")
        self.cache.put(key, MadePreview(resource, time.monotonic()), len(resource.body or b"") + 256)
        return resource


def _described(key: PreviewKey, source: MagSource) -> tuple[object, ...]:
    """What besides its files makes a preview: the read, the rendering and how the source decodes."""
    return (key, source.kind, source.bbox.lo, source.bbox.hi, source.dtype.str, source.channels, source.fill_value)


def _etag(key: PreviewKey, source: MagSource, files: tuple[FileSource, ...]) -> str:
    """The ETag of a preview from its files' identities (named relative to the data root: alike on every replica)."""
    origin = sorted(((source.relative(path), identity) for path, identity in files), key=repr)
    return make_etag(_RENDERING_VERSION, *_described(key, source), origin)
