"""Who may read what: the one place that reads a request's token, keeps the tokens file current and
decides grants. The data routes, the previews, the index and the proxy's ``/auth`` all ask here.

A token is one token, with one spelling per carrier, so that a proxy in front counts and caches it under
the very token read here. It comes once: as one ``X-Auth-Token`` header line whose value is the token's
UTF-8 bytes exactly as the tokens file writes it (no list, no comma, no blanks around it), as one
``token`` query parameter (that name, lower case and unencoded; its value percent-decoded) or as the path
segment of ``/t/{token}/data/...`` (cut from the path by :func:`gateway.http.urls.split_path_token`,
percent-decoded). A share link (``/s/{capability}/...``, :mod:`gateway.http.share`) is one more carrier, of a
read-only grant of one dataset; it is checked by its signature, expiry and the revocation list.
An empty header or parameter carries no token. Anything else is a 400 with the reason:
two carriers, even of equal tokens (a link and a token too); repeated header lines or parameters; a header
value with a comma or surrounding blanks; a parameter named ``TOKEN``, ``Token`` or ``%74oken``, which
another reader (nginx's
``$arg_token`` ignores case) might take for the token. The tokens file is refused at start-up if a token
holds a comma or surrounding blanks.

With sign-in configured (:mod:`gateway.http.oidc`) two more credentials count: ``Authorization: Bearer <access
token>``, a token like the others (with any of them a 400), and the login cookie, which the browser sends on
every request to this site whether asked or not: it counts only when the request carries no other credential
(a page opened with ``?token=`` or a ``/t/`` path by a signed-in browser reads as that token). Both end in
the issuer's claims, which the tokens file's ``"claims"`` map to grants; without sign-in neither is read.
"""

import functools
import hashlib
import hmac
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote_to_bytes

from pydantic import BaseModel, ValidationError, field_validator

from gateway_storage.faults import Malformed

from .filestamp import Stamp, file_stamp
from .messages import HttpError, Request, WayIn
from .share import ShareLinks

log = logging.getLogger("gateway")
SHAPE = (
    '{"tokens": {"<token>": ["<organization>/<dataset pattern>", ...]}, '
    '"claims": {"<claim>": {"<value>": ["<organization>/<dataset pattern>", ...]}}}'
)
TOKEN_HEADER = b"x-auth-token"
AUTHORIZATION_HEADER = b"authorization"
QUERY_NAME = b"token"  # the one spelling of the token parameter
HOW = "send it as the X-Auth-Token header, the token query parameter or the path /t/{token}/data/..."


def _where(loc: tuple[int | str, ...]) -> str:
    """Where in the file an error is; a token (a key of "tokens") is shown as <token>, never itself."""
    if not loc:
        return "top level"
    return ".".join([str(loc[0]), *(["<token>"] if len(loc) > 1 else []), *map(str, loc[2:])])


class TokensFileError(Malformed, ValueError):
    """The tokens file cannot be used; the message names the problem."""


def _check_patterns(where: str, patterns: list[str]) -> None:
    for pattern in patterns:
        if pattern.count("/") != 1 or not all(pattern.split("/")):
            raise ValueError(f"{where}: pattern {pattern!r} is not '<org>/<dataset pattern>'")


class _TokensFile(BaseModel):
    tokens: dict[str, list[str]]
    claims: dict[str, dict[str, list[str]]] = {}  # signed-in users: claim name -> claim value -> patterns

    @field_validator("claims")
    @classmethod
    def _claim_patterns(cls, claims: dict[str, dict[str, list[str]]]) -> dict[str, dict[str, list[str]]]:
        for name, values in claims.items():
            for value, patterns in values.items():
                _check_patterns(f"claim {name!r} value {value!r}", patterns)
        return claims

    @field_validator("tokens")
    @classmethod
    def _patterns(cls, tokens: dict[str, list[str]]) -> dict[str, list[str]]:
        for number, (token, patterns) in enumerate(tokens.items(), 1):
            if not token:
                raise ValueError(f"token #{number} is empty")
            if "," in token or token != token.strip(" \t") or not token.isprintable():
                raise ValueError(
                    f"token #{number} holds a comma, a control character or surrounding blanks: a header "
                    "could not carry it as one token"
                )
            _check_patterns(f"token #{number}", patterns)
        return tokens


