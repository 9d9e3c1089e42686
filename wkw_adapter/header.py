"""The 16-byte WKW header: magic, version, block and file sizes, block and voxel types, data offset."""

import enum
import struct
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .errors import HeaderError

HEADER_SIZE = 16
MAGIC = b"WKW"
_LAYOUT = struct.Struct("<3sBBBBBQ")


class BlockType(enum.IntEnum):
    RAW = 1
    LZ4 = 2
    LZ4HC = 3

    @property
    def compressed(self) -> bool:
        return self is not BlockType.RAW


VOXEL_DTYPES: dict[int, np.dtype] = {
    1: np.dtype("<u1"),
    2: np.dtype("<u2"),
    3: np.dtype("<u4"),
    4: np.dtype("<u8"),
    5: np.dtype("<f4"),
    6: np.dtype("<f8"),
    7: np.dtype("<i1"),
    8: np.dtype("<i2"),
    9: np.dtype("<i4"),
    10: np.dtype("<i8"),
}
_VOXEL_TYPES = {dtype: code for code, dtype in VOXEL_DTYPES.items()}


@dataclass(frozen=True, slots=True)
class WkwHeader:
    """Parsed header fields plus the geometry derived from them."""

    version: int
    block_len_log2: int
    file_len_log2: int
    block_type: BlockType
    voxel_type: int
    bytes_per_voxel: int
    data_offset: int

    @classmethod
    def create(
        cls,
        dtype: npt.DTypeLike,
        num_channels: int = 1,
        block_type: BlockType = BlockType.RAW,
        block_len: int = 32,
        file_len: int = 32,
    ) -> "WkwHeader":
        """A header for new data; ``data_offset`` is what a data file of this kind uses."""
        dtype = np.dtype(dtype).newbyteorder("<")
        if dtype not in _VOXEL_TYPES:
            raise HeaderError(f"WKW cannot store voxels of type {dtype}")
        for name, value in (("block_len", block_len), ("file_len", file_len)):
            if value < 1 or value & (value - 1) or value > 2**10:
                raise HeaderError(f"{name} must be a power of two up to 1024, got {value}")
        if not 1 <= num_channels * dtype.itemsize <= 255:
            raise HeaderError(f"{num_channels} channels of {dtype} do not fit the bytes-per-voxel field")
        header = cls(
            version=1,
            block_len_log2=block_len.bit_length() - 1,
            file_len_log2=file_len.bit_length() - 1,
            block_type=BlockType(block_type),
            voxel_type=_VOXEL_TYPES[dtype],
            bytes_per_voxel=dtype.itemsize * num_channels,
            data_offset=0,
        )
        return header.with_data_offset(header.file_data_offset)

    def with_data_offset(self, data_offset: int) -> "WkwHeader":
        return WkwHeader(
            self.version,
            self.block_len_log2,
            self.file_len_log2,
            self.block_type,
            self.voxel_type,
            self.bytes_per_voxel,
            data_offset,
        )

    @property
    def dtype(self) -> np.dtype:
        return VOXEL_DTYPES[self.voxel_type]

    @property
    def num_channels(self) -> int:
        return self.bytes_per_voxel // self.dtype.itemsize

    @property
    def block_len(self) -> int:
        """Voxels along one side of a block."""
        return 1 << self.block_len_log2

    @property
    def file_len(self) -> int:
        """Blocks along one side of a file."""
        return 1 << self.file_len_log2

    @property
    def file_voxel_len(self) -> int:
        """Voxels along one side of a file."""
        return self.block_len * self.file_len

    @property
    def blocks_per_file(self) -> int:
        return self.file_len**3

    @property
    def block_bytes(self) -> int:
        return self.block_len**3 * self.bytes_per_voxel

    @property
    def stored_block_limit(self) -> int:
        """The most bytes one stored block can take: its voxels raw, or the LZ4 bound of them."""
        return lz4_bound(self.block_bytes) if self.block_type.compressed else self.block_bytes

    @property
    def jump_table_size(self) -> int:
        return 8 * self.blocks_per_file if self.block_type.compressed else 0

    @property
    def file_data_offset(self) -> int:
        """Where block 0 starts in a data file written with this header."""
        return HEADER_SIZE + self.jump_table_size

    def encode(self) -> bytes:
        return _LAYOUT.pack(
            MAGIC,
            self.version,
            self.file_len_log2 << 4 | self.block_len_log2,
            int(self.block_type),
            self.voxel_type,
            self.bytes_per_voxel,
            self.data_offset,
        )


def lz4_bound(size: int) -> int:
    """The largest an LZ4 block of ``size`` input bytes can be (LZ4_COMPRESSBOUND)."""
    return size + size // 255 + 16


def parse_header(data: bytes) -> WkwHeader:
    """Parse and validate a header; raise :class:`HeaderError` on anything off."""
    if len(data) < HEADER_SIZE:
        raise HeaderError(f"header is {len(data)} bytes, expected {HEADER_SIZE}")
    magic, version, lengths, block_type, voxel_type, bytes_per_voxel, data_offset = _LAYOUT.unpack_from(data)
    if magic != MAGIC:
        raise HeaderError(f"bad magic {magic!r}, expected {MAGIC!r}")
    if version != 1:
        raise HeaderError(f"unsupported version {version}, expected 1")
    if block_type not in BlockType._value2member_map_:
        raise HeaderError(f"unknown block type {block_type}")
    if voxel_type not in VOXEL_DTYPES:
        raise HeaderError(f"unknown voxel type {voxel_type}")
    itemsize = VOXEL_DTYPES[voxel_type].itemsize
    if bytes_per_voxel == 0 or bytes_per_voxel % itemsize:
        raise HeaderError(f"{bytes_per_voxel} bytes per voxel is not a multiple of the voxel size {itemsize}")
    block_len_log2 = lengths & 0x0F
    file_len_log2 = lengths >> 4
    if block_len_log2 > 10 or file_len_log2 > 10:
        raise HeaderError(f"implausible block/file length byte 0x{lengths:02x}")
    return WkwHeader(
        version=version,
        block_len_log2=block_len_log2,
        file_len_log2=file_len_log2,
        block_type=BlockType(block_type),
        voxel_type=voxel_type,
        bytes_per_voxel=bytes_per_voxel,
        data_offset=data_offset,
    )
