"""The state of one benchmark run: its mode, directories, results and failures."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import Case, Mode, Result, log


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
