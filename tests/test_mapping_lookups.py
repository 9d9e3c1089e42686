"""Lookups of agglomerate mappings against numpy's truth, through the store (issue 43): a contiguous HDF5 array is
read at its offset without h5py, in either byte order and any unsigned type; a chunked one through h5py; a Zarr v3
group by its chunks. Ids spread over many pieces (more than one read's worth of consecutive pieces) and ids past
the array all come back right, cold (nothing cached) and warm."""

from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import zarr

from gateway.sources.mappings import PIECE_ENTRIES, RUN_BYTES, Found, Mappings
from gateway_storage import LocalStore

ENTRIES = 3 * RUN_BYTES // 8 + 12_345  # a run of consecutive uint64 pieces is read in more than one piece


def table_of(dtype: str) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(7)
    top = np.iinfo(np.dtype(dtype)).max
    table = rng.integers(1, top, size=ENTRIES, dtype=np.uint64).astype(dtype)
    table[0] = 0
    return table


def ids_of(rng: np.random.Generator) -> np.ndarray[Any, Any]:
    """Sorted distinct ids: a dense stretch across many pieces, scattered ones, and ids past the array."""
    dense = np.arange(5 * PIECE_ENTRIES, 5 * PIECE_ENTRIES + 2 * RUN_BYTES // 8, 7)
    scattered = rng.integers(0, ENTRIES, size=3000)
    past = np.array([ENTRIES, ENTRIES + 1, 1 << 40])
    return np.unique(np.concatenate([dense, scattered, past, [0, ENTRIES - 1]])).astype(np.uint64)


def truth(table: np.ndarray[Any, Any], ids: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    out = ids.copy()
    inside = ids < table.size
    out[inside] = table[ids[inside].astype(np.intp)].astype(np.uint64)
    return out


@pytest.mark.parametrize(
    "form",
    ["contiguous <u8", "contiguous >u8", "contiguous <u4", "contiguous >u2", "chunked <u8", "zarr <u8", "zarr <u4"],
)
def test_a_lookup_is_the_table_s_entries_cold_and_warm(tmp_path: Path, form: str) -> None:
    layout, dtype = form.split()
    table = table_of(dtype)
    if layout == "zarr":
        path = tmp_path / "agglomerates" / "view"
        group = zarr.open_group(str(path), mode="w", zarr_format=3)
        group.create_array(
            "segment_to_agglomerate", data=table.astype(np.dtype(dtype).newbyteorder("=")), chunks=(5000,)
        )
        found = Found("view", "zarr", str(path))
    else:
        path = tmp_path / "agglomerates" / "view.hdf5"
        path.parent.mkdir()
        with h5py.File(path, "w") as f:
            chunks = {"chunks": (5000,), "compression": "gzip"} if layout == "chunked" else {}
            f.create_dataset("segment_to_agglomerate", data=table, dtype=np.dtype(dtype), **chunks)
        found = Found("view", "hdf5", str(path))
    store = LocalStore(str(tmp_path))
    mapping = Mappings(store, 64 << 20).open(found, np.dtype(np.uint64))
    assert mapping.dtype == np.dtype(dtype).newbyteorder("="), mapping.dtype
    ids = ids_of(np.random.default_rng(len(form)))
    for _ in ("cold", "warm"):
        values, sources = mapping.lookup(ids)
        np.testing.assert_array_equal(values, truth(table, ids))
        assert sources, "the files read are named"


def write_view(tmp_path: Path, form: str, table: np.ndarray[Any, Any], agglomerates: int | None) -> Found:
    """The table as an agglomerate file of ``form`` (with offsets declaring ``agglomerates`` where given)."""
    if form == "zarr":
        path = tmp_path / "agglomerates" / "view"
        group = zarr.open_group(str(path), mode="w", zarr_format=3)
        group.create_array("segment_to_agglomerate", data=table, chunks=(5000,))
        if agglomerates is not None:
            group.create_array("agglomerate_to_segments_offsets", data=np.zeros(agglomerates + 1, np.uint64))
        return Found("view", "zarr", str(path))
    path = tmp_path / "agglomerates" / "view.hdf5"
    path.parent.mkdir(exist_ok=True)
    with h5py.File(path, "w") as f:
        chunks = {"chunks": (5000,), "compression": "gzip"} if form == "chunked" else {}
        f.create_dataset("segment_to_agglomerate", data=table, **chunks)
        if agglomerates is not None:
            f.create_dataset("agglomerate_to_segments_offsets", data=np.zeros(agglomerates + 1, np.uint64))
    return Found("view", "hdf5", str(path))


@pytest.mark.parametrize("form", ["contiguous", "chunked", "zarr"])
def test_a_chunk_maps_as_the_table_says_whether_its_ids_lie_close_or_far(tmp_path: Path, form: str) -> None:
    """Chunks of uint16 labels whose ids span fewer values than their voxels (translated through the span of the
    table) and more (by their runs), with 0, ids past the table and across its end, against numpy, cold and
    warm, in the layer's type (uint16: the offsets declare 60,000 agglomerates); a table entry past that type is
    a fault of exactly the chunks that use it."""
    from gateway.sources.mappings import MappingUnreadable

    entries = 40_000
    rng = np.random.default_rng(43)
    table = rng.integers(1, 60_000, size=entries, dtype=np.uint64)
    table[0], table[7] = 5, 70_000  # 0 maps to 0 whatever its entry says; 7's agglomerate is past uint16
    found = write_view(tmp_path, form, table, 60_000)
    mapping = Mappings(LocalStore(str(tmp_path)), 64 << 20).open(found, np.dtype(np.uint16))
    dtype = np.dtype(np.uint16)
    assert mapping.holds() == dtype

    def chunk(base: int, spread: int) -> np.ndarray[Any, Any]:
        blocks = np.minimum(base + rng.integers(0, spread, size=(1, 4, 4, 4)), 65_535).astype(np.uint16)
        blocks[0, 0, 0, 0] = 0
        blocks[blocks == 7] = 8
        return np.repeat(np.repeat(np.repeat(blocks, 8, 1), 8, 2), 8, 3)

    def truth(data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        wide = data.astype(np.uint64)
        inside = wide < entries
        out = wide.copy()
        out[inside] = table[wide[inside]]
        out[wide == 0] = 0
        return out.astype(dtype)

    chunks = {
        "close": chunk(10_000, 2_000),  # a span of 2,000 ids in 32,768 voxels
        "far": chunk(0, 65_536),  # ids over the whole table and past it
        "across its end": chunk(entries - 1_000, 2_000),
        "at its start": chunk(0, 500),
    }
    for _ in ("cold", "warm"):
        for name, data in chunks.items():
            mapped, sources = mapping.apply(data, dtype)
            assert mapped.dtype == dtype and mapped.shape == data.shape, name
            np.testing.assert_array_equal(mapped, truth(data), err_msg=name)
            assert sources, name
    for data in (chunks["at its start"].copy(), chunks["far"].copy()):
        data[0, 10, 0, 0] = 7
        with pytest.raises(MappingUnreadable, match="past uint16"):
            mapping.apply(data, dtype)
