"""A worker's heap: the long-lived part kept out of the cycle collector's full collections, and the C
allocator's thresholds set for chunks made and freed on every request.

A full collection walks every object the collector tracks and holds the interpreter while it does: with the
catalog of a few large datasets loaded (1,000 layers each: their models, sources and views, ~20,000 objects
a dataset) one took 130 to 280 ms on a 2-core machine, in whichever thread allocated, so the event loop
waited that long. Objects that survive such a costly collection are long-lived (loaded datasets, modules,
caches), so they are frozen (``gc.freeze``): later full collections walk only what was made since, and a
frozen object is still freed when its last reference goes (a dataset loaded again frees the one before: the
catalog's objects form no cycles). What freezing costs is the cyclic garbage alive at that moment (a request
in flight), never collected; freezes happen only after collections that cost more than
``FREEZE_AFTER_SECONDS``, that is after the heap grew by many thousands of objects, so that stays small.

Each chunk made allocates and frees arrays of 0.1 to 16 MiB (its voxels, their mapped copy, the indices
of a gather). glibc's thresholds move with what was freed last, and with arrays of several sizes in turn it
mapped blocks afresh and gave the top of its heap back after frees, so requests paid for faulting pages in
again: a mapped 64³ chunk's mapping took 2-3 times as long, and its system time 1.4 ms against 0.2-0.5 ms.
:func:`tune_allocator` sets them where glibc's own adjustment stops (``MMAP_THRESHOLD``, ``TRIM_THRESHOLD``):
blocks below the first stay in the heap, and the heap's top until more than the second lies free there, so
what a worker holds beyond its use is bounded as glibc would bound it, per allocator arena. (4 and 16 MiB
were tried first: a 128³ uint32 chunk's 8 MiB arrays were then mapped each time, 30 % more CPU a chunk.)
"""

import ctypes
import ctypes.util
import gc
import logging
import os
import time
from typing import Any

log = logging.getLogger("gateway")
FREEZE_AFTER_SECONDS = 0.01  # a full collection that took longer: its survivors are frozen
MMAP_THRESHOLD = 32 << 20  # blocks this large or larger are mapped on their own: glibc's largest dynamic value
TRIM_THRESHOLD = 64 << 20  # the heap's free top is given back once larger than this: twice the above, as glibc
# mallopt's parameters (glibc's malloc.h); an operator's MALLOC_*_ environment variables take precedence.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_OPERATOR_SET = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


class HeapFreezer:
    """A ``gc.callbacks`` entry that freezes the survivors of a costly full collection."""

    def __init__(self, after: float = FREEZE_AFTER_SECONDS) -> None:
        self.after = after
        self.freezes = 0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        elif time.perf_counter() - self._started > self.after:
            gc.freeze()
            self.freezes += 1
            log.debug("a full collection took over %s s: %d objects are frozen", self.after, gc.get_freeze_count())


def freeze_long_lived() -> None:
    """Freeze what the worker holds once started (modules, settings, the app), and from then on the
    survivors of every costly full collection."""
    gc.collect()
    gc.freeze()
    if not any(isinstance(callback, HeapFreezer) for callback in gc.callbacks):
        gc.callbacks.append(HeapFreezer())


def tune_allocator() -> bool:
    """Set glibc's thresholds (see the module's docstring), unless the environment sets them; whether set (no
    glibc: nothing to set)."""
    if any(name in os.environ for name in _OPERATOR_SET):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return False
    mapped = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    return bool(mapped and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
