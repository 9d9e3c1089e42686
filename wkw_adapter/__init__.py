"""The WKW format on its own: headers, data files, mags, and a writer. No HTTP, no Zarr.

Bytes are read through a store of the storage kernel (:mod:`gateway_storage`).
"""

from .errors import BlockDecodeError, HeaderError, JumpTableError, WkwError
from .file import StoredBlock, WkwFile, WkwFileCache, compress_block, decode_block, decompress_block
from .header import HEADER_SIZE, BlockType, WkwHeader, lz4_bound, parse_header
from .mag import WkwMag, read_mag_header
from .morton import morton_decode, morton_encode, morton_grid
from .writer import encode_file, write_mag

__all__ = [
    "HEADER_SIZE",
    "BlockDecodeError",
    "BlockType",
    "HeaderError",
    "JumpTableError",
    "StoredBlock",
    "WkwError",
    "WkwFile",
    "WkwFileCache",
    "WkwHeader",
    "WkwMag",
    "compress_block",
    "decode_block",
    "decompress_block",
    "encode_file",
    "lz4_bound",
    "morton_decode",
    "morton_encode",
    "morton_grid",
    "parse_header",
    "read_mag_header",
    "write_mag",
]