def _part(pattern: str) -> re.Pattern[str]:
    """One part of a grant pattern: ``*`` stands for any run of characters, every other character for itself
    (``[``, ``]`` and ``?`` too: dataset names hold them, and ``lab/ds[1]`` must not grant ``lab/ds1``)."""
    return re.compile(".*".join(map(re.escape, pattern.split("*"))), re.DOTALL)


def _pattern(pattern: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """An ``<org>/<dataset pattern>`` the tokens file was checked to hold as its two parts."""
    organization, _, dataset = pattern.partition("/")
    return _part(organization), _part(dataset)


MAX_ALLOWED = 1024  # datasets whose verdict a grant remembers


@dataclass(frozen=True, slots=True)
class Grant:
    patterns: tuple[tuple[re.Pattern[str], re.Pattern[str]], ...]
    holder: str = "the token"  # who holds it, as a refusal names it
    shared: tuple[str, str] | None = None  # a share link's one dataset (organization, name): its start page

    @classmethod
    def of_link(cls, organization: str, dataset: str, link: str) -> "Grant":
        """A share link's grant: exactly one dataset (its names match themselves, ``*`` included)."""
        return _link_grant(organization, dataset, link)

    # What it was found to allow, per dataset asked for: the patterns are matched once per dataset, not twice on
    # every request (a kept answer's check is otherwise mostly this). Bounded: emptied when full.
    _allowed: dict[tuple[str, str], bool] = field(default_factory=dict, compare=False, repr=False)

    def allows(self, organization: str, dataset: str) -> bool:
        found = self._allowed.get((organization, dataset))
        if found is None:
            found = any(org.fullmatch(organization) and ds.fullmatch(dataset) for org, ds in self.patterns)
            if len(self._allowed) >= MAX_ALLOWED:
                self._allowed.clear()
            self._allowed[(organization, dataset)] = found
        return found


@functools.lru_cache(maxsize=4096)  # a link's grant is asked for on every chunk: made once per worker
def _link_grant(organization: str, dataset: str, link: str) -> Grant:
    exact = (re.compile(re.escape(organization), re.DOTALL), re.compile(re.escape(dataset), re.DOTALL))
    return Grant((exact,), f"the share link {link} (for {organization}/{dataset} only)", (organization, dataset))


class Tokens:
    """The grants of a tokens file. ``None`` from :meth:`grant` means the token is unknown."""

    def __init__(self, grants: dict[bytes, Grant], claims: dict[str, dict[str, list[str]]] | None = None) -> None:
        self._grants = list(grants.items())
        # compiled once: a signed-in request only looks its claims' values up
        self._claims = {
            name: {value: tuple(map(_pattern, patterns)) for value, patterns in by_value.items()}
            for name, by_value in (claims or {}).items()
        }

    @classmethod
    def load(cls, path: Path) -> "Tokens":
        try:
            document = json.loads(path.read_text())
        except OSError as exc:
            raise TokensFileError(f"tokens file {str(path)!r} cannot be read: {exc.strerror}") from exc
        except ValueError as exc:
            raise TokensFileError(f"tokens file {str(path)!r} is not JSON: {exc}") from exc
        try:
            parsed = _TokensFile.model_validate(document)
        except ValidationError as exc:
            reasons = "; ".join(f"{_where(e['loc'])}: {e['msg']}" for e in exc.errors())
            raise TokensFileError(f"tokens file {str(path)!r} is invalid: {reasons}; expected {SHAPE}") from None
        return cls(
            {
                token.encode("utf-8", "surrogatepass"): Grant(tuple(_pattern(p) for p in patterns))
                for token, patterns in parsed.tokens.items()
            },
            parsed.claims,
        )

    def grant(self, token: str) -> Grant | None:
        """The grant of ``token``; every known token is compared, so timing tells nothing."""
        offered = token.encode("utf-8", "surrogatepass")
        found = None
        for known, grant in self._grants:
            if hmac.compare_digest(offered, known):
                found = grant
        return found

    def claims_grant(self, claims: Mapping[str, Any]) -> Grant:
        """The grant of a signed-in user's verified ``claims``: the patterns of every value of every claim the
        file names (a claim is a string or a list of strings; 401 for another type, never a guess)."""
        patterns: list[tuple[re.Pattern[str], re.Pattern[str]]] = []
        for name, by_value in self._claims.items():
            value = claims.get(name)
            if value is None:
                continue
            values = [value] if isinstance(value, str) else value
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise HttpError(401, f"the claim {name!r} is neither a string nor a list of strings")
            for one in values:
                patterns += by_value.get(one, ())
        return Grant(tuple(dict.fromkeys(patterns)))


class ReloadingTokens:
    """The tokens of a file, read again when the file changes (checked at most every ``interval`` s).

    A changed file that cannot be used is reported and the tokens read before stay in force.
    """

    def __init__(self, path: Path, interval: float) -> None:
        self.path = path
        self.interval = interval
        self._stamp = self._stat()
        self._tokens = Tokens.load(path)
        self._checked = time.monotonic()
        self._lock = threading.Lock()

    def _stat(self) -> Stamp:
        return file_stamp(self.path)

    def current(self) -> Tokens:
        """The tokens in force (the file looked at again if ``interval`` has passed)."""
        if self.interval > 0 and time.monotonic() - self._checked >= self.interval:
            self._refresh()
        return self._tokens

    def grant(self, token: str) -> Grant | None:
        return self.current().grant(token)

    def claims_grant(self, claims: Mapping[str, Any]) -> Grant:
        return self.current().claims_grant(claims)

    def _refresh(self) -> None:
        with self._lock:
            self._checked = time.monotonic()
            stamp = self._stat()
            if stamp == self._stamp:
                return
            self._stamp = stamp
            try:
                self._tokens = Tokens.load(self.path)
            except TokensFileError as exc:
                log.error("%s; the tokens read before stay in force", exc)
                return
            log.info("tokens file %r changed: its tokens are now in force", str(self.path))


class Identities(Protocol):
    """Who a signed-in request is: the claims the OpenID issuer vouches for (:class:`gateway.http.oidc.SignIn`)."""

    async def bearer_claims(self, token: str) -> Mapping[str, Any]: ...

    def login_claims(self, cookie: str) -> Mapping[str, Any]: ...

    def login_cookie(self, request: Request) -> str | None: ...


MAX_DECISIONS = 4096  # tokens whose grants are remembered per worker; past it the oldest is forgotten


class Decisions:
    """The grants of the tokens offered, remembered per token until the tokens in force change.

    Finding a token's grant compares it with every known token (in constant time) and costs as much as the rest
    of a kept answer's way; a token comes again and again. A grant is remembered under a keyed hash of the token
    offered, never the token, and only for a token that holds a grant: it holds no credential it was not given,
    and an unknown token is compared every time. When the tokens file changes, everything remembered is dropped
    before the next request is decided, so a revoked token or a narrowed grant is refused at once.
    """

    def __init__(self, tokens: ReloadingTokens) -> None:
        self.tokens = tokens
        self._key = os.urandom(16)  # per worker: a remembered hash tells nothing outside it
        self._in_force: Tokens | None = None
        self._grants: dict[bytes, Grant] = {}

    def __len__(self) -> int:
        return len(self._grants)

    def _digest(self, token: str) -> bytes:
        return hashlib.blake2b(token.encode("utf-8", "surrogatepass"), key=self._key, digest_size=16).digest()

    def holds(self, token: str) -> bool:
        """Whether a grant of ``token`` is remembered."""
        return self._digest(token) in self._grants

    def grant(self, token: str) -> Grant | None:
        """The grant of ``token`` in the tokens in force; None for an unknown token."""
        in_force = self.tokens.current()
        if in_force is not self._in_force:
            self._grants = {}
            self._in_force = in_force
        digest = self._digest(token)
        found = self._grants.get(digest)
        if found is None:
            found = in_force.grant(token)
            if found is not None:
                if len(self._grants) >= MAX_DECISIONS:
                    del self._grants[next(iter(self._grants))]
                self._grants[digest] = found
        return found


@dataclass(frozen=True, slots=True)
class Token:
    """A token of the tokens file."""

    value: str
    in_url: bool  # a page asked for with ?token= or /t/{token}/ carries it on in its image and viewer URLs

    async def look_up(self, access: "Access") -> Grant | None:
        """This credential's grant in ``access`` (None when the gateway is open); 401 when it grants nothing."""
        return access.token_grant(self.value)

    @property
    def delegates(self) -> bool:
        """Whether its holder may hand on read access to others (create a share link)."""
        return True


@dataclass(frozen=True, slots=True)
class LinkToken(Token):
    """A share link's capability, from a ``/s/{capability}/`` path: its pages carry it on as their path prefix."""

    async def look_up(self, access: "Access") -> Grant | None:
        return access.link_grant(self.value)

    @property
    def delegates(self) -> bool:
        return False  # a link is handed on as itself, never made into a longer or other one


@dataclass(frozen=True, slots=True)
class BearerToken(Token):
    """An access token of the OpenID issuer (``Authorization: Bearer``)."""

    async def look_up(self, access: "Access") -> Grant | None:
        return access.claims_grant(await access._signed_in().bearer_claims(self.value))


@dataclass(frozen=True, slots=True)
class LoginCookie(Token):
    """The login cookie of a browser signed in at /login."""

    async def look_up(self, access: "Access") -> Grant | None:
        return access.claims_grant(access._signed_in().login_claims(self.value))


def _utf8(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HttpError(400, f"the token in {where} is not UTF-8") from None


def _header_token(lines: list[bytes]) -> Token | None:
    """The token of the ``X-Auth-Token`` header: its one line's value, exactly; 400 for a list or blanks."""
    if len(lines) > 1:
        raise HttpError(400, f"the request carries more than one token (X-Auth-Token header lines): {HOW}, once")
    if not lines or not lines[0]:
        return None
    value = _utf8(lines[0], "the X-Auth-Token header")
    if "," in value or value != value.strip(" \t"):
        raise HttpError(
            400,
            "the X-Auth-Token header carries one token exactly as it was issued: no list, no comma, "
            "no blanks around it",
        )
    return Token(value, False)


def _query_token(query: bytes) -> Token | None:
    """The token of the one ``token`` parameter, percent-decoded; 400 for more, or for a misspelt name."""
    if not query or (b"%" not in query and b"token" not in query.lower()):  # the cheap test first
        return None
    values: list[bytes] = []
    for part in query.split(b"&"):
        name, _, value = part.partition(b"=")
        if name == QUERY_NAME:
            values.append(_form_decoded(value))
        elif _form_decoded(name).lower() == QUERY_NAME:  # bytes.lower: ASCII only, as every proxy folds case
            raise HttpError(
                400,
                "the token parameter is spelled 'token', in lower case and unencoded: another reader "
                "could take this one for it",
            )
    if len(values) > 1:
        raise HttpError(400, f"the request carries more than one token (token parameters): {HOW}, once")
    return Token(_utf8(values[0], "the query"), True) if values and values[0] else None


def _form_decoded(raw: bytes) -> bytes:
    """A query name or value as form decoding reads it: ``+`` is a blank, percent escapes are bytes."""
    return unquote_to_bytes(raw.replace(b"+", b" "))


def _path_token(raw: bytes) -> Token:
    """The token of a ``/t/{token}/`` path: 400 for one that is empty, or that URLs drop (``.``, ``..``)."""
    if raw in (b"", b".", b".."):
        raise HttpError(400, "the token in the path /t/{token}/ is empty, '.' or '..'")
    return Token(_utf8(raw, "the path"), True)


def _bearer_token(lines: list[bytes]) -> Token | None:
    """The access token of the one ``Authorization: Bearer`` line; 400 for another scheme, or more lines."""
    if len(lines) > 1:
        raise HttpError(400, "the request carries more than one Authorization header line")
    if not lines or not lines[0]:
        return None
    scheme, _, value = _utf8(lines[0], "the Authorization header").partition(" ")
    value = value.strip(" ")
    if scheme.lower() != "bearer" or not value or " " in value or "," in value:
        raise HttpError(400, "the Authorization header carries 'Bearer <access token>', one token, nothing else")
    return BearerToken(value, False)


def read_token(
    header_lines: list[bytes],
    query: bytes,
    path_token: bytes | None = None,
    path_link: bytes | None = None,
    authorization: list[bytes] | None = None,
    login_cookie: str | None = None,
) -> Token | None:
    """The one token offered by these ``X-Auth-Token`` lines, this raw query string, the path's token
    segment (see :func:`gateway.http.urls.split_path_token`), a share link's capability and the
    ``Authorization`` lines, if any; 400 for more, or for a token spelt otherwise than one way. Failing those,
    the login cookie's."""
    offered = [
        token
        for token in (
            _header_token(header_lines),
            _query_token(query),
            None if path_token is None else _path_token(path_token),
            None if path_link is None else LinkToken(path_link.decode("latin-1"), False),
            _bearer_token(authorization or []),
        )
        if token is not None
    ]
    if len(offered) > 1:
        if path_link is not None:
            raise HttpError(400, "the request carries a share link and a token: a share link needs no other, send one")
        raise HttpError(400, f"the request carries more than one token: {HOW}, once")
    if offered:
        return offered[0]
    return None if login_cookie is None else LoginCookie(login_cookie, False)


class Access:
    """The tokens and share links in force and the decisions made with them; ``open`` without a tokens file.
    ``identities``: sign-in with OpenID Connect, when configured (see the module's docstring)."""

    def __init__(
        self,
        tokens_file: Path | None,
        reload_seconds: float,
        links: ShareLinks | None = None,
        identities: Identities | None = None,
    ) -> None:
        self.tokens = ReloadingTokens(tokens_file, reload_seconds) if tokens_file is not None else None
        self.links = links
        self.identities = identities
        self.decisions = Decisions(self.tokens) if self.tokens is not None else None
        ways = ((WayIn.SIGN_IN, identities), (WayIn.SHARE_LINK, links))
        self.ways_in = frozenset(way for way, taken in ways if taken is not None)  # beside tokens: a 401 says them

    @property
    def open(self) -> bool:
        return self.tokens is None

    def read(
        self, request: Request, query: bytes, path_token: bytes | None, path_link: bytes | None = None
    ) -> Token | None:
        """The request's one credential (see :func:`read_token`): a sign-in's only when sign-in is configured."""
        if self.identities is None:
            return read_token(request.header_lines(TOKEN_HEADER), query, path_token, path_link)
        return read_token(
            request.header_lines(TOKEN_HEADER),
            query,
            path_token,
            path_link,
            request.header_lines(AUTHORIZATION_HEADER),
            self.identities.login_cookie(request),
        )

    def _signed_in(self) -> Identities:
        if self.identities is None:
            raise HttpError(401, "sign-in is not configured on this gateway")
        return self.identities

    async def grant(self, token: Token | None) -> Grant | None:
        """The grant of ``token``: None when the gateway is open; 401 without a valid token, which names the other
        ways in this gateway takes (a person's page lists them)."""
        try:
            if token is None:
                if self.tokens is None:
                    return None
                raise HttpError(401, f"a token is required: {HOW}{self._or_sign_in}")
            return await token.look_up(self)
        except HttpError as exc:
            if exc.status == 401:
                exc.ways_in = self.ways_in
            raise

    def token_grant(self, value: str) -> Grant | None:
        if self.decisions is None:
            return None
        grant = self.decisions.grant(value)
        if grant is None:
            raise HttpError(401, "the token is not valid")
        return grant

    def claims_grant(self, claims: Mapping[str, Any]) -> Grant | None:
        """The grant the tokens file's ``"claims"`` give a signed-in identity (None when the gateway is open)."""
        return None if self.tokens is None else self.tokens.claims_grant(claims)

    def link_grant(self, capability: str) -> Grant:
        """A share link's grant, even where the gateway is open: a link reads its own dataset and nothing else."""
        if self.links is None:
            raise HttpError(401, "this gateway accepts no share links (no share_key_file is set)")
        claims = self.links.check(capability)
        return Grant.of_link(claims.organization, claims.dataset, claims.id)

    @property
    def _or_sign_in(self) -> str:
        return "" if self.identities is None else "; or an Authorization: Bearer access token; or sign in at /login"


def check_dataset(grant: Grant | None, organization: str, dataset: str) -> None:
    """403 unless ``grant`` covers the dataset (whether or not it exists: absent and forbidden look alike)."""
    if grant is not None and not grant.allows(organization, dataset):
        raise HttpError(403, f"{grant.holder} does not grant access to {organization}/{dataset}")


def check_files(grant: Grant | None, organization: str, dataset: str, owners: Iterable[tuple[str, str]]) -> None:
    """403, as for the URL, unless ``grant`` covers every dataset whose directory holds files that the dataset
    ``organization/dataset`` reads (its layers' ``owners``): authorization follows the files, not only the URL."""
    if grant is not None and not all(grant.allows(org, name) for org, name in owners):
        raise HttpError(
            403,
            f"{grant.holder} does not grant access to {organization}/{dataset} (or to every dataset whose files it "
            "reads)",
        )


def granted_names(grant: Grant | None, organization: str, names: list[str]) -> list[str]:
    """The datasets of ``names`` (those of ``organization``) that ``grant`` covers."""
    return names if grant is None else [name for name in names if grant.allows(organization, name)]


def check_organization(grant: Grant | None, organization: str, names: list[str]) -> None:
    """A token sees an organization only where it is granted a dataset there: 403 otherwise, absent or not."""
    if grant is not None and not granted_names(grant, organization, names):
        raise HttpError(403, f"{grant.holder} does not grant access to organization {organization}")
