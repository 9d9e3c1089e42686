"""What a serving process spends, read from ``/proc``: peak memory, bytes read, CPU seconds."""

import os
from pathlib import Path

from .servers import Server


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


class PeakRss:
    """Peak resident memory of the serving process while the block runs, above its resident size before."""

    def __init__(self, server: Server) -> None:
        self.pid = server.serving_pid()
        self.growth = 0

    def __enter__(self) -> "PeakRss":
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        self.before = _status_kib(self.pid, "VmRSS") * 1024
        return self

    def __exit__(self, *exc: object) -> None:
        self.growth = _status_kib(self.pid, "VmHWM") * 1024 - self.before


def bytes_read(server: Server) -> int:
    """Bytes the serving process has read from files and sockets so far (``rchar``)."""
    for line in Path(f"/proc/{server.serving_pid()}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar")


def cpu_seconds(server: Server) -> float:
    """User and system CPU time of the serving process so far, every thread of it."""
    fields = Path(f"/proc/{server.serving_pid()}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
