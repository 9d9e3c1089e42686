"""The bounds every chunked format (Zarr, N5, precomputed) holds its metadata to, defined once.

Whoever can write a dataset can write its metadata, so a source reads it as strict JSON
(``documents.load_json``, at most ``MAX_DOCUMENT_BYTES``), parses it with the strict models of
``metadata.py``, refuses a chunk that would
decode to more than any real writer stores, and says what a read decodes (``decoded_bytes``), which
decides event loop or thread and what a chunk holds of the worker's memory budget. Metadata past
these bounds makes the mag unusable with the reason, never a failed request.
"""

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from gateway_storage import FileIdentity, Store

from .documents import MAX_DOCUMENT_BYTES, load_json
from .mag import SourceError

# Bounds on what one request may have to decode or read: a chunk (an inner chunk of a shard) decodes
# whole, and a shard index is read whole. Writers use chunks of a few MiB at most (webknossos-libs:
# 32^3 voxels in shards of 32^3 chunks; Neuroglancer's precomputed writers: 64^3 or 128^3 voxels).
MAX_CHUNK_BYTES = 128 << 20
MAX_CHUNKS_PER_SHARD = 1 << 18


def json_type(value: Any) -> str:
    """The JSON type of a parsed value, for messages."""
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def read_document(
    storage: Store, path: str, name: str, settled: bool = False
) -> tuple[dict[str, Any], FileIdentity] | None:
    """The JSON object in file ``path`` (called ``name`` in messages) and its identity; None if there is none.
    ``settled``: a file written within the settle time is FileUnsettledError (see :meth:`Store.read_whole`)."""
    found = storage.read_whole(path, limit=MAX_DOCUMENT_BYTES, settled=settled)
    if found is None:
        return None
    try:
        document = load_json(found[0])
    except ValueError as exc:
        raise SourceError(f"{name} is not usable: {exc}") from None
    if not isinstance(document, dict):
        raise SourceError(f"{name} must be a JSON object, not {json_type(document)}")
    return document, found[1]


def check_chunk_bytes(shape: Sequence[int], itemsize: int, what: str = "a chunk") -> int:
    """The bytes a chunk of ``shape`` (every channel included) decodes to; refused past ``MAX_CHUNK_BYTES``."""
    total = itemsize
    for edge in shape:
        total *= edge
    if total > MAX_CHUNK_BYTES:
        raise SourceError(f"{what} of {tuple(shape)} decodes to {total} bytes, more than {MAX_CHUNK_BYTES}")
    return total


def chunked_decoded_bytes(
    chunk: Sequence[int], itemsize: int, channels: int, shape: Sequence[int], offset: Sequence[int] = (0, 0, 0)
) -> int:
    """The most bytes reading a grid-aligned box of ``shape`` (x, y, z) decodes from a source that decodes whole
    chunks of served shape ``chunk`` (c, x, y, z) whose grid starts at ``offset``: every chunk the box touches.

    Where the source's grid lines up with the box's (edges that divide each other, from the same origin) a box
    touches ``ceil(edge / chunk)`` chunks per axis; elsewhere one more.
    """
    total = itemsize * -(-channels // chunk[0]) * chunk[0]
    for edge, size, start in zip(shape, chunk[1:], offset):
        aligned = start % size == 0 and (edge % size == 0 or size % edge == 0)
        total *= (-(-edge // size) + (0 if aligned else 1)) * size
    return total


@contextmanager
def malformed_metadata(name: str) -> Iterator[None]:
    """Metadata that slips past the type checks (a field of a type no check expected) is a reason, not a crash."""
    try:
        yield
    except SourceError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
        raise SourceError(f"malformed {name} ({type(exc).__name__}: {exc})") from None


def stored_limit(decoded: int) -> int:
    """The most bytes a stored chunk that decodes to ``decoded`` bytes can hold: incompressible data grows a little
    in every codec, never to twice its size."""
    return 2 * decoded + (1 << 20)
