"""The MagSource contract (``tests/test_source_contract.py`` on main) for N5 and Neuroglancer precomputed mags.

Not collected on its own (no ``test_`` prefix): the contract suite reached main after this branch was
made, and test modules import nothing from each other. After the merge, these classes belong at the end
of ``tests/test_source_contract.py`` (with the imports below that it lacks), beside the WKW and Zarr ones.
"""

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import tensorstore as ts
from test_source_contract import (
    BBOX,
    CHUNK,
    EXTENT,
    MAG,
    MagSourceContract,
    Vec3,
    WrittenMag,
    ZarrContract,
    _cube_box,
    _is_storage_fault,
    _window,
)

from gateway.sources.mag import MagSource, StoredChunk
from gateway.sources.n5_source import N5MagSource
from gateway.sources.precomputed_source import PrecomputedMagSource, Sharding, compressed_morton_code
from gateway_storage import ByteLRU, LocalStore

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


class PrecomputedContract(MagSourceContract):
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
            sharding = Sharding.parse(self.sharding)
            grid = tuple(-(-e // CHUNK) for e in EXTENT)
            shard, _ = sharding.locate(compressed_morton_code(position, grid))
            return directory / sharding.shard_name(shard)
        starts = [p * CHUNK for p in position]
        return directory / "_".join(f"{s}-{min(s + CHUNK, e)}" for s, e in zip(starts, EXTENT))

    @pytest.mark.parametrize("corner", [(0, 0, 0), (16, 32, 16)], ids=str)
    def test_a_stored_chunk_decodes_to_exactly_that_chunk(self, written: WrittenMag, corner: Vec3) -> None:
        source = self.open(written.root, written.directory)
        assert source.stored_chunk_shape is None and source.native is None
        assert source.stored_chunk(self._index(corner), corner) is None, "re-encoded, never passed through"

    def test_a_truncated_data_file_is_never_an_absent_chunk(self, own_copy: WrittenMag) -> None:
        corner: Vec3 = (16, 16, 16)
        path = self.data_file(own_copy.directory, corner)
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size // 3)
        source = self.open(own_copy.root, own_copy.directory)
        with pytest.raises(Exception) as raised:
            source.read_box(corner, (corner[0] + CHUNK, corner[1] + CHUNK, corner[2] + CHUNK))
        assert _is_storage_fault(raised.value), repr(raised.value)

    def test_a_rewritten_file_changes_the_identity_and_the_voxels(self, own_copy: WrittenMag) -> None:
        """The same source (as the catalog keeps it) reads the new voxels of a file rewritten under it."""
        corner: Vec3 = (16, 16, 16)
        end: Vec3 = (corner[0] + CHUNK, corner[1] + CHUNK, corner[2] + CHUNK)
        source = self.open(own_copy.root, own_copy.directory)
        np.testing.assert_array_equal(source.read_box(corner, end).data, own_copy.truth[_window(corner, end)])
        data = self._random(np.random.default_rng(99))
        self.write(own_copy.directory, data, [(0, 0, 0)])
        np.testing.assert_array_equal(source.read_box(corner, end).data, data[_window(corner, end)])


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
