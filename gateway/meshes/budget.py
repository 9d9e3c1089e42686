"""What one mesh request may cost: its time, the triangles and vertices it makes, and the surface of each box.

The cost of meshing follows the surface of a segment, not its voxels: a 3-D checkerboard of one id has
a surface on every face of every voxel. So a box's surface (the faces between the segment's voxels and
the others) is counted before its marching cubes, which then costs at most that much. A box past the bound
is not refused but meshed coarser (:mod:`gateway.meshes.surfaces`: its labels two times coarser by mode, a
quarter of the faces of a real surface); only a box whose coarser labels are still past it (a pattern made
to cost, such as a checkerboard of two-voxel cells) stops the work. The triangles and vertices made are
summed after each box; and the request's deadline is checked before each box is read.
Past any bound the work stops at once with the reason: a 413 for work too large (it would be as large
on a retry), a 503 for work too slow (the machine may be less busy later).
"""

import time

import numpy as np

from ..settings import MESH_SECONDS
from .errors import MeshTooLarge, MeshTooSlow

# Faces between a segment's voxels and the others within one box (a level-0 window of 65 voxels per edge) that
# are meshed at the box's mag: a ball that fills the cube has about 17,000, a folded glial sheet 48,000, and a
# voxel checkerboard 820,000, which would hold a thread (and the interpreter: the mesher does not release it)
# for seconds. Past it the box is meshed from labels two times coarser, whose faces must be within it too.
MAX_BOX_SURFACE = 1 << 15
MAX_TRIANGLES = 1 << 21  # per request, over every box meshed (a few MiB of Draco, 48 MiB of legacy fragment)
MAX_VERTICES = 1 << 21


def surface_faces(mask: np.ndarray) -> int:
    """Faces between set and unset voxels of a boolean ``(x, y, z)`` mask, along all three axes."""
    return sum(int(np.count_nonzero(np.diff(mask, axis=axis))) for axis in range(3))


class MeshBudget:
    """The running totals and the deadline of one request; one thread uses it."""

    def __init__(self, what: str, seconds: float = MESH_SECONDS) -> None:
        self.what = what
        self.seconds = seconds
        self.deadline: float | None = None  # set when the first box is about to be read
        self.triangles = 0
        self.vertices = 0

    def check_time(self) -> None:
        """Before each box: the request's meshing (from its first box on) within its time."""
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + self.seconds
        elif now > self.deadline:
            raise MeshTooSlow(
                f"{self.what} took more than the {self.seconds:g} s one mesh request may; the work was stopped "
                "(retry when the gateway is less busy, or use the legacy source, one cube per request)"
            )

    def refuse_surface(self, where: str, faces: int, coarser_faces: int) -> MeshTooLarge:
        """The reason a box is not meshed: past the bound at its mag, and with its labels two times coarser."""
        return MeshTooLarge(
            f"{self.what}: the segment's surface in {where} has {faces} voxel faces, and still {coarser_faces} with "
            f"its labels two times coarser (by mode), more than the {MAX_BOX_SURFACE} one box may (a pattern, not "
            "a surface); the work was stopped"
        )

    def count(self, triangles: int, vertices: int) -> None:
        """After a box is meshed: the request's totals within their bounds."""
        self.triangles += triangles
        self.vertices += vertices
        totals = (("triangles", self.triangles, MAX_TRIANGLES), ("vertices", self.vertices, MAX_VERTICES))
        for name, total, bound in totals:
            if total > bound:
                raise MeshTooLarge(
                    f"{self.what} makes more than {bound} {name}, the most one mesh request may; the work was stopped"
                )
