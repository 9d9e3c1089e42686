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
