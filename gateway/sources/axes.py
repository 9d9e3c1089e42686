"""How the dimensions of a stored array map to the served ``(c, x, y, z)`` axes: one rule for every chunked format."""

from dataclasses import dataclass

import numpy as np

from .mag import SourceError

SERVED_AXES = ("c", "x", "y", "z")


def axis_names(names: object, rank: int, axis_order: dict[str, int] | None) -> list[str]:
    """The served axis of each stored dimension: from the array's own names, else the mag's ``axisOrder``,
    else ``x, y, z`` (rank 3) or ``c, x, y, z`` (rank 4).

    webknossos-libs writes ``axisOrder`` ``{c: 0, x: 1, y: 2, z: 3}`` for arrays of rank 3 too; such an order names
    a channel the array lacks, and its spatial axes are taken in the order it gives them.
    """
    if isinstance(names, list) and names and all(isinstance(n, str) and n for n in names):
        axes = [n.lower() for n in names]
    elif axis_order:
        order = {name.lower(): position for name, position in axis_order.items() if isinstance(position, int)}
        if len(order) == rank + 1 and "c" in order:
            order.pop("c")
            order = {name: i for i, name in enumerate(sorted(order, key=order.__getitem__))}
        axes = [""] * rank
        for name, position in order.items():
            if 0 <= position < rank:
                axes[position] = name
    elif rank in (3, 4):
        axes = list(SERVED_AXES[4 - rank :])
    else:
        raise SourceError(f"a {rank}-dimensional array without axis names cannot be mapped to c, x, y, z")
    if sorted(a for a in axes if a != "c") != ["x", "y", "z"] or len(axes) != rank or axes.count("c") > 1:
        raise SourceError(f"axes {axes} cannot be mapped to c, x, y, z (need x, y, z and at most one c)")
    return axes


@dataclass(frozen=True)
class AxisMap:
    """The stored dimensions of an array (``axes``, ``shape``) and how they relate to the served axes."""

    axes: tuple[str, ...]
    shape: tuple[int, ...]

    @property
    def served_axis(self) -> list[int]:
        """The served axis of each stored dimension."""
        return [SERVED_AXES.index(a) for a in self.axes]

    @property
    def channels(self) -> int:
        return self.shape[self.axes.index("c")] if "c" in self.axes else 1

    def permutation(self, stored_order: list[int]) -> tuple[int, ...]:
        """The served-axis permutation whose C order is the byte order of stored dimensions ``stored_order``."""
        served = self.served_axis
        order = [served[d] for d in stored_order]
        if "c" not in self.axes:
            order = [0, *order]  # a channel axis of length 1 may sit anywhere
        return tuple(order)

    def served_chunk(self, chunks: tuple[int, ...]) -> tuple[int, int, int, int]:
        """A stored chunk shape as a served ``(c, x, y, z)`` one."""
        served = [1, 1, 1, 1]
        for axis, size in zip(self.served_axis, chunks):
            served[axis] = size
        return (served[0], served[1], served[2], served[3])

    def stored_index(self, index: tuple[int, ...]) -> tuple[int, ...]:
        """A served ``(c, x, y, z)`` grid index in stored dimensions."""
        return tuple(index[axis] for axis in self.served_axis)

    def stored_box(self, offset: tuple[int, int, int], shape: tuple[int, int, int]) -> tuple[list[int], list[int]]:
        """The served box ``[offset, offset + shape)`` of every channel in stored dimensions, clipped to ``shape``."""
        served_lo = (0, *offset)
        served_hi = (self.channels, *(o + s for o, s in zip(offset, shape)))
        lo = [served_lo[a] for a in self.served_axis]
        hi = [min(served_hi[a], n) for a, n in zip(self.served_axis, self.shape)]
        return lo, hi

    def to_served(self, data: np.ndarray) -> np.ndarray:
        """Stored-dimension voxels as ``(c, x, y, z)``."""
        served = self.served_axis
        data = np.transpose(data, sorted(range(len(self.axes)), key=lambda d: served[d]))
        return data if "c" in self.axes else data[None]
