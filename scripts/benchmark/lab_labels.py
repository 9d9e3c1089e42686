"""Segmentations as labs have them, written by webknossos-libs: a glial sheet, a ragged automated segmentation
(for tests/test_mesh_lab_labels.py and benchmark/lab_meshes.py).

- ``sheet``: an astrocyte-like segment, a thin (three-voxel) sheet folded in two directions, with a branch and
  fenestrated by small holes, about a million voxels; most of its level-0 boxes hold more voxel faces than one box
  may cost at its mag (``MAX_BOX_SURFACE``), so they are meshed from coarser labels;
- ``ragged``: watershed-like cells (each voxel given to the nearest of a few seeds, measured from a position
  jittered per voxel), whose boundaries are noise at the voxel scale: most segments are past the bound too;
- a ``noisy_ball`` inside one cube of the ragged layer, a ball whose shell is salted: one box, meshed coarser, and
  closed there.

Each layer is written block-aligned (bounding box at the origin, as webKnossos writes layers) with mags 1 and 2,
and ``single``: the ragged labels with mag 1 only, at an unaligned offset. The ragged cells are nearest seeds of
positions jittered per voxel, a slice at a time (a k-d tree over every voxel took 40 s here).
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np

ORGANIZATION = "lab"
DATASET = "labels"
VOXEL_NM = (8.0, 8.0, 16.0)
SHAPE = (256, 256, 128)
SHEET = 1
SHEET_LAYER = "sheet"
RAGGED_LAYER = "ragged"
SINGLE_LAYER = "single"  # one mag, unaligned
SINGLE_OFFSET = (16, 8, 4)  # where the single-mag layer's bounding box starts (mag-1 voxels)
CELLS = 11
NOISY_BALL = 100
BALL_CENTRE, BALL_RADIUS = (96.0, 96.0, 32.0), 22.0  # within level-0 cube (1, 1, 0): voxels 64..127, 0..63


def sheet_labels(shape: tuple[int, int, int] = SHAPE) -> np.ndarray:
    """The folded, branching, fenestrated sheet (id :data:`SHEET`), three voxels thick."""
    x, y = np.meshgrid(*(np.arange(n, dtype=np.float32) for n in shape[:2]), indexing="ij")
    z = np.arange(shape[2], dtype=np.float32)
    labels = np.zeros(shape, dtype=np.uint32)
    fold = 9.0 * np.sin(x / 11.0) * np.cos(y / 15.0) + 4.0 * np.sin((x + y) / 5.0)
    for base in (16.0, 38.0, 60.0, 82.0, 104.0):  # five folded layers
        labels[np.abs(z[None, None, :] - (base + fold)[:, :, None]) < 1.5] = SHEET
    branch = 128.0 + 30.0 * np.sin(z / 13.0)[None, :] + 6.0 * np.sin(x[:, :1] / 4.0)  # a wall joining the layers
    wall = (np.abs(y[:, :, None] - branch[:, None, :]) < 1.5) & (z[None, None, :] > 16) & (z[None, None, :] < 104)
    labels[wall] = SHEET
    holes = np.random.default_rng(42).random(shape, dtype=np.float32) < 0.12  # fenestrations at the voxel scale
    labels[holes] = 0
    return labels


def ragged_labels(shape: tuple[int, int, int] = SHAPE) -> np.ndarray:
    """Watershed-like cells 1..CELLS with boundaries jittered per voxel, and the noisy ball."""
    rng = np.random.default_rng(11)
    seeds = (rng.random((CELLS, 3)) * np.asarray(shape)).astype(np.float32)
    x, y = np.meshgrid(*(np.arange(n, dtype=np.float32) for n in shape[:2]), indexing="ij")
    labels = np.zeros(shape, dtype=np.uint32)
    ball = np.asarray(BALL_CENTRE, dtype=np.float32)
    for z in range(shape[2]):  # a slice at a time: the nearest seed from a position jittered per voxel
        jitter = rng.normal(0.0, 2.5, (3, *shape[:2])).astype(np.float32)
        px, py, pz = x + jitter[0], y + jitter[1], np.float32(z) + jitter[2]
        distances = np.stack([(px - sx) ** 2 + (py - sy) ** 2 + (pz - sz) ** 2 for sx, sy, sz in seeds])
        labels[:, :, z] = distances.argmin(axis=0) + 1
        radius = np.sqrt((x - ball[0]) ** 2 + (y - ball[1]) ** 2 + (z - ball[2]) ** 2)
        salted = (radius >= BALL_RADIUS - 4) & (radius < BALL_RADIUS) & (rng.random(shape[:2]) < 0.5)
        labels[:, :, z][(radius < BALL_RADIUS - 4) | salted] = NOISY_BALL
    return labels


@dataclass(frozen=True)
class LabLabels:
    root: Path
    sheet: np.ndarray  # mag-1 labels from the origin
    ragged: np.ndarray


def write_lab_labels(root: Path) -> LabLabels:
    """The dataset below ``root``: ``sheet`` and ``ragged`` (mags 1 and 2, by mode), ``single`` (mag 1, offset)."""
    import tinybrain
    import webknossos as wk

    sheet, ragged = sheet_labels(), ragged_labels()
    dataset = wk.Dataset(root / ORGANIZATION / DATASET, voxel_size=VOXEL_NM)
    for name, labels in ((SHEET_LAYER, sheet), (RAGGED_LAYER, ragged)):
        layer = dataset.add_layer(
            name, "segmentation", dtype="uint32", data_format="wkw", largest_segment_id=int(labels.max())
        )
        layer.bounding_box = wk.BoundingBox((0, 0, 0), SHAPE)
        layer.add_mag(1, chunk_shape=32, shard_shape=256, compress=False).write(labels, absolute_offset=(0, 0, 0))
        # by mode, as a lab's pipeline makes it (tinybrain reads memory in Fortran order)
        coarser = tinybrain.downsample_segmentation(np.asfortranarray(labels), (2, 2, 2))[0]
        layer.add_mag(2, chunk_shape=32, shard_shape=256, compress=False).write(coarser, absolute_offset=(0, 0, 0))
    single = dataset.add_layer(
        SINGLE_LAYER, "segmentation", dtype="uint32", data_format="wkw", largest_segment_id=NOISY_BALL
    )
    top = SINGLE_OFFSET
    single.bounding_box = wk.BoundingBox(top, tuple(n - t for n, t in zip(SHAPE, top)))
    single.add_mag(1, chunk_shape=32, shard_shape=256, compress=False).write(
        ragged[top[0] :, top[1] :, top[2] :], absolute_offset=top
    )
    return LabLabels(root, sheet, ragged)
