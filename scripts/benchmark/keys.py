"""The request sequences: per key set, the same shuffled chunk keys for every server; and the Zipf ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gateway_storage.geometry import Vec3

from .config import (
    BLOCK,
    DATA_ORIGIN,
    MAPPED,
    SEED,
    SEGMENTATION,
    SMALL_EDGE,
    SMALL_LAYER,
    V2,
    ZIPF_EDGES,
    ZIPF_EXPONENT,
    Mode,
)

Request = tuple[str, str]  # (path, byte range "first-last" or "")


def _grid(box: Vec3, edge: int) -> list[Vec3]:
    """Chunk indices (relative) of the chunks of edge ``edge`` covering ``box``, in a fixed shuffled order."""
    counts = [b // edge for b in box]
    cells = [(x, y, z) for x in range(counts[0]) for y in range(counts[1]) for z in range(counts[2])]
    order = np.random.default_rng(SEED + edge).permutation(len(cells))
    return [cells[i] for i in order]


def _absolute(rel: Vec3, edge: int, origin: Vec3 = DATA_ORIGIN) -> Vec3:
    return (origin[0] // edge + rel[0], origin[1] // edge + rel[1], origin[2] // edge + rel[2])


def v2_key(layer: str, index: Vec3) -> str:
    return f"{V2}/{layer}/1/0.{index[0]}.{index[1]}.{index[2]}"


def chunk_sequences(mode: Mode) -> dict[str, list[Request]]:
    """The plain-chunk request sequences (path, range) of each key set; ranges of shards come later."""
    u16_edge = BLOCK * mode.u16_file_len
    return {
        "u8-32": [(v2_key("color", _absolute(c, 32)), "") for c in _grid(mode.key_box, 32)],
        "u16-32": [(v2_key("color16", _absolute(c, 32)), "") for c in _grid((u16_edge,) * 3, 32)],
        "u8-64": [(v2_key("color", _absolute(c, 64)), "") for c in _grid(mode.key_box, 64)],
        "u8-128": [(v2_key("color", _absolute(c, 128)), "") for c in _grid(mode.key_box, 128)],
        "many": [(v2_key("many", _absolute(c, 32)), "") for c in _grid((mode.data_edge,) * 3, 32)],
        "small": [
            (v2_key(SMALL_LAYER, _absolute(c, SMALL_EDGE)), "") for c in _grid((mode.small_edge,) * 3, SMALL_EDGE)
        ],
        **{
            f"{prefix}-{edge}": [(v2_key(layer, _absolute(c, edge)), "") for c in _grid(mode.seg_box, edge)]
            for prefix, layer in (("seg", SEGMENTATION), ("map", MAPPED))
            for edge in (32, 64)
        },
    }


def zipf_sequences(mode: Mode) -> dict[str, list[Request]]:
    """Per Zipf key set, ``mode.zipf_draws`` keys over the chunks of the populated cube, the chunk of rank k
    drawn with probability proportional to k^-ZIPF_EXPONENT; ranks are dealt to chunks in a seeded shuffle,
    so the popular chunks lie scattered as a viewer's favourite regions do."""
    sequences = {}
    for keyset, edge in ZIPF_EDGES.items():
        cells = _grid((mode.data_edge,) * 3, edge)  # in a seeded shuffle: the cell at position k has rank k + 1
        weights = np.arange(1, len(cells) + 1, dtype=np.float64) ** -ZIPF_EXPONENT
        draws = np.random.default_rng(SEED + 1000 + edge).choice(len(cells), mode.zipf_draws, p=weights / weights.sum())
        sequences[keyset] = [(v2_key("color", _absolute(cells[i], edge)), "") for i in draws]
    return sequences


def distinct(requests: list[Request]) -> list[Request]:
    """Each request of a sequence once, in the order of first appearance."""
    return list(dict.fromkeys(requests))


def write_paths(path: Path, requests: list[Request]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{p}\t{r}\n" if r else f"{p}\n" for p, r in requests))
    return path


def chunk_index(path: str) -> Vec3:
    """The (x, y, z) index of a v2 chunk key ``.../0.x.y.z``."""
    x, y, z = (int(v) for v in path.rsplit("/", 1)[1].split(".")[1:])
    return x, y, z
