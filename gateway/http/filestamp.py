"""The identity of a file's current version, by which the files an operator edits (the tokens file, the share
revocation list) are known to have changed and are read again."""

import os
from pathlib import Path

Stamp = tuple[int, int, int] | None


def file_stamp(path: Path) -> Stamp:
    """Inode, modification time and size of ``path``; None when it cannot be looked at (missing, say)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size
