"""A worker's long-lived heap kept out of the cycle collector's full collections.

A full collection walks every object the collector tracks and holds the interpreter while it does: with the
catalog of a few large datasets loaded (1,000 layers each: their models, sources and views, ~20,000 objects
a dataset) one took 130 to 280 ms on a 2-core machine, in whichever thread allocated, so the event loop
waited that long. Objects that survive such a costly collection are long-lived (loaded datasets, modules,
caches), so they are frozen (``gc.freeze``): later full collections walk only what was made since, and a
frozen object is still freed when its last reference goes (a dataset loaded again frees the one before: the
catalog's objects form no cycles). What freezing costs is the cyclic garbage alive at that moment (a request
in flight), never collected; freezes happen only after collections that cost more than
``FREEZE_AFTER_SECONDS``, that is after the heap grew by many thousands of objects, so that stays small.
"""

import gc
import logging
import time
from typing import Any

log = logging.getLogger("gateway")
FREEZE_AFTER_SECONDS = 0.01  # a full collection that took longer: its survivors are frozen


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
