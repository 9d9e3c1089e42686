"""What every ``MagSource`` must do, checked for each implementation (in the manner of zarr-python's StoreTests).

``MagSourceContract`` states the contract once; each format subclasses it with three things: how its own
library writes a mag (``write``), how that library reads it back (``read_truth``: the wkw package for WKW,
tensorstore for Zarr), and how the gateway opens it as a source (``open``), plus how to decode the stored
bytes it hands out (``decode``) and which file holds a voxel (``data_file``). Every mag has the same
geometry: an array of ``EXTENT`` voxels with random, nonzero voxels everywhere but one file cube that is
never written (``HOLE``), and a bounding box smaller than the array, so that masking to it shows.

A new format (N5, Neuroglancer precomputed) adds a subclass; the tests come with it.
"""

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import lz4.block
import numcodecs
import numpy as np
import pytest
import tensorstore as ts
import wkw

from gateway.http.errors import rule_for
from gateway.shard_formats.neuroglancer_sharded import compressed_morton_code
from gateway.sources.mag import ChunkNotFound, MagSource, StoredChunk, StoredEncoding
from gateway.sources.metadata import PrecomputedSharding
from gateway.sources.n5_source import N5MagSource
from gateway.sources.precomputed_source import PrecomputedMagSource, sharding_of
from gateway.sources.properties import BoundingBox
from gateway.sources.wkw_source import WkwMagSource
from gateway.sources.zarr_source import ZarrMagSource
from gateway_storage import ByteLRU, LocalStore
from gateway_storage.geometry import Box, Vec3, vec3
from wkw_adapter import WkwFileCache

MAG: Vec3 = (1, 1, 1)
CHUNK = 16  # voxels per edge of a stored chunk (a WKW block, a Zarr chunk or inner chunk)
CUBE = 32  # voxels per edge of a data file (a WKW file, a Zarr v3 shard; a Zarr chunk file is smaller)
EXTENT: Vec3 = (80, 64, 48)  # the array as written: [0, EXTENT)
HOLE: Vec3 = (2, 1, 1)  # the file cube that is never written: x 64-80, y 32-64, z 32-48
TOP_LEFT: Vec3 = (5, 7, 3)
SIZE: Vec3 = (70, 50, 40)  # the bounding box: [5, 75) x [7, 57) x [3, 43), inside EXTENT, over part of HOLE
BBOX = BoundingBox.model_validate({"topLeft": TOP_LEFT, "width": SIZE[0], "height": SIZE[1], "depth": SIZE[2]})
BBOX_HI: Vec3 = (75, 57, 43)

# Boxes [lo, hi) to read, by where they lie against the bounding box.
BOXES: dict[str, tuple[Vec3, Vec3]] = {
    "inside": ((16, 16, 16), (48, 32, 32)),
    "inside-unaligned": ((9, 11, 4), (40, 50, 30)),
    "straddling-the-low-corner": ((0, 0, 0), (20, 20, 20)),
    "straddling-the-high-corner": ((60, 40, 30), (80, 64, 48)),
    "over-the-hole": ((56, 24, 24), (80, 64, 48)),
    "the-whole-served-shape": ((0, 0, 0), BBOX_HI),
    "outside-below": ((0, 0, 0), (5, 64, 48)),
    "outside-beyond-the-array": ((80, 0, 0), (96, 16, 16)),
}
# Stored chunks (their voxel corner) that hold written voxels, and one in the hole.
WRITTEN_CHUNKS: list[Vec3] = [(0, 0, 0), (16, 32, 16), (48, 16, 32), (64, 0, 0)]
CHUNK_IN_HOLE: Vec3 = (64, 32, 32)


