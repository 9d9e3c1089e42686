"""Chunk answers kept in each worker, under what their URL means and the versions of the files they came from.

Viewers and dask graphs ask for the same chunks again and again, while the stored files they are made of
rarely change; making one again reads, decodes and encodes it every time. An answer is kept with the
versions of the files it was made from (the :class:`~gateway.zarr.resource.FileVersions` its ETag covers)
and handed out again only while the store says each file is still that version: the check ETags rely on,
a stat per file for local files, so a rewritten file is never answered from here. Its bytes were read under
the settle rule when the answer was made, and a file rewritten since has another version.

The key holds no token: authorization is decided before a chunk is looked up, on every request.
"""

from typing import NamedTuple

import anyio

from gateway_storage import ByteLRU, StorageError

from ..zarr.resource import Resource
from .budget import MemoryBudget

# No answer larger than this share of the budget is kept, so that a few large chunks cannot flush the many
# small ones a viewer asks for again.
LARGEST_SHARE = 16
# What an entry holds beside its body, counted against the budget with it: the key and the resource, and
# per file it was made from its path and identity.
ENTRY_BYTES = 512
FILE_BYTES = 256
# A kept answer made from at most this many local files is checked on the event loop: a few stats cost less than
# the hand-off to a thread (about 100-300 µs here, 10 % of a warm 32³ chunk). One made from more is checked in a
# chunk thread: 512 stats (small WKW file cubes) on the loop held /healthz at a p95 of 553 ms.
INLINE_CHECK_FILES = 8


class AnswerKey(NamedTuple):  # a tuple: hashed and compared in C, once per chunk request
    """What a chunk URL means: the tree, the array's names, what the array is made as, the chunk's grid index.

    ``made_as`` is the array's fingerprint (its layout, codec and source location): a dataset loaded again
    with another layout or other mag paths gets other keys, while the same one keeps its answers.
    """

    tree: str
    names: tuple[str, ...]  # organization, dataset, group, array
    made_as: str
    chunk: tuple[int, ...]  # the grid index


class AnswerCache:
    """Answers with a body and the versions of every file they were made from, by bytes, least recently used
    first out; ``max_bytes`` 0 keeps none. ``hits`` and ``misses`` count answers given from here and made.

    Its bytes count against the worker's ``budget``: an answer is kept only where the work in flight leaves
    room, and kept answers give way (least recently used first) when work needs their room."""

    def __init__(self, max_bytes: int, budget: MemoryBudget | None = None) -> None:
        self.max_bytes = max_bytes
        self.budget = budget
        if budget is not None:
            budget.kept = self
        self.largest = max_bytes // LARGEST_SHARE
        self._kept: ByteLRU[Resource] = ByteLRU(max_bytes)
        self.hits = 0
        self.misses = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    @property
    def size_bytes(self) -> int:
        return self._kept.size_bytes

    def shrink_to(self, nbytes: int) -> None:
        """Drop the least recently used answers until at most ``nbytes`` are kept."""
        self._kept.shrink_to(nbytes)

    async def current(self, key: AnswerKey, threads: anyio.CapacityLimiter) -> Resource | None:
        """The answer kept under ``key`` if every file it was made from is still the version read, else None.

        The check (a stat per file for local files, a request per object for a remote store) runs where making
        the answer would read: on the event loop for at most ``INLINE_CHECK_FILES`` local files (a stat each,
        cheaper than a thread hand-off, as a cheap chunk's reads are), else in a thread of ``threads`` (an
        answer made of small WKW file cubes names hundreds of files). A check that fails with a storage fault
        is a miss: making the answer again meets the fault and answers it as the error map says.
        """
        kept = self._kept.get(key)
        if kept is not None:
            versions = kept.made_from
            assert versions is not None, "only answers that name their files are kept"
            try:
                if versions.store.is_local and len(versions.files) <= INLINE_CHECK_FILES:
                    unchanged = versions.current()
                else:
                    unchanged = await anyio.to_thread.run_sync(versions.current, limiter=threads)
            except (StorageError, OSError):
                unchanged = False
            if unchanged:
                self.hits += 1
                return kept
        self.misses += 1
        return None

    def keep(self, key: AnswerKey, answer: Resource) -> None:
        """Keep ``answer`` if it is a body made from files it names, and small enough; else leave it."""
        body = answer.body
        if body is None or answer.made_from is None:
            return  # a reader (a virtual shard streams) or a body whose files are unknown
        size = len(body) + ENTRY_BYTES + FILE_BYTES * len(answer.made_from.files)
        if size <= self.largest and (self.budget is None or self.budget.can_keep(size)):
            self._kept.put(key, answer, size)
