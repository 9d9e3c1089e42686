"""Keeping every path inside the data root."""

from wkw_adapter.storage import resolve_inside


def is_plain_name(name: str) -> bool:
    """A single path segment that cannot climb or hide: no separators, no leading dot, no NUL."""
    return bool(name) and not name.startswith(".") and not any(c in name for c in "/\\\0")


def inside(root_real: str, path: str) -> str | None:
    """``path`` with every symlink resolved, or None if that lies outside ``root_real``."""
    return resolve_inside(root_real, path)
