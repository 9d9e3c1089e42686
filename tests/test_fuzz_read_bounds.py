"""Generated damage to the files of a layer against the read bounds (issue 24, item 1: every read is bounded
before it happens).

Hypothesis writes a layer of one kind with known voxels (Zarr v2 uncompressed chunks, a Zarr v3 shard of
uncompressed inner chunks, a WKW LZ4 file, a WKW raw file) and damages it: file sizes (empty, one byte short
or long, twice, sparse 512 MiB), holes, shard-index entries (absent, swapped, shifted, overlapping, huge,
past the end, wrapping past 2**64, a broken checksum, a shard padded by a sparse hole before its index),
WKW jump-table entries (zero-length, shifted, swapped, huge, past the end, before the data, in a file
extended by a sparse hole so that huge entries still lie inside it) and metadata documents past their size
bound (sparse, or holes of NULs).

In process, the real catalog and sources read through a :class:`RecordingStore` (a real ``LocalStore`` whose
reads are noted as the real reader performs them): every chunk read and every region read of the layer
must take no more bytes than the layer's geometry allows for what it covers (each chunk, inner chunk,
block, index, header, jump table and document at most its own size bound, as the formats define them), and
must give exactly the voxels the files hold where they are sound, else an error of the storage kinds with
a reason. Through a real gateway, the same damage is asked for with GET, HEAD and ``Range: bytes=0-0`` on
every chunk of both trees: bytes the serving process read (``/proc``'s ``rchar``) and its peak memory stay
within what the geometry allows, and every 200 GET is exactly the voxels.

The WKW layers are also read as the v3 tree's virtual shards (``gateway/zarr/shards.py``), laid out from the
jump table alone.

Metadata multipliers: Hypothesis writes metadata-only Zarr layers (v2 and v3, chunks absent) of generated
channels (a few, around what fits the budget, around ``MAX_CHANNELS``, a bomb of 16,384) and data types; every
tree's chunk (and the layer's preview) is costed before it is built: unusable past ``MAX_CHANNELS``, a 413 past
the whole memory budget, served within it, and the worker's peak memory stays within the budget (16 examples,
about 10 s).

Examples: 50 per kind in process (about 10 s in all), 12 per kind through the gateway (about 30 s in all), on
a 2-core machine that other test runs keep busy.
"""

import itertools
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crc32c
import lz4.block
import numcodecs
import numpy as np
import pytest
import requests
import wkw
import zarr
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from support.layers import layer_entry, write_properties
from support.measure import PeakRss, bytes_read
from support.servers import Server, assert_no_unexpected_errors

from gateway.meshes.surfaces import BOX_SURFACE_BYTES, SURFACE_BYTES
from gateway.sources.bounds import MAX_CHUNK_BYTES
from gateway.sources.catalog import Catalog
from gateway.sources.dataset import Dataset
from gateway.sources.documents import MAX_DOCUMENT_BYTES
from gateway.sources.loader import MAX_PROPERTIES_BYTES
from gateway.sources.mag import MAX_CHANNELS, ChunkNotFound, MagSource, SourceError
from gateway.sources.registry import SourceFormats
from gateway.zarr.shards import plan_shard, read_shard
from gateway_storage import FileIdentity, LocalStore, StorageError, WrapperStore
from wkw_adapter import WkwError

pytestmark = pytest.mark.slow  # hundreds of generated cases

ORG, DATASET = "fuzz", "layer"
EDGE, CHUNK, INNER = 64, 32, 16
BIG = 512 << 20
CHUNK_BYTES, INNER_BYTES = CHUNK**3, INNER**3  # uint8
INDEX_BYTES = 8 * 16 + 4  # a shard of 2³ inner chunks: (offset, nbytes) pairs and a crc32c
WKW_HEADER, WKW_TABLE = 16, 8 * 8  # a WKW file of 2³ blocks: its header and jump table
EMPTY = 2**64 - 1
RSS_GROWTH = 64 << 20  # reading any one planted file whole would add 512 MiB
SLACK = 1 << 20  # what a serving process reads besides stored files: requests, the catalog's small documents
# The errors a damaged file may raise, each with its reason: faults of storage and of the formats.
READ_ERRORS = (StorageError, OSError, WkwError, SourceError)


def lz4_bound(size: int) -> int:
    """The most bytes LZ4 stores ``size`` bytes in (LZ4_COMPRESSBOUND of the LZ4 block format)."""
    return size + size // 255 + 16


# --- a store that notes what the real reader reads ---------------------------------------------------------


class RecordingStore(WrapperStore):
    """A real :class:`LocalStore` (through the kernel's own pass-through store); every read it performs is noted
    as ``(path, bytes)``."""

    def __init__(self, inner: LocalStore) -> None:
        super().__init__(inner)
        self.reads: list[tuple[str, int]] = []

    def _read(self, path: str, offset: int, size: int, expected: FileIdentity, settled: bool) -> bytes:
        self.reads.append((path, size))  # what the real reader is asked for: it reads exactly this
        return super()._read(path, offset, size, expected, settled)

    def _read_whole(self, path: str, limit: int, settled: bool) -> tuple[bytes, FileIdentity] | None:
        found = super()._read_whole(path, limit, settled)
        if found is not None:
            self.reads.append((path, len(found[0])))
        return found

    def taken(self) -> list[tuple[str, int]]:
        reads, self.reads = self.reads, []
        return reads


