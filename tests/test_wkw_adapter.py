"""Tests for ``wkw_adapter`` against the format authors' own ``wkw`` package.

Every voxel read or written by the adapter is compared with what ``wkw``
reads or writes for the same data; corrupt files are made by copying files
written by ``wkw`` and patching their bytes.
"""

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import lz4.block
import numpy as np
import numpy.typing as npt
import pytest
import wkw

from gateway_storage import ByteLRU, FileChangedError, FileIdentity, LocalStore, StorageError, TruncatedFileError
from gateway_storage.geometry import vec3
from wkw_adapter import (
    HEADER_SIZE,
    BlockDecodeError,
    BlockType,
    HeaderError,
    JumpTableError,
    WkwError,
    WkwFileCache,
    WkwHeader,
    WkwMag,
    decode_block,
    encode_file,
    morton_decode,
    morton_encode,
    morton_grid,
    parse_header,
    write_mag,
)
from wkw_adapter import file as wkw_file_module

ALL_DTYPES = [
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.float32,
    np.float64,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
]
WKW_BLOCK_TYPES = {
    BlockType.RAW: wkw.Header.BLOCK_TYPE_RAW,
    BlockType.LZ4: wkw.Header.BLOCK_TYPE_LZ4,
    BlockType.LZ4HC: wkw.Header.BLOCK_TYPE_LZ4HC,
}
ALL_BLOCK_TYPES = list(WKW_BLOCK_TYPES)
# Voxel type codes of the WKW header (as the wkw library writes them).
VOXEL_TYPE_CODES = {np.dtype(t): code for code, t in enumerate(ALL_DTYPES, start=1)}


# --------------------------------------------------------------------------- helpers


CorruptCopy = Callable[[BlockType], tuple[Path, Path]]  # the corrupt_copy fixture: (mag_dir, data_file_path)


def random_voxels(rng: np.random.Generator, dtype: npt.DTypeLike, shape: tuple[int, ...]) -> np.ndarray:
    """Voxels over the whole range of ``dtype``, with a compressible (small-valued) half."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        data = (rng.standard_normal(shape) * 1e3).astype(dtype)
    else:
        info = np.iinfo(dtype)
        data = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    # Make part of the data compressible so LZ4 blocks differ in length.
    data[..., : shape[-1] // 2] = (data[..., : shape[-1] // 2] % 4).astype(dtype)
    return np.asfortranarray(data)


def create_wkw(
    path: Path, dtype: npt.DTypeLike, num_channels: int, block_type: BlockType, block_len: int, file_len: int
) -> wkw.Dataset:
    return wkw.Dataset.create(
        str(path),
        wkw.Header(
            dtype,
            num_channels=num_channels,
            block_type=WKW_BLOCK_TYPES[block_type],
            block_len=block_len,
            file_len=file_len,
        ),
    )


def wkw_read(path: Path, offset: tuple[int, int, int], shape: tuple[int, int, int]) -> np.ndarray:
    with wkw.Dataset.open(str(path)) as ds:
        voxels: np.ndarray = ds.read(offset, shape)
        return voxels


def open_mag(path: Path, max_bytes: int = 64 << 20) -> WkwMag:
    return WkwMag(str(path), WkwFileCache(LocalStore(), max_bytes))


def data_file(path: Path, cube: tuple[int, int, int]) -> Path:
    x, y, z = cube
    return path / f"z{z}" / f"y{y}" / f"x{x}.wkw"


# Files a sample dataset holds; (0,1,0), (0,0,1), (1,0,1) and (1,1,1) are missing.
WRITTEN_CUBES = [(0, 0, 0), (1, 0, 0), (0, 1, 1), (1, 1, 0)]


def build_sample(
    path: Path,
    dtype: npt.DTypeLike,
    num_channels: int,
    block_type: BlockType,
    block_len: int,
    file_len: int,
    seed: int = 0,
) -> int:
    """Write whole files with ``wkw`` (plus an unaligned region for RAW); returns the file edge in voxels."""
    rng = np.random.default_rng(seed)
    edge = block_len * file_len
    with create_wkw(path, dtype, num_channels, block_type, block_len, file_len) as ds:
        for cube in WRITTEN_CUBES:
            data = random_voxels(rng, dtype, (num_channels, edge, edge, edge))
            ds.write(tuple(c * edge for c in cube), data)
        if block_type is BlockType.RAW:
            # An unaligned write that creates a partial file (1, 0, 1) and overlaps (1, 0, 0).
            shape = (edge // 2 + 1, 7, edge // 2 + 3)
            ds.write((edge + 3, 5, edge - 2), random_voxels(rng, dtype, (num_channels, *shape)))
    return edge


def sample_regions(edge: int, block_len: int) -> list[tuple[tuple[int, int, int], tuple[int, int, int]]]:
    b, e = block_len, edge
    return [
        ((0, 0, 0), (2 * e, 2 * e, 2 * e)),  # everything, missing files included
        ((3, 5, 7), (2 * e - 4, 2 * e - 6, 2 * e - 8)),  # unaligned, straddles all blocks and files
        ((b - 1, b - 2, b - 3), (3, 4, 5)),  # straddles 8 blocks
        ((e - 2, e - 3, e - 1), (5, 6, 4)),  # straddles 8 files
        ((e + 1, 1, e + 1), (e, e, e)),  # into the missing file (1, 0, 1) and beyond
        ((2 * e + 3, 1, 0), (5, 6, 7)),  # only missing files
        ((e + 5, 2, 3), (1, 1, 1)),  # one voxel
        ((b, 2 * b, 0), (b, b, b)),  # exactly one block
        ((1, e - 1, e - 1), (2 * e - 1, 2, 2)),  # long thin bar through y/z file boundary
        ((b, 0, b), (2 * b, 3 * b, b)),  # block-aligned, several blocks of one file
        ((e - b, e - b, 0), (2 * b, 2 * b, 2 * b)),  # block-aligned, straddles files
        ((e, 0, e - b), (e, b, 2 * b)),  # block-aligned, partly in the missing file (1, 0, 1)
    ]


def check_regions_match_wkw(path: Path, block_len: int, edge: int) -> None:
    mag = open_mag(path)
    whole = wkw_read(path, (0, 0, 0), (2 * edge, 2 * edge, 2 * edge))
    assert whole.any(), "sample data must not be all zero"
    for offset, shape in sample_regions(edge, block_len):
        expected = wkw_read(path, offset, shape)
        got = mag.read_region(offset, shape)
        assert got.shape == expected.shape, (offset, shape)
        assert got.dtype == expected.dtype, (offset, shape)
        assert np.array_equal(got, expected), (offset, shape)


def decode_file_blocks(content: bytes) -> list[bytes]:
    """Raw bytes of every block of a data file, decoded independently of ``wkw_adapter.file``."""
    header = parse_header(content[:HEADER_SIZE])
    blocks = []
    if not header.block_type.compressed:
        for index in range(header.blocks_per_file):
            start = header.data_offset + index * header.block_bytes
            blocks.append(content[start : start + header.block_bytes])
        return blocks
    ends = np.frombuffer(content[HEADER_SIZE : HEADER_SIZE + 8 * header.blocks_per_file], dtype="<u8")
    start = header.data_offset
    for end in ends.tolist():
        blocks.append(lz4.block.decompress(content[start:end], uncompressed_size=header.block_bytes))
        start = end
    return blocks


def patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def bump_mtime(path: Path, old_mtime_ns: int) -> None:
    """Make sure a rewritten file's mtime differs from ``old_mtime_ns``."""
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, max(st.st_mtime_ns, old_mtime_ns) + 1_000_000_000))


