"""Names taken from URLs: each must be one plain path segment."""


def is_plain_name(name: str) -> bool:
    """A single path segment that cannot climb or hide: no separators, no leading dot, no NUL, and text
    (a directory name that is not UTF-8 comes back from the file system with surrogates: no URL names it)."""
    return bool(name) and not name.startswith(".") and not any(c in name for c in "/\\\0") and _is_text(name)


def _is_text(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
