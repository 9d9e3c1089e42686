"""Run a :class:`~gateway.batch.tasks.BlockTask`: its blocks without an output, in this process or as tasks on
dask.distributed, then its ``finish`` once every block has one.

The worker that runs a block writes its output (:class:`~gateway.batch.outputs.BlockOutputs`), so a block is
done exactly when its output exists: a worker killed mid-block leaves nothing (the scheduler runs the block
again elsewhere), a run killed mid-way is started again and submits only the blocks without an output. A block
that fails names itself and the reason; a run with a failed block ends with the list and never finishes, unless it
is asked to go on (``keep_going``: the task's ``finish`` is given the others and is told which failed, the summary
lists them).
"""

import contextlib
import logging
import resource
import sys
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from gateway_storage.faults import Unavailable

from .outputs import BlockOutputs
from .tasks import Block, BlockMissing, BlockTask

# Beyond what a task says one block holds: the worker process itself (the interpreter, numpy, the task's
# libraries, dask's own state), measured at 200-300 MiB here, with room.
WORKER_HEADROOM_BYTES = 512 << 20
CONNECT_SECONDS = 10  # to reach an existing scheduler
EVENTS = "all"  # the scheduler's topic that tells of workers that leave
# dask's own log lines (a worker's failed task, a closed connection at shutdown) are off: a run says what went
# wrong itself, in one line or the list of failed blocks.
DASK_LOG_LEVEL = logging.CRITICAL + 1
Say = Callable[[str], None]


class RunFailed(Unavailable):
    """The run cannot go on or cannot finish; the message is one line (or the list of failed blocks)."""


class BlocksFailed(RunFailed):
    """Some blocks failed: nothing was finished; the others' outputs are kept for the next run."""

    def __init__(self, failed: "list[FailedBlock]", blocks: int, done: "list[BlockDone]") -> None:
        self.failed = failed
        self.done = done
        listed = "\n".join(f"  block {f.key}: {f.reason}" for f in failed)
        super().__init__(f"{len(failed)} of {blocks} blocks failed, nothing was finished:\n{listed}")


class ClusterUnavailable(RunFailed):
    """The dask scheduler cannot be reached, or went away: run again to resume."""


