"""What keeps the event loop answering, checked on its own (issue 24, item 2): the lag probe sees a stall of
the loop, and the heap policy freezes the survivors of a costly full collection without keeping garbage
that references alone would free. The bound under the catalog bombs is ``tests/test_catalog_load.py``'s. And
the worker's allocator thresholds: a chunk's arrays reuse the heap instead of faulting pages in afresh."""

import asyncio
import os
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


FAULTS_SCRIPT = textwrap.dedent(
    """
    import resource, sys
    import numpy as np
    from gateway import heap

    def faults_per_chunk(rounds=50):
        rng = np.random.default_rng(0)
        labels = rng.integers(3, 20_003, 64**3, dtype=np.uint32)
        table = np.arange(20_000, dtype=np.uint32)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(rounds):
            mapped = table.take(labels - np.uint32(3))  # a mapped 64³ chunk's gather: 1 MiB, its indices 2 MiB
            wide = mapped.astype(np.uint64)  # and a copy of twice that, as an encoder's input may be
            del mapped, wide
        return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / rounds

    untuned = faults_per_chunk()
    tuned = heap.tune_allocator()
    print(untuned, tuned, faults_per_chunk())
    """
)


def test_a_worker_s_chunks_reuse_its_heap_unless_the_environment_sets_the_allocator() -> None:
    """In processes of their own (the thresholds are the whole process's): a chunk's arrays of 1 to 2 MiB faulted
    in about 1,000 pages each time with glibc's own thresholds; with the worker's, almost none. An operator's
    MALLOC_* variable is left to decide."""
    done = subprocess.run([sys.executable, "-c", FAULTS_SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    untuned, tuned, faults = done.stdout.split()
    assert tuned == "True"
    assert float(faults) < 64, f"{faults} page faults per chunk with the worker's thresholds ({untuned} without)"
    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": str(128 << 10)}  # glibc's default, set by an operator
    done = subprocess.run([sys.executable, "-c", FAULTS_SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[1] == "False"
