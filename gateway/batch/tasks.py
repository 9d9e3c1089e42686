"""What a block task is: the contract between the runner and the work it runs (index, meshes).

A task splits a layer into blocks, makes one block's output from the data alone (on any worker, in any
order, any number of times), and combines every block's output into the finished result. The runner keeps
each output under the block's key and the task's data version, so a run that is started again after a
crash or a killed worker redoes only the blocks without an output, and a result is finished (marked
complete) only when every block has one.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from gateway_storage.faults import Absent
from gateway_storage.geometry import Vec3


class BlockMissing(Absent, LookupError):
    """The output of a block that failed in this run, asked for by a ``finish`` that goes on without it: a task
    whose result can stand without some blocks (a mesh set: their fragments are left out) catches it and lists
    the block; one whose result cannot lets it end the run."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"block {key} failed: {reason}")
        self.key = key
        self.reason = reason


@dataclass(frozen=True, order=True, slots=True)
class Block:
    """A box of the layer in the voxels of its finest mag, ``[lo, hi)``; the task reads what overlap it needs."""

    key: str  # unique within the task and safe as a file name, e.g. its grid position "3_0_7"
    lo: Vec3
    hi: Vec3


def box_voxels(lo: Vec3, hi: Vec3) -> int:
    """The voxels of the box ``[lo, hi)`` (none where it is empty)."""
    return max(0, hi[0] - lo[0]) * max(0, hi[1] - lo[1]) * max(0, hi[2] - lo[2])


class BlockTask(Protocol):
    """Work the runner can split, ship to workers (it is pickled: it holds descriptions, not open files) and
    finish. ``run`` may be called on a worker process; ``finish`` runs where the run was started."""

    @property
    def name(self) -> str:
        """What the outputs are, e.g. ``segment-index`` or ``meshes``: part of where outputs are kept."""

    def version(self) -> str:
        """The data version the outputs are made from (a stamp of the layer's files): outputs of another
        version are never combined with these."""

    def blocks(self) -> Sequence[Block]:
        """Every block of the layer, each once."""

    def memory_bytes(self) -> int:
        """The most memory one block's ``run`` holds at once (stated to the user, given to the scheduler)."""

    def voxels(self, block: Block) -> int:
        """The voxels of the layer's finest mag that ``block`` accounts for, each voxel of the layer in exactly one
        block (no padding past the bounding box, nothing for a block that reads coarser mags only): progress and
        summaries add these up to the layer's voxels."""

    def run(self, block: Block) -> bytes:
        """The output of one block; raises with the block and the reason when its data cannot be read."""

    def finish(self, outputs: Callable[[Block], bytes]) -> str:
        """Combine every block's output (``outputs(block)`` reads one back, or raises :class:`BlockMissing` for
        a block that failed in a run that goes on without it) into the result, written so that it is marked
        complete last; returns where it was written."""
