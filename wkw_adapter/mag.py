"""A WKW mag directory: ``header.wkw`` plus data files ``z{Z}/y{Y}/x{X}.wkw``."""

import os

import numpy as np

from gateway_storage import FileSource, Store
from gateway_storage.geometry import Vec3

from .errors import HeaderError
from .file import StoredBlock, WkwFile, WkwFileCache, decode_block, decompress_block_into
from .header import HEADER_SIZE, WkwHeader, parse_header
from .morton import morton_encode
from .region import copy_overlap


class WkwMag:
    """Blocks and regions of one mag, in that mag's own voxel coordinates.

    ``store`` is what the mag's files are looked up in (by default the store of ``files``, the cache of
    headers and jump tables that mags share): a gateway's sources pass the anchored view of the mag
    directory, so that a missing data file is absent only in a mag directory that is there. ``header`` is
    the mag's ``header.wkw`` where the caller read it already (through a store of its own), else read here.
    """

    def __init__(
        self, directory: str, files: WkwFileCache, store: Store | None = None, header: WkwHeader | None = None
    ) -> None:
        self.directory = directory
        self.files = files
        self.store = files.store if store is None else store
        self.header = read_mag_header(self.store, directory) if header is None else header

    def file_path(self, cube: Vec3) -> str:
        x, y, z = cube
        return f"{self.directory}{os.sep}z{z}{os.sep}y{y}{os.sep}x{x}.wkw"

    def locate_block(self, block: Vec3) -> tuple[Vec3, int]:
        """The file cube holding a block (block coordinates) and its Morton index there."""
        log2 = self.header.file_len_log2
        mask = self.header.file_len - 1
        cube = (block[0] >> log2, block[1] >> log2, block[2] >> log2)
        return cube, morton_encode(block[0] & mask, block[1] & mask, block[2] & mask)

    def open_file(self, cube: Vec3) -> WkwFile | None:
        """The data file of ``cube``, or None where there is none (its blocks read as zeros)."""
        path = self.file_path(cube)
        identity = self.store.identity(path)
        return None if identity is None else self.files.version(path, identity, self._check_compatible)

    def _check_compatible(self, wkw_file: WkwFile) -> None:
        mine, theirs = self.header, wkw_file.header
        if (mine.block_len_log2, mine.file_len_log2, mine.voxel_type, mine.bytes_per_voxel) != (
            theirs.block_len_log2,
            theirs.file_len_log2,
            theirs.voxel_type,
            theirs.bytes_per_voxel,
        ):
            raise HeaderError(f"{wkw_file.path}: header does not match {self.directory}/header.wkw")

    def stored_block(self, block: Vec3) -> StoredBlock | None:
        """A block's stored bytes, or None where the file or block holds no data."""
        cube, index = self.locate_block(block)
        wkw_file = self.open_file(cube)
        if wkw_file is None:
            return None
        return self.files.stored_block(wkw_file, index)

    def read_block(self, block: Vec3) -> np.ndarray | None:
        """A block as ``[c, x, y, z]``, or None where it holds no data (reads as zeros)."""
        stored = self.stored_block(block)
        return None if stored is None else decode_block(stored)

    def read_region(self, offset: Vec3, shape: Vec3) -> np.ndarray:
        """Voxels ``[offset, offset + shape)`` as ``[c, x, y, z]``; absent data is zero."""
        return self.read_region_with_sources(offset, shape)[0]

    def read_region_with_sources(self, offset: Vec3, shape: Vec3) -> tuple[np.ndarray, list[FileSource]]:
        """Like :meth:`read_region`, plus the path and identity (None: absent) of every file consulted.

        The identities are those of the bytes actually read, so a caller can
        derive a validator (ETag) that is exact for this answer.
        """
        header = self.header
        side = header.block_len
        aligned = not any(o % side for o in offset) and not any(n % side for n in shape)
        if shape == (side, side, side) and aligned:
            return self._read_one_block(offset)
        if min(shape) <= 0:
            return np.zeros((header.num_channels, *shape), dtype=header.dtype, order="F"), []
        if aligned:
            return self._read_aligned(offset, shape)
        out = np.zeros((header.num_channels, *shape), dtype=header.dtype, order="F")
        scratch = np.empty((header.num_channels, side, side, side), dtype=header.dtype, order="F")
        into = scratch.reshape(-1, order="F").view(np.uint8).data
        sources: list[FileSource] = []
        for _, wkw_file, blocks in self._blocks_by_file_sorted(self._blocks_by_file(offset, shape, sources)):
            stored = self.files.stored_blocks(wkw_file, [index for index, _ in blocks])
            for (_, (x, y, z)), data in zip(blocks, stored):
                decompress_block_into(data, wkw_file.header.block_type, into)
                copy_overlap(out, offset, scratch, (x * side, y * side, z * side))
        return out, sources

    def _blocks_by_file(
        self, offset: Vec3, shape: Vec3, sources: list[FileSource]
    ) -> list[tuple[Vec3, WkwFile, list[Vec3]]]:
        """Each existing file the box ``[offset, offset + shape)`` touches, opened (its identity checked
        once), with the blocks of the box inside it; every file consulted is added to ``sources``."""
        side = self.header.block_len
        log2 = self.header.file_len_log2
        first_block = [o // side for o in offset]
        last_block = [(o + n - 1) // side for o, n in zip(offset, shape)]
        found = []
        for cube in _cells([b >> log2 for b in first_block], [b >> log2 for b in last_block]):
            wkw_file = self.open_file(cube)
            sources.append((self.file_path(cube), None if wkw_file is None else wkw_file.identity))
            if wkw_file is None:
                continue
            lo = [max(f, c << log2) for f, c in zip(first_block, cube)]
            hi = [min(la, ((c + 1) << log2) - 1) for la, c in zip(last_block, cube)]
            found.append((cube, wkw_file, _cells(lo, hi)))
        return found

    def _read_aligned(self, offset: Vec3, shape: Vec3) -> tuple[np.ndarray, list[FileSource]]:
        """A block-aligned region: each block decoded into one scratch buffer and copied into place once.

        The copy moves whole rows of a block (its x-row of voxels and channels) as single items, which
        numpy copies about twice as fast as the same bytes voxel by voxel.
        """
        header = self.header
        side, channels = header.block_len, header.num_channels
        sources: list[FileSource] = []
        found = self._blocks_by_file(offset, shape, sources)
        make = np.empty if len(found) == len(sources) else np.zeros  # absent files read as zeros
        out = make((channels, *shape), dtype=header.dtype, order="F")
        row = np.dtype((np.void, channels * side * header.dtype.itemsize))
        # [z, y, x-row] views of the bytes: Fortran order [c, x, y, z] is C order [z, y, x, c].
        out_rows = out.T.reshape(shape[2], shape[1], -1).view(np.uint8).view(row)
        scratch = np.empty(header.block_bytes, dtype=np.uint8)
        scratch_rows = scratch.view(row).reshape(side, side, 1)
        into = scratch.data
        first = (offset[0] // side, offset[1] // side, offset[2] // side)
        for _, wkw_file, blocks in self._blocks_by_file_sorted(found):
            stored = self.files.stored_blocks(wkw_file, [index for index, _ in blocks])
            for (_, (x, y, z)), data in zip(blocks, stored):
                decompress_block_into(data, wkw_file.header.block_type, into)
                i, j, k = x - first[0], y - first[1], (z - first[2]) * side
                out_rows[k : k + side, j * side : (j + 1) * side, i : i + 1] = scratch_rows
        return out, sources

    def _blocks_by_file_sorted(
        self, found: list[tuple[Vec3, WkwFile, list[Vec3]]]
    ) -> list[tuple[Vec3, WkwFile, list[tuple[int, Vec3]]]]:
        """The blocks of each file with their Morton numbers, in file order (so runs are read at once)."""
        return [
            (cube, wkw_file, sorted((self.locate_block(b)[1], b) for b in blocks)) for cube, wkw_file, blocks in found
        ]

    def _read_one_block(self, offset: Vec3) -> tuple[np.ndarray, list[FileSource]]:
        """A block-aligned region of exactly one block: its decoded array, without a copy."""
        side = self.header.block_len
        cube, index = self.locate_block((offset[0] // side, offset[1] // side, offset[2] // side))
        wkw_file = self.open_file(cube)
        sources: list[FileSource] = [(self.file_path(cube), None if wkw_file is None else wkw_file.identity)]
        if wkw_file is None:
            shape = (self.header.num_channels, side, side, side)
            return np.zeros(shape, dtype=self.header.dtype, order="F"), sources
        return decode_block(self.files.stored_block(wkw_file, index)), sources


def read_mag_header(store: Store, directory: str) -> WkwHeader:
    """The ``header.wkw`` of the mag ``directory``: HeaderError if there is none."""
    path = os.path.join(directory, "header.wkw")
    identity = store.identity(path)
    if identity is None:
        raise HeaderError(f"{path} does not exist")
    # 16 bytes written once when the mag is made: not held to the settle rule, so a new mag is served
    # at once (a torn header fails to parse, and the catalog looks at a mag with problems again soon).
    return parse_header(store.read(path, 0, HEADER_SIZE, identity, limit=HEADER_SIZE, settled=False))


def _cells(first: list[int], last: list[int]) -> list[Vec3]:
    """All integer points of the box ``[first, last]`` (inclusive)."""
    return [
        (x, y, z)
        for x in range(first[0], last[0] + 1)
        for y in range(first[1], last[1] + 1)
        for z in range(first[2], last[2] + 1)
    ]
