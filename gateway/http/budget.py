"""A worker's memory budget for what requests build: costly chunks of every tree wait their turn, and a need
larger than the whole budget is refused before any work."""

from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol

import anyio

from gateway_storage.faults import TooLarge


class Kept(Protocol):
    """Answers a worker keeps (the answer cache): their bytes count against the budget, and give way to work."""

    @property
    def size_bytes(self) -> int: ...

    def shrink_to(self, nbytes: int) -> None: ...


class OverBudget(TooLarge):
    """What a request would build, costed from the metadata, is more than the whole budget: a 413 with the reason,
    answered before a byte is read or allocated."""


class MemoryBudget:
    """Bytes that what requests build at once may hold (decoded blocks, a chunk, its encoded copies), granted
    first come, first served.

    Each need is costed from the metadata before any work. A need larger than the whole budget is refused
    (:class:`OverBudget`): memory stays bounded by the budget, whatever a planted file declares. A request
    cancelled while it waits (its client went away) leaves the queue without producing anything. The answers
    the worker keeps count against the same bytes: they are kept only where work leaves room, and the least
    recently used give way when work needs it. A limit of 0 means no bound.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.kept: Kept | None = None
        self._queue: deque[tuple[int, anyio.Event]] = deque()

    def make_room(self, nbytes: int) -> bool:
        """Whether an answer of ``nbytes`` may be kept beside the work in flight; if so, the answers kept
        already give way (least recently used first) until it fits beside them."""
        if self.limit <= 0:
            return True
        if self.used + nbytes > self.limit:
            return False
        if self.kept is not None and self.kept.size_bytes > self.limit - self.used - nbytes:
            self.kept.shrink_to(self.limit - self.used - nbytes)
        return True

    def check(self, nbytes: int, what: str = "this chunk") -> None:
        """Refuse a need that no wait could grant; :class:`OverBudget` with the reason."""
        if 0 < self.limit < nbytes:
            raise OverBudget(
                f"{what} would hold {nbytes} bytes while it is made, more than the {self.limit} bytes a worker "
                "gives everything it makes at once (chunk_memory_bytes)"
            )

    def would_wait(self, nbytes: int) -> bool:
        """Whether holding ``nbytes`` now would have to wait for others to finish."""
        return self.limit > 0 and (bool(self._queue) or self.used + nbytes > self.limit)

    @asynccontextmanager
    async def hold(self, nbytes: int, what: str = "this chunk") -> AsyncIterator[None]:
        """Hold ``nbytes`` of the budget while the body runs, waiting for them if others hold too many."""
        if self.limit <= 0 or nbytes <= 0:
            yield
            return
        self.check(nbytes, what)
        await self._acquire(nbytes)
        try:
            yield
        finally:
            self._release(nbytes)

    async def _acquire(self, amount: int) -> None:
        if not self._queue and self.used + amount <= self.limit:
            self._grant(amount)
            return
        entry = (amount, anyio.Event())
        self._queue.append(entry)
        try:
            await entry[1].wait()
        except BaseException:
            if entry in self._queue:
                self._queue.remove(entry)
            else:  # granted just as it was cancelled
                self._release(amount)
            raise

    def _release(self, amount: int) -> None:
        self.used -= amount
        while self._queue and self.used + self._queue[0][0] <= self.limit:
            granted, event = self._queue.popleft()
            self._grant(granted)
            event.set()

    def _grant(self, amount: int) -> None:
        self.used += amount
        if self.kept is not None and self.kept.size_bytes > self.limit - self.used:
            self.kept.shrink_to(self.limit - self.used)
