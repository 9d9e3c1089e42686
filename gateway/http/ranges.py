"""``Range`` headers (RFC 9110 §14): parsing into byte spans of a known-size object."""

import re

from gateway_storage.faults import Invalid

MAX_RANGES = 64
# Longer than any object's position needs (2**64 has 20 digits); past Python's limit on converting digits.
MAX_POSITION_DIGITS = 20
_SPEC = re.compile(r"^(?:(\d+)-(\d*)|-(\d+))$")


class TooManyRanges(Invalid, ValueError):
    """More ranges than any client needs; refused rather than served."""


class PositionTooLong(Invalid, ValueError):
    """A position written with more digits than any object needs (leading zeros included): 400."""


class Unsatisfiable(Invalid, ValueError):
    """No range lies within the object: 416."""


def parse_range(header: str | None, size: int) -> list[tuple[int, int]] | None:
    """Half-open spans ``[start, end)`` to send, or None to send the whole object.

    A header that is not a valid ``bytes=`` range set is ignored (None), as
    RFC 9110 lets a server do; end positions past the object are clamped.
    Overlapping ranges that add up to more than the object are ignored too,
    so an answer never carries more data than the whole object (RFC 9110 §14.2).
    """
    if header is None:
        return None
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or not spec.strip():
        return None
    specs = [s.strip() for s in spec.split(",")]
    if len(specs) > MAX_RANGES:
        raise TooManyRanges(f"{len(specs)} ranges in one request; at most {MAX_RANGES} are served")
    spans = []
    for item in specs:
        match = _SPEC.match(item)
        if match is None:
            return None
        first, last, suffix = match.groups()
        if max(len(first or ""), len(last or ""), len(suffix or "")) > MAX_POSITION_DIGITS:
            raise PositionTooLong(f"a range position has more than {MAX_POSITION_DIGITS} digits")
        if suffix is not None:
            length = int(suffix)
            if length > 0 and size > 0:
                spans.append((max(size - length, 0), size))
            continue
        start = int(first)
        if last and int(last) < start:
            return None
        end = size if not last else min(int(last) + 1, size)
        if start < size:
            spans.append((start, end))
    if not spans:
        raise Unsatisfiable(f"no range of {header!r} lies within the {size} bytes")
    if len(spans) > 1 and sum(end - start for start, end in spans) > size:
        return None
    return spans