# --- layers and their damage ------------------------------------------------------------------------------


def truth(seed: int) -> np.ndarray:
    """The layer's voxels (x, y, z): few values, so that LZ4 compresses them as real data compresses."""
    return np.random.default_rng(seed).integers(0, 4, (EDGE,) * 3).astype(np.uint8) * 60 + 1


def sparse(path: Path, size: int) -> None:
    """``path`` cut or extended to ``size`` bytes; an extension is a hole (reads as NULs, costs no disk)."""
    os.truncate(path, size)


@dataclass
class Layer:
    """A written, damaged layer: what it holds, and what any read of it may cost."""

    kind: str
    data_format: str
    chunk: int  # the edge of the source's (inner) chunks: what one stored chunk covers
    expected: np.ndarray  # the voxels the files hold, where they are sound
    faulty: set[tuple[int, int, int]] = field(default_factory=set)  # chunk coordinates a read must refuse
    unusable: tuple[str, ...] | None = None  # a layer whose metadata cannot be used: its reason says one of these
    documents: dict[str, int] = field(default_factory=dict)  # file name: the most bytes one read of it may take

    def allowance(self, chunks: list[tuple[int, int, int]]) -> int:
        """The most bytes reading these (inner) chunks may take: each one's bound, plus what finds them (each
        shard's index, the file's header and jump table)."""
        if self.kind == "v2raw":
            return len(chunks) * CHUNK_BYTES
        if self.kind == "v3shard":
            shards = {tuple(c // (CHUNK // INNER) for c in coords) for coords in chunks}
            return len(shards) * INDEX_BYTES + len(chunks) * INNER_BYTES
        if self.kind == "wkwlz4":
            return WKW_HEADER + WKW_TABLE + len(chunks) * lz4_bound(CHUNK_BYTES)
        return WKW_HEADER + len(chunks) * CHUNK_BYTES  # raw WKW blocks

    def may_refuse(self, chunks: list[tuple[int, int, int]]) -> bool:
        """Whether a read of these chunks may be refused: one of them is damaged, or the LZ4 file's jump table
        is (a table found wrong refuses the whole file)."""
        return any(coords in self.faulty for coords in chunks) or (self.kind == "wkwlz4" and bool(self.faulty))


Vec = tuple[int, int, int]
ORIGIN: Vec = (0, 0, 0)
WHOLE: Vec = (EDGE, EDGE, EDGE)


def _scaled(coords: Vec, edge: int) -> Vec:
    """The voxel corner of chunk ``coords`` of a grid of ``edge``."""
    return (coords[0] * edge, coords[1] * edge, coords[2] * edge)


def _chunk_coords(chunk: int) -> list[tuple[int, int, int]]:
    n = EDGE // chunk
    return list(itertools.product(range(n), range(n), range(n)))


def _cut(expected: np.ndarray, coords: tuple[int, int, int], edge: int) -> tuple[slice, ...]:
    return tuple(slice(c * edge, (c + 1) * edge) for c in coords)


def write_v2raw(mag: Path, data: st.DataObject, voxels: np.ndarray) -> Layer:
    array = zarr.create_array(
        str(mag), shape=(EDGE,) * 3, chunks=(CHUNK,) * 3, dtype="uint8", compressors=None, zarr_format=2
    )
    array[...] = voxels
    layer = Layer("v2raw", "zarr", CHUNK, voxels.copy(), documents={".zarray": MAX_DOCUMENT_BYTES})
    for coords in data.draw(st.lists(st.sampled_from(_chunk_coords(CHUNK)), max_size=3, unique=True), "damaged chunks"):
        path = mag / ".".join(map(str, coords))
        how = data.draw(st.sampled_from(["size", "size", "hole", "random"]), f"damage of {coords}")
        if how == "size":
            size = data.draw(st.sampled_from([0, 1, CHUNK_BYTES - 1, CHUNK_BYTES + 1, 2 * CHUNK_BYTES, BIG]), "size")
            sparse(path, size)
        elif how == "hole":  # cut, then extended back: the right length, NULs at the end (any reader reads them)
            sparse(path, data.draw(st.integers(0, CHUNK_BYTES - 1), "cut at"))
            sparse(path, CHUNK_BYTES)
        else:
            path.write_bytes(os.urandom(data.draw(st.sampled_from([CHUNK_BYTES, CHUNK_BYTES - 7, 3 * CHUNK_BYTES]))))
        stored = path.read_bytes() if path.stat().st_size <= 4 * CHUNK_BYTES else b""
        if len(stored) == CHUNK_BYTES:  # the right length: these are the chunk's voxels, whatever they are
            layer.expected[_cut(voxels, coords, CHUNK)] = np.frombuffer(stored, np.uint8).reshape((CHUNK,) * 3)
        else:
            layer.faulty.add(coords)
    return layer


INDEX_DAMAGE = ["keep"] * 6 + ["absent", "swap", "shift", "huge_size", "huge_offset", "past_end", "wrap", "size"]


def write_v3shard(mag: Path, data: st.DataObject, voxels: np.ndarray) -> Layer:
    """Shards of 32³ with inner chunks of 16³, uncompressed; the first shard's index is damaged."""
    array = zarr.create_array(
        str(mag),
        shape=(EDGE,) * 3,
        chunks=(INNER,) * 3,
        shards=(CHUNK,) * 3,
        dtype="uint8",
        compressors=None,
        zarr_format=3,
    )
    array[...] = voxels
    layer = Layer("v3shard", "zarr3", INNER, voxels.copy(), documents={"zarr.json": MAX_DOCUMENT_BYTES})
    shard = mag / "c" / "0" / "0" / "0"
    raw = shard.read_bytes()
    body, table = raw[:-INDEX_BYTES], np.frombuffer(raw[-INDEX_BYTES:-4], "<u8").reshape(8, 2).copy()
    original = table.copy()
    for position in range(8):
        how = data.draw(st.sampled_from(INDEX_DAMAGE), f"index entry {position}")
        other = original[data.draw(st.integers(0, 7), "other entry")]
        offset, nbytes = int(original[position][0]), int(original[position][1])
        if how == "absent":
            offset = nbytes = EMPTY
        elif how == "swap":
            offset, nbytes = int(other[0]), int(other[1])
        elif how == "shift":
            offset = max(0, offset + data.draw(st.integers(-INNER_BYTES, INNER_BYTES), "shift"))
        elif how == "huge_size":
            nbytes = data.draw(st.sampled_from([BIG, 2**63, EMPTY - 1, INNER_BYTES * 2]), "huge size")
        elif how == "huge_offset":
            offset = data.draw(st.sampled_from([BIG, 2**63, EMPTY - 1]), "huge offset")
        elif how == "past_end":
            offset = len(raw) - data.draw(st.integers(0, INNER_BYTES - 1), "from the end")
        elif how == "wrap":  # offset + nbytes past 2**64: wraps in uint64 arithmetic
            offset, nbytes = EMPTY - INNER_BYTES // 2, INNER_BYTES
        elif how == "size":
            nbytes = data.draw(st.sampled_from([0, 1, INNER_BYTES - 1, INNER_BYTES + 1]), "size")
        table[position] = (offset, nbytes)
    padding = data.draw(st.sampled_from([0, 0, 4096, BIG]), "a hole before the index")
    index = table.tobytes()
    checksum = crc32c.crc32c(index)
    if data.draw(st.integers(0, 5), "checksum") == 0:
        checksum ^= 1
    shard.write_bytes(body)
    sparse(shard, len(body) + padding)
    with open(shard, "ab") as handle:
        handle.write(index + checksum.to_bytes(4, "little"))
    size = len(body) + padding + INDEX_BYTES
    with open(shard, "rb") as handle:
        for position, coords in enumerate(itertools.product(range(2), range(2), range(2))):
            offset, nbytes = int(table[position][0]), int(table[position][1])
            where = _cut(voxels, coords, INNER)
            if crc32c.crc32c(index) != checksum:
                layer.faulty.add(coords)
            elif offset == EMPTY and nbytes == EMPTY:
                layer.expected[where] = 0  # absent: the fill value
            elif nbytes == INNER_BYTES and offset + nbytes <= size:
                handle.seek(offset)
                layer.expected[where] = np.frombuffer(handle.read(nbytes), np.uint8).reshape((INNER,) * 3)
            else:
                layer.faulty.add(coords)
    return layer


TABLE_DAMAGE = ["zero", "shift", "swap", "huge", "past_end", "before_data", "over_bound"]


def write_wkw(mag: Path, data: st.DataObject, voxels: np.ndarray, compressed: bool) -> Layer:
    """One file of 2³ blocks of 32³ (the whole layer); an LZ4 file's jump table, or a raw file's size, damaged."""
    block_type = wkw.Header.BLOCK_TYPE_LZ4 if compressed else wkw.Header.BLOCK_TYPE_RAW
    with wkw.Dataset.create(str(mag), wkw.Header(np.uint8, block_len=CHUNK, file_len=2, block_type=block_type)) as ds:
        ds.write((0, 0, 0), voxels)
    kind = "wkwlz4" if compressed else "wkwraw"
    layer = Layer(kind, "wkw", CHUNK, voxels.copy(), documents={"header.wkw": WKW_HEADER})
    path = mag / "z0" / "y0" / "x0.wkw"
    raw = path.read_bytes()
    data_offset = int.from_bytes(raw[8:16], "little")
    blocks = [(x, y, z) for z in range(2) for y in range(2) for x in range(2)]  # Morton order of a 2³ cube
    extended = data.draw(st.sampled_from([None, None, BIG]), "a hole at the end")
    if not compressed:
        size = data.draw(
            st.sampled_from([len(raw), 0, 8, WKW_HEADER, data_offset + 3 * CHUNK_BYTES + 5, len(raw) - 1]), "size"
        )
        sparse(path, extended or size)
        for index, coords in enumerate(blocks):
            if (extended or size) < data_offset + (index + 1) * CHUNK_BYTES:
                layer.faulty.add(coords)
        if (extended or size) < WKW_HEADER:
            layer.faulty.update(blocks)
        return layer
    ends = np.frombuffer(raw[WKW_HEADER : WKW_HEADER + WKW_TABLE], "<u8").copy()
    original = ends.copy()
    size = extended or len(raw)
    for _ in range(data.draw(st.integers(0, 3), "damaged entries")):
        position = data.draw(st.integers(0, 7), "entry")
        start = data_offset if position == 0 else int(ends[position - 1])
        how = data.draw(st.sampled_from(TABLE_DAMAGE), f"damage of entry {position}")
        values = {
            "zero": start,
            "shift": max(0, int(ends[position]) + data.draw(st.integers(-64, 64), "shift")),
            "swap": int(original[data.draw(st.integers(0, 7), "other entry")]),
            "huge": data.draw(st.sampled_from([BIG, 2**63, EMPTY]), "huge"),
            "past_end": size + data.draw(st.integers(1, 4096), "past the end"),
            "before_data": data.draw(st.integers(0, max(data_offset - 1, 0)), "before the data"),
            "over_bound": start + lz4_bound(CHUNK_BYTES) + data.draw(st.integers(1, BIG // 2), "over the bound"),
        }
        ends[position] = min(values[how], EMPTY)  # an entry after a huge one may add past what 64 bits hold
    with open(path, "r+b") as handle:
        handle.seek(16)
        handle.write(ends.tobytes())
    if extended:
        sparse(path, extended)
    starts = [data_offset, *map(int, original[:-1])]
    for index, coords in enumerate(blocks):
        start = data_offset if index == 0 else int(ends[index - 1])
        if (start, int(ends[index])) != (starts[index], int(original[index])):
            layer.faulty.add(coords)  # its bytes are not its block's: refused, or (by chance) still its block
    return layer


def damage_document(layer: Layer, mag: Path, dataset: Path, data: st.DataObject) -> None:
    """Perhaps: the layer's metadata document or the dataset's properties past its size bound, or holed."""
    target = data.draw(st.sampled_from(["none", "none", "none", "document", "properties"]), "document damage")
    if target == "none":
        return
    name = next(iter(layer.documents)) if target == "document" else "datasource-properties.json"
    path = (mag if target == "document" else dataset) / name
    bound = layer.documents[name] if target == "document" else MAX_PROPERTIES_BYTES
    holes = [] if name == "header.wkw" else ["hole"]  # a header's NULs may be its own zeros: no oracle there
    how = data.draw(st.sampled_from(["past", "big", *holes]), "how")
    if how == "hole":  # cut inside the document, then extended by NULs: no longer JSON
        size = path.stat().st_size
        sparse(path, data.draw(st.integers(1, size - 1), "cut at"))
        sparse(path, size + 100)
        layer.unusable = ("JSON", "UTF-8")  # NULs may read as another encoding that JSON allows
        return
    sparse(path, bound + 1 if how == "past" else BIG)
    if name != "header.wkw":  # a mag header is its first 16 bytes: the rest of that file is never read
        layer.unusable = ("its format allows there",) if target == "document" else ("too large",)


KINDS = ["v2raw", "v3shard", "wkwlz4", "wkwraw"]


def plant(dataset: Path, kind: str, seed: int, data: st.DataObject) -> Layer:
    voxels = truth(seed)
    mag = dataset / kind / "1"
    if kind == "v2raw":
        layer = write_v2raw(mag, data, voxels)
    elif kind == "v3shard":
        layer = write_v3shard(mag, data, voxels)
    else:
        layer = write_wkw(mag, data, voxels, compressed=kind == "wkwlz4")
    write_properties(dataset, [layer_entry(kind, layer.data_format)])
    damage_document(layer, mag, dataset, data)
    return layer


# --- in process: the real catalog and sources, every read noted ------------------------------------------


def _touched(layer: Layer, lo: tuple[int, int, int], hi: tuple[int, int, int]) -> list[tuple[int, int, int]]:
    x, y, z = (range(a // layer.chunk, -(-b // layer.chunk)) for a, b in zip(lo, hi))
    return list(itertools.product(x, y, z))


def _assert_within(store: RecordingStore, layer: Layer, chunks: list[tuple[int, int, int]], what: str) -> None:
    reads = store.taken()
    total = sum(size for _, size in reads)
    assert total <= layer.allowance(chunks), (what, layer.kind, total, layer.allowance(chunks), reads)


def _check_region(
    source: MagSource, store: RecordingStore, layer: Layer, lo: tuple[int, int, int], hi: tuple[int, int, int]
) -> None:
    touched = _touched(layer, lo, hi)
    try:
        region = source.read_box(lo, hi)
    except READ_ERRORS as exc:
        assert str(exc) and layer.may_refuse(touched), ("a sound region was refused", layer.kind, lo, hi, exc)
    else:
        wanted = layer.expected[tuple(slice(a, b) for a, b in zip(lo, hi))]
        assert np.array_equal(region.data[0], wanted), ("wrong voxels", layer.kind, lo, hi, sorted(layer.faulty))
    _assert_within(store, layer, touched, f"region {lo}-{hi}")


def _check_stored_chunk(source: MagSource, store: RecordingStore, layer: Layer, coords: tuple[int, int, int]) -> None:
    lo = _scaled(coords, layer.chunk)
    block = layer.expected[_cut(layer.expected, coords, layer.chunk)]
    try:
        stored = source.stored_chunk((0, *coords), lo)
    except ChunkNotFound:
        assert layer.kind == "v3shard" and not block.any(), ("absent, yet it holds voxels", coords)
    except READ_ERRORS as exc:
        assert str(exc) and layer.may_refuse([coords]), ("a sound chunk was refused", layer.kind, coords, exc)
    else:
        assert stored is not None  # every file of these layers exists
        if coords not in layer.faulty and layer.kind != "wkwlz4":
            expected = block.tobytes(order="F" if layer.kind == "wkwraw" else "C")
            assert stored.data == expected, ("a stored chunk that is not its voxels", layer.kind, coords)
        elif coords not in layer.faulty:
            decoded = lz4.block.decompress(stored.data, uncompressed_size=CHUNK_BYTES)
            assert decoded == block.tobytes(order="F"), ("a stored block that is not its voxels", coords)
    _assert_within(store, layer, [coords], f"stored chunk {coords}")


def _check_virtual_shard(source: MagSource, store: RecordingStore, layer: Layer) -> None:
    """The v3 tree's sharded layout: the WKW file cube served as one shard, laid out from its jump table alone,
    read whole, as its first byte and as its last."""
    every = _chunk_coords(CHUNK)
    try:
        blocks = source.stored_blocks((0, 0, 0))
        assert blocks is not None
        plan = plan_shard(source, blocks, (0, 0, 0))
        for start, end in ((0, plan.size), (0, 1), (plan.size - 1, plan.size)):
            read_shard(source, plan, start, end)
    except READ_ERRORS as exc:
        assert str(exc) and layer.may_refuse(every), ("a sound file cube was refused", layer.kind, exc)
    _assert_within(store, layer, every * 3, "virtual shard")


@pytest.fixture
def scratch() -> Iterator[Callable[[], Path]]:
    """Fresh directories for the examples of one test, removed with it."""
    with tempfile.TemporaryDirectory(prefix="fuzz-read-bounds-") as base:
        counter = itertools.count()
        yield lambda: Path(base) / f"root{next(counter)}"


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 3), data=st.data())
def test_every_read_of_a_damaged_layer_is_bounded_and_exact_or_refused(
    scratch: Callable[[], Path], kind: str, seed: int, data: st.DataObject
) -> None:
    root = scratch()
    layer = plant(root / ORG / DATASET, kind, seed, data)
    store = RecordingStore(LocalStore(str(root)))
    catalog = Catalog(store, SourceFormats(store, 8 << 20))
    dataset = catalog.dataset(ORG, DATASET)
    assert dataset is not None
    event(f"{kind}: {'unusable' if layer.unusable is not None else 'damaged' if layer.faulty else 'sound'}")
    for path, size in store.taken():  # the load: each document within its own bound
        name = os.path.basename(path)
        bound = MAX_PROPERTIES_BYTES if name == "datasource-properties.json" else layer.documents.get(name, 0)
        assert size <= bound, (path, size, bound)
    if layer.unusable is not None:
        reason = dataset.reason if not isinstance(dataset, Dataset) else "; ".join(dataset.layers[kind].problems)
        assert reason and any(word in reason for word in layer.unusable), (layer.unusable, reason)
        assert not isinstance(dataset, Dataset) or not dataset.layers[kind].mags
        return
    assert isinstance(dataset, Dataset), dataset
    mags = dataset.layers[kind].mags
    if not mags:  # a WKW file cut inside its header is found when the mag opens: the reason is said
        assert layer.kind.startswith("wkw") and dataset.layers[kind].problems
        return
    source = mags[(1, 1, 1)]
    for coords in _chunk_coords(layer.chunk):
        _check_stored_chunk(source, store, layer, coords)
    boxes: list[tuple[Vec, Vec]] = [
        (ORIGIN, WHOLE),
        ((5, 9, 17), (40, 64, 33)),
        (ORIGIN, _scaled((1, 1, 1), layer.chunk)),
    ]
    for lo, hi in boxes:
        _check_region(source, store, layer, lo, hi)
    if layer.kind.startswith("wkw"):
        _check_virtual_shard(source, store, layer)
    if not layer.faulty:  # sound files are read exactly, every region of them
        assert np.array_equal(source.read_box(ORIGIN, WHOLE).data[0], layer.expected)


# --- through a real gateway: GET, HEAD and a range of every chunk, bytes read and memory measured -------------


@pytest.fixture(scope="module")
def gateway_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz-read-bounds")
    (root / ORG).mkdir()
    return root


@pytest.fixture(scope="module")
def served(gateway_root: Path, server_factory: Callable[..., Server]) -> Server:
    return server_factory(gateway_root, codec="none")


def _served_chunk(body: bytes, zarray: dict[str, Any]) -> np.ndarray:
    """A v2 chunk's voxels (c, x, y, z) as the served ``.zarray`` says they are encoded."""
    if zarray["compressor"] is not None:
        body = numcodecs.get_codec(zarray["compressor"]).decode(body)
    return np.frombuffer(body, np.dtype(zarray["dtype"])).reshape(zarray["chunks"], order=zarray["order"])


def _keys(chunks: list[int]) -> list[tuple[int, int, int]]:
    """The chunks asked for: every one of a layer of 2³ chunks; of a finer grid, those of the first shard (where
    the damage is) and the last one."""
    per_edge = [EDGE // edge for edge in chunks]
    if per_edge == [2, 2, 2]:
        return _chunk_coords(CHUNK)
    x, y, z = (range(min(n, CHUNK // edge)) for n, edge in zip(per_edge, chunks))
    return [*itertools.product(x, y, z), (per_edge[0] - 1, per_edge[1] - 1, per_edge[2] - 1)]


_datasets = itertools.count()


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 3), data=st.data())
def test_every_request_for_a_damaged_layer_reads_within_its_geometry(
    gateway_root: Path, served: Server, kind: str, seed: int, data: st.DataObject
) -> None:
    name = f"d{next(_datasets)}"
    layer = plant(gateway_root / ORG / name, kind, seed, data)
    event(f"{kind}: {'unusable' if layer.unusable is not None else 'damaged' if layer.faulty else 'sound'}")
    base = f"{served.url}/data/{{tree}}/{ORG}/{name}/{kind}/1"
    allowance = SLACK
    with requests.Session() as session, PeakRss(served) as peak:
        session.headers["Accept-Encoding"] = "identity"  # a range of the stored bytes, not of a gzip body
        before = bytes_read(served)
        zarray = session.get(base.format(tree="zarr") + "/.zarray", timeout=60)
        if layer.unusable is not None:
            assert zarray.status_code in (404, 409, 500), (zarray.status_code, zarray.text[:300])
            assert any(word in zarray.json()["error"] for word in layer.unusable), zarray.text[:300]
            keys: list[tuple[int, int, int]] = []
        elif zarray.status_code != 200:  # a WKW file cut inside its header: the mag cannot open, with the reason
            assert layer.kind.startswith("wkw") and zarray.json()["error"], zarray.text[:300]
            keys = []
        else:
            metadata = zarray.json()
            keys = _keys(metadata["chunks"][1:])
        for coords in keys:
            allowance += _check_chunk_requests(session, base, layer, metadata, coords)
        read = bytes_read(served) - before
    assert read <= allowance, f"{kind}: the gateway read {read} bytes, more than the {allowance} its geometry allows"
    assert peak.growth < RSS_GROWTH, f"{kind}: the worker grew by {peak.growth >> 20} MiB"
    if keys and not layer.faulty:
        array = zarr.open_array(base.format(tree="zarr3"), mode="r")
        assert np.array_equal(np.asarray(array[0]), layer.expected), "the v3 tree's voxels of a sound layer"
    assert_no_unexpected_errors(served)


def _check_chunk_requests(
    session: requests.Session, base: str, layer: Layer, zarray: dict[str, Any], coords: tuple[int, int, int]
) -> int:
    """GET, HEAD and ``Range: bytes=0-0`` of one chunk in both trees; the most bytes they may read, by geometry."""
    edge = zarray["chunks"][1]
    touched = _touched(layer, _scaled(coords, edge), _scaled((coords[0] + 1, coords[1] + 1, coords[2] + 1), edge))
    wanted = layer.expected[_cut(layer.expected, coords, edge)]
    v2 = f"{base.format(tree='zarr')}/0.{'.'.join(map(str, coords))}"
    v3 = f"{base.format(tree='zarr3')}/c/0/{'/'.join(map(str, coords))}"
    for url in (v2, v3):
        got = session.get(url, timeout=60)
        where = (layer.kind, url, got.status_code, got.content[:200] if got.status_code >= 400 else b"")
        if got.status_code == 200:
            if url == v2:
                assert np.array_equal(_served_chunk(got.content, zarray)[0], wanted), ("wrong voxels", where)
        elif got.status_code == 404:  # absent by the format's rules: only a chunk that reads as the fill value
            assert not wanted.any() and not layer.may_refuse(touched), ("a fault read as absent", where)
        else:
            assert got.status_code >= 500 and got.json()["error"], where
            assert layer.may_refuse(touched), ("a sound chunk was refused", where)
        head = session.head(url, timeout=60)
        ranged = session.get(url, headers={"Range": "bytes=0-0"}, timeout=60)
        assert head.status_code == got.status_code, (where, head.status_code)
        if got.status_code == 200:
            assert ranged.status_code == 206 and ranged.content == got.content[:1], (where, ranged.status_code)
        else:
            assert ranged.status_code == got.status_code, (where, ranged.status_code)
    return 6 * layer.allowance(touched)


# --- metadata multipliers: what a few bytes of metadata declare, costed before anything is built ---------------

MULTIPLIED_BUDGET = 24 << 20  # chunk_memory_bytes of the gateway below: chunks of a few channels are past it
MULTIPLIED_EDGE = 32  # its served chunk edge
SLACK_RSS = 16 << 20  # what a worker's memory moves by besides what it builds for a chunk
# Channels near the bounds: a few, around what fits the budget, around MAX_CHANNELS, and a channel bomb.
CHANNELS = st.one_of(
    st.integers(1, 8),
    st.integers(MAX_CHANNELS - 2, MAX_CHANNELS + 2),
    st.sampled_from([64, 96, 128, 200, 1024, 16384]),
)


@pytest.fixture(scope="module")
def multiplied_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-multipliers")


@pytest.fixture(scope="module")
def multiplied(multiplied_root: Path, server_factory: Callable[..., Server]) -> Server:
    server = server_factory(
        multiplied_root, chunk_memory_bytes=MULTIPLIED_BUDGET, chunk_edge=MULTIPLIED_EDGE, codec="none"
    )
    # a first preview imports the image libraries (tens of MiB, once): not what an example measures
    _metadata_only_layer(multiplied_root / ORG / "warm", 1, "uint8", 2, 1)
    requests.get(f"{server.url}/preview/{ORG}/warm/many.png", timeout=120)
    return server


def _metadata_only_layer(dataset: Path, channels: int, dtype: str, version: int, chunk_channels: int) -> None:
    """A Zarr layer of ``channels`` x 64³ whose chunks are all absent (made of the fill value if asked for)."""
    shape, chunks = [channels, EDGE, EDGE, EDGE], [chunk_channels, 32, 32, 32]
    entry = {**layer_entry("many", "zarr" if version == 2 else "zarr3"), "elementClass": dtype}
    write_properties(dataset, [{**entry, "numChannels": channels}])
    mag = dataset / "many" / "1"
    mag.mkdir(parents=True)
    if version == 2:
        zarray = {"zarr_format": 2, "shape": shape, "chunks": chunks, "dtype": np.dtype(dtype).str, "order": "C"}
        (mag / ".zarray").write_text(json.dumps({**zarray, "compressor": None, "fill_value": 0, "filters": None}))
        return
    grid = {"name": "regular", "configuration": {"chunk_shape": chunks}}
    document = {"zarr_format": 3, "node_type": "array", "shape": shape, "data_type": dtype, "chunk_grid": grid}
    keys = {"name": "default", "configuration": {"separator": "/"}}
    codecs = [{"name": "bytes", "configuration": {"endian": "little"}}]
    (mag / "zarr.json").write_text(
        json.dumps({**document, "chunk_key_encoding": keys, "fill_value": 0, "codecs": codecs})
    )


@settings(max_examples=16, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    channels=CHANNELS,
    dtype=st.sampled_from(["uint8", "uint16", "uint64"]),
    version=st.sampled_from([2, 3]),
    whole=st.booleans(),
)
def test_every_chunk_a_metadata_multiplier_declares_is_costed_before_it_is_built(
    multiplied_root: Path, multiplied: Server, channels: int, dtype: str, version: int, whole: bool
) -> None:
    """A metadata-only Zarr layer of generated channels and data type (chunks absent: made of the fill value):
    past ``MAX_CHANNELS`` the mag is unusable with the reason; else each tree's chunk (v2, v3, xarray,
    precomputed) whose working memory is past the whole budget is a 413 naming it, one within it is served, and
    the worker never grows past the budget."""
    name = f"m{next(_datasets)}"
    _metadata_only_layer(multiplied_root / ORG / name, channels, dtype, version, channels if whole else 1)
    served_chunk = channels * MULTIPLIED_EDGE**3 * np.dtype(dtype).itemsize
    event(
        "unusable" if channels > MAX_CHANNELS else "past the budget" if 3 * served_chunk > MULTIPLIED_BUDGET else "fits"
    )
    base = f"{multiplied.url}/data/{{tree}}/{ORG}/{name}"
    paths = {
        "zarr": "/many/1/0.0.0.0",
        "zarr3": "/many/1/c/0/0/0/0",
        "xarray": "/1/many/c/0/0/0/0" if channels > 1 else "/1/many/c/0/0/0",
        "precomputed": "/many/1/0-32_0-32_0-32",
    }
    with requests.Session() as session, PeakRss(multiplied) as peak:
        for tree, path in paths.items():
            got = session.get(base.format(tree=tree) + path, timeout=120)
            where = (tree, channels, dtype, version, got.status_code, got.text[:300] if got.status_code >= 400 else "")
            if channels > MAX_CHANNELS:  # the xarray tree has no mag at all: its only layer is unusable
                assert got.status_code == 404, where
                assert tree == "xarray" or f"{channels} channels" in got.json()["error"], where
            elif 3 * served_chunk > MULTIPLIED_BUDGET:  # the chunk, its copy and what it decodes: past the budget
                assert got.status_code == 413 and "chunk_memory_bytes" in got.json()["error"], where
            elif 4 * served_chunk <= MULTIPLIED_BUDGET:  # within it, with every copy a tree makes
                assert got.status_code in (200, 404), where  # 404: absent, read as the fill value (0)
                if got.status_code == 200:
                    assert not any(got.content), where
        # the layer's preview: made within the same budget, else refused with the reason (or past its own bound)
        preview = session.get(f"{multiplied.url}/preview/{ORG}/{name}/many.png", timeout=120)
        where = ("preview", channels, dtype, version, preview.status_code, preview.text[:300])
        assert preview.status_code in (200, 404, 413), where
        if preview.status_code != 200:
            assert preview.json()["error"], where
    assert peak.growth < MULTIPLIED_BUDGET + SLACK_RSS, (
        f"{channels} x {dtype}: the worker grew by {peak.growth >> 20} MiB"
    )
    assert_no_unexpected_errors(multiplied)


# --- meshes: the chunk shape a segmentation declares, costed before a window is read --------------------------

MESH_BUDGET = 192 << 20  # chunk_memory_bytes of the gateway below: the most surface a request makes fits in it
# Chunk edges a writer uses, and ones whose chunk alone decodes far past the budget (metadata only: no file).
MESH_CHUNK_EDGES = st.sampled_from([16, 32, 64, 128, 256, 1024, 4096])


@pytest.fixture(scope="module")
def meshed_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-mesh-multipliers")


@pytest.fixture(scope="module")
def meshed(meshed_root: Path, server_factory: Callable[..., Server]) -> Server:
    server = server_factory(meshed_root, chunk_memory_bytes=MESH_BUDGET, mesh_threads=2)
    # a first mesh imports the meshing libraries (tens of MiB, once): not what an example measures
    _segmentation_only_metadata(meshed_root / ORG / "warm", 32, "uint8", (64, 64, 64))
    requests.get(f"{server.url}/data/meshes/{ORG}/warm/seg/legacy/1:0:0_0_0", timeout=120)
    return server


def _segmentation_only_metadata(dataset: Path, chunk: int, dtype: str, size: tuple[int, int, int]) -> None:
    """A Zarr v2 segmentation layer of ``size`` in chunks of ``chunk``³, none stored (all of the fill value)."""
    entry = {**layer_entry("seg", "zarr", size), "category": "segmentation", "elementClass": dtype}
    write_properties(dataset, [{**entry, "largestSegmentId": 1}])
    mag = dataset / "seg" / "1"
    mag.mkdir(parents=True)
    zarray = {"zarr_format": 2, "shape": [1, *size], "chunks": [1, chunk, chunk, chunk], "order": "C"}
    zarray |= {"dtype": np.dtype(dtype).str, "compressor": None, "fill_value": 0, "filters": None}
    (mag / ".zarray").write_text(json.dumps(zarray))


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    chunk=MESH_CHUNK_EDGES,
    dtype=st.sampled_from(["uint8", "uint32", "uint64"]),
    size=st.sampled_from([(64, 64, 64), (256, 256, 128), (4096, 4096, 256)]),
)
def test_every_mesh_request_a_declared_chunk_shape_makes_costly_is_refused_before_it_reads(
    meshed_root: Path, meshed: Server, chunk: int, dtype: str, size: tuple[int, int, int]
) -> None:
    """A metadata-only segmentation of generated chunk shape, data type and extent: each mesh request (legacy
    fragment, multi-resolution manifest, the precomputed tree's) is answered or refused with the reason, one
    whose windows would decode past the worker's whole budget a 413 naming it, and the worker never grows past
    the budget."""
    name = f"s{next(_datasets)}"
    _segmentation_only_metadata(meshed_root / ORG / name, chunk, dtype, size)
    paths = [
        f"/data/meshes/{ORG}/{name}/seg/legacy/1:0:0_0_0",
        f"/data/meshes/{ORG}/{name}/seg/multires/1.index",
        f"/data/precomputed/{ORG}/{name}/seg/mesh/1.index",
    ]
    chunk_bytes = chunk**3 * np.dtype(dtype).itemsize
    with requests.Session() as session, PeakRss(meshed) as peak:
        for path in paths:
            got = session.get(meshed.url + path, timeout=300)
            where = (path, chunk, dtype, size, got.status_code, got.text[:300] if got.status_code >= 400 else "")
            # 404: a layer whose chunks no writer makes, or a segment it does not hold; 409: one too large to scan
            assert got.status_code in (200, 404, 409, 413), where
            if got.status_code >= 400:
                assert got.json()["error"], where
            if chunk_bytes > MAX_CHUNK_BYTES:
                assert got.status_code == 404 and "decodes to" in got.json()["error"], where
                event("unusable")
            # a window decodes one chunk at least, whole; a legacy fragment meshes one box, the others every box
            elif chunk_bytes + (BOX_SURFACE_BYTES if "legacy" in path else SURFACE_BYTES) > MESH_BUDGET:
                assert got.status_code == 413 and "chunk_memory_bytes" in got.json()["error"], where
                event("refused: past the budget")
            else:
                event(f"answered {got.status_code}")
    assert peak.growth < MESH_BUDGET + SLACK_RSS, f"{chunk}³ x {dtype}: the worker grew by {peak.growth >> 20} MiB"
    assert_no_unexpected_errors(meshed)
