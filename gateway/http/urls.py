"""The URL space of the data routes, parsed once per request into a typed target.

A token may also stand in the path: ``/t/{token}/data/...`` and ``/t/{token}/preview/...`` serve exactly
what the path below the token serves, for clients that can carry a token neither as a header nor as a
query kept on every file below a URL (Neuroglancer's zarr sources). The token segment is cut here, once
(:func:`split_path_token`), and read, like every other token, by :func:`gateway.http.auth.read_token`.

``/data/{tree}/{organization}/{dataset}/{group}/{array}/{chunk key}``: each level
answers its listing (the directory itself) and the metadata names its tree says
belong there (:mod:`gateway.zarr.trees`); any other metadata name is a 404 that
says why, and anything deeper than an array is a chunk key.
"""

import enum
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import unquote, unquote_to_bytes

from gateway_storage.faults import Fault

from ..precomputed.tree import PRECOMPUTED_PREFIX, parse_precomputed_path
from ..precomputed.tree import TREES as PRECOMPUTED_TREES
from ..sources.paths import MAX_SEGMENT_BYTES, UNSAFE_SEGMENTS, is_safe_segment
from ..zarr.trees import METADATA_NAMES, TREES, NodeNotFound, Tree
from .messages import REDACTED_PATH_TOKEN, REDACTED_SHARE_LINK, SHARE_PREFIX, HttpError

DATA_PREFIX = "/data/"
PREVIEW_PREFIX = "/preview/"
VIEWER_PREFIX = "/neuroglancer"  # the Neuroglancer client the gateway serves (gateway.http.pages.viewer)
MESH_PREFIX = "/data/meshes/"  # below DATA_PREFIX: routed before the trees
FAVICON = "/favicon.ico"  # the gateway's icon (gateway.http.pages.icon): open to everyone, as the start page is
LOGIN_PATHS = ("/login", "/callback", "/logout")  # sign-in with OpenID Connect (gateway.http.oidc)
CALLBACK_PATH = LOGIN_PATHS[1]  # where the issuer sends the browser back to
TOKEN_PREFIX = "/t/"  # /t/{token}/data/... : a token in the path, outside /data/ so that no tree name clashes
SHARE_ROUTE = "/share/"  # POST /share/{organization}/{dataset}: a new share link (gateway.http.handlers.share)
INDEX = "/"
OPS_PATHS = ("/healthz", "/readyz", "/metrics", "/auth")  # gateway.http.ops
READS = ("GET", "HEAD")  # the methods every place takes; POST only at SHARE_ROUTE
# What a /t/{token}/ or /s/{capability}/ prefix may stand in front of.
_BELOW_PATH_CREDENTIAL = (DATA_PREFIX, PREVIEW_PREFIX, VIEWER_PREFIX + "/", SHARE_ROUTE)


# The trees as the URL space names them: each tree under its own name, and webKnossos' older name for the v3 tree.
TREE_ROUTES: dict[str, Tree] = {**TREES, "zarr3_experimental": TREES["zarr3"]}


class Level(enum.IntEnum):
    TREE = 0
    ORGANIZATION = 1
    DATASET = 2
    GROUP = 3
    ARRAY = 4


@dataclass(frozen=True, slots=True)
class DataTarget:
    """What a data path names: a node (its listing or one of its metadata files) or a chunk."""

    tree: Tree
    tree_name: str
    level: Level
    names: tuple[str, ...]  # organization, dataset, group, array: as many as ``level`` says
    file: str | None = None  # a metadata name at that level
    key: str | None = None  # a chunk key below an array
    misplaced: str | None = None  # why a metadata name is a 404 here, once the nodes above are found to exist

    @property
    def route(self) -> str:
        """The kind of resource, a bounded metric label."""
        if self.key is not None:
            return "chunk"
        return "listing" if self.file is None and self.misplaced is None else "metadata"

    @property
    def organization(self) -> str:
        return self.names[0]

    @property
    def dataset(self) -> str:
        return self.names[1]

    @property
    def base(self) -> str:
        """The node's own path, ending in "/": what its listing's links start with (a page's credential form, a
        share link's prefix among them, is added by :mod:`gateway.http.pages.links`)."""
        return DATA_PREFIX + "/".join((self.tree_name, *self.names)) + "/"


_LEVEL_NAMES = {Level.DATASET: "dataset", Level.GROUP: "group", Level.ARRAY: "array"}


def _files(tree: Tree, level: Level) -> tuple[str, ...]:
    if level == Level.DATASET:
        return tree.dataset_files
    if level == Level.GROUP:
        return tree.group_files
    if level == Level.ARRAY:
        return tree.array_files
    return ()


_LEVELS = tuple(Level)
# Per tree, the names each level answers, indexed by depth: the lookup of the per-request loop below.
_FILES = {name: tuple(_files(tree, level) for level in _LEVELS) for name, tree in TREE_ROUTES.items()}


