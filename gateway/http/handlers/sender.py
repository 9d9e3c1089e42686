"""How every handler answers with a resource: validators, conditional requests and ranges."""

from dataclasses import dataclass

import anyio

from ...zarr.resource import Resource
from ..messages import Answer, Request
from ..responses import Reader, send_resource


@dataclass(frozen=True, slots=True)
class Sender:
    """Sends resources, their reads in the chunk threads, cached as the settings say unless told otherwise."""

    chunk_threads: anyio.CapacityLimiter
    cache_control: bytes

    async def send(self, request: Request, resource: Resource, cache_control: bytes | None = None) -> Answer:
        """``resource`` with validators, conditional requests and ranges, cached as ``cache_control`` says
        (the settings' ``cache_control`` when None)."""
        reader = Reader(resource, self.chunk_threads, request.context)
        control = self.cache_control if cache_control is None else cache_control
        return await send_resource(request.headers, request.method, resource, control, reader)
