"""Chunks and shards: kept answers while their files are unchanged, cheap ones on the event loop, the rest in a
chunk thread within the memory budget (a chunk larger than the whole budget is a 413 before any work); a chunk
asked for by many requests at once, before its answer is kept, is made once for all of them."""

import asyncio
from dataclasses import dataclass, field

import anyio

from gateway_storage import FileChangedError, FileUnsettledError
from gateway_storage.faults import Abandoned

from ...resources import Resource
from ...sources.dataset import Dataset
from ...zarr.nodes import ArrayNode
from ..answers import AnswerCache, AnswerKey, KeptTarget, Moment
from ..budget import MemoryBudget
from ..messages import Request
from ..urls import DataTarget


@dataclass(frozen=True, slots=True)
class Chunks:
    """Answers the chunk a target names: from the answer cache while every file it was made from is unchanged,
    else made (and kept); a file rewritten mid-read is tried once more the same way (then the error map
    answers 503)."""

    chunk_threads: anyio.CapacityLimiter
    memory: MemoryBudget
    answers: AnswerCache
    # The chunks being made, by their answer's key: a request for one of them waits for that answer (a viewer's
    # many connections ask for the same new chunks at once; each would make it, in threads that then contend).
    making: dict[AnswerKey, "asyncio.Future[tuple[Resource, Moment]]"] = field(default_factory=dict)

    async def answer(
        self, target: DataTarget, node: ArrayNode, key: str, request: Request, dataset: Dataset
    ) -> Resource:
        """The chunk ``key`` of ``node``, an array of ``dataset``; a kept one is remembered under the request's
        path, so that the front of the edge finds it next time."""
        index = target.tree.parse_key(key, node.rank)
        if not self.answers.enabled:
            return await self._made(node, index, request)
        place = AnswerKey(target.tree.name, target.names, node.fingerprint, index)
        kept = await self.answers.current(place, self.chunk_threads)
        if kept is None:
            kept, read_from = await self._made_once(place, node, index, request)
            if not self.answers.keep(place, kept, read_from):
                return kept
            await self.answers.files.watch(kept, self.chunk_threads)
        self.answers.targets.remember(request.path, KeptTarget(place, dataset))
        return kept

    async def _made_once(
        self, place: AnswerKey, node: ArrayNode, index: tuple[int, ...], request: Request
    ) -> tuple[Resource, Moment]:
        """The chunk made by this request, or by the one already making it (its answer or its fault), and the
        moment before its maker began to read its files. If that request is cancelled (its client left), a
        waiting one makes it."""
        while (pending := self.making.get(place)) is not None:
            try:
                return await asyncio.shield(pending)
            except _Abandoned:
                continue
        future: asyncio.Future[tuple[Resource, Moment]] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieved)
        self.making[place] = future
        read_from = self.answers.files.moment()
        try:
            made = await self._made(node, index, request), read_from
        except Abandoned:  # its client left: not the waiting requests' fault
            future.set_exception(_Abandoned())
            raise
        except Exception as exc:
            future.set_exception(exc)
            raise
        except BaseException:  # cancelled
            future.set_exception(_Abandoned())
            raise
        finally:
            del self.making[place]
        future.set_result(made)
        return made

    async def _made(self, node: ArrayNode, index: tuple[int, ...], request: Request) -> Resource:
        self.memory.check(node.working_bytes)  # a need no wait could grant is refused before any work
        for attempt in (1, 2):
            try:
                cheap = node.cheap_chunk(index)
                if cheap is not None:
                    return cheap
                if self.memory.would_wait(node.working_bytes) or self.chunk_threads.available_tokens < 1:
                    # It will wait in line: if its client leaves meanwhile, it is skipped. (Watching costs
                    # about as much as a thread hand-off, so a chunk that starts at once is not watched.)
                    return await request.unless_client_leaves(lambda: self._costly(node, index))
                return await self._costly(node, index)
            except FileUnsettledError:
                raise  # trying again at once cannot help: the file must first be quiet for settle_seconds
            except FileChangedError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def _costly(self, node: ArrayNode, index: tuple[int, ...]) -> Resource:
        async with self.memory.hold(node.working_bytes):
            return await anyio.to_thread.run_sync(node.costly_chunk, index, limiter=self.chunk_threads)


class _Abandoned(Abandoned):
    """The request making a chunk was cancelled or its client left: a request waiting for it makes it itself."""


def _retrieved(future: "asyncio.Future[tuple[Resource, Moment]]") -> None:
    """A fault no request waited for is not reported as never retrieved (the request that met it answers it)."""
    future.exception()
