"""The names in mesh URLs that are parsed, not looked up: segment ids and legacy cube positions."""

import re

from gateway_storage.geometry import Vec3

from .errors import MeshInputError

_ID = re.compile(r"[0-9]{1,20}")
_CUBE = re.compile(r"([0-9]{1,7})_([0-9]{1,7})_([0-9]{1,7})")


def parse_segment_id(text: str) -> int:
    """A segment id as Neuroglancer writes it: base 10, 1 to 2**64 - 1."""
    if not _ID.fullmatch(text) or not 0 < int(text) < 1 << 64:
        raise MeshInputError(f"{text!r} is not a segment id: ids are base-10 integers from 1 to 2**64-1")
    return int(text)


def parse_cube(text: str, name: str) -> Vec3:
    """``{x}_{y}_{z}`` of a legacy fragment name."""
    match = _CUBE.fullmatch(text)
    if match is None:
        raise MeshInputError(f"{name!r} is not a legacy fragment: they are {{id}}:0:{{x}}_{{y}}_{{z}}")
    return (int(match[1]), int(match[2]), int(match[3]))
