"""Where the outputs of a task's blocks are kept between runs: ``<work>/<task name>/<data version>/<block key>``.

``<work>`` is a local directory or a prefix in an object store (``s3://``, ``gs://``, ``az://``), written through
the storage kernel (:meth:`gateway_storage.Store.write`): each output is written whole or not at all (a temporary
file renamed into place, or one PUT), by the process that made it, so an output that exists is a finished block
whatever was killed since, and one run's outputs are never read as another data version's.
"""

import os
import re
from functools import cached_property

from gateway_storage import Store, open_store, store_kind

from .tasks import Block

# A block key or a version is one file name: letters, digits and . _ - (no separator, no leading dot).
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}")
MAX_OUTPUT_BYTES = 4 << 30  # a block's output read back (the mesh set's own bound on one is far lower)
MAX_OUTPUTS = 10_000_000  # files of one version of a task's outputs removed at the end


def file_name(text: str, what: str) -> str:
    """``text`` where it is safe as one file name; a ValueError naming ``what`` otherwise."""
    if not _NAME.fullmatch(text):
        raise ValueError(f"{what} {text!r} is not a plain file name")
    return text


def work_store(work_dir: str) -> Store:
    """The store of a work directory or prefix (a local one is made if missing)."""
    if store_kind(work_dir) is None:
        os.makedirs(work_dir, exist_ok=True)
    return open_store(work_dir)


class BlockOutputs:
    """The outputs of one task at one data version. Pickled to the workers as names: each process opens the store."""

    def __init__(self, work_dir: str, task_name: str, version: str) -> None:
        self.work_dir = work_dir.rstrip("/")
        self.name = file_name(version, "data version")
        self.directory = "/".join([self.work_dir, file_name(task_name, "task name"), self.name])

    def __getstate__(self) -> dict[str, str]:
        return {"work_dir": self.work_dir, "name": self.name, "directory": self.directory}

    @cached_property
    def store(self) -> Store:
        return work_store(self.work_dir)

    def path(self, block: Block) -> str:
        return f"{self.directory}/{file_name(block.key, 'block key')}"

    def has(self, block: Block) -> bool:
        return self.store.identity(self.path(block)) is not None

    def read(self, block: Block) -> bytes:
        found = self.store.read_whole(self.path(block), limit=MAX_OUTPUT_BYTES)
        if found is None:
            raise FileNotFoundError(f"the output of block {block.key} is gone from {self.directory}")
        return found[0]

    def write(self, block: Block, data: bytes) -> None:
        self.store.write(self.path(block), data)

    def discard(self) -> None:
        """Remove every output of this version (its result is written: they are spent), and, on a local disk, the
        directories above that are left empty."""
        for listed in self.store.list_files(self.directory, MAX_OUTPUTS) or []:
            self.store.delete(f"{self.directory}/{listed.path}")
        if store_kind(self.work_dir) is None:
            for directory in (self.directory, os.path.dirname(self.directory), self.work_dir):
                try:
                    os.rmdir(directory)
                except OSError:  # not empty: outputs of other versions or tasks
                    return
