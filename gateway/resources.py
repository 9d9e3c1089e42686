"""What a route answers with: a byte object of known size and validators, readable by range."""

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from gateway_storage import FileSource, Store

JSON = "application/json"
OCTET_STREAM = "application/octet-stream"


def make_etag(*parts: object) -> str:
    """A strong, quoted ETag that is the same on every replica for the same parts (bytes hashed as such)."""
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        digest.update(part if isinstance(part, bytes) else str(part).encode())
        digest.update(b"\0")
    return f'"{digest.hexdigest()}"'


def stored_etag(fingerprint: str, index: tuple[int, ...], origin: str, size: int, version: str) -> str:
    """:func:`make_etag` for the parts of a stored chunk, in one hash update: it is computed per request."""
    text = f"{fingerprint}\0{index}\0{origin}\0{size}\0{version}"
    return f'"{hashlib.blake2b(text.encode(), digest_size=16).hexdigest()}"'


def files_etag(fingerprint: str, index: object, relative: Callable[[str], str], files: list[FileSource]) -> str:
    """:func:`make_etag` of an answer made from stored files: each named below the data root (the same on every
    replica) with every field of the version read, or as absent; in one hash update: it is computed per chunk
    made (a tuple's text, field names and all, cost several times as much)."""
    named = [
        f"{relative(path)}\1-"
        if read is None
        else f"{relative(path)}\1{read.size}\1{read.version}\1{read.mtime!r}\1{read.changed!r}"
        for path, read in files
    ]
    text = "\0".join((fingerprint, str(index), *named))
    return f'"{hashlib.blake2b(text.encode(), digest_size=16).hexdigest()}"'


@dataclass(frozen=True, slots=True)
class FileVersions:
    """The stored files an answer was made from and the versions read (None: the file was absent), so
    that whoever keeps the answer can tell whether making it again could give other bytes."""

    store: Store
    files: tuple[FileSource, ...]

    def current(self) -> bool:
        """Whether every file is still the version read: the check the answer's ETag relies on (a stat each
        for local files; their settle rule was applied when they were read)."""
        identity = self.store.identity
        return all(identity(path) == read for path, read in self.files)


@dataclass(slots=True)  # not frozen: one is built per request, and frozen construction is slower
class Resource:
    """An object of ``size`` bytes: held in ``body``, or produced on demand by ``reader(start, end)``.

    A reader produces only the bytes asked for. It may do I/O, so callers run it off the event loop,
    unless ``local_reads`` says its reads are positioned reads of local files: then a range that
    decodes little (``decoded_bytes(start, end)``, by default the range's length) costs less than the
    hand-off to a thread and the caller may read it in place. A body is sliced in place. ``made_from``
    names the stored files a body was made from, where the producer knows them all.
    """

    size: int
    etag: str
    media_type: str
    body: bytes | None = None
    reader: Callable[[int, int], bytes] | None = None
    last_modified: float | None = None
    local_reads: bool = False
    decoded_bytes: Callable[[int, int], int] | None = None
    made_from: FileVersions | None = None
    # The head lines of its whole answer (200, the body held) and the Cache-Control they were built with, once
    # an answer that is sent again and again (a kept one) was sent: built once, not per request.
    whole_head: tuple[bytes, tuple[tuple[bytes, bytes], ...]] | None = None

    def work(self, start: int, end: int) -> int:
        """The bytes that producing ``[start, end)`` decodes or reads: what decides event loop or thread."""
        return end - start if self.decoded_bytes is None else self.decoded_bytes(start, end)


def bytes_resource(
    body: bytes,
    media_type: str,
    etag: str | None = None,
    last_modified: float | None = None,
    made_from: FileVersions | None = None,
) -> Resource:
    return Resource(
        len(body), etag or make_etag(body), media_type, body=body, last_modified=last_modified, made_from=made_from
    )
