"""The sample dataset of ``gateway.sample`` (what ``scripts/serve-sample`` serves), as tests read it back."""

from pathlib import Path
from typing import Any

import numpy as np
import wkw

from gateway.sample import DATASET, ORGANIZATION, SIZE, TOP_LEFT

VOLUME_LO = np.asarray(TOP_LEFT)
VOLUME_HI = VOLUME_LO + np.asarray(SIZE)


def sample_labels(root: Path) -> np.ndarray[Any, Any]:
    """The sample's segmentation at mag 1, ``[x, y, z]`` over ``[0, end)``, as the wkw package reads it; zero
    outside the bounding box."""
    with wkw.Dataset.open(str(root / ORGANIZATION / DATASET / "segmentation" / "1")) as ds:
        data = ds.read((0, 0, 0), tuple(int(v) for v in VOLUME_HI))[0]
    out: np.ndarray[Any, Any] = np.zeros_like(data)
    inside = tuple(slice(a, b) for a, b in zip(VOLUME_LO, VOLUME_HI))
    out[inside] = data[inside]
    return out
