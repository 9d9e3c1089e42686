"""``/data/meshes/{organization}/{dataset}/{layer}/{multires|legacy}/{file}``: a precomputed mesh source of a
segmentation layer (:mod:`gateway.meshes`), made in a thread."""

from dataclasses import dataclass

from ...meshes.service import MeshService
from ..messages import Answer, Request
from ..urls import parse_mesh_path
from .access import Authorizer
from .sender import Sender


@dataclass(frozen=True, slots=True)
class MeshHandler:
    """A layer's meshes, after the same access decision as its data."""

    access: Authorizer
    meshes: MeshService
    sender: Sender

    async def __call__(self, request: Request) -> Answer:
        target = parse_mesh_path(request.path)
        dataset = await self.access.readable_dataset(request, target.organization, target.dataset)
        found = await self.meshes.answer(dataset, target.layer, target.kind, target.file)
        return await self.sender.send(request, found)
