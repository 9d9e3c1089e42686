"""Reading the JSON documents a data root holds (datasource properties, Zarr metadata) as strict JSON.

Anyone who can write a dataset can write these files, so they are parsed with bounds: no NaN or
Infinity (Python's json accepts them, and they would be served back as non-JSON), no number too
large for a float, and no nesting deeper than any real document has (a deep one exhausts the
parser's recursion). What parsing builds is bounded before it starts: a document is refused on its
size, and on the most values it may hold (counted on its bytes: each value after the first follows a
comma or opens an array or object), since a parsed value costs tens of bytes for each byte it was
written in, and the parser holds the interpreter while it runs.
"""

import json
import math
from typing import Any

from gateway_storage.faults import Malformed

MAX_DEPTH = 64  # webknossos-libs and Zarr writers nest a few levels; 64 leaves room for user metadata
# The most bytes any metadata document of the data root may hold (datasource-properties.json, .zarray, zarr.json,
# attributes.json, info): real ones hold kilobytes; a larger file is refused on its size, before it is read.
MAX_DOCUMENT_BYTES = 4 << 20
# The most values a document may hold (counted before it is parsed): the largest real ones (properties of a
# thousand layers with their mags) hold tens of thousands; parsed, this many cost at most tens of MiB.
MAX_DOCUMENT_VALUES = 200_000


class DocumentError(Malformed, ValueError):
    """A file that is not a JSON document the gateway accepts; the message says why."""


def _no_constant(name: str) -> float:
    raise DocumentError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise DocumentError(f"the number {text[:40]} does not fit a double")
    return value


def _depth(document: Any) -> int:
    """How deeply arrays and objects nest in ``document``, counted without recursion."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(document, 0)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, dict):
            value = list(value.values())
        elif not isinstance(value, list):
            continue
        depth += 1
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            break
        pending.extend((item, depth) for item in value)
    return deepest


def most_values(data: bytes | str) -> int:
    """The most values a JSON text can hold, counted without parsing it: one, and one more per comma and per
    opening bracket (commas and brackets inside strings count too, so this is never less than the truth)."""
    if isinstance(data, str):
        return data.count(",") + data.count("[") + data.count("{") + 1
    return data.count(b",") + data.count(b"[") + data.count(b"{") + 1


def load_json(data: bytes | str, max_values: int = MAX_DOCUMENT_VALUES) -> Any:
    """The document in ``data``; :class:`DocumentError` if it is not strict JSON within the bounds, which
    include at most ``max_values`` values, checked before parsing."""
    values = most_values(data)
    if values > max_values:
        raise DocumentError(f"it may hold {values} values (commas and brackets), more than {max_values}")
    try:
        document = json.loads(data, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise DocumentError(f"it nests deeper than {MAX_DEPTH} levels") from None
    except UnicodeDecodeError as exc:
        raise DocumentError(f"it is not UTF-8 text: {exc}") from None
    except DocumentError:
        raise
    except ValueError as exc:
        raise DocumentError(f"it is not JSON: {exc}") from None
    if _depth(document) > MAX_DEPTH:
        raise DocumentError(f"it nests deeper than {MAX_DEPTH} levels")
    return document
