"""The kinds of fault: what went wrong, in as few kinds as the answers to them need, for every exception of the project.

Every exception class of the gateway subclasses one kind (besides the built-in exception it has always been, so
every ``except OSError`` or ``except LookupError`` still catches what it caught), and the HTTP layer's error map
(:mod:`gateway.http.errors`) answers each kind in one table, without knowing the classes below it::

    Exception
     └── Fault                the root: a failure the gateway knows (HttpError: an answer the HTTP layer decided)
          ├── Absent          nothing there, by design: a node, chunk, preview or mesh that does not exist
          ├── Invalid         the asker's input is wrong: a path, key, range, parameter, command line
          ├── Conflict        there, but not servable as it is now: a dataset unusable, an index not built
          ├── TooLarge        more than a bound allows: a mesh, a preview, a request's memory
          ├── Unavailable     not now: a file being rewritten, a store that did not answer, a run to do again
          ├── Unsupported     a feature this installation lacks (an extra not installed)
          ├── Abandoned       the exchange ended before its answer: the asker left, or the answer was cut off
          ├── Broken          stored bytes, or a store, that cannot be read correctly: a storage fault, never zeros
          └── Malformed       a document or setting the gateway was given is not what it must be

The module lives in the storage kernel because the kernel is the bottom of the dependency order (it imports
nothing of the project) and every other package imports it already: its own errors, the WKW format's and the
gateway's all subclass these kinds without an upward import, and a fourth top-level package for one module
would be one more thing to install and check.

A kind says how its faults are told with the class attributes of :class:`Fault`, and a class below it may say
otherwise; they are facts of the fault, not of HTTP: how long until asking again may succeed, what the asker is
told in place of a text that would say too much or too little, the label a storage fault is counted under.
"""

from typing import ClassVar


class Fault(Exception):
    """The root of the kinds: a failure the gateway knows."""

    said: ClassVar[str | None] = None  # what the asker is told in place of the exception's own text
    prefix: ClassVar[str] = ""  # what stands before the exception's own text
    retry_seconds: ClassVar[int | None] = None  # after how long asking again may succeed
    counted_as: ClassVar[str | None] = None  # the storage-fault label it is counted under (and so logged)


class Absent(Fault):
    """Nothing there, by design: the only kind a client may take for fill values."""


class Invalid(Fault):
    """The asker's input is wrong: asking again the same way fails the same way."""


class Conflict(Fault):
    """There, but not servable in its present state (bad properties, an index not built yet)."""


class TooLarge(Fault):
    """More than a bound allows: refused before the work is done."""


class Unavailable(Fault):
    """Not now: asking again later may succeed."""

    retry_seconds: ClassVar[int | None] = 1
    prefix: ClassVar[str] = ""  # restated: a storage error that is unavailable is told so, not as a broken one
    counted_as: ClassVar[str | None] = None


class Unsupported(Fault):
    """A feature this installation lacks."""


class Abandoned(Fault):
    """The exchange ended before its answer: nobody is left to tell."""


class Broken(Fault):
    """Stored bytes, or the store itself, that cannot be read correctly: never to be taken for absent data."""

    prefix: ClassVar[str] = "storage fault: "
    counted_as: ClassVar[str | None] = "fault"


class Malformed(Fault):
    """A document or setting the gateway was given is not what it must be: the operator's to fix."""


KINDS = (Absent, Invalid, Conflict, TooLarge, Unavailable, Unsupported, Abandoned, Broken, Malformed)
