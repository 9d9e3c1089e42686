"""Names taken from URLs: the one check that a path segment names itself and nothing else."""

MAX_SEGMENT_BYTES = 255  # the longest file name a file system holds (NAME_MAX): a longer segment names nothing
UNSAFE_SEGMENTS = (
    f"path segments '.' and '..', backslashes, NUL and segments over {MAX_SEGMENT_BYTES} bytes are not allowed"
)


def is_safe_segment(segment: str) -> bool:
    """One path segment that cannot climb or reach aside: not empty, ``.`` or ``..``, no separator, no NUL, and
    short enough to be a file's name (a longer one is refused before any store is asked about it).

    The HTTP edge applies it to every segment of a URL path (metadata names such as ``.zarray`` pass);
    :func:`is_plain_name` adds what names of organizations, datasets and layers must also hold.
    """
    return (
        segment not in ("", ".", "..")
        and "/" not in segment
        and "\\" not in segment
        and "\0" not in segment
        and (
            len(segment) <= MAX_SEGMENT_BYTES // 4 or len(segment.encode("utf-8", "surrogatepass")) <= MAX_SEGMENT_BYTES
        )
    )


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
