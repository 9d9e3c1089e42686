"""Names taken from URLs: each must be one plain path segment."""


def is_plain_name(name: str) -> bool:
    """A single path segment that cannot climb or hide: no separators, no leading dot, no NUL."""
    return bool(name) and not name.startswith(".") and not any(c in name for c in "/\\\0")
