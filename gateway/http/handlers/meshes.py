"""``/data/meshes/{organization}/{dataset}/{layer}/{multires|legacy}/{file}``: a precomputed mesh source of a
segmentation layer (:mod:`gateway.meshes`), made in a thread."""

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from ...meshes.service import MeshService
from ..budget import MemoryBudget
from ..messages import Answer, Request
from ..urls import MESH_NEEDS, parse_mesh_path
from .access import Authorizer
from .sender import Sender


@dataclass(frozen=True, slots=True)
class MeshHandler:
    """A layer's meshes, after the same access decision as its data; a request holds its cost of the worker's
    memory budget (costed from the layer's metadata) while it is made, as chunks do."""

    access: Authorizer
    meshes: MeshService
    sender: Sender
    memory: MemoryBudget

    async def __call__(self, request: Request) -> Answer:
        target = parse_mesh_path(request.path)
        dataset = await self.access.readable_dataset(MESH_NEEDS, request)
        need = self.meshes.working_bytes(dataset, target.layer, target.kind, target.file)  # metadata: nothing read
        self.memory.check(need, "this mesh request")  # a 413 at once, not once a mesh thread is free

        def hold(nbytes: int) -> AbstractAsyncContextManager[None]:
            return self.memory.hold(nbytes, "this mesh request")

        found = await self.meshes.answer(dataset, target.layer, target.kind, target.file, hold)
        return await self.sender.send(request, found)