def _cubes() -> list[Vec3]:
    """The file cubes of the array, the hole left out."""
    counts = [-(-e // CUBE) for e in EXTENT]
    return [
        (x, y, z) for x in range(counts[0]) for y in range(counts[1]) for z in range(counts[2]) if (x, y, z) != HOLE
    ]


def _window(lo: Vec3, hi: Vec3) -> tuple[slice, slice, slice, slice]:
    return (slice(None), *Box(lo, hi).slices())


def _cube_box(cube: Vec3) -> tuple[Vec3, Vec3]:
    lo = vec3(c * CUBE for c in cube)
    hi = vec3(min(a + CUBE, e) for a, e in zip(lo, EXTENT))
    return lo, hi


def _is_storage_fault(exc: BaseException) -> bool:
    """What the HTTP layer answers with a 5xx (never a 404, which clients turn into fill values)."""
    return rule_for(exc).status >= 500 and not isinstance(exc, ChunkNotFound)


@dataclass(frozen=True)
class WrittenMag:
    """A mag directory as the format's library wrote it, and what that library reads from it."""

    root: Path
    directory: Path
    truth: np.ndarray  # (c, x, y, z) over [0, EXTENT), unmasked


class MagSourceContract:
    """The contract of ``gateway.sources.mag.MagSource``; subclass it per format (``Test...``) to check one."""

    dtype: ClassVar[str] = "uint16"
    channels: ClassVar[int] = 1
    detects_corruption: ClassVar[bool] = True  # False where any bytes are valid voxels (uncompressed)

    # --- what a subclass provides -------------------------------------------------------------------

    def write(self, directory: Path, data: np.ndarray, cubes: list[Vec3]) -> None:
        """Write the file cubes ``cubes`` of ``data`` ((c, x, y, z) over [0, EXTENT)) with the format's library."""
        raise NotImplementedError

    def read_truth(self, directory: Path) -> np.ndarray:
        """The whole array, (c, x, y, z) over [0, EXTENT), as the format's own library reads it."""
        raise NotImplementedError

    def open(self, root: Path, directory: Path) -> MagSource:
        """The gateway's source over the mag, with fresh caches, as the catalog would open it."""
        raise NotImplementedError

    def decode(self, source: MagSource, chunk: StoredChunk) -> np.ndarray:
        """The (c, x, y, z) voxels of a stored chunk, decoded from its bytes as a client would."""
        raise NotImplementedError

    def chunk_shape(self, source: MagSource) -> tuple[int, int, int, int] | None:
        """The (c, x, y, z) shape of the chunks the source hands out as stored."""
        return source.stored_chunk_shape

    def data_file(self, directory: Path, voxel: Vec3) -> Path:
        """The file that holds ``voxel``."""
        raise NotImplementedError

    # --- fixtures -----------------------------------------------------------------------------------

    @pytest.fixture(scope="class")
    @classmethod
    def written(cls, tmp_path_factory: pytest.TempPathFactory) -> WrittenMag:
        """The mag, written once per format: the tests that damage it take ``own_copy``."""
        return cls()._write_mag(tmp_path_factory.mktemp(cls.__name__), np.random.default_rng(11))

    @pytest.fixture
    def own_copy(self, written: WrittenMag, tmp_path: Path) -> WrittenMag:
        """A copy of the written mag that a test may damage."""
        root = tmp_path / "root"
        shutil.copytree(written.root, root)
        return WrittenMag(root, root / written.directory.relative_to(written.root), written.truth)

    def _write_mag(self, root: Path, rng: np.random.Generator) -> WrittenMag:
        directory = root / "mag"
        data = self._random(rng)
        self.write(directory, data, _cubes())
        truth = self.read_truth(directory)
        expected = data.copy()
        expected[_window(*_cube_box(HOLE))] = 0
        np.testing.assert_array_equal(truth, expected, err_msg="the format's library reads back what it wrote")
        return WrittenMag(root, directory, truth)

    def _random(self, rng: np.random.Generator) -> np.ndarray:
        """Nonzero voxels (a voxel read as zeros is a mistake) of few values, so that compressors compress."""
        return rng.integers(1, 64, size=(self.channels, *EXTENT), dtype=self.dtype)

    def _expected(self, truth: np.ndarray, lo: Vec3, hi: Vec3) -> np.ndarray:
        """Box [lo, hi) of the truth, the fill value (0) outside the array and outside the bounding box."""
        inside_array = np.zeros((self.channels, *EXTENT), dtype=bool)
        inside_array[_window(TOP_LEFT, BBOX_HI)] = True
        masked = np.where(inside_array, truth, 0)
        out = np.zeros((self.channels, *(h - low for low, h in zip(lo, hi))), dtype=truth.dtype)
        clip_hi = vec3(min(h, e) for h, e in zip(hi, EXTENT))
        if all(a < b for a, b in zip(lo, clip_hi)):
            out[_window((0, 0, 0), Box(lo, clip_hi).size)] = masked[_window(lo, clip_hi)]
        return out

    # --- geometry -----------------------------------------------------------------------------------

    def test_geometry_follows_the_bounding_box_and_the_header(self, written: WrittenMag) -> None:
        source = self.open(written.root, written.directory)
        assert source.shape == BBOX_HI
        assert (source.bbox.lo, source.bbox.hi) == (TOP_LEFT, BBOX_HI)
        assert source.dtype == np.dtype(self.dtype)
        assert source.channels == self.channels
        assert source.mag == MAG
        assert source.location_key == "mag", "relative to the data root, the same on every replica"

    # --- voxels -------------------------------------------------------------------------------------

    @pytest.mark.parametrize("box", BOXES)
    def test_read_box_is_the_format_library_s_read_masked_to_the_bounding_box(
        self, written: WrittenMag, box: str
    ) -> None:
        lo, hi = BOXES[box]
        region = self.open(written.root, written.directory).read_box(lo, hi)
        expected = self._expected(written.truth, lo, hi)
        assert region.data.shape == expected.shape
        assert region.data.dtype == expected.dtype
        np.testing.assert_array_equal(region.data, expected)

    def test_a_box_outside_the_bounding_box_reads_no_file(self, written: WrittenMag) -> None:
        region = self.open(written.root, written.directory).read_box(*BOXES["outside-beyond-the-array"])
        assert region.sources == [], "nothing was read, so nothing can change its answer"
        assert not region.data.any()

    # --- stored chunks ------------------------------------------------------------------------------

    @pytest.mark.parametrize("corner", WRITTEN_CHUNKS, ids=str)
    def test_a_stored_chunk_decodes_to_exactly_that_chunk(self, written: WrittenMag, corner: Vec3) -> None:
        source = self.open(written.root, written.directory)
        shape = self.chunk_shape(source)
        assert shape is not None and shape[1:] == (CHUNK,) * 3 and shape[0] == self.channels
        chunk = source.stored_chunk(self._index(corner), corner)
        assert chunk is not None, "a written chunk is handed out as stored"
        assert chunk.identity is not None and chunk.origin.startswith("mag/")
        decoded = self.decode(source, chunk)
        assert decoded.shape == shape
        end = vec3(min(c + CHUNK, e) for c, e in zip(corner, EXTENT))
        inside = _window((0, 0, 0), Box(corner, end).size)
        np.testing.assert_array_equal(decoded[inside], written.truth[_window(corner, end)])

    def test_a_chunk_never_written_is_absent(self, written: WrittenMag) -> None:
        """Absent means "reads as the fill value": None (the caller reads voxels) or ChunkNotFound (a 404)."""
        source = self.open(written.root, written.directory)
        try:
            chunk = source.stored_chunk(self._index(CHUNK_IN_HOLE), CHUNK_IN_HOLE)
        except ChunkNotFound:
            chunk = None
        assert chunk is None
        box = (CHUNK_IN_HOLE, vec3(min(c + CHUNK, e) for c, e in zip(CHUNK_IN_HOLE, BBOX_HI)))
        assert not source.read_box(*box).data.any()

    @staticmethod
    def _index(corner: Vec3) -> tuple[int, int, int, int]:
        x, y, z = (c // CHUNK for c in corner)
        return (0, x, y, z)

    def _truncated(self, copy: WrittenMag, corner: Vec3) -> MagSource:
        """The source over ``copy`` after the data file holding ``corner`` is cut to a third of its size."""
        path = self.data_file(copy.directory, corner)
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size // 3)
        return self.open(copy.root, copy.directory)

    @staticmethod
    def _assert_chunk_read_faults(source: MagSource, corner: Vec3) -> None:
        with pytest.raises(Exception) as raised:
            source.read_box(corner, tuple(c + CHUNK for c in corner))  # type: ignore[arg-type]
        assert _is_storage_fault(raised.value), repr(raised.value)

    # --- faults -------------------------------------------------------------------------------------

    @pytest.mark.parametrize("corner", [(16, 16, 16), (48, 40, 8)], ids=str)
    def test_a_truncated_data_file_is_a_storage_fault_never_zeros(self, own_copy: WrittenMag, corner: Vec3) -> None:
        self._assert_chunk_read_faults(self._truncated(own_copy, corner), corner)

    def test_a_truncated_data_file_is_never_an_absent_chunk(self, own_copy: WrittenMag) -> None:
        """Its stored chunk is a storage fault, or bytes that cannot decode: never "absent", which reads as fill."""
        corner: Vec3 = (16, 16, 16)
        source = self._truncated(own_copy, corner)
        try:
            chunk = source.stored_chunk(self._index(corner), corner)
        except Exception as exc:
            assert _is_storage_fault(exc), repr(exc)
        else:
            assert chunk is not None, "a damaged file is not an absent one"
            with pytest.raises(Exception):  # noqa: B017 (each codec fails in its own way)
                self.decode(source, chunk)

    def test_a_corrupt_data_file_is_a_storage_fault_never_zeros(self, own_copy: WrittenMag) -> None:
        """Garbage over the middle of a file: a fault where the format can tell (compressed payloads, checksums);
        where it cannot (uncompressed voxels: any bytes are voxels), exactly what the format's library reads."""
        corner: Vec3 = (16, 16, 16)
        path = self.data_file(own_copy.directory, corner)
        payload = bytearray(path.read_bytes())
        garbage = np.random.default_rng(3).integers(0, 256, size=len(payload) // 2, dtype=np.uint8).tobytes()
        start = len(payload) // 4  # past any header, before any index at the end
        payload[start : start + len(garbage)] = garbage
        path.write_bytes(bytes(payload))
        source = self.open(own_copy.root, own_copy.directory)
        box = ((0, 0, 0), _cube_box((0, 0, 0))[1])
        if not self.detects_corruption:
            expected = self._expected(self.read_truth(own_copy.directory), *box)
            assert (expected != self._expected(own_copy.truth, *box)).any(), "the garbage changed voxels"
            np.testing.assert_array_equal(source.read_box(*box).data, expected)
            return
        with pytest.raises(Exception) as raised:
            source.read_box(*box)
        assert _is_storage_fault(raised.value), repr(raised.value)

    # --- identity -----------------------------------------------------------------------------------

    def test_a_rewritten_file_changes_the_identity_and_the_voxels(self, own_copy: WrittenMag) -> None:
        """The same source (as the catalog keeps it) sees a file rewritten under it: new identity, new voxels."""
        corner: Vec3 = (16, 16, 16)
        source = self.open(own_copy.root, own_copy.directory)
        before = source.stored_chunk(self._index(corner), corner)
        assert before is not None and before.identity is not None
        path = self.data_file(own_copy.directory, corner)
        old = path.stat()
        data = self._random(np.random.default_rng(99))
        self.write(own_copy.directory, data, [(0, 0, 0)])
        if path.stat().st_mtime_ns == old.st_mtime_ns:  # a coarse file-system clock: the rewrite is still new
            os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns + 1_000_000_000))
        after = source.stored_chunk(self._index(corner), corner)
        assert after is not None and after.identity is not None
        assert after.identity != before.identity
        end = (corner[0] + CHUNK, corner[1] + CHUNK, corner[2] + CHUNK)
        np.testing.assert_array_equal(self.decode(source, after), data[_window(corner, end)])
        np.testing.assert_array_equal(source.read_box(corner, end).data, data[_window(corner, end)])
        region = source.read_box(corner, end)
        if region.sources is not None:  # a source that names the files it read names this version
            assert [identity for file, identity in region.sources if file == str(path)] == [after.identity]


# --- WKW ------------------------------------------------------------------------------------------------


class WkwContract(MagSourceContract):
    """A WKW mag written by the wkw package: files of 2^3 blocks of 16^3 (a file cube of 32)."""

    block_type: ClassVar[int] = wkw.Header.BLOCK_TYPE_LZ4HC

    def write(self, directory: Path, data: np.ndarray, cubes: list[Vec3]) -> None:
        header = wkw.Header(
            np.dtype(self.dtype), num_channels=self.channels, block_type=self.block_type, block_len=CHUNK, file_len=2
        )
        exists = (directory / "header.wkw").exists()
        dataset = wkw.Dataset.open(str(directory)) if exists else wkw.Dataset.create(str(directory), header)
        with dataset:
            for cube in cubes:  # compressed files are written whole: a cube past EXTENT is padded with zeros
                lo, hi = _cube_box(cube)
                padded = np.zeros((self.channels, CUBE, CUBE, CUBE), dtype=self.dtype)
                padded[_window((0, 0, 0), Box(lo, hi).size)] = data[_window(lo, hi)]
                dataset.write(lo, np.asfortranarray(padded))

    def read_truth(self, directory: Path) -> np.ndarray:
        with wkw.Dataset.open(str(directory)) as dataset:
            data: np.ndarray = dataset.read((0, 0, 0), EXTENT)
        return data

    def open(self, root: Path, directory: Path) -> MagSource:
        storage = LocalStore(str(root))
        return WkwMagSource(MAG, str(directory), BBOX, WkwFileCache(storage))

    def decode(self, source: MagSource, chunk: StoredChunk) -> np.ndarray:
        shape = self.chunk_shape(source)
        assert shape is not None
        raw = chunk.data
        if chunk.encoding is StoredEncoding.LZ4_BLOCK:
            raw = lz4.block.decompress(raw, uncompressed_size=chunk.uncompressed_size)
        else:
            assert chunk.encoding is StoredEncoding.RAW_BLOCK
        return np.frombuffer(raw, dtype=source.dtype).reshape(shape, order="F")

    def data_file(self, directory: Path, voxel: Vec3) -> Path:
        x, y, z = (v // CUBE for v in voxel)
        return directory / f"z{z}" / f"y{y}" / f"x{x}.wkw"


class TestWkwLz4Source(WkwContract):
    pass


class TestWkwRawSource(WkwContract):
    block_type = wkw.Header.BLOCK_TYPE_RAW
    dtype = "uint8"
    channels = 3
    detects_corruption = False


# --- Zarr -----------------------------------------------------------------------------------------------


class ZarrContract(MagSourceContract):
    """A Zarr array written by tensorstore, dimensions (c, x, y, z)."""

    def spec(self, directory: Path) -> dict[str, Any]:
        """The tensorstore spec that creates the array."""
        raise NotImplementedError

    def write(self, directory: Path, data: np.ndarray, cubes: list[Vec3]) -> None:
        spec = self.spec(directory)
        try:
            store = ts.open(spec, open=True).result()
        except ValueError:
            store = ts.open(spec, create=True).result()
        for cube in cubes:
            lo, hi = _cube_box(cube)
            store[_window(lo, hi)].write(data[_window(lo, hi)]).result()

    def read_truth(self, directory: Path) -> np.ndarray:
        driver = self.spec(directory)["driver"]
        store = ts.open({"driver": driver, "kvstore": {"driver": "file", "path": str(directory) + "/"}}).result()
        data: np.ndarray = store.read().result()
        return data

    def chunk_shape(self, source: MagSource) -> tuple[int, int, int, int] | None:
        # ZarrMagSource leaves stored_chunk_shape at None although it hands chunks out: the Zarr layer
        # takes a Zarr source's chunk shape from its native encoding.
        return source.native.chunk_shape if source.native is not None else None

    def open(self, root: Path, directory: Path) -> MagSource:
        return ZarrMagSource(MAG, LocalStore(str(root)), str(directory), BBOX, None, ByteLRU(1 << 20))

    def decode(self, source: MagSource, chunk: StoredChunk) -> np.ndarray:
        native = source.native
        assert native is not None and chunk.encoding is StoredEncoding.NATIVE
        raw = chunk.data
        if native.zarr_format == 2:
            if native.v2_compressor is not None:
                raw = numcodecs.get_codec(dict(native.v2_compressor)).decode(raw)
        else:
            for codec in reversed(native.v3_codecs):
                raw = _decode_v3(codec, raw)
        stored_shape = tuple(native.chunk_shape[a] for a in native.permutation)
        stored = np.frombuffer(bytes(raw), dtype=native.dtype).reshape(stored_shape)
        return np.transpose(stored, np.argsort(native.permutation)).astype(source.dtype)


def _decode_v3(codec: dict[str, Any], raw: bytes) -> bytes:
    """One bytes-to-bytes codec of the Zarr v3 spec, undone."""
    name, config = codec["name"], codec.get("configuration") or {}
    if name == "crc32c":
        import crc32c

        body, checksum = raw[:-4], raw[-4:]
        assert crc32c.crc32c(body).to_bytes(4, "little") == checksum
        return body
    codecs = {"gzip": lambda: numcodecs.GZip(config.get("level", 6)), "zstd": lambda: numcodecs.Zstd()}
    if name == "blosc":
        return bytes(numcodecs.Blosc().decode(raw))
    return bytes(codecs[name]().decode(raw))


class TestZarrV2Source(ZarrContract):
    def spec(self, directory: Path) -> dict[str, Any]:
        return {
            "driver": "zarr",
            "kvstore": {"driver": "file", "path": str(directory) + "/"},
            "metadata": {
                "shape": [self.channels, *EXTENT],
                "chunks": [self.channels, CHUNK, CHUNK, CHUNK],
                "dtype": np.dtype(self.dtype).str,
                "compressor": {"id": "zstd", "level": 3},
                "fill_value": 0,
                "order": "C",
            },
        }

    def data_file(self, directory: Path, voxel: Vec3) -> Path:
        return directory / ".".join(["0", *(str(v // CHUNK) for v in voxel)])


def _zarr3_spec(directory: Path, channels: int, dtype: str, cube: int, codecs: list[Any]) -> dict[str, Any]:
    """A tensorstore spec of a Zarr v3 array at ``directory``: channels first, then x, y, z in cubes of ``cube``."""
    return {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": str(directory) + "/"},
        "metadata": {
            "shape": [channels, *EXTENT],
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [channels, *(cube,) * 3]}},
            "data_type": dtype,
            "dimension_names": ["c", "x", "y", "z"],
            "codecs": codecs,
            "fill_value": 0,
        },
    }


class TestZarrV3Source(ZarrContract):
    dtype = "uint32"

    def spec(self, directory: Path) -> dict[str, Any]:
        codecs = [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "gzip"}]
        return _zarr3_spec(directory, self.channels, self.dtype, CHUNK, codecs)

    def data_file(self, directory: Path, voxel: Vec3) -> Path:
        return directory.joinpath("c", "0", *(str(v // CHUNK) for v in voxel))


class TestZarrV3ShardedSource(ZarrContract):
    """Shards of 2^3 inner chunks (a file cube of 32), the index at the end with a crc32c."""

    channels = 2

    def spec(self, directory: Path) -> dict[str, Any]:
        inner = [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd"}]
        sharding = {
            "name": "sharding_indexed",
            "configuration": {
                "chunk_shape": [self.channels, *(CHUNK,) * 3],
                "codecs": inner,
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                "index_location": "end",
            },
        }
        return _zarr3_spec(directory, self.channels, self.dtype, CUBE, [sharding])

    def data_file(self, directory: Path, voxel: Vec3) -> Path:
        return directory.joinpath("c", "0", *(str(v // CUBE) for v in voxel))


# --- N5 -------------------------------------------------------------------------------------------------


class N5Contract(ZarrContract):
    """An N5 dataset written by tensorstore in blocks of 16^3: dimensions (x, y, z), or (c, x, y, z) with channels.

    Its full blocks are handed out as Zarr chunks of its native encoding (big-endian, order F), so they
    decode as the Zarr contract decodes a v2 chunk.
    """

    compression: ClassVar[dict[str, Any]] = {"type": "gzip"}

    def _dimensions(self) -> tuple[list[int], list[int]]:
        if self.channels == 1:
            return list(EXTENT), [CHUNK] * 3
        return [self.channels, *EXTENT], [self.channels, *(CHUNK,) * 3]

    def spec(self, directory: Path) -> dict[str, Any]:
        dimensions, block = self._dimensions()
        metadata = {
            "dimensions": dimensions,
            "blockSize": block,
            "dataType": self.dtype,
            "compression": self.compression,
        }
        return {"driver": "n5", "kvstore": {"driver": "file", "path": str(directory) + "/"}, "metadata": metadata}

    def write(self, directory: Path, data: np.ndarray, cubes: list[Vec3]) -> None:
        spec = self.spec(directory)
        store = ts.open(spec, open=True, create=True).result()
        for cube in cubes:
            lo, hi = _cube_box(cube)
            voxels = data[_window(lo, hi)]
            target = store[tuple(slice(a, b) for a, b in zip(lo, hi))] if self.channels == 1 else store[_window(lo, hi)]
            target.write(voxels[0] if self.channels == 1 else voxels).result()

    def read_truth(self, directory: Path) -> np.ndarray:
        store = ts.open({"driver": "n5", "kvstore": {"driver": "file", "path": str(directory) + "/"}}).result()
        data: np.ndarray = store.read().result()
        return data[None] if self.channels == 1 else data

    def open(self, root: Path, directory: Path) -> MagSource:
        return N5MagSource(MAG, LocalStore(str(root)), str(directory), BBOX, None)

    def data_file(self, directory: Path, voxel: Vec3) -> Path:
        block = [str(v // CHUNK) for v in voxel]
        return directory.joinpath(*block) if self.channels == 1 else directory.joinpath("0", *block)


class TestN5GzipSource(N5Contract):
    pass


class TestN5RawSource(N5Contract):
    compression: ClassVar[dict[str, Any]] = {"type": "raw"}
    dtype = "uint8"
    detects_corruption = False


class TestN5BloscSource(N5Contract):
    compression: ClassVar[dict[str, Any]] = {"type": "blosc", "cname": "zstd", "clevel": 5, "shuffle": 2}
    dtype = "uint32"
    channels = 2
    detects_corruption = False  # Blosc carries no checksum: garbage in its stream may decode, as tensorstore reads it


# --- Neuroglancer precomputed ---------------------------------------------------------------------------


class ReadOnlyVoxels(MagSourceContract):
    """A source that hands out no chunk as stored (each is read as voxels): the stored-chunk tests say that."""

    @pytest.mark.parametrize("corner", [(0, 0, 0), (16, 32, 16)], ids=str)
    def test_a_stored_chunk_decodes_to_exactly_that_chunk(self, written: WrittenMag, corner: Vec3) -> None:
        source = self.open(written.root, written.directory)
        assert source.stored_chunk_shape is None and source.native is None
        assert source.stored_chunk(self._index(corner), corner) is None, "read as voxels, never passed through"

    def test_a_truncated_data_file_is_never_an_absent_chunk(self, own_copy: WrittenMag) -> None:
        corner: Vec3 = (16, 16, 16)
        self._assert_chunk_read_faults(self._truncated(own_copy, corner), corner)

    REWRITTEN: ClassVar[tuple[Vec3, Vec3]] = ((16, 16, 16), (16 + CHUNK, 16 + CHUNK, 16 + CHUNK))

    def _served(self, data: np.ndarray) -> np.ndarray:
        """What the source serves of the stored voxels ``data``."""
        return data

    def _reads_a_rewrite(self, own_copy: WrittenMag) -> tuple[MagSource, np.ndarray]:
        """The same source (as the catalog keeps it) reads box ``REWRITTEN`` of the truth, then of a data file
        rewritten under it; the source and the new stored voxels."""
        corner, end = self.REWRITTEN
        source = self.open(own_copy.root, own_copy.directory)
        np.testing.assert_array_equal(source.read_box(corner, end).data, own_copy.truth[_window(corner, end)])
        data = self._random(np.random.default_rng(99))
        self.write(own_copy.directory, data, [(0, 0, 0)])
        np.testing.assert_array_equal(source.read_box(corner, end).data, self._served(data)[_window(corner, end)])
        return source, data


class PrecomputedContract(ReadOnlyVoxels):
    """One scale (key ``mag``) of a precomputed volume at the data root, written by tensorstore in chunks of 16^3.

    Its chunks are never handed out as stored: a Zarr chunk cannot declare them. So the stored-chunk tests
    say that, and the identity test reads voxels.
    """

    encoding: ClassVar[str] = "raw"
    sharding: ClassVar[dict[str, Any] | None] = None

    def _scale(self) -> dict[str, Any]:
        scale: dict[str, Any] = {
            "key": "mag",
            "size": list(EXTENT),
            "resolution": [1.0, 1.0, 1.0],
            "voxel_offset": [0, 0, 0],
            "chunk_size": [CHUNK] * 3,
            "encoding": self.encoding,
        }
        if self.encoding == "compressed_segmentation":
            scale["compressed_segmentation_block_size"] = [8, 8, 8]
        if self.sharding is not None:
            scale["sharding"] = self.sharding
        return scale

    def write(self, directory: Path, data: np.ndarray, cubes: list[Vec3]) -> None:
        spec = {
            "driver": "neuroglancer_precomputed",
            "kvstore": {"driver": "file", "path": str(directory.parent) + "/"},
            "multiscale_metadata": {"type": "image", "data_type": self.dtype, "num_channels": self.channels},
            "scale_metadata": self._scale(),
        }
        store = ts.open(spec, open=True, create=True).result()
        for cube in cubes:
            lo, hi = _cube_box(cube)
            box = (*(slice(a, b) for a, b in zip(lo, hi)), slice(None))
            store[box].write(np.moveaxis(data[_window(lo, hi)], 0, 3)).result()

    def read_truth(self, directory: Path) -> np.ndarray:
        kvstore = {"driver": "file", "path": str(directory.parent) + "/"}
        spec = {"driver": "neuroglancer_precomputed", "kvstore": kvstore, "scale_metadata": {"key": directory.name}}
        return np.moveaxis(ts.open(spec).result().read().result(), 3, 0)

    def open(self, root: Path, directory: Path) -> MagSource:
        return PrecomputedMagSource(MAG, LocalStore(str(root)), str(directory), BBOX, ByteLRU(1 << 20))

    def decode(self, source: MagSource, chunk: StoredChunk) -> np.ndarray:
        raise AssertionError("a precomputed source hands out no stored chunk")

    def data_file(self, directory: Path, voxel: Vec3) -> Path:
        position = tuple(v // CHUNK for v in voxel)
        if self.sharding is not None:
            sharding = sharding_of(PrecomputedSharding.model_validate(self.sharding))
            grid = tuple(-(-e // CHUNK) for e in EXTENT)
            shard, _ = sharding.locate(compressed_morton_code(position, grid))
            return directory / sharding.shard_name(shard)
        starts = [p * CHUNK for p in position]
        return directory / "_".join(f"{s}-{min(s + CHUNK, e)}" for s, e in zip(starts, EXTENT))

    def test_a_rewritten_file_changes_the_identity_and_the_voxels(self, own_copy: WrittenMag) -> None:
        """The same source (as the catalog keeps it) reads the new voxels of a file rewritten under it."""
        self._reads_a_rewrite(own_copy)


class TestPrecomputedRawSource(PrecomputedContract):
    dtype = "uint8"
    channels = 3
    detects_corruption = False


class TestPrecomputedSegmentationSource(PrecomputedContract):
    dtype = "uint32"
    encoding = "compressed_segmentation"
    detects_corruption = False  # garbage over its value tables is other labels: tensorstore reads them too


class TestPrecomputedShardedSource(PrecomputedContract):
    """Shards of gzip'd chunks, found through gzip'd minishard indexes (murmurhash3 spreads them over shards)."""

    sharding: ClassVar[dict[str, Any] | None] = {
        "@type": "neuroglancer_uint64_sharded_v1",
        "preshift_bits": 2,
        "hash": "murmurhash3_x86_128",
        "minishard_bits": 2,
        "shard_bits": 2,
        "minishard_index_encoding": "gzip",
        "data_encoding": "gzip",
    }


# --- a mapped layer's mag: a WKW mag with an HDF5 agglomerate mapping applied -----------------------------------

# Voxels are 1..63: the mapping reverses them (64 - v) for ids below MAPPED_ENTRIES; ids past it stay as they are.
MAPPED_ENTRIES = 48


def _agglomerates() -> np.ndarray:
    table = (64 - np.arange(MAPPED_ENTRIES)).astype(np.uint16)
    table[0] = 0
    return table


class TestMappedSource(ReadOnlyVoxels, WkwContract):
    """``MappedMag`` over a WKW mag: the contract's voxels are the WKW library's with the mapping applied; no chunk
    is handed out as stored (each is mapped), and a damaged data file is a fault of the mapped mag too."""

    def _write_mag(self, root: Path, rng: np.random.Generator) -> WrittenMag:
        import h5py

        written = super()._write_mag(root, rng)
        with h5py.File(root / "agglomerates.hdf5", "w") as f:
            f.create_dataset("segment_to_agglomerate", data=_agglomerates())
        return WrittenMag(written.root, written.directory, self._mapped(written.truth))

    def _served(self, data: np.ndarray) -> np.ndarray:
        return self._mapped(data)

    @staticmethod
    def _mapped(data: np.ndarray) -> np.ndarray:
        table = _agglomerates()
        out = data.copy()
        inside = data < MAPPED_ENTRIES
        out[inside] = table[data[inside]]
        return out

    def open(self, root: Path, directory: Path) -> MagSource:
        from gateway.sources.mappings import Found, MappedMag, Mappings, mapped_dtype

        source = super().open(root, directory)
        mappings = Mappings(source.storage, 1 << 20)
        mapping = mappings.open(Found("agglomerates", "hdf5", str(root / "agglomerates.hdf5")), source.dtype)
        return MappedMag(source, mapping, mapped_dtype(source.dtype, mapping))

    def test_geometry_follows_the_bounding_box_and_the_header(self, written: WrittenMag) -> None:
        source = self.open(written.root, written.directory)
        assert (source.shape, source.bbox.lo, source.bbox.hi) == (BBOX_HI, TOP_LEFT, BBOX_HI)
        assert (source.dtype, source.channels, source.mag) == (np.dtype(self.dtype), self.channels, MAG)
        assert source.location_key == "mag#agglomerates.hdf5", "the source's and the mapping's, as replicas name them"

    def test_a_rewritten_file_changes_the_identity_and_the_voxels(self, own_copy: WrittenMag) -> None:
        """A rewritten data file and a rewritten mapping: the same source reads the new voxels, and names the
        version of each it read."""
        import h5py

        source, data = self._reads_a_rewrite(own_copy)
        corner, end = self.REWRITTEN
        path = own_copy.root / "agglomerates.hdf5"
        before = os.stat(path)
        with h5py.File(path, "w") as f:
            f.create_dataset("segment_to_agglomerate", data=np.full(MAPPED_ENTRIES, 7, dtype=np.uint16))
        if os.stat(path).st_mtime_ns == before.st_mtime_ns:
            os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
        region = source.read_box(corner, end)
        want = data[_window(corner, end)].copy()
        want[want < MAPPED_ENTRIES] = 7
        np.testing.assert_array_equal(region.data, want)
        assert region.sources is not None
        named = [identity for file, identity in region.sources if file == str(path)]
        assert len(named) == 1 and named[0] is not None and named[0].size == os.stat(path).st_size
