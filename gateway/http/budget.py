"""A worker's memory budget for chunks in flight: requests whose chunks would exceed it wait their turn."""

from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio


class MemoryBudget:
    """Bytes that chunks being produced at once may hold, granted first come, first served.

    A chunk larger than the whole budget waits until nothing else holds any, then runs alone: memory
    stays bounded by the budget or by one chunk, whichever is larger. A request cancelled while it
    waits (its client went away) leaves the queue without producing anything. A limit of 0 means no
    bound.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._queue: deque[tuple[int, anyio.Event]] = deque()

    def would_wait(self, nbytes: int) -> bool:
        """Whether holding ``nbytes`` now would have to wait for others to finish."""
        return self.limit > 0 and (bool(self._queue) or self.used + min(nbytes, self.limit) > self.limit)

    @asynccontextmanager
    async def hold(self, nbytes: int) -> AsyncIterator[None]:
        if self.limit <= 0:
            yield
            return
        amount = min(nbytes, self.limit)
        await self._acquire(amount)
        try:
            yield
        finally:
            self._release(amount)

    async def _acquire(self, amount: int) -> None:
        if not self._queue and self.used + amount <= self.limit:
            self.used += amount
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
            self.used += granted
            event.set()