class BlockError(Unavailable):
    """One block's failure as it travels back from a worker: its key and the reason, plain text."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(key, reason)
        self.key = key
        self.reason = reason

    def __str__(self) -> str:
        return f"block {self.key}: {self.reason}"


@dataclass(frozen=True, slots=True)
class BlockDone:
    key: str
    output_bytes: int
    peak_rss_bytes: int  # of the process that ran it, so far
    started: float  # wall-clock time.time() on the worker
    ended: float


@dataclass(frozen=True, slots=True)
class FailedBlock:
    key: str
    reason: str


def _distributed() -> Any:
    """dask.distributed, imported when a run uses it (the ``batch`` extra); untyped, so typed as Any here."""
    import distributed

    return distributed


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux counts KiB


def run_block(block: Block, task: BlockTask, outputs: BlockOutputs) -> BlockDone:
    """Run one block and keep its output: what every worker runs (a module function, found by name there)."""
    started = time.time()
    try:
        output = task.run(block)
        outputs.write(block, output)
    except Exception as exc:  # any fault of one block fails that block, with its reason
        where = f"voxels {list(block.lo)} to {list(block.hi)}"
        raise BlockError(block.key, f"{where}: {type(exc).__name__}: {exc}") from None
    return BlockDone(block.key, len(output), _peak_rss_bytes(), started, time.time())


@dataclass(frozen=True, slots=True)
class RunSummary:
    result: str  # where ``finish`` wrote the result
    blocks: int
    submitted: int  # blocks run by this run; the others had an output from an earlier one
    voxels: int  # of the layer's finest mag, in the blocks submitted
    seconds: float  # from the first block's start to the last one's end (no cluster start, no finish)
    wall_seconds: float  # of the whole run
    memory_bytes: int  # what the task says one block holds at most
    peak_rss_bytes: int  # the largest peak of any process that ran a block (0 when none ran)
    workers: str
    failed: tuple[FailedBlock, ...] = ()  # blocks the result was finished without (a run that went on)

    @property
    def voxels_per_second(self) -> float:
        return self.voxels / self.seconds if self.seconds > 0 else 0.0

    def lines(self) -> list[str]:
        reused = self.blocks - self.submitted
        peak = f", peak {self.peak_rss_bytes / 2**20:.0f} MiB per worker process" if self.submitted else ""
        return [
            f"{self.blocks} blocks: {self.submitted} run on {self.workers}, {reused} kept from an earlier run",
            f"{self.voxels:,} voxels in {self.seconds:.1f} s of blocks ({self.voxels_per_second / 1e6:.1f} M voxels/s),"
            f" {self.wall_seconds:.1f} s in all",
            f"memory: at most {self.memory_bytes / 2**20:.0f} MiB per block{peak}",
        ]


class Executor(ABC):
    """Where blocks run."""

    @property
    @abstractmethod
    def description(self) -> str:
        """Where, as the summary says it."""

    @abstractmethod
    def run(self, task: BlockTask, blocks: Sequence[Block], outputs: BlockOutputs, say: Say) -> list[BlockDone]:
        """Run ``blocks`` (each keeps its output); raises :class:`BlocksFailed` once all have run if any failed."""


class InProcess(Executor):
    """One block after the other in this process: a small layer needs no cluster."""

    description = "this process"

    def __init__(self, progress: bool) -> None:
        self.progress = progress

    def run(self, task: BlockTask, blocks: Sequence[Block], outputs: BlockOutputs, say: Say) -> list[BlockDone]:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        done: list[BlockDone] = []
        failed: list[FailedBlock] = []
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed:,.0f}/{task.total:,.0f} blocks"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        )
        with Progress(*columns, disable=not self.progress, console=Console(stderr=True)) as bar:
            shown = bar.add_task(task.name, total=len(blocks))
            for block in blocks:
                try:
                    done.append(run_block(block, task, outputs))
                except BlockError as exc:
                    failed.append(FailedBlock(exc.key, exc.reason))
                bar.advance(shown)
        if failed:
            raise BlocksFailed(failed, len(blocks), done)
        return done


class Dask(Executor):
    """Blocks as tasks on a dask.distributed cluster, one task per block, each retried by the scheduler when
    the worker running it dies (``distributed.scheduler.allowed-failures`` times)."""

    def __init__(self, progress: bool) -> None:
        self.progress = progress

    @abstractmethod
    def client(self, task: BlockTask, say: Say) -> Any:
        """A context manager giving a connected ``distributed.Client``."""

    def run(self, task: BlockTask, blocks: Sequence[Block], outputs: BlockOutputs, say: Say) -> list[BlockDone]:
        distributed = _distributed()
        with self.client(task, say) as client:
            if client.dashboard_link:
                say(f"dask dashboard: {client.dashboard_link}")
            client.subscribe_topic(EVENTS, lambda event: _say_worker_death(event, say))
            futures = client.map(
                run_block,
                blocks,
                task=task,
                outputs=outputs,
                key=[f"{task.name}-{outputs.name[:12]}-{block.key}" for block in blocks],
            )
            try:
                if self.progress:  # dask's bar, on standard error as the in-process one: the summary is the output
                    with contextlib.redirect_stdout(sys.stderr):
                        distributed.progress(futures)
                distributed.wait(futures)
                return _collect(blocks, futures)
            except (OSError, distributed.comm.core.CommClosedError) as exc:
                raise ClusterUnavailable(f"lost the dask scheduler mid-run ({exc}); run again to resume") from None
            finally:
                client.unsubscribe_topic(EVENTS)


def _say_worker_death(event: tuple[float, dict[str, Any]], say: Say) -> None:
    message = event[1]
    if message.get("action") == "remove-worker" and not message.get("expected"):
        running = len(message.get("processing-tasks") or ())
        say(f"dask worker {message.get('worker')} died running {running} blocks: the scheduler runs them again")


def _collect(blocks: Sequence[Block], futures: list[Any]) -> list[BlockDone]:
    """The finished blocks' records; :class:`BlocksFailed` listing the others."""
    distributed = _distributed()

    done: list[BlockDone] = []
    failed: list[FailedBlock] = []
    for block, future in zip(blocks, futures):
        if future.status == "finished":
            done.append(future.result())
        elif future.status == "cancelled":
            raise ClusterUnavailable("the dask scheduler dropped the run's tasks (it went away?); run again to resume")
        else:
            exc = future.exception()
            if isinstance(exc, distributed.KilledWorker):
                reason = "every worker that ran it died (killed, or over its memory limit)"
            else:
                reason = exc.reason if isinstance(exc, BlockError) else f"{type(exc).__name__}: {exc}"
            failed.append(FailedBlock(block.key, reason))
    if failed:
        raise BlocksFailed(failed, len(blocks), done)
    return done


