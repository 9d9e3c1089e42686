"""What can go wrong with a mesh request, as exception types the HTTP edge maps to statuses."""

from gateway_storage.faults import Absent, Conflict, Invalid, TooLarge, Unavailable


class MeshInputError(Invalid, ValueError):
    """The request names something that has no mesh by its nature: a malformed id, a color layer (a 400)."""


class SegmentIndexRequired(Conflict, LookupError):
    """The layer needs a segment index (none, or a stale one, and too large to scan on demand): a 409."""


class MeshTooLarge(TooLarge, ValueError):
    """The segment needs more meshing than one request may do: a 413 that names the way out."""


class MeshNotFound(Absent, LookupError):
    """No such layer, source or cube: absent by design (a 404)."""


class MeshTooSlow(Unavailable, RuntimeError):
    """The request's meshing ran past its time bound and was stopped: a 503 (the machine may be busy)."""

    retry_seconds = 10


class StoredMeshesRequired(Conflict, LookupError):
    """A segment too large to mesh on demand whose stored mesh set is stale or incomplete: a 409 (run
    ``mesh-segments`` again)."""
