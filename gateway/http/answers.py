"""Chunk answers kept in each worker, under what their URL means and the versions of the files they came from.

Viewers and dask graphs ask for the same chunks again and again, while the stored files they are made of
rarely change; making one again reads, decodes and encodes it every time. An answer is kept with the
versions of the files it was made from (the :class:`~gateway.resources.FileVersions` its ETag covers)
and handed out again only while each file is still that version: the check ETags rely on.

That check is never file work on the event loop. Where the kernel reports changes of local files
(:class:`gateway_storage.changes.Changes`), the directories from each file's own up to its root are watched and an
answer is trusted until a change is reported in one of them; then its files are looked at again (a stat each, in
a chunk thread), so a rewritten local file is never answered from here. Elsewhere they are looked at (a stat, or a
request per object) at most once per file per ``recheck_seconds``, the settle time: data written later than that
may be answered as it was before, as the settle rule already lets it be a 503. Its bytes were read under the
settle rule when the answer was made, and a file rewritten since has another version.

The key holds no token: authorization is decided before a chunk is looked up, on every request.
"""

import math
import threading
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import anyio

from gateway_storage import ByteLRU, FileIdentity, StorageError, Store
from gateway_storage.changes import Changes

from ..resources import FileVersions, Resource
from ..sources.dataset import Dataset
from .budget import MemoryBudget

# No answer larger than this share of the budget is kept, so that a few large chunks cannot flush the many
# small ones a viewer asks for again.
LARGEST_SHARE = 16
# What an entry holds beside its body, counted against the budget with it: the key and the resource, and
# per file it was made from its path and identity.
ENTRY_BYTES = 512
FILE_BYTES = 256
MAX_LOOKED_UP = 1 << 17  # identities remembered per worker (a few MiB); past it the oldest are forgotten
MAX_TARGETS = 1 << 17  # chunk paths remembered per worker for the front of the edge; past it the oldest go


class AnswerKey(NamedTuple):  # a tuple: hashed and compared in C, once per chunk request
    """What a chunk URL means: the tree, the array's names, what the array is made as, the chunk's grid index.

    ``made_as`` is the array's fingerprint (its layout, codec and source location): a dataset loaded again
    with another layout or other mag paths gets other keys, while the same one keeps its answers.
    """

    tree: str
    names: tuple[str, ...]  # organization, dataset, group, array
    made_as: str
    chunk: tuple[int, ...]  # the grid index


@dataclass(frozen=True, slots=True, eq=False)
class KeptTarget:
    """What a chunk path answered from here names: the answer's key and the dataset it was served from (the very
    object: a dataset loaded again is another one)."""

    key: AnswerKey
    dataset: Dataset


class KeptTargets:
    """Chunk paths (as routed: below a ``/t/{token}/``) whose answers were kept, so that the front of the edge
    finds a kept answer by the raw path alone; at most ``MAX_TARGETS``, the oldest forgotten first."""

    def __init__(self) -> None:
        self._targets: dict[str, KeptTarget] = {}

    def get(self, path: str) -> KeptTarget | None:
        return self._targets.get(path)

    def remember(self, path: str, target: KeptTarget) -> None:
        found = self._targets.get(path)
        if found is not None and found.dataset is target.dataset and found.key == target.key:
            return  # (a dataset is compared by identity: its fields are large)
        if len(self._targets) >= MAX_TARGETS:
            del self._targets[next(iter(self._targets))]
        self._targets[path] = target


class Moment(NamedTuple):
    """A moment before an answer's files were read: its ``time.monotonic()`` and the change notifications' epoch."""

    at: float
    epoch: int


@dataclass(slots=True)
class _Check:
    """A check of a kept answer in a thread, which every request for it meanwhile waits for."""

    done: anyio.Event = field(default_factory=anyio.Event)
    unchanged: bool = False


@dataclass(slots=True)
class _Kept:
    """A kept answer and when its files were last found unchanged."""

    answer: Resource
    versions: FileVersions
    checked_at: float  # time.monotonic() of the last look at its files
    epoch: int  # the change notifications' epoch before that look
    notified: bool | None = None  # whether every file's changes are reported (None: not asked yet)
    check: _Check | None = None


