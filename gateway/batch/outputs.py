"""Where the outputs of a task's blocks are kept between runs: ``<work>/<task name>/<data version>/<block key>``.

Each output is written whole or not at all (a temporary file renamed into place), by the process that made
it, so an output that exists is a finished block whatever was killed since, and one run's outputs are never
read as another data version's.
"""

import os
import re
import shutil
import tempfile
from pathlib import Path

from .tasks import Block

# A block key or a version is one file name: letters, digits and . _ - (no separator, no leading dot).
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}")


def write_atomically(path: Path, data: bytes) -> None:
    """``data`` as the file ``path``, readable by the gateway's user: a reader sees the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as out:
            out.write(data)
        os.chmod(temporary, 0o644)  # readable by the gateway's user, as the data files are
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def file_name(text: str, what: str) -> str:
    """``text`` where it is safe as one file name; a ValueError naming ``what`` otherwise."""
    if not _NAME.fullmatch(text):
        raise ValueError(f"{what} {text!r} is not a plain file name")
    return text


class BlockOutputs:
    """The outputs of one task at one data version."""

    def __init__(self, work_dir: Path, task_name: str, version: str) -> None:
        self.directory = work_dir / file_name(task_name, "task name") / file_name(version, "data version")

    def path(self, block: Block) -> Path:
        return self.directory / file_name(block.key, "block key")

    def has(self, block: Block) -> bool:
        return self.path(block).is_file()

    def read(self, block: Block) -> bytes:
        return self.path(block).read_bytes()

    def write(self, block: Block, data: bytes) -> None:
        write_atomically(self.path(block), data)

    def discard(self) -> None:
        """Remove every output of this version (its result is written: they are spent), and the directories
        above that are left empty."""
        shutil.rmtree(self.directory, ignore_errors=True)
        for directory in (self.directory.parent, self.directory.parent.parent):
            try:
                directory.rmdir()
            except OSError:  # not empty: outputs of other versions or tasks
                return
