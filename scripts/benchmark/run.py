"""The state of one benchmark run: its mode, directories, results and failures."""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from .config import Case, Mode, Result, log

Key = TypeVar("Key", bound=Hashable)


@dataclass
class Run:
    mode: Mode
    out: Path
    work: Path
    workers: int
    profile: int
    results: dict[tuple[str, str], Result] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def root(self) -> Path:
        return self.work / "data"

    @property
    def logs(self) -> Path:
        return self.work / "logs"

    @property
    def tokens_file(self) -> Path:
        return self.work / "tokens.json"

    def static(self, keyset: str) -> Path:
        return self.work / "static" / keyset

    def paths(self, name: str) -> Path:
        return self.work / "paths" / f"{name}.txt"

    def record(self, case: Case, result: Result) -> None:
        self.results[(case.name, case.keyset)] = result
        if result.error:
            self.failures.append(f"{case.name} [{case.keyset}]: {result.error}")

    def fail(self, case: Case, error: str) -> None:
        log(f"FAILED {case.name} [{case.keyset}]: {error}")
        self.record(case, Result(case.name, case.keyset, case.server, note=case.note, error=error))

    def measure(
        self, runs: dict[Key, Callable[[], dict[str, Any]]], slow: Collection[Key] = ()
    ) -> dict[Key, dict[str, Any] | Exception]:
        """Each measured run's stats, or the exception it raised: one after another in the order given, or, when
        the mode runs them side by side, all at once but the ``slow`` ones, which run at once after the others
        (a server that takes a second of CPU per answer finishes none beside a dozen other loads)."""
        if not self.mode.side_by_side:
            return _run_all(runs, 1)
        first = {key: measured for key, measured in runs.items() if key not in slow}
        outcomes = _run_all(first, len(first))
        outcomes.update(_run_all({key: runs[key] for key in runs if key not in first}, len(runs) - len(first)))
        return {key: outcomes[key] for key in runs}


def _run_all(runs: dict[Key, Callable[[], dict[str, Any]]], at_once: int) -> dict[Key, dict[str, Any] | Exception]:
    """Call each of ``runs``, ``at_once`` at a time (in the order given when one)."""
    if not runs:
        return {}
    with ThreadPoolExecutor(max_workers=at_once) as pool:
        futures = {key: pool.submit(measured) for key, measured in runs.items()}
    outcomes: dict[Key, dict[str, Any] | Exception] = {}
    for key, future in futures.items():
        error = future.exception()
        if error is not None and not isinstance(error, Exception):
            raise error
        outcomes[key] = future.result() if error is None else error
    return outcomes