CACHED_PATH_CHARS = 512  # a longer path is parsed on every call: the cache holds only short strings
PARSED_PATHS = 4096  # paths whose targets are kept: far more than the requests a worker has in flight


def parse_data_path(path: str) -> DataTarget:
    """The target of a path below ``/data/``; :class:`NodeNotFound` or a 400 when it names none.

    A metadata name where it does not belong is a 404 too, but only once the nodes above it are
    known to exist, so that the message names the nearest level that does (``misplaced``).
    A request's path is parsed once: its handler and the request log's label (:class:`RouteLabels`) read the
    same target, kept for the most recent paths.
    """
    return _parsed(path) if len(path) <= CACHED_PATH_CHARS else _parse_data_path(path)


def _parse_data_path(path: str) -> DataTarget:
    tree_name, _, rest = path[len(DATA_PREFIX) :].partition("/")
    tree = TREE_ROUTES.get(tree_name)
    if tree is None:
        raise NodeNotFound(f"unknown tree {tree_name!r}; there are {', '.join(TREE_ROUTES)}")
    segments = _segments(rest)
    files_by_depth = _FILES[tree_name]
    last = len(segments) - 1
    for depth, segment in enumerate(segments):
        if depth == Level.ARRAY:
            return _below_array(tree, tree_name, tuple(segments[:depth]), segments[depth:])
        if segment in METADATA_NAMES:
            level = _LEVELS[depth]
            files = files_by_depth[depth]
            if segment in files and depth == last:
                return DataTarget(tree, tree_name, level, tuple(segments[:depth]), file=segment)
            why = tree.misplaced(segment, _LEVEL_NAMES.get(level, level.name.lower()), files)
            return DataTarget(tree, tree_name, level, tuple(segments[:depth]), misplaced=why)
    return DataTarget(tree, tree_name, _LEVELS[len(segments)], tuple(segments))


_parsed = functools.lru_cache(maxsize=PARSED_PATHS)(_parse_data_path)


def _below_array(tree: Tree, tree_name: str, names: tuple[str, ...], rest: list[str]) -> DataTarget:
    """``rest`` (not empty) below the array node ``names``: one of its metadata files, or a chunk key."""
    first = rest[0]
    if len(rest) == 1 and first in tree.array_files:
        return DataTarget(tree, tree_name, Level.ARRAY, names, file=first)
    if first in METADATA_NAMES:
        return DataTarget(
            tree, tree_name, Level.ARRAY, names, misplaced=tree.misplaced(first, "array", tree.array_files)
        )
    return DataTarget(tree, tree_name, Level.ARRAY, names, key="/".join(rest))


def _segments(rest: str) -> list[str]:
    """The non-empty segments of ``rest``, each one checked (the one check of every URL path segment)."""
    segments = [s for s in rest.split("/") if s]
    suspect = ".." in rest or "\\" in rest or "\0" in rest or "/./" in f"/{rest}/"
    if suspect or len(rest) > MAX_SEGMENT_BYTES // 4:  # rare, or long enough to hold a long segment: look closer
        for segment in segments:
            if not is_safe_segment(segment):
                raise HttpError(400, UNSAFE_SEGMENTS)
    return segments


@dataclass(frozen=True, slots=True)
class PreviewTarget:
    """``/preview/{organization}/{dataset}/{layer}.png``: a small image of a layer for its dataset page."""

    organization: str
    dataset: str
    layer: str


def parse_preview_path(path: str) -> PreviewTarget:
    rest = path[len(PREVIEW_PREFIX) :]
    parts = rest.split("/")
    if len(parts) != 3 or not all(parts) or not parts[2].endswith(".png"):
        raise HttpError(404, f"a preview is at {PREVIEW_PREFIX}{{organization}}/{{dataset}}/{{layer}}.png")
    _segments(rest)
    return PreviewTarget(parts[0], parts[1], parts[2].removesuffix(".png"))


@dataclass(frozen=True, slots=True)
class MeshTarget:
    """``/data/meshes/{organization}/{dataset}/{layer}/{multires|legacy}/{file}``: a file of a layer's mesh source."""

    organization: str
    dataset: str
    layer: str
    kind: str
    file: str


def parse_mesh_path(path: str) -> MeshTarget:
    rest = path[len(MESH_PREFIX) :]
    parts = rest.split("/", 4)
    if len(parts) < 5 or not all(parts[:4]) or not parts[4]:
        raise HttpError(
            404, f"a mesh file is at {MESH_PREFIX}{{organization}}/{{dataset}}/{{layer}}/{{multires|legacy}}/{{file}}"
        )
    _segments(rest)
    return MeshTarget(*parts)


