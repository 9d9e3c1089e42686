"""Which segments a batch run indexes and meshes, as the field's tools choose them: igneous's ``dust_threshold``
(leave out segments of fewer voxels) and ``object_ids`` (only these segments).

A run with a selection makes a segment index or a stored mesh set of the segments it keeps and no others, as
igneous does: a segment left out is not listed and has no mesh. The selection is recorded in what the run
writes (the index's metadata, the set's ``stamp.json``), and the outputs of its blocks are kept apart from
those of a run with another selection.
"""

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class SegmentSelection:
    """``dust_threshold``: the fewest voxels (of the finest mag) a kept segment has; ``ids``: the only segments
    kept (sorted, each once), or None for every segment."""

    dust_threshold: int = 0
    ids: tuple[int, ...] | None = None

    @classmethod
    def of(cls, dust_threshold: int = 0, ids: Iterable[int] | None = None) -> "SegmentSelection":
        if dust_threshold < 0:
            raise ValueError(f"a dust threshold of {dust_threshold} voxels: it is at least 0")
        return cls(dust_threshold, None if ids is None else tuple(sorted(set(ids))))

    @property
    def everything(self) -> bool:
        return self.dust_threshold <= 1 and self.ids is None

    @property
    def needs_voxels(self) -> bool:
        """Whether the segments' voxel counts (a segment index) decide what is kept."""
        return self.dust_threshold > 1

    def keeps(self, ids: np.ndarray, voxels: np.ndarray | None) -> np.ndarray:
        """Which of ``ids`` (with their voxel counts, needed if :attr:`needs_voxels`) are kept, as a mask."""
        kept = np.ones(len(ids), dtype=bool)
        if self.ids is not None:
            kept &= np.isin(ids.astype(np.uint64), np.asarray(self.ids, dtype=np.uint64))
        if self.needs_voxels:
            if voxels is None:
                raise ValueError("a dust threshold needs the segments' voxel counts")
            kept &= voxels.astype(np.uint64) >= np.uint64(self.dust_threshold)
        return kept

    def describe(self) -> dict[str, Any]:
        """What is recorded beside the result: the threshold, and the subset's size and digest."""
        return {
            "dust_threshold": self.dust_threshold,
            "segments": None if self.ids is None else len(self.ids),
            "segments_digest": None if self.ids is None else _digest(self.ids),
        }

    def key(self) -> str:
        """A short name of the selection for file names ("" for every segment)."""
        return "" if self.everything else "sel-" + _digest(json.dumps(self.describe(), sort_keys=True))[:12]


def _digest(value: object) -> str:
    return hashlib.blake2b(repr(value).encode(), digest_size=16).hexdigest()


EVERY_SEGMENT = SegmentSelection()
