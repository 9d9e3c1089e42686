"""A small segmentation with three mags (written by the ``wkw`` package), its stored mesh set made as the runner
would make it (every block, then ``finish``), and a reader of a served multi-resolution mesh written from
Neuroglancer's format document (manifest layout, fragment ranges, Draco with integer positions)."""

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import DracoPy
import numpy as np
import requests
import wkw

from gateway.batch.mesh_sets import MeshSetTask

ORGANIZATION = "stored"
DATASET = "cells"
LAYER = "cells"
SHAPE = (192, 192, 96)
VOXEL_NM = (4.0, 4.0, 8.0)
MAGS = (1, 2, 4)
TUBE = 5  # winds through most cubes: the segment too large to mesh on demand
BALLS = {7: ((60, 60, 48), 20.0), 9: ((150, 140, 50), 14.0), 13: ((100, 100, 30), 6.0)}
SMALL = 13  # within one cube of each level: 3 * 65^3 voxels meshed on demand
SMALL_VOXELS = 3 * 65**3
EDGE = 11  # a slab on the volume's faces (closed there by the fill value outside)
HOSTILE = 15  # a checkerboard of two-voxel cells, planted where asked: past the surface bound even two times coarser
HOSTILE_BOX = ((130, 2, 34), (190, 62, 94))


def cells_labels(hostile: bool = False) -> np.ndarray:
    x, y, z = np.meshgrid(*(np.arange(n, dtype=np.float64) for n in SHAPE), indexing="ij")
    labels = np.zeros(SHAPE, dtype=np.uint32)
    for segment, (centre, radius) in BALLS.items():
        inside = (x - centre[0]) ** 2 + (y - centre[1]) ** 2 + (z - centre[2]) ** 2 < radius**2
        labels[inside] = segment
    axis_y = 96 + 60 * np.sin(x / 30.0)
    axis_z = 48 + 25 * np.cos(x / 40.0)
    tube = ((y - axis_y) ** 2 + (z - axis_z) ** 2 < 9.0**2) & (x > 8) & (x < 184)
    labels[tube] = TUBE
    labels[:30, 150:, :20] = EDGE
    if hostile:
        (x0, y0, z0), (x1, y1, z1) = HOSTILE_BOX
        board = ((x // 2 + y // 2 + z // 2) % 2 == 0)[x0:x1, y0:y1, z0:z1]
        labels[x0:x1, y0:y1, z0:z1][board] = HOSTILE
    return labels


def write_cells(root: Path, block_type: int = 1, hostile: bool = False) -> np.ndarray:
    """The dataset under ``root`` (raw WKW blocks, or ``block_type`` 2: LZ4), with the checkerboard of
    :data:`HOSTILE` if asked; returns its mag-1 labels."""
    labels = cells_labels(hostile)
    dataset = root / ORGANIZATION / DATASET
    for mag in MAGS:
        header = wkw.Header(np.uint32, block_type=block_type, file_len=4)
        with wkw.Dataset.open(str(dataset / LAYER / str(mag)), header) as ds:
            data = labels[::mag, ::mag, ::mag]
            if block_type != 1:  # compressed files are written whole: zeros past the bounding box fill them
                data = np.pad(data, [(0, -n % (32 * 4)) for n in data.shape])
            ds.write((0, 0, 0), np.ascontiguousarray(data))
    layer = {
        "name": LAYER,
        "category": "segmentation",
        "elementClass": "uint32",
        "dataFormat": "wkw",
        "largestSegmentId": TUBE + 10,
        "boundingBox": {"topLeft": [0, 0, 0], "width": SHAPE[0], "height": SHAPE[1], "depth": SHAPE[2]},
        "mags": [{"mag": [m, m, m]} for m in MAGS],
    }
    properties = {"id": {"name": DATASET, "team": ""}, "scale": {"factor": list(VOXEL_NM)}, "dataLayers": [layer]}
    (dataset / "datasource-properties.json").write_text(json.dumps(properties))
    return labels


def set_directory(root: Path) -> Path:
    return root / ORGANIZATION / DATASET / f"{LAYER}.meshes"


def make_mesh_set(root: Path, fine_lod: int | None = None) -> MeshSetTask:
    """The layer's stored set, every block run here in turn (the runner's work, serially), then finished."""
    task = MeshSetTask.for_layer(str(root), f"{ORGANIZATION}/{DATASET}", LAYER)
    if fine_lod is not None:
        task = replace(task, fine_lod=fine_lod)
    outputs = {block.key: task.run(block) for block in task.blocks()}
    assert task.finish(lambda block: outputs[block.key]) == str(set_directory(root))
    return task


# --- reading what the gateway serves -----------------------------------------------------------------


@dataclass
class Fragment:
    lod: int
    position: tuple[int, int, int]
    data: bytes
    vertices: np.ndarray  # nanometers
    faces: np.ndarray


@dataclass
class ServedMesh:
    manifest: bytes
    data: bytes
    manifest_etag: str
    data_etag: str
    fragments: list[Fragment]


Get = Callable[..., requests.Response]


def read_served(get: Get, base: str, segment: int) -> ServedMesh:
    """A segment's manifest and fragments as Neuroglancer reads them (each fragment by a byte range)."""
    info = get(base + "info").json()
    assert info["@type"] == "neuroglancer_multilod_draco" and "sharding" not in info, info
    limit = (1 << info["vertex_quantization_bits"]) - 1
    transform = np.asarray(info["transform"], dtype=np.float64).reshape(3, 4)
    index = get(f"{base}{segment}.index")
    assert index.status_code == 200, index.text
    raw = index.content
    chunk_shape = np.asarray(struct.unpack_from("<3f", raw, 0))
    origin = np.asarray(struct.unpack_from("<3f", raw, 12))
    (lods,) = struct.unpack_from("<I", raw, 24)
    offsets = np.frombuffer(raw, "<f4", 3 * lods, 28 + 4 * lods).reshape(lods, 3)
    counts = np.frombuffer(raw, "<u4", lods, 28 + 16 * lods)
    at, start = 28 + 20 * lods, 0
    fragments = []
    whole = get(f"{base}{segment}")
    assert whole.status_code == 200, whole.text
    for lod, count in enumerate(counts.tolist()):
        positions = np.frombuffer(raw, "<u4", 3 * count, at).reshape(3, count).T
        sizes = np.frombuffer(raw, "<u4", count, at + 12 * count)
        at += 16 * count
        for position, size in zip(positions.tolist(), sizes.tolist()):
            if size:
                part = get(f"{base}{segment}", Range=f"bytes={start}-{start + size - 1}")
                assert part.status_code == 206 and part.content == whole.content[start : start + size]
                mesh = DracoPy.decode(part.content)
                quantized = np.asarray(mesh.points, dtype=np.float64).reshape(-1, 3)
                stored = origin + offsets[lod] + chunk_shape * 2**lod * (np.asarray(position) + quantized / limit)
                vertices = stored @ transform[:, :3].T + transform[:, 3]
                faces = np.asarray(mesh.faces, dtype=np.int64).reshape(-1, 3)
                fragments.append(Fragment(lod, tuple(position), part.content, vertices, faces))
            start += size
    assert at == len(raw) and start == len(whole.content), "the manifest does not describe the data file"
    return ServedMesh(raw, whole.content, index.headers["ETag"], whole.headers["ETag"], fragments)
