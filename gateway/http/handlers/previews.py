"""``/preview/{organization}/{dataset}/{layer}.png``: a small image of a layer for its dataset page."""

from dataclasses import dataclass

from ...metrics import count_preview
from ...previews import Previews
from ...resources import Resource
from ..budget import MemoryBudget
from ..errors import HttpError
from ..messages import Answer, Request
from ..urls import PREVIEW_NEEDS, parse_preview_path
from .access import Authorizer
from .sender import Sender


@dataclass(frozen=True, slots=True)
class PreviewHandler:
    """A layer's preview, after the same access decision as its data; revalidated before it is made, and made
    within the worker's memory budget, as chunks are."""

    access: Authorizer
    previews: Previews
    sender: Sender
    memory: MemoryBudget

    async def __call__(self, request: Request) -> Answer:
        target = parse_preview_path(request.path)
        dataset = await self.access.readable_dataset(PREVIEW_NEEDS, request)
        layer = dataset.layers.get(target.layer)
        if layer is None or not layer.mags:
            raise HttpError(404, f"no servable layer {target.layer!r}; there are {', '.join(dataset.layers)}")
        planned = await self.previews.planned(layer.mags, layer.properties.category)
        self.memory.check(planned.working_bytes, "this preview")

        async def made() -> Resource:
            async with self.memory.hold(planned.working_bytes, "this preview"):
                return await self.previews.answer(planned)

        if planned.etag is None:  # known only from the voxels read
            return await self.sender.send(request, await made())
        answer, fresh = await self.sender.send_made(request, planned.etag, planned.last_modified, made)
        if not fresh:
            count_preview("revalidated")
        return answer
