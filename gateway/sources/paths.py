"""Keeping every path inside the data root."""

import os


def is_plain_name(name: str) -> bool:
    """A single path segment that cannot climb or hide: no separators, no leading dot, no NUL."""
    return bool(name) and not name.startswith(".") and not any(c in name for c in "/\\\0")


def inside(root_real: str, path: str) -> str | None:
    """``path`` with every symlink resolved, or None if that lies outside ``root_real``."""
    real = os.path.realpath(path)
    if real == root_real or real.startswith(root_real.rstrip(os.sep) + os.sep):
        return real
    return None