# --------------------------------------------------------------------------- 1. read_region vs wkw


@pytest.mark.parametrize("block_type", ALL_BLOCK_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda t: np.dtype(t).name)
def test_read_region_matches_wkw_all_voxel_types(tmp_path: Path, dtype: npt.DTypeLike, block_type: BlockType) -> None:
    edge = build_sample(tmp_path / "mag", dtype, 1, block_type, block_len=8, file_len=2)
    check_regions_match_wkw(tmp_path / "mag", 8, edge)


@pytest.mark.parametrize("block_type", ALL_BLOCK_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize(
    ("dtype", "num_channels"),
    [(np.uint8, 3), (np.uint16, 2), (np.float32, 2), (np.int64, 3)],
    ids=["uint8x3-rgb", "uint16x2", "float32x2", "int64x3"],
)
def test_read_region_matches_wkw_multichannel(
    tmp_path: Path, dtype: npt.DTypeLike, num_channels: int, block_type: BlockType
) -> None:
    edge = build_sample(tmp_path / "mag", dtype, num_channels, block_type, block_len=8, file_len=2, seed=1)
    mag = open_mag(tmp_path / "mag")
    assert mag.header.num_channels == num_channels
    check_regions_match_wkw(tmp_path / "mag", 8, edge)


@pytest.mark.parametrize("block_type", ALL_BLOCK_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize(("block_len", "file_len"), [(16, 2), (8, 4), (32, 1), (4, 4)])
def test_read_region_matches_wkw_geometry(tmp_path: Path, block_len: int, file_len: int, block_type: BlockType) -> None:
    edge = build_sample(tmp_path / "mag", np.uint16, 2, block_type, block_len, file_len, seed=2)
    mag = open_mag(tmp_path / "mag")
    assert (mag.header.block_len, mag.header.file_len) == (block_len, file_len)
    check_regions_match_wkw(tmp_path / "mag", block_len, edge)


@pytest.mark.parametrize("block_type", ALL_BLOCK_TYPES, ids=lambda t: t.name)
def test_read_region_in_many_small_reads(
    tmp_path: Path, block_type: BlockType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs of consecutive blocks longer than the span limit are read in parts, with the same voxels."""
    edge = build_sample(tmp_path / "mag", np.uint16, 2, block_type, block_len=8, file_len=2, seed=3)
    monkeypatch.setattr(wkw_file_module, "MAX_SPAN", 1)  # every block a read of its own
    check_regions_match_wkw(tmp_path / "mag", 8, edge)


def test_read_region_empty_and_missing(tmp_path: Path) -> None:
    build_sample(tmp_path / "mag", np.uint16, 2, BlockType.LZ4, 8, 2)
    mag = open_mag(tmp_path / "mag")
    empty = mag.read_region((3, 4, 5), (0, 7, 2))
    assert empty.shape == (2, 0, 7, 2)
    assert empty.dtype == np.uint16
    # A region lying only in missing files is zeros, and wkw agrees.
    far = mag.read_region((100, 200, 300), (9, 10, 11))
    assert far.shape == (2, 9, 10, 11)
    assert not far.any()
    assert np.array_equal(far, wkw_read(tmp_path / "mag", (100, 200, 300), (9, 10, 11)))


def test_missing_mag_header_raises(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(HeaderError):
        open_mag(tmp_path / "empty")


# --------------------------------------------------------------------------- 2. blocks


@pytest.mark.parametrize("block_type", ALL_BLOCK_TYPES, ids=lambda t: t.name)
def test_stored_and_decoded_blocks_match_wkw(tmp_path: Path, block_type: BlockType) -> None:
    path = tmp_path / "mag"
    build_sample(path, np.uint16, 2, block_type, block_len=8, file_len=2, seed=3)
    mag = open_mag(path)
    header = mag.header
    assert header.block_bytes == 8**3 * 2 * 2
    blocks = [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 1), (2, 1, 0), (3, 0, 1), (3, 1, 1), (1, 2, 3), (2, 3, 1)]
    for block in blocks:
        cube = vec3(b // 2 for b in block)
        # Morton number inside a file of 2x2x2 blocks, written out by hand.
        index = (block[0] % 2) | (block[1] % 2) << 1 | (block[2] % 2) << 2
        assert mag.locate_block(block) == (cube, index)
        expected = wkw_read(path, vec3(8 * b for b in block), (8, 8, 8))
        expected_bytes = expected.tobytes(order="F")
        content = data_file(path, cube).read_bytes()

        stored = mag.stored_block(block)
        assert stored is not None
        assert stored.block_type is block_type
        if block_type is BlockType.RAW:
            start = 16 + index * header.block_bytes
            assert stored.data == content[start : start + header.block_bytes]
            assert stored.data == expected_bytes
        else:
            ends = np.frombuffer(content[16 : 16 + 8 * 8], dtype="<u8")
            start = 16 + 8 * 8 if index == 0 else int(ends[index - 1])
            assert stored.data == content[start : int(ends[index])]
            assert lz4.block.decompress(stored.data, uncompressed_size=header.block_bytes) == expected_bytes
        decoded = decode_block(stored)
        assert decoded.shape == (2, 8, 8, 8)
        assert np.array_equal(decoded, expected)
        read = mag.read_block(block)
        assert read is not None
        assert np.array_equal(read, expected)


def test_blocks_of_missing_files_are_none(tmp_path: Path) -> None:
    path = tmp_path / "mag"
    build_sample(path, np.uint8, 3, BlockType.LZ4HC, block_len=8, file_len=2)
    mag = open_mag(path)
    for block in [(0, 2, 0), (1, 3, 1), (0, 0, 2), (7, 7, 7)]:
        assert mag.stored_block(block) is None
        assert mag.read_block(block) is None
    assert mag.read_block((0, 0, 0)) is not None


# --------------------------------------------------------------------------- 3. Morton order


def test_morton_vectors() -> None:
    assert morton_encode(0, 0, 0) == 0
    assert morton_encode(1, 0, 0) == 1
    assert morton_encode(0, 1, 0) == 2
    assert morton_encode(0, 0, 1) == 4
    assert morton_encode(1, 1, 1) == 7
    assert morton_encode(2, 0, 0) == 8
    assert morton_encode(29, 20, 3) == 13029
    assert morton_decode(13029) == (29, 20, 3)
    assert morton_decode(1) == (1, 0, 0)
    assert morton_decode(2) == (0, 1, 0)
    assert morton_decode(4) == (0, 0, 1)


def test_morton_roundtrip() -> None:
    for code in range(8**4):
        assert morton_encode(*morton_decode(code)) == code
    for xyz in [(0, 0, 0), (31, 31, 31), (1023, 5, 700), (12345, 678, 9)]:
        assert morton_decode(morton_encode(*xyz)) == xyz


@pytest.mark.parametrize("side", [1, 2, 3, 4, 8, 32])
def test_morton_grid(side: int) -> None:
    grid = morton_grid(side)
    assert grid.shape == (side, side, side)
    for x in range(side):
        for y in range(side):
            for z in range(side):
                assert int(grid[x, y, z]) == morton_encode(x, y, z)
    if side & (side - 1) == 0:
        # A power-of-two cube is numbered 0 .. side^3 - 1 without gaps.
        assert sorted(grid.ravel().tolist()) == list(range(side**3))


# --------------------------------------------------------------------------- 4. headers


@pytest.mark.parametrize("block_type", ALL_BLOCK_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize(
    ("dtype", "num_channels", "block_len", "file_len"),
    [
        (np.uint8, 1, 8, 2),
        (np.uint8, 3, 16, 2),
        (np.uint16, 2, 8, 4),
        (np.float32, 1, 32, 1),
        (np.int64, 2, 4, 2),
        (np.float64, 1, 8, 1),
        (np.int8, 1, 2, 8),
    ],
)
def test_parse_header_of_wkw_files(
    tmp_path: Path, dtype: npt.DTypeLike, num_channels: int, block_len: int, file_len: int, block_type: BlockType
) -> None:
    path = tmp_path / "mag"
    edge = block_len * file_len
    with create_wkw(path, dtype, num_channels, block_type, block_len, file_len) as ds:
        ds.write((edge, 0, 0), random_voxels(np.random.default_rng(4), dtype, (num_channels, edge, edge, edge)))
    blocks_per_file = file_len**3
    expected_offset = 16 if block_type is BlockType.RAW else 16 + 8 * blocks_per_file

    for name, content in [
        ("header.wkw", (path / "header.wkw").read_bytes()),
        ("data", data_file(path, (1, 0, 0)).read_bytes()),
    ]:
        header = parse_header(content[:16])
        assert header.version == 1, name
        assert header.block_len == block_len, name
        assert header.file_len == file_len, name
        assert header.file_voxel_len == edge, name
        assert header.blocks_per_file == blocks_per_file, name
        assert header.block_type is block_type, name
        assert header.dtype == np.dtype(dtype), name
        assert header.voxel_type == VOXEL_TYPE_CODES[np.dtype(dtype)], name
        assert header.num_channels == num_channels, name
        assert header.bytes_per_voxel == np.dtype(dtype).itemsize * num_channels, name
        assert header.block_bytes == block_len**3 * header.bytes_per_voxel, name
        assert header.encode() == content[:16], name
        if name == "data":
            assert header.data_offset == expected_offset
            assert header.file_data_offset == expected_offset
        else:
            assert header.data_offset == int.from_bytes(content[8:16], "little")

    created = WkwHeader.create(dtype, num_channels, block_type, block_len, file_len)
    assert created.data_offset == expected_offset
    assert created.encode() == data_file(path, (1, 0, 0)).read_bytes()[:16]
    assert parse_header(created.encode()) == created
    assert created.with_data_offset(0).encode() == (path / "header.wkw").read_bytes()


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("block_type", ALL_BLOCK_TYPES, ids=lambda t: t.name)
def test_header_create_roundtrip(dtype: npt.DTypeLike, block_type: BlockType) -> None:
    for num_channels, block_len, file_len in [(1, 32, 32), (3, 16, 2), (2, 1, 1), (4, 1024, 1024)]:
        header = WkwHeader.create(np.dtype(dtype), num_channels, block_type, block_len, file_len)
        encoded = header.encode()
        assert len(encoded) == HEADER_SIZE
        assert encoded[:3] == b"WKW"
        assert encoded[4] == (file_len.bit_length() - 1) << 4 | (block_len.bit_length() - 1)
        parsed = parse_header(encoded)
        assert parsed == header
        assert (parsed.dtype, parsed.num_channels, parsed.block_len, parsed.file_len) == (
            np.dtype(dtype),
            num_channels,
            block_len,
            file_len,
        )
        assert parsed.block_type is block_type


def test_header_create_rejects_bad_arguments() -> None:
    with pytest.raises(HeaderError):
        WkwHeader.create(np.bool_)
    with pytest.raises(HeaderError):
        WkwHeader.create(np.complex64)
    with pytest.raises(HeaderError):
        WkwHeader.create(np.uint8, block_len=24)
    with pytest.raises(HeaderError):
        WkwHeader.create(np.uint8, file_len=0)
    with pytest.raises(HeaderError):
        WkwHeader.create(np.uint8, block_len=2048)  # parse_header would reject what this encodes
    with pytest.raises(HeaderError):
        WkwHeader.create(np.uint8, num_channels=0)
    with pytest.raises(HeaderError):
        WkwHeader.create(np.uint64, num_channels=32)  # 256 bytes per voxel do not fit the header byte
    # A big-endian request still describes little-endian WKW voxels.
    assert WkwHeader.create(">u2").dtype == np.dtype("<u2")


def test_parse_header_rejects_short_input() -> None:
    good = WkwHeader.create(np.uint8).encode()
    for size in (0, 3, 15):
        with pytest.raises(HeaderError):
            parse_header(good[:size])


# --------------------------------------------------------------------------- 5. writer


@pytest.mark.parametrize("block_type", ALL_BLOCK_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize(
    ("dtype", "num_channels"),
    [(np.uint8, 3), (np.int16, 1), (np.float32, 2), (np.uint64, 1)],
    ids=["uint8x3", "int16", "float32x2", "uint64"],
)
def test_write_mag_read_by_wkw(tmp_path: Path, dtype: npt.DTypeLike, num_channels: int, block_type: BlockType) -> None:
    path = tmp_path / "mag"
    header = WkwHeader.create(dtype, num_channels, block_type, block_len=8, file_len=2)
    offset, shape = (5, 17, 3), (20, 9, 30)
    data = random_voxels(np.random.default_rng(5), dtype, (num_channels, *shape))
    written = write_mag(str(path), header, data, offset)
    # x 5..25 -> cubes 0, 1; y 17..26 -> cube 1; z 3..33 -> cubes 0, 1, 2.
    expected_files = {str(data_file(path, (x, 1, z))) for x in (0, 1) for z in (0, 1, 2)}
    assert set(written) == expected_files
    assert {str(p) for p in path.rglob("x*.wkw")} == expected_files

    assert np.array_equal(wkw_read(path, offset, shape), data)
    # Everything else in (and around) the files written is zero.
    expected = np.zeros((num_channels, 40, 40, 50), dtype=dtype)
    expected[:, 5:25, 17:26, 3:33] = data
    assert np.array_equal(wkw_read(path, (0, 0, 0), (40, 40, 50)), expected)
    mag = open_mag(path)
    assert np.array_equal(mag.read_region((0, 0, 0), (40, 40, 50)), expected)
    assert np.array_equal(mag.read_region(offset, shape), data)


def test_write_mag_three_dimensional_data(tmp_path: Path) -> None:
    path = tmp_path / "mag"
    data = random_voxels(np.random.default_rng(6), np.uint8, (9, 10, 11))
    write_mag(str(path), WkwHeader.create(np.uint8, block_len=4, file_len=2), data, (1, 2, 3))
    assert np.array_equal(wkw_read(path, (1, 2, 3), (9, 10, 11)), data[None])


@pytest.mark.parametrize(("dtype", "num_channels"), [(np.uint8, 3), (np.float64, 1), (np.int32, 2)])
def test_encode_file_raw_equals_wkw_bytes(tmp_path: Path, dtype: npt.DTypeLike, num_channels: int) -> None:
    path = tmp_path / "mag"
    cube = random_voxels(np.random.default_rng(7), dtype, (num_channels, 16, 16, 16))
    with create_wkw(path, dtype, num_channels, BlockType.RAW, block_len=8, file_len=2) as ds:
        ds.write((16, 0, 16), cube)
    header = WkwHeader.create(dtype, num_channels, BlockType.RAW, block_len=8, file_len=2)
    assert encode_file(header, cube) == data_file(path, (1, 0, 1)).read_bytes()
    # The writer's whole directory is byte-identical too.
    write_mag(str(tmp_path / "ours"), header, cube, (16, 0, 16))
    assert (tmp_path / "ours" / "header.wkw").read_bytes() == (path / "header.wkw").read_bytes()
    assert data_file(tmp_path / "ours", (1, 0, 1)).read_bytes() == data_file(path, (1, 0, 1)).read_bytes()


@pytest.mark.parametrize("block_type", [BlockType.RAW, BlockType.LZ4HC], ids=lambda t: t.name)
def test_a_region_that_fills_part_of_a_file_is_written_as_wkw_writes_it(tmp_path: Path, block_type: BlockType) -> None:
    """The writer encodes the blocks outside the region once, as one empty block: the file is still wkw's."""
    data = random_voxels(np.random.default_rng(9), np.uint16, (1, 11, 5, 9))  # 2 x 1 x 2 of the file's 64 blocks
    whole = np.zeros((1, 32, 32, 32), dtype=np.uint16, order="F")
    whole[:, 3:14, 3:8, 5:14] = data
    with create_wkw(tmp_path / "theirs", np.uint16, 1, block_type, block_len=8, file_len=4) as ds:
        ds.write((0, 0, 0), whole)  # a compressed file is written whole
    header = WkwHeader.create(np.uint16, 1, block_type, block_len=8, file_len=4)
    assert len(write_mag(str(tmp_path / "ours"), header, data, (3, 3, 5))) == 1
    ours, theirs = (data_file(tmp_path / name, (0, 0, 0)).read_bytes() for name in ("ours", "theirs"))
    assert decode_file_blocks(ours) == decode_file_blocks(theirs)  # the bytes too, uncompressed
    assert block_type is not BlockType.RAW or ours == theirs
    assert np.array_equal(wkw_read(tmp_path / "ours", (0, 0, 0), (32, 32, 32)), whole)


@pytest.mark.parametrize("block_type", [BlockType.LZ4, BlockType.LZ4HC], ids=lambda t: t.name)
@pytest.mark.parametrize(("dtype", "num_channels"), [(np.uint8, 3), (np.uint32, 1)])
def test_encode_file_compressed_decodes_like_wkw(
    tmp_path: Path, dtype: npt.DTypeLike, num_channels: int, block_type: BlockType
) -> None:
    path = tmp_path / "mag"
    cube = random_voxels(np.random.default_rng(8), dtype, (num_channels, 16, 16, 16))
    with create_wkw(path, dtype, num_channels, block_type, block_len=8, file_len=2) as ds:
        ds.write((0, 16, 0), cube)
    theirs = data_file(path, (0, 1, 0)).read_bytes()
    ours = encode_file(WkwHeader.create(dtype, num_channels, block_type, block_len=8, file_len=2), cube)
    assert ours[:16] == theirs[:16]
    ends = np.frombuffer(ours[16 : 16 + 8 * 8], dtype="<u8")
    assert int(ends[-1]) == len(ours)
    assert bool(np.all(np.diff(ends.astype(np.int64)) > 0))
    our_blocks, their_blocks = decode_file_blocks(ours), decode_file_blocks(theirs)
    assert our_blocks == their_blocks
    # Block i holds the Morton-i block of the cube, in F order.
    for index, raw in enumerate(our_blocks):
        bx, by, bz = morton_decode(index)
        block = cube[:, 8 * bx : 8 * bx + 8, 8 * by : 8 * by + 8, 8 * bz : 8 * bz + 8]
        assert raw == block.tobytes(order="F")


# --------------------------------------------------------------------------- 6. corrupt input


@pytest.fixture(scope="module")
def good_mags(tmp_path_factory: pytest.TempPathFactory) -> dict[BlockType, Path]:
    """One mag per block type: uint8, block_len 8, file_len 2, file (0,0,0) written by wkw."""
    root = tmp_path_factory.mktemp("good")
    mags = {}
    for block_type in ALL_BLOCK_TYPES:
        path = root / block_type.name
        with create_wkw(path, np.uint8, 1, block_type, block_len=8, file_len=2) as ds:
            data = random_voxels(np.random.default_rng(9), np.uint8, (1, 16, 16, 16))
            data[:, :8] %= 3  # make some blocks compress well
            ds.write((0, 0, 0), data)
        mags[block_type] = path
    return mags


@pytest.fixture
def corrupt_copy(tmp_path: Path, good_mags: dict[BlockType, Path]) -> CorruptCopy:
    """Copy of a good mag: returns ``(mag_dir, data_file_path)``."""

    def make(block_type: BlockType) -> tuple[Path, Path]:
        dst = tmp_path / f"bad-{block_type.name}"
        shutil.copytree(good_mags[block_type], dst)
        return dst, data_file(dst, (0, 0, 0))

    return make


def block_coords(index: int) -> tuple[int, int, int]:
    return morton_decode(index)


def stored_voxels(mag: WkwMag, index: int) -> np.ndarray:
    """Block ``index`` (in Morton order) as the adapter reads it; it must hold data."""
    block = mag.read_block(block_coords(index))
    assert block is not None, f"block {index} holds no data"
    return block


def identity_of(store: LocalStore, path: Path) -> FileIdentity:
    found = store.identity(str(path))
    assert found is not None, f"{path} is missing"
    return found


def expected_block(good: Path, index: int) -> np.ndarray:
    return wkw_read(good, vec3(8 * c for c in block_coords(index)), (8, 8, 8))


HEADER_PATCHES = [
    pytest.param(0, b"XKW", id="magic"),
    pytest.param(0, b"wkw", id="magic-case"),
    pytest.param(3, b"\x00", id="version-0"),
    pytest.param(3, b"\x02", id="version-2"),
    pytest.param(5, b"\x00", id="block-type-0"),
    pytest.param(5, b"\x04", id="block-type-4"),
    pytest.param(6, b"\x00", id="voxel-type-0"),
    pytest.param(6, b"\x0b", id="voxel-type-11"),
    pytest.param(7, b"\x00", id="bytes-per-voxel-0"),
]


@pytest.mark.parametrize(("offset", "value"), HEADER_PATCHES)
@pytest.mark.parametrize("block_type", ALL_BLOCK_TYPES, ids=lambda t: t.name)
def test_bad_data_file_header(corrupt_copy: CorruptCopy, block_type: BlockType, offset: int, value: bytes) -> None:
    mag_dir, path = corrupt_copy(block_type)
    patch(path, offset, value)
    mag = open_mag(mag_dir)
    with pytest.raises(HeaderError):
        mag.read_block((0, 0, 0))
    with pytest.raises(HeaderError):
        mag.read_region((0, 0, 0), (16, 16, 16))


@pytest.mark.parametrize(("offset", "value"), HEADER_PATCHES)
def test_bad_mag_header(corrupt_copy: CorruptCopy, offset: int, value: bytes) -> None:
    mag_dir, _ = corrupt_copy(BlockType.LZ4)
    patch(mag_dir / "header.wkw", offset, value)
    with pytest.raises(HeaderError):
        open_mag(mag_dir)


def test_bytes_per_voxel_not_multiple_of_voxel_size() -> None:
    content = bytearray(WkwHeader.create(np.uint16, 2).encode())
    content[7] = 3
    with pytest.raises(HeaderError):
        parse_header(bytes(content))


def test_data_file_incompatible_with_mag_header(corrupt_copy: CorruptCopy) -> None:
    mag_dir, path = corrupt_copy(BlockType.RAW)
    patch(path, 6, b"\x02\x02")  # uint16, 2 bytes per voxel: a valid header, but not this mag's
    parse_header(path.read_bytes()[:16])
    with pytest.raises(HeaderError):
        open_mag(mag_dir).read_block((0, 0, 0))


@pytest.mark.parametrize("block_type", ALL_BLOCK_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("size", [0, 1, 10, 15])
def test_file_shorter_than_header(corrupt_copy: CorruptCopy, block_type: BlockType, size: int) -> None:
    mag_dir, path = corrupt_copy(block_type)
    os.truncate(path, size)
    with pytest.raises(TruncatedFileError):
        open_mag(mag_dir).read_region((0, 0, 0), (8, 8, 8))


@pytest.mark.parametrize("block_type", [BlockType.LZ4, BlockType.LZ4HC], ids=lambda t: t.name)
@pytest.mark.parametrize("size", [16, 17, 16 + 20, 16 + 63])
def test_file_ending_inside_jump_table(corrupt_copy: CorruptCopy, block_type: BlockType, size: int) -> None:
    mag_dir, path = corrupt_copy(block_type)
    os.truncate(path, size)
    with pytest.raises(TruncatedFileError):
        open_mag(mag_dir).read_block((1, 1, 1))


def test_raw_file_truncated_inside_blocks(corrupt_copy: CorruptCopy, good_mags: dict[BlockType, Path]) -> None:
    mag_dir, path = corrupt_copy(BlockType.RAW)
    os.truncate(path, 16 + 3 * 512 + 256)  # blocks 0..2 whole, block 3 half, 4..7 gone
    mag = open_mag(mag_dir)
    for index in range(3):
        block = mag.read_block(block_coords(index))
        assert block is not None
        assert np.array_equal(block, expected_block(good_mags[BlockType.RAW], index))
    for index in range(3, 8):
        with pytest.raises(TruncatedFileError):
            mag.read_block(block_coords(index))
    with pytest.raises(TruncatedFileError):
        mag.read_region((0, 0, 0), (16, 16, 16))
    # A region inside the intact blocks still reads.
    expected = wkw_read(good_mags[BlockType.RAW], (1, 2, 3), (6, 10, 4))  # blocks 0 and 2
    assert np.array_equal(mag.read_region((1, 2, 3), (6, 10, 4)), expected)


def read_jumps(path: Path) -> np.ndarray:
    return np.frombuffer(path.read_bytes()[16 : 16 + 64], dtype="<u8").copy()


def write_jumps(path: Path, jumps: np.ndarray) -> None:
    patch(path, 16, jumps.astype("<u8").tobytes())


def _swap_two_entries(jumps: np.ndarray) -> None:
    jumps[[3, 4]] = jumps[[4, 3]]  # not increasing


def _first_entry_before_data(jumps: np.ndarray) -> None:
    jumps[0] = 40  # inside the jump table


@pytest.mark.parametrize(
    ("edit", "block"),
    [(_swap_two_entries, (0, 0, 0)), (_first_entry_before_data, (1, 0, 0))],
    ids=["not_increasing", "first_entry_before_data"],
)
@pytest.mark.parametrize("block_type", [BlockType.LZ4, BlockType.LZ4HC], ids=lambda t: t.name)
def test_jump_table_out_of_order(
    corrupt_copy: CorruptCopy, block_type: BlockType, edit: Callable[[np.ndarray], None], block: tuple[int, int, int]
) -> None:
    mag_dir, path = corrupt_copy(block_type)
    jumps = read_jumps(path)
    edit(jumps)
    write_jumps(path, jumps)
    with pytest.raises(JumpTableError):
        open_mag(mag_dir).read_block(block)


@pytest.mark.parametrize("block_type", [BlockType.LZ4, BlockType.LZ4HC], ids=lambda t: t.name)
def test_data_offset_overlapping_jump_table(corrupt_copy: CorruptCopy, block_type: BlockType) -> None:
    mag_dir, path = corrupt_copy(block_type)
    patch(path, 8, (16).to_bytes(8, "little"))
    with pytest.raises(JumpTableError):
        open_mag(mag_dir).read_block((0, 0, 0))


@pytest.mark.parametrize("block_type", [BlockType.LZ4, BlockType.LZ4HC], ids=lambda t: t.name)
def test_jump_table_past_end_of_file(corrupt_copy: CorruptCopy, block_type: BlockType) -> None:
    mag_dir, path = corrupt_copy(block_type)
    size = path.stat().st_size
    jumps = read_jumps(path)
    assert int(jumps[-1]) == size
    jumps[-1] = size + 1
    write_jumps(path, jumps)
    with pytest.raises(JumpTableError):
        open_mag(mag_dir).read_block((0, 0, 0))

    jumps[5:] = size + 1000  # still non-decreasing, but past the end
    write_jumps(path, jumps)
    with pytest.raises(JumpTableError):
        open_mag(mag_dir).read_region((0, 0, 0), (4, 4, 4))


@pytest.mark.parametrize("block_type", [BlockType.LZ4, BlockType.LZ4HC], ids=lambda t: t.name)
def test_compressed_file_truncated_inside_blocks(corrupt_copy: CorruptCopy, block_type: BlockType) -> None:
    mag_dir, path = corrupt_copy(block_type)
    os.truncate(path, path.stat().st_size - 10)
    with pytest.raises(JumpTableError):
        open_mag(mag_dir).read_block((0, 0, 0))


@pytest.mark.parametrize("block_type", [BlockType.LZ4, BlockType.LZ4HC], ids=lambda t: t.name)
def test_lz4_block_garbage(corrupt_copy: CorruptCopy, good_mags: dict[BlockType, Path], block_type: BlockType) -> None:
    mag_dir, path = corrupt_copy(block_type)
    jumps = read_jumps(path)
    patch(path, int(jumps[1]), b"\xff" * int(jumps[2] - jumps[1]))  # block 2
    mag = open_mag(mag_dir)
    with pytest.raises(BlockDecodeError):
        mag.read_block(block_coords(2))
    with pytest.raises(BlockDecodeError):
        mag.read_region((0, 0, 0), (16, 16, 16))
    for index in (0, 1, 3, 7):
        block = mag.read_block(block_coords(index))
        assert block is not None
        assert np.array_equal(block, expected_block(good_mags[block_type], index))


@pytest.mark.parametrize("block_type", [BlockType.LZ4, BlockType.LZ4HC], ids=lambda t: t.name)
def test_lz4_jump_entry_shifted(
    corrupt_copy: CorruptCopy, good_mags: dict[BlockType, Path], block_type: BlockType
) -> None:
    mag_dir, path = corrupt_copy(block_type)
    jumps = read_jumps(path)
    jumps[2] -= 7  # block 2 loses its last bytes, block 3 gains them in front
    write_jumps(path, jumps)
    mag = open_mag(mag_dir)
    for index in (2, 3):
        with pytest.raises(BlockDecodeError):
            mag.read_block(block_coords(index))
    assert np.array_equal(stored_voxels(mag, 4), expected_block(good_mags[block_type], 4))


@pytest.mark.parametrize("last_byte", [b"\x00", b"\x10", b"\xff"])
def test_lz4_one_byte_block(corrupt_copy: CorruptCopy, good_mags: dict[BlockType, Path], last_byte: bytes) -> None:
    mag_dir, path = corrupt_copy(BlockType.LZ4)
    jumps = read_jumps(path)
    jumps[1] = jumps[2] - 1  # block 2 is a single byte, block 1 gets cut short
    write_jumps(path, jumps)
    patch(path, int(jumps[1]), last_byte)
    mag = open_mag(mag_dir)
    for index in (1, 2):
        with pytest.raises(BlockDecodeError):
            mag.read_block(block_coords(index))
    assert np.array_equal(stored_voxels(mag, 0), expected_block(good_mags[BlockType.LZ4], 0))


@pytest.mark.parametrize("block_type", [BlockType.LZ4, BlockType.LZ4HC], ids=lambda t: t.name)
def test_lz4_jump_entries_span_two_blocks(corrupt_copy: CorruptCopy, block_type: BlockType) -> None:
    mag_dir, path = corrupt_copy(block_type)
    jumps = read_jumps(path)
    jumps[4] = jumps[5]  # block 4's range now also holds block 5's stream: decodes to too many bytes
    write_jumps(path, jumps)
    with pytest.raises(BlockDecodeError):
        open_mag(mag_dir).read_block(block_coords(4))


@pytest.mark.parametrize("payload", [256, 511, 513, 1024])
def test_lz4_block_decoding_to_wrong_size(
    corrupt_copy: CorruptCopy, good_mags: dict[BlockType, Path], payload: int
) -> None:
    """Splice a valid LZ4 stream of ``payload`` bytes (not 512) in as block 3 and fix up the jump table."""
    mag_dir, path = corrupt_copy(BlockType.LZ4)
    content = path.read_bytes()
    jumps = read_jumps(path)
    start, end = int(jumps[2]), int(jumps[3])  # block 3
    replacement = lz4.block.compress(bytes(range(256)) * (payload // 256) + bytes(payload % 256), store_size=False)
    new_jumps = jumps.astype(np.int64)
    new_jumps[3:] += len(replacement) - (end - start)
    path.write_bytes(content[:16] + new_jumps.astype("<u8").tobytes() + content[80:start] + replacement + content[end:])
    mag = open_mag(mag_dir)
    with pytest.raises(BlockDecodeError):
        mag.read_block(block_coords(3))
    for index in (0, 2, 4, 7):
        assert np.array_equal(stored_voxels(mag, index), expected_block(good_mags[BlockType.LZ4], index))


def test_format_errors_are_wkw_errors_and_store_errors_are_storage_errors() -> None:
    for cls in (HeaderError, JumpTableError, BlockDecodeError):
        assert issubclass(cls, WkwError) and not issubclass(cls, StorageError)
    for storage_error in (TruncatedFileError, FileChangedError):
        assert issubclass(storage_error, StorageError) and not issubclass(storage_error, WkwError)


# --------------------------------------------------------------------------- 7. caches


@pytest.mark.parametrize("block_type", ALL_BLOCK_TYPES, ids=lambda t: t.name)
def test_cache_sees_rewrite_by_wkw(tmp_path: Path, block_type: BlockType) -> None:
    path = tmp_path / "mag"
    rng = np.random.default_rng(10)
    first = random_voxels(rng, np.uint16, (2, 16, 16, 16))
    second = random_voxels(rng, np.uint16, (2, 16, 16, 16))
    with create_wkw(path, np.uint16, 2, block_type, block_len=8, file_len=2) as ds:
        ds.write((0, 0, 0), first)
    mag = open_mag(path)
    assert np.array_equal(mag.read_region((0, 0, 0), (16, 16, 16)), first)
    file = data_file(path, (0, 0, 0))
    opened = mag.files.open(str(file))
    assert opened is not None
    assert mag.files.open(str(file)) is opened  # cached while unchanged
    assert mag.files.lru.hits >= 1

    old_mtime = file.stat().st_mtime_ns
    with wkw.Dataset.open(str(path)) as ds:
        ds.write((0, 0, 0), second)
    bump_mtime(file, old_mtime)
    assert np.array_equal(mag.read_region((0, 0, 0), (16, 16, 16)), second)
    assert np.array_equal(mag.read_region((3, 1, 4), (9, 13, 7)), second[:, 3:12, 1:14, 4:11])
    reopened = mag.files.open(str(file))
    assert reopened is not None and reopened is not opened
    assert reopened.identity != opened.identity
    # The old version is either still read as it was (an open descriptor keeps it) or refused:
    # never the new bytes under the old identity.
    try:
        stored = mag.files.stored_block(opened, 0)
    except FileChangedError:
        return
    assert np.array_equal(decode_block(stored), first[:, :8, :8, :8])


def test_cache_sees_rewrite_by_write_mag_with_other_block_type(tmp_path: Path) -> None:
    path = tmp_path / "mag"
    rng = np.random.default_rng(11)
    first = random_voxels(rng, np.uint8, (3, 16, 16, 16))
    second = random_voxels(rng, np.uint8, (3, 16, 16, 16))
    write_mag(str(path), WkwHeader.create(np.uint8, 3, BlockType.RAW, 8, 2), first)
    mag = open_mag(path)
    assert np.array_equal(mag.read_region((0, 0, 0), (16, 16, 16)), first)
    file = data_file(path, (0, 0, 0))
    old_mtime = file.stat().st_mtime_ns

    # Same geometry, now LZ4: a stale RAW header would read compressed bytes as voxels.
    write_mag(str(path), WkwHeader.create(np.uint8, 3, BlockType.LZ4, 8, 2), second)
    bump_mtime(file, old_mtime)
    assert np.array_equal(mag.read_region((0, 0, 0), (16, 16, 16)), second)
    assert np.array_equal(mag.read_region((0, 0, 0), (16, 16, 16)), wkw_read(path, (0, 0, 0), (16, 16, 16)))

    # And back to RAW with the same size as the first version: only the mtime tells them apart.
    old_mtime = file.stat().st_mtime_ns
    write_mag(str(path), WkwHeader.create(np.uint8, 3, BlockType.RAW, 8, 2), first)
    bump_mtime(file, old_mtime)
    assert np.array_equal(mag.read_region((0, 0, 0), (16, 16, 16)), first)


def _written_and_read(
    path: Path, seed: int, dtype: type, extent: tuple[int, int, int], block_type: BlockType
) -> tuple[np.ndarray, WkwMag]:
    """One channel of random voxels written at ``path`` (blocks of 8, files of 2 blocks), opened and read once
    (which fills the cache), with what was written."""
    data = random_voxels(np.random.default_rng(seed), dtype, (1, *extent))
    write_mag(str(path), WkwHeader.create(dtype, 1, block_type, 8, 2), data)
    mag = open_mag(path)
    assert np.array_equal(mag.read_region((0, 0, 0), extent), data)
    return data, mag


def test_cache_sees_same_size_rewrite_in_place(tmp_path: Path) -> None:
    """An LZ4 file patched in place, keeping its size: the new jump table must be used."""
    path = tmp_path / "mag"
    data, mag = _written_and_read(path, 12, np.uint8, (16, 16, 16), BlockType.LZ4)

    # Swap blocks 0 and 1 on disk, with a matching jump table: same size, other content.
    file = data_file(path, (0, 0, 0))
    content = file.read_bytes()
    ends = np.frombuffer(content[16:80], dtype="<u8").astype(np.int64)
    b0, b1 = content[80 : ends[0]], content[ends[0] : ends[1]]
    new_ends = ends.copy()
    new_ends[0] = 80 + len(b1)
    old_mtime = file.stat().st_mtime_ns
    with open(file, "r+b") as f:
        f.seek(16)
        f.write(new_ends.astype("<u8").tobytes() + b1 + b0)
    bump_mtime(file, old_mtime)
    assert file.stat().st_size == len(content)

    swapped = data.copy()
    swapped[:, 0:8, 0:8, 0:8], swapped[:, 8:16, 0:8, 0:8] = data[:, 8:16, 0:8, 0:8], data[:, 0:8, 0:8, 0:8]
    assert np.array_equal(mag.read_region((0, 0, 0), (16, 16, 16)), swapped)
    assert np.array_equal(wkw_read(path, (0, 0, 0), (16, 16, 16)), swapped)


def test_cache_sees_deleted_and_new_files(tmp_path: Path) -> None:
    path = tmp_path / "mag"
    data, mag = _written_and_read(path, 13, np.int32, (32, 16, 16), BlockType.LZ4HC)
    data_file(path, (1, 0, 0)).unlink()
    expected = data.copy()
    expected[:, 16:] = 0
    assert np.array_equal(mag.read_region((0, 0, 0), (32, 16, 16)), expected)
    write_mag(str(path), WkwHeader.create(np.int32, 1, BlockType.LZ4HC, 8, 2), data)
    assert np.array_equal(mag.read_region((0, 0, 0), (32, 16, 16)), data)


def test_file_cache_stays_within_budget(tmp_path: Path) -> None:
    path = tmp_path / "mag"
    header = WkwHeader.create(np.uint8, 1, BlockType.LZ4, 4, 2)
    data = random_voxels(np.random.default_rng(14), np.uint8, (1, 32, 16, 8))
    write_mag(str(path), header, data)  # 4 * 2 * 1 = 8 files
    files = WkwFileCache(LocalStore(), max_bytes=3 * (256 + 64))
    mag = WkwMag(str(path), files)
    assert np.array_equal(mag.read_region((0, 0, 0), (32, 16, 8)), data)
    assert files.lru.size_bytes <= files.lru.max_bytes
    assert len(files.lru) == 3
    assert np.array_equal(mag.read_region((0, 0, 0), (32, 16, 8)), data)


def test_byte_lru_eviction_order_and_budget() -> None:
    lru: ByteLRU[str] = ByteLRU(100)
    lru.put("a", "A", 40)
    lru.put("b", "B", 40)
    assert lru.size_bytes == 80
    assert lru.get("a") == "A"  # a is now more recent than b
    lru.put("c", "C", 40)
    assert lru.size_bytes <= 100
    assert lru.get("b") is None  # least recently used went first
    assert lru.get("a") == "A"
    assert lru.get("c") == "C"
    assert len(lru) == 2
    lru.put("d", "D", 30)  # a, c, d = 110 > 100: the LRU (a) goes
    assert lru.get("a") is None
    assert (lru.get("c"), lru.get("d")) == ("C", "D")
    assert lru.size_bytes == 70
    assert lru.hits == 5
    assert lru.misses == 2


def test_byte_lru_refuses_oversized_entry() -> None:
    lru: ByteLRU[str] = ByteLRU(100)
    lru.put("a", "A", 60)
    lru.put("huge", "H", 101)
    assert lru.get("huge") is None
    assert lru.get("a") == "A"  # nothing was flushed for it
    assert lru.size_bytes == 60
    lru.put("a", "A2", 500)  # replacing with something too big drops the old value
    assert lru.get("a") is None
    assert lru.size_bytes == 0
    assert len(lru) == 0
    lru.put("exact", "E", 100)
    assert lru.get("exact") == "E"
    assert lru.size_bytes == 100


def test_byte_lru_replace_and_random_fill() -> None:
    lru: ByteLRU[int] = ByteLRU(1000)
    lru.put("k", 1, 300)
    lru.put("k", 2, 500)
    assert lru.size_bytes == 500
    assert lru.get("k") == 2
    rng = np.random.default_rng(15)
    sizes: dict[int, int] = {}
    for key in range(500):
        size = int(rng.integers(0, 1200))
        sizes[key] = size
        lru.put(key, key, size)
        assert lru.size_bytes <= lru.max_bytes
        if rng.random() < 0.3:
            lru.get(int(rng.integers(0, key + 1)))
    present = [key for key in sizes if key in lru._entries]
    assert lru.size_bytes == sum(sizes[key] for key in present) + (500 if "k" in lru._entries else 0)
    # The newest key fits alone, so it is always kept unless it was too big.
    assert (499 in present) == (sizes[499] <= 1000)
    hits, misses = lru.hits, lru.misses
    lru.get("nope")
    assert (lru.hits, lru.misses) == (hits, misses + 1)


# --------------------------------------------------------------------------- 8. LocalStore


def test_local_store_identity_and_reads(tmp_path: Path) -> None:
    store = LocalStore()
    path = tmp_path / "f.bin"
    assert store.identity(str(path)) is None
    path.write_bytes(bytes(range(100)))
    identity = store.identity(str(path))
    assert isinstance(identity, FileIdentity)
    assert identity.size == 100
    assert store.read(str(path), 10, 5, identity, limit=5) == bytes(range(10, 15))
    assert store.read(str(path), 0, 100, identity, limit=100) == bytes(range(100))
    with pytest.raises(TruncatedFileError):
        store.read(str(path), 95, 10, identity, limit=10)
    with pytest.raises(FileChangedError):
        store.read(str(path), 0, 10, identity._replace(size=99), limit=10)
    with pytest.raises(FileChangedError):
        store.read(str(path), 0, 10, identity._replace(version=identity.version + "x"), limit=10)


def test_local_store_detects_rewrite(tmp_path: Path) -> None:
    store = LocalStore()
    path = tmp_path / "mag"
    rng = np.random.default_rng(16)
    with create_wkw(path, np.uint8, 1, BlockType.RAW, 8, 2) as ds:
        ds.write((0, 0, 0), random_voxels(rng, np.uint8, (1, 16, 16, 16)))
    file = data_file(path, (0, 0, 0))
    old = identity_of(store, file)
    old_mtime = file.stat().st_mtime_ns
    # Rewrite in place with wkw: same size, same inode, new content and mtime.
    with wkw.Dataset.open(str(path)) as ds:
        ds.write((0, 0, 0), random_voxels(rng, np.uint8, (1, 16, 16, 16)))
    bump_mtime(file, old_mtime)
    new = identity_of(store, file)
    assert new.size == old.size
    assert new != old
    with pytest.raises(FileChangedError):
        store.read(str(file), 0, 16, old, limit=16)
    assert store.read(str(file), 0, 16, new, limit=16) == file.read_bytes()[:16]


def test_local_store_detects_replacement_with_same_size_and_mtime(tmp_path: Path) -> None:
    store = LocalStore()
    path = tmp_path / "f.bin"
    path.write_bytes(b"a" * 64)
    old = identity_of(store, path)
    st = path.stat()
    other = tmp_path / "g.bin"
    other.write_bytes(b"b" * 64)
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, path)  # a new inode under the old name
    assert path.stat().st_mtime_ns == st.st_mtime_ns
    with pytest.raises(FileChangedError):
        store.read(str(path), 0, 8, old, limit=8)
    assert store.read(str(path), 0, 8, identity_of(store, path), limit=8) == b"b" * 8
