"""How every handler answers with a resource: validators, conditional requests and ranges."""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

from ...resources import Resource
from ..messages import Answer, Request
from ..responses import Reader, answer_by_validators, send_resource


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

    async def send_made(
        self, request: Request, etag: str, last_modified: float | None, make: Callable[[], Awaitable[Resource]]
    ) -> tuple[Answer, bool]:
        """A resource whose validators are known before it is made: a request they answer (304, 412) is
        answered without making it. Returns the answer and whether ``make`` ran."""
        decided = answer_by_validators(request.headers, etag, last_modified, self.cache_control)
        if decided is not None:
            return decided, False
        return await self.send(request, await make()), True