@dataclass(frozen=True, slots=True)
class ClusterPorts:
    """Where a ``LocalCluster`` listens: all on loopback (nothing of a batch run is for other machines), the
    dashboard at ``dashboard`` (``host:port``, or None for none), the scheduler at ``scheduler`` (0: any free port),
    nannies and workers in ``workers`` (``FIRST:LAST``, one port, or empty: any free ports)."""

    dashboard: str | None = "127.0.0.1:8787"
    scheduler: int = 0
    workers: str = ""

    HOST = "127.0.0.1"

    def cluster_arguments(self) -> dict[str, Any]:
        """``LocalCluster``'s keywords for these places."""
        found: dict[str, Any] = {"host": self.HOST, "scheduler_port": self.scheduler}
        found["dashboard_address"] = self.dashboard
        if self.workers:
            found |= {"worker_port": self.workers, "port": self.workers}  # a worker and its nanny, each a free one
        return found


class LocalWorkers(Dask):
    """A ``LocalCluster`` of worker processes on this machine, one thread each, with a memory limit of what the
    task says one block holds plus :data:`WORKER_HEADROOM_BYTES`, listening on loopback only (:class:`ClusterPorts`)."""

    def __init__(self, workers: int, progress: bool, ports: ClusterPorts | None = None) -> None:
        super().__init__(progress)
        self.workers = workers
        self.ports = ports or ClusterPorts()

    @property
    def description(self) -> str:
        return f"{self.workers} local dask worker processes"

    @contextmanager
    def client(self, task: BlockTask, say: Say) -> Iterator[Any]:
        distributed = _distributed()
        limit = task.memory_bytes() + WORKER_HEADROOM_BYTES
        say(f"starting {self.workers} dask worker processes, a memory limit of {limit / 2**20:.0f} MiB each")
        with warnings.catch_warnings():  # "port 8787 is already in use": the link printed names the port used
            warnings.simplefilter("ignore")
            cluster = distributed.LocalCluster(
                n_workers=self.workers,
                threads_per_worker=1,
                processes=True,
                memory_limit=limit,
                silence_logs=DASK_LOG_LEVEL,
                **self.ports.cluster_arguments(),
            )
        with cluster, distributed.Client(cluster) as client:
            yield client


class Scheduler(Dask):
    """An existing dask cluster, by its scheduler's address; its workers see the same data and work directory."""

    def __init__(self, address: str, progress: bool) -> None:
        super().__init__(progress)
        self.address = address

    @property
    def description(self) -> str:
        return f"the dask cluster at {self.address}"

    @contextmanager
    def client(self, task: BlockTask, say: Say) -> Iterator[Any]:
        distributed = _distributed()
        logging.getLogger("distributed").setLevel(DASK_LOG_LEVEL)
        try:
            client = distributed.Client(self.address, timeout=f"{CONNECT_SECONDS}s")
        except (OSError, TimeoutError, ValueError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ClusterUnavailable(f"cannot reach the dask scheduler at {self.address}: {reason}") from None
        say(f"each block needs up to {task.memory_bytes() / 2**20:.0f} MiB: give the workers that much and more")
        with client:
            yield client


def run_task(
    task: BlockTask, executor: Executor, outputs: BlockOutputs, say: Say | None = None, keep_going: bool = False
) -> RunSummary:
    """Run every block of ``task`` that has no output yet, then finish it; the outputs are removed once the result
    is written (a later run of the same data version would find its result, not its blocks). With ``keep_going``
    a run whose blocks failed finishes with the others (``finish`` gets :class:`BlockMissing` for each failed one)
    and lists the failed in its summary; without, it ends with :class:`BlocksFailed` and keeps the others' outputs."""
    tell: Say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    blocks = task.blocks()
    pending = [block for block in blocks if not outputs.has(block)]
    memory = task.memory_bytes()
    tell(
        f"{task.name} of version {task.version()}: {len(pending)} of {len(blocks)} blocks to run "
        f"on {executor.description}, each holding at most {memory / 2**20:.0f} MiB"
    )
    started = time.perf_counter()
    failed: dict[str, FailedBlock] = {}
    try:
        done = executor.run(task, pending, outputs, tell) if pending else []
    except BlocksFailed as exc:
        if not keep_going:
            raise
        done, failed = exc.done, {f.key: f for f in exc.failed}

    def output(block: Block) -> bytes:
        missing = failed.get(block.key)
        if missing is not None:
            raise BlockMissing(missing.key, missing.reason)
        return outputs.read(block)

    result = task.finish(output)
    outputs.discard()
    return RunSummary(
        result,
        len(blocks),
        len(pending),
        sum(task.voxels(block) for block in pending),
        max((d.ended for d in done), default=0.0) - min((d.started for d in done), default=0.0),
        time.perf_counter() - started,
        memory,
        max((d.peak_rss_bytes for d in done), default=0),
        executor.description,
        tuple(failed.values()),
    )
