"""Names taken from URLs: the one check that a path segment names itself and nothing else."""


def is_safe_segment(segment: str) -> bool:
    """One path segment that cannot climb or reach aside: not empty, ``.`` or ``..``, no separator, no NUL.

    The HTTP edge applies it to every segment of a URL path (metadata names such as ``.zarray`` pass);
    :func:`is_plain_name` adds what names of organizations, datasets and layers must also hold.
    """
    return segment not in ("", ".", "..") and "/" not in segment and "\\" not in segment and "\0" not in segment


def is_plain_name(name: str) -> bool:
    """A safe segment that does not hide either: no leading dot, and text (a directory name that is not
    UTF-8 comes back from the file system with surrogates: no URL names it)."""
    return is_safe_segment(name) and not name.startswith(".") and _is_text(name)


def _is_text(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
