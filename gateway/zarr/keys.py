"""Parsing chunk keys of both trees into grid indices."""

from gateway_storage.faults import Invalid

_MAX_DIGITS = 18  # anything longer is past every grid this gateway serves


class MalformedKey(Invalid, ValueError):
    """A chunk key that is malformed (400), as opposed to one past the grid (404)."""


def _parse(parts: list[str], key: str, rank: int) -> tuple[int, ...]:
    if len(parts) != rank:
        raise MalformedKey(f"chunk key {key!r} has {len(parts)} indices, the array has {rank} dimensions")
    for part in parts:
        if not part.isascii() or not part.isdigit():
            raise MalformedKey(f"chunk key {key!r}: index {part!r} is not a non-negative integer")
        if len(part) > _MAX_DIGITS:
            raise MalformedKey(f"chunk key {key!r}: index {part!r} is out of range")
    return tuple(int(p) for p in parts)


def parse_v2_key(key: str, rank: int) -> tuple[int, ...]:
    """``"0.1.2.3"`` (dimension separator ".")."""
    return _parse(key.split("."), key, rank)


def parse_v3_key(key: str, rank: int) -> tuple[int, ...]:
    """``"c/0/1/2/3"`` (default encoding, separator "/")."""
    parts = key.split("/")
    if parts[0] != "c":
        raise MalformedKey(f"chunk key {key!r} must start with 'c/' (default chunk key encoding)")
    return _parse(parts[1:], key, rank)