class LookedUp:
    """Identities of files, each looked up at most once per ``seconds`` while no change is reported: one looked up
    before the change notifications' epoch moved on is looked up again (it may have been read before the change)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._found: dict[str, tuple[int, int, FileIdentity | None, float]] = {}  # path -> store, epoch, identity, when
        self._lock = threading.Lock()

    def identity(self, store: Store, path: str, epoch: int, now: float) -> FileIdentity | None:
        """The identity of ``path`` in ``store``, for a look that began at ``epoch`` and ``now``."""
        found = self._found.get(path)
        if found is not None and found[:2] == (id(store), epoch) and now - found[3] < self.seconds:
            return found[2]
        identity = store.identity(path)
        if self.seconds > 0:
            with self._lock:
                if len(self._found) >= MAX_LOOKED_UP:
                    del self._found[next(iter(self._found))]
                self._found[path] = (id(store), epoch, identity, now)
        return identity


class WatchedFiles:
    """Whether changes of the files an answer is made from are reported, as :meth:`AnswerCache.keep` needs to
    know to trust an answer from its read, and their watches, set as soon as an answer made from them is kept."""

    def __init__(self, changes: Changes, recheck_seconds: float) -> None:
        self.changes = changes
        self.recheck_seconds = recheck_seconds
        self._unwatched: dict[str, None] = {}  # files being watched, or whose changes are not reported (watch)

    def moment(self) -> Moment:
        """Now, as :meth:`AnswerCache.keep` needs to know when an answer's files began to be read."""
        return Moment(time.monotonic(), self.changes.epoch)

    def reported_since(self, versions: FileVersions, moment: float) -> bool:
        """Whether every change of the files of ``versions`` after ``moment`` is reported (no file work)."""
        return versions.store.is_local and all(self.changes.watched_before(path, moment) for path, _ in versions.files)

    async def watch(self, answer: Resource, threads: anyio.CapacityLimiter) -> None:
        """Watch the directories of the files ``answer`` (just kept) was made from, in a thread of ``threads``, if
        they are local and not all watched yet: the answers made from them from now on are trusted from their read
        (:meth:`AnswerCache.keep`), not first looked at. Each file is watched once, whatever the requests meanwhile."""
        versions = answer.made_from
        if versions is None or not versions.store.is_local or self.recheck_seconds <= 0:
            return
        changes, skipped = self.changes, self._unwatched
        paths = [path for path, _ in versions.files if not changes.watched_before(path, math.inf)]
        paths = [path for path in paths if path not in skipped]
        if not paths:
            return
        changes.listen()
        skipped.update(dict.fromkeys(paths))  # (meanwhile too: one thread watches them)
        store = versions.store
        try:
            watched = await anyio.to_thread.run_sync(
                lambda: [changes.watch(path, store.root_of(path)) for path in paths], limiter=threads
            )
        except (StorageError, OSError):  # tried again with the next answer kept from them
            for path in paths:
                skipped.pop(path, None)
            return
        for path, done in zip(paths, watched):
            if done:  # watched now; one that is not (NFS, say) stays skipped, and is looked at by interval
                del skipped[path]
        while len(skipped) > MAX_LOOKED_UP:
            del skipped[next(iter(skipped))]


