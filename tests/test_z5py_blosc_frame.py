"""The Blosc chunk z5py (the C++ Zarr writer) leaves, byte for byte, is served as numcodecs reads it (issue 24,
item 8).

z5py compresses a chunk with Blosc and copies the frame into a buffer of the frame's size plus Blosc's
overhead of 16 bytes, then writes the whole buffer: 16 bytes follow the frame in the file. A chunk of 10,000
random uint8 voxels does not compress, so Blosc stores it as is (memcpyed): the header ``02 01 23 01``
(format 2, LZ4's version 1, flags byte-shuffle, memcpyed and LZ4, type size 1), nbytes 10000, blocksize
10000, cbytes 10016, and the file is 10,032 bytes. numcodecs (the Zarr v2 reference reader) reads it from
disk; tensorstore's decoder refuses the trailing bytes. Through the gateway both zarr-python and tensorstore
read every chunk voxel for voxel, in both trees, and the v2 tree passes the frame through exactly as it ends.
"""

import struct
from collections.abc import Callable
from pathlib import Path

import numcodecs
import numpy as np
import requests
import zarr
from support.clients import read_tensorstore, read_zarr_python
from support.layers import layer_entry, write_properties
from support.servers import Server, assert_no_unexpected_errors

ORG, DATASET, LAYER = "z5py", "ds", "color"
SHAPE = (50, 40, 40)
CHUNKS = (25, 20, 20)  # 10,000 voxels of uint8: nbytes 10000
TRAILING = bytes(range(16))
HEADER = bytes.fromhex("02012301") + struct.pack("<3I", 10000, 10000, 10016)


def voxels() -> np.ndarray:
    return np.random.default_rng(23).integers(0, 256, SHAPE).astype("uint8")


def test_a_z5py_blosc_chunk_byte_for_byte_reads_exactly(tmp_path: Path, server_factory: Callable[..., Server]) -> None:
    root = tmp_path / "root"
    dataset = root / ORG / DATASET
    write_properties(dataset, [layer_entry(LAYER, "zarr", SHAPE)])
    mag = dataset / LAYER / "1"
    blosc = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)  # z5py's default
    array = zarr.create_array(str(mag), shape=SHAPE, chunks=CHUNKS, dtype="uint8", zarr_format=2, compressors=blosc)
    array[...] = voxels()
    frames = {}
    for chunk in sorted(mag.glob("*.*.*")):
        frame = chunk.read_bytes()
        chunk.write_bytes(frame + TRAILING)  # the buffer z5py writes: the frame and Blosc's 16 bytes of overhead
        frames[chunk.name] = frame
    assert len(frames) == 8
    for name, frame in frames.items():  # byte for byte what z5py leaves
        stored = (mag / name).read_bytes()
        assert stored[:16] == HEADER and len(frame) == 10016 and len(stored) == 10032, name
    assert np.array_equal(zarr.open_array(str(mag), mode="r")[...], voxels())  # numcodecs reads it from disk

    server = server_factory(root)
    for tree, zarr_format in (("zarr", 2), ("zarr3", 3)):
        url = f"{server.url}/data/{tree}/{ORG}/{DATASET}/{LAYER}/1"
        assert np.array_equal(read_zarr_python(url, zarr_format)[0], voxels()), tree
        assert np.array_equal(read_tensorstore(url, zarr_format)[0], voxels()), tree
    for name, frame in frames.items():  # passed through as the frame ends, without what follows it
        response = requests.get(f"{server.url}/data/zarr/{ORG}/{DATASET}/{LAYER}/1/0.{name}", timeout=30)
        assert response.status_code == 200 and response.content == frame, name
    assert_no_unexpected_errors(server)
