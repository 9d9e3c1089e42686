"""What keeps the event loop answering, checked on its own (issue 24, item 2): the lag probe sees a stall of
the loop, and the heap policy freezes the survivors of a costly full collection without keeping garbage
that references alone would free. The bound under the catalog bombs is ``tests/test_catalog_load.py``'s."""

import asyncio
import subprocess
import sys
import textwrap
import time

import pytest

from gateway.metrics import LoopLag


@pytest.mark.serial  # it measures a lag (a lower bound, which a busy machine only raises)
def test_the_probe_sees_a_stall_of_the_loop() -> None:
    probe = LoopLag(0.01)

    async def stalled() -> None:
        probe.start(asyncio.get_running_loop())
        await asyncio.sleep(0.1)
        time.sleep(0.3)  # the loop held, as a blocking call on it or a thread in one long C call would
        await asyncio.sleep(0.1)
        probe.stop()

    asyncio.run(stalled())
    # the timer due during the stall ran at least the stall less one interval late (later on a busy machine)
    assert probe.longest >= 0.3 - 0.01, probe.longest


def test_survivors_of_a_costly_full_collection_are_frozen_and_still_freed_by_their_last_reference() -> None:
    """In a process of its own: freezing is for the whole interpreter."""
    script = textwrap.dedent(
        """
        import gc, weakref
        from gateway.heap import HeapFreezer
        gc.callbacks.append(HeapFreezer(after=0.0))  # every full collection counts as costly here

        class Node:
            pass

        kept = [Node() for _ in range(100_000)]
        gc.collect()
        assert gc.get_freeze_count() >= len(kept), gc.get_freeze_count()
        alive = weakref.ref(kept[0])
        del kept
        assert alive() is None, "a frozen object without cycles is freed by its last reference"
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