def parse_share_path(path: str) -> tuple[str, str]:
    """The organization and dataset of ``/share/{organization}/{dataset}``, where a share link is made."""
    rest = path[len(SHARE_ROUTE) :]
    parts = rest.split("/")
    if len(parts) != 2 or not all(parts):
        raise HttpError(404, f"a share link is made with POST {SHARE_ROUTE}{{organization}}/{{dataset}}")
    _segments(rest)
    return parts[0], parts[1]


def request_path(raw_path: str) -> str:
    """A raw (percent-encoded) request path as the server decodes it for the routes: what ``/auth`` parses."""
    return unquote(raw_path) if "%" in raw_path else raw_path


def split_path_token(raw_path: str, path: str) -> tuple[bytes | None, str]:
    """The token of a ``/t/{token}/...`` path (its percent-decoded bytes) and the path below it, as the routes
    read it; ``(None, path)`` for any other path.

    ``raw_path`` is the path as sent (percent escapes kept, one character per byte), ``path`` the same
    decoded. The token segment is cut from the raw path, so that a token holding an encoded ``/`` stays one
    segment. A path that starts with ``/t/`` only once decoded, or holds neither ``/`` alone (the start page,
    for pages opened below a token) nor a ``/data/``, ``/preview/``, ``/neuroglancer/`` or ``/share/`` path
    below its token (the viewer's own files then come with the token, as a proxy that checks every path needs),
    names nothing: it comes back as a path that no route answers (a 404), with the token replaced by ``***``, so
    that no message and no log line shows it.
    """
    return _split(TOKEN_PREFIX, REDACTED_PATH_TOKEN, raw_path, path)


def split_share_link(raw_path: str, path: str) -> tuple[bytes | None, str]:
    """The capability of a ``/s/{capability}/...`` share link path and the path below it, as
    :func:`split_path_token` cuts a token (and with the same refusals, ``/s/***`` for a path that names nothing).
    The bare ``/s/{capability}/`` is the start page below the link, which leads to the shared dataset's page."""
    return _split(SHARE_PREFIX, REDACTED_SHARE_LINK, raw_path, path)


def _split(prefix: str, redacted: str, raw_path: str, path: str) -> tuple[bytes | None, str]:
    if not path.startswith(prefix):
        return None, path
    segment, slash, rest = raw_path[len(prefix) :].partition("/")
    below = request_path("/" + rest)
    start_page = below == "/"  # the start page of pages opened below a token; a link's: its dataset's page
    if not raw_path.startswith(prefix) or not slash or not (start_page or below.startswith(_BELOW_PATH_CREDENTIAL)):
        return None, redacted
    return unquote_to_bytes(segment.encode("latin-1")), below


# --- the URL table ------------------------------------------------------------------------------------------


def takes(method: str, path: str) -> bool:
    """Whether ``method`` is one a place may take (else a 405, on every path alike, before routing)."""
    return method in READS or (method == "POST" and path.startswith(SHARE_ROUTE))


OTHER = "other"  # the metric label of a request no place takes: a 404, a 405
PREFLIGHT = "preflight"  # ... and of every OPTIONS, a CORS preflight


def _data_label(path: str) -> str:
    try:
        return parse_data_path(path).route
    except Fault:  # the routes answer it with a 4xx; its label says nothing of the path
        return OTHER


def _precomputed_label(path: str) -> str:
    try:
        return parse_precomputed_path(path).route
    except Fault:
        return OTHER


def _names(target: PreviewTarget | MeshTarget) -> tuple[str, ...]:
    return target.organization, target.dataset


def _data_names(path: str) -> tuple[str, ...]:
    return parse_data_path(path).names[:2]


def _precomputed_names(path: str) -> tuple[str, ...]:
    return parse_precomputed_path(path).names[:2]


@dataclass(frozen=True, slots=True)
class Needs:
    """What a request to a place must carry, stated once per place: the place's route decides by it and so does the
    proxy's ``/auth`` for the original URI (:meth:`gateway.http.handlers.access.Authorizer.admit`), so the two
    cannot disagree.

    ``credential``: the request's one credential is read (400 for more than one) and, unless the gateway is open,
    must be valid (401); an open place reads none and refuses nobody. ``names``: the organization and dataset the
    path names, parsed as the route parses it (raising the route's own 400 or 404), whose grant the credential must
    hold (403); none: any valid credential. ``delegating``: the credential may hand access on (a share link may
    not: 403). ``methods``: what the route answers; any other method it refuses itself (405).
    """

    credential: bool = True
    names: Callable[[str], tuple[str, ...]] | None = None
    delegating: bool = False
    methods: tuple[str, ...] = READS