class AnswerCache:
    """Answers with a body and the versions of every file they were made from, by bytes, least recently used
    first out; ``max_bytes`` 0 keeps none. ``hits`` and ``misses`` count answers given from here and made.

    Its bytes count against the worker's ``budget``: an answer is kept only where the work in flight leaves
    room, and kept answers give way (least recently used first) when work needs their room. ``recheck_seconds``
    is how long a look at an answer's files holds (the settle time); ``changes`` reports local files' changes."""

    def __init__(
        self,
        max_bytes: int,
        budget: MemoryBudget | None = None,
        recheck_seconds: float = 0.0,
        changes: Changes | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self.budget = budget
        if budget is not None:
            budget.kept = self
        self.largest = max_bytes // LARGEST_SHARE
        self._kept: ByteLRU[_Kept] = ByteLRU(max_bytes)
        self.recheck_seconds = recheck_seconds
        self.looked_up = LookedUp(recheck_seconds)
        self.changes = changes if changes is not None else Changes()
        self.targets = KeptTargets()
        self.files = WatchedFiles(self.changes, recheck_seconds)
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

    def _trusted(self, kept: _Kept) -> bool:
        """Whether ``kept`` may be given without a look at its files: where every change of them is reported, no
        change reported since the last look (and never before its first); elsewhere, a look within
        ``recheck_seconds``. (None at all with ``recheck_seconds`` 0: the promise is then to look every time.)"""
        if kept.notified:
            return kept.epoch == self.changes.epoch and self.recheck_seconds > 0
        return kept.notified is False and time.monotonic() - kept.checked_at < self.recheck_seconds

    def fresh(self, key: AnswerKey) -> Resource | None:
        """The answer kept under ``key`` if it may be given without any file work now, else None. Nothing is
        counted: the front of the edge counts the answer it gives in ``hits``, or falls through to
        :meth:`current`."""
        kept = self._kept.get(key)
        return kept.answer if kept is not None and self._trusted(kept) else None

    async def current(self, key: AnswerKey, threads: anyio.CapacityLimiter) -> Resource | None:
        """The answer kept under ``key`` if every file it was made from is still the version read, else None.

        When the last look at its files no longer holds, they are looked at again in a thread of ``threads``
        (once, whatever the number of requests waiting for it). A look that fails with a storage fault is a
        miss: making the answer again meets the fault and answers it as the error map says.
        """
        kept = self._kept.get(key)
        if kept is not None and (self._trusted(kept) or await self._recheck(kept, threads)):
            self.hits += 1
            return kept.answer
        self.misses += 1
        return None

    async def _recheck(self, kept: _Kept, threads: anyio.CapacityLimiter) -> bool:
        check = kept.check
        if check is not None:
            await check.done.wait()
            return check.unchanged
        self.changes.listen()
        check = kept.check = _Check()
        try:
            check.unchanged = await anyio.to_thread.run_sync(self._look, kept, limiter=threads)
        except (StorageError, OSError):
            check.unchanged = False
        finally:
            kept.check = None
            check.done.set()
        return check.unchanged

    def _look(self, kept: _Kept) -> bool:
        """Whether every file of ``kept`` is still the version read (in a thread): their directories watched
        first where changes are reported, then each identity, looked up at most once per ``recheck_seconds``."""
        epoch = self.changes.epoch
        now = time.monotonic()
        versions = kept.versions
        store = versions.store
        # Asked every time: a watched directory that went (and maybe came back) is watched again.
        notified = store.is_local and all(self.changes.watch(path, store.root_of(path)) for path, _ in versions.files)
        if not all(self.looked_up.identity(store, path, epoch, now) == read for path, read in versions.files):
            return False
        kept.checked_at, kept.epoch, kept.notified = now, epoch, notified
        return True

    def keep(self, key: AnswerKey, answer: Resource, read_from: Moment | None = None) -> bool:
        """Keep ``answer`` if it is a body made from files it names, and small enough; else leave it. Whether
        it was kept. ``read_from``: the moment before its files began to be read."""
        body = answer.body
        versions = answer.made_from
        if body is None or versions is None:
            return False  # a reader (a virtual shard streams) or a body whose files are unknown
        size = len(body) + ENTRY_BYTES + FILE_BYTES * len(versions.files)
        if size > self.largest or (self.budget is not None and not self.budget.make_room(size)):
            return False
        kept = _Kept(answer, versions, time.monotonic(), self.changes.epoch)
        if read_from is not None and self.files.reported_since(versions, read_from.at):
            # Its files were read after that moment, and every change of them since is reported: trusted as a
            # look then would be (a change reported meanwhile has moved the epoch on: the next request looks).
            kept.checked_at, kept.epoch, kept.notified = read_from.at, read_from.epoch, True
        # Otherwise whether their changes are reported is not known yet: the first request for it looks (in a
        # thread), and watches their directories.
        self._kept.put(key, kept, size)
        return True