OPEN = Needs(credential=False)  # public: the viewer's files, the icon, sign-in, the operations endpoints
SIGNED_IN = Needs()  # any valid credential: the start page's list of datasets (its open view shows none)
DATA_NEEDS = Needs(names=_data_names)  # a grant for what a data path names: nothing, an organization, a dataset
PRECOMPUTED_NEEDS = Needs(names=_precomputed_names)
MESH_NEEDS = Needs(names=lambda path: _names(parse_mesh_path(path)))
PREVIEW_NEEDS = Needs(names=lambda path: _names(parse_preview_path(path)))
SHARE_NEEDS = Needs(names=parse_share_path, delegating=True, methods=("POST",))  # a new link for a dataset it reads
NOWHERE = SIGNED_IN  # what no place takes (the router's 404): the proxy passes no anonymous client's probe


@dataclass(frozen=True, slots=True)
class Place:
    """A place of the URL space: an exact path, or (``below``) a prefix with the path itself and everything below it,
    with the metric label of its requests (the same for all, or the kind of target its parser finds: chunk,
    metadata, listing) and what its requests need."""

    path: str
    label: Callable[[str], str]  # of the path
    needs: Needs
    below: bool = False


def _always(label: str) -> Callable[[str], str]:
    return lambda path: label


# The one table of the places the gateway answers, in the order they are routed (the chunk routes first: the most
# asked). The composition root gives each place it serves a handler, Starlette routes them, the request log labels
# by them, and each place's handler and the proxy's /auth decide access by its needs.
PLACES: tuple[Place, ...] = (
    *(Place(f"{DATA_PREFIX}{name}", _data_label, DATA_NEEDS, below=True) for name in TREE_ROUTES),
    *(Place(f"{DATA_PREFIX}{name}", _precomputed_label, PRECOMPUTED_NEEDS, below=True) for name in PRECOMPUTED_TREES),
    Place(MESH_PREFIX.rstrip("/"), _always("mesh"), MESH_NEEDS, below=True),
    Place(PREVIEW_PREFIX.rstrip("/"), _always("preview"), PREVIEW_NEEDS, below=True),
    Place(DATA_PREFIX.rstrip("/"), _data_label, DATA_NEEDS, below=True),  # no tree takes it: its parser names them
    Place(VIEWER_PREFIX, _always("viewer"), OPEN, below=True),
    Place(SHARE_ROUTE.rstrip("/"), _always("share"), SHARE_NEEDS, below=True),
    Place(INDEX, _always("index"), SIGNED_IN),
    Place(FAVICON, _always("favicon"), OPEN),
    *(Place(path, _always(path.strip("/")), OPEN) for path in OPS_PATHS),
    *(Place(path, _always("login"), OPEN) for path in LOGIN_PATHS),
)
assert PRECOMPUTED_PREFIX.startswith(DATA_PREFIX) and all(f"{DATA_PREFIX}{n}" != MESH_PREFIX for n in TREE_ROUTES)


MAX_LABELLED = 1 << 14  # paths whose label is remembered; past it they are found anew
MAX_LABELLED_LENGTH = 256  # a longer path's label is found anew: what is remembered stays under 4 MiB


class Places:
    """The places served, looked up as the router looks them up: the place that takes a path, if any."""

    def __init__(self, places: Iterable[Place]) -> None:
        served = list(places)
        self.exact = {place.path: place for place in served}
        self.prefixes = tuple((place.path + "/", place) for place in served if place.below)

    def of(self, path: str) -> Place | None:
        """The place the router hands ``path`` to (the path the routes read: below a path token); None for none.
        Exact paths and prefixes never overlap in the table, so the exact lookup first finds what the router does."""
        place = self.exact.get(path)
        if place is None:
            for prefix, below in self.prefixes:
                if path.startswith(prefix):
                    return below
        return place

    def needs(self, path: str) -> Needs:
        """What a request to ``path`` needs: its place's needs, or :data:`NOWHERE`'s."""
        place = self.of(path)
        return NOWHERE if place is None else place.needs


class RouteLabels:
    """The metric label of a request, from the places served: bounded (a kind of resource, never a path)."""

    def __init__(self, places: Iterable[Place]) -> None:
        self.places = Places(places)
        self._reads: dict[str, str] = {}  # the label of a read of each path met lately: a viewer asks again

    def of(self, method: str, path: str) -> str:
        """The label of ``method`` on ``path`` (the path the routes read: below a path token)."""
        if method in READS:
            if len(path) > MAX_LABELLED_LENGTH:
                return self._label(path)
            known = self._reads.get(path)
            if known is None:
                if len(self._reads) >= MAX_LABELLED:
                    self._reads.clear()
                known = self._reads[path] = self._label(path)
            return known
        if method == "OPTIONS":
            return PREFLIGHT
        if not takes(method, path):
            return OTHER
        return self._label(path)

    def _label(self, path: str) -> str:
        place = self.places.of(path)
        return OTHER if place is None else place.label(path)
