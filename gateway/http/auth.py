"""Who may read what: the one place that reads a request's token, keeps the tokens file current and
decides grants. The data routes, the previews, the index and the proxy's ``/auth`` all ask here.

A token is one token. It comes as the ``X-Auth-Token`` header, as the ``token`` query parameter or as
the path segment of ``/t/{token}/data/...`` (cut from the path by
:func:`gateway.http.urls.split_path_token`), once. The header's bytes are the token's UTF-8 encoding,
exactly as ``?token=`` and the path carry it percent-encoded, so a token of any characters works every
way. Following RFC 9110 (5.3, 5.6.1), header lines of one name are one comma-separated list and empty
list elements are ignored; a token therefore cannot contain a comma (the tokens file is refused at
start-up if one does). A request that offers more than one token, in any mix of header lines, list
elements, query parameters and the path, even equal ones, is a 400: a proxy in front might count or
cache it under another token than the one read here.
"""

import fnmatch
import hmac
import json
import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl

from pydantic import BaseModel, ValidationError, field_validator

from .messages import HttpError

log = logging.getLogger("gateway")
SHAPE = '{"tokens": {"<token>": ["<organization>/<dataset pattern>", ...]}}'
TOKEN_HEADER = b"x-auth-token"
HOW = "send it as the X-Auth-Token header, the token query parameter or the path /t/{token}/data/..."


def _where(loc: tuple[int | str, ...]) -> str:
    """Where in the file an error is; a token (a key of "tokens") is shown as <token>, never itself."""
    if not loc:
        return "top level"
    return ".".join([str(loc[0]), *(["<token>"] if len(loc) > 1 else []), *map(str, loc[2:])])


class TokensFileError(ValueError):
    """The tokens file cannot be used; the message names the problem."""


class _TokensFile(BaseModel):
    tokens: dict[str, list[str]]

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
            for pattern in patterns:
                if pattern.count("/") != 1 or not all(pattern.split("/")):
                    raise ValueError(f"token #{number}: pattern {pattern!r} is not '<org>/<dataset pattern>'")
        return tokens


def _pattern(pattern: str) -> tuple[str, str]:
    """An ``<org>/<dataset pattern>`` the tokens file was checked to hold as its two parts."""
    organization, _, dataset = pattern.partition("/")
    return organization, dataset


@dataclass(frozen=True, slots=True)
class Grant:
    patterns: tuple[tuple[str, str], ...]

    def allows(self, organization: str, dataset: str) -> bool:
        return any(
            fnmatch.fnmatchcase(organization, org) and fnmatch.fnmatchcase(dataset, ds) for org, ds in self.patterns
        )


class Tokens:
    """The grants of a tokens file. ``None`` from :meth:`grant` means the token is unknown."""

    def __init__(self, grants: dict[bytes, Grant]) -> None:
        self._grants = list(grants.items())

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
            }
        )

    def grant(self, token: str) -> Grant | None:
        """The grant of ``token``; every known token is compared, so timing tells nothing."""
        offered = token.encode("utf-8", "surrogatepass")
        found = None
        for known, grant in self._grants:
            if hmac.compare_digest(offered, known):
                found = grant
        return found


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

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def grant(self, token: str) -> Grant | None:
        if self.interval > 0 and time.monotonic() - self._checked >= self.interval:
            self._refresh()
        return self._tokens.grant(token)

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


@dataclass(frozen=True, slots=True)
class Token:
    value: str
    in_url: bool  # a page asked for with ?token= or /t/{token}/ carries it on in its image and viewer URLs


def _utf8(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HttpError(400, f"the token in {where} is not UTF-8") from None


def _query_values(query: bytes, name: str) -> list[bytes]:
    """The raw bytes of every ``name`` parameter, percent escapes in names and values decoded."""
    text = query.decode("latin-1")  # one character per byte, so the bytes come back unchanged
    pairs = parse_qsl(text, keep_blank_values=True, encoding="latin-1", errors="strict")
    return [value.encode("latin-1") for key, value in pairs if key == name]


def _path_token(raw: bytes) -> Token:
    """The token of a ``/t/{token}/`` path: 400 for one that is empty, or that URLs drop (``.``, ``..``)."""
    if raw in (b"", b".", b".."):
        raise HttpError(400, "the token in the path /t/{token}/ is empty, '.' or '..'")
    return Token(_utf8(raw, "the path"), True)


def read_token(header_lines: list[bytes], query: bytes, path_token: bytes | None = None) -> Token | None:
    """The one token offered by these ``X-Auth-Token`` lines, this raw query string and the path's token
    segment (see :func:`gateway.http.urls.split_path_token`), if any; 400 for more."""
    offered = [
        Token(element, False)
        for line in header_lines
        for element in (part.strip(" \t") for part in _utf8(line, "the X-Auth-Token header").split(","))
        if element
    ]
    if b"token" in query or b"%" in query:  # the cheap test first; a percent-encoded name is found by the parse
        offered += [Token(_utf8(value, "the query"), True) for value in _query_values(query, "token")]
    offered = [token for token in offered if token.value]
    if path_token is not None:
        offered.append(_path_token(path_token))
    if len(offered) > 1:
        raise HttpError(400, f"the request carries more than one token: {HOW}, once")
    return offered[0] if offered else None


class Access:
    """The tokens in force and the decisions made with them; ``open`` without a tokens file."""

    def __init__(self, tokens_file: Path | None, reload_seconds: float) -> None:
        self.tokens = ReloadingTokens(tokens_file, reload_seconds) if tokens_file is not None else None

    @property
    def open(self) -> bool:
        return self.tokens is None

    def grant(self, token: Token | None) -> Grant | None:
        """The grant of ``token``: None when the gateway is open; 401 without a valid token."""
        if self.tokens is None:
            return None
        if token is None:
            raise HttpError(401, f"a token is required: {HOW}")
        grant = self.tokens.grant(token.value)
        if grant is None:
            raise HttpError(401, "the token is not valid")
        return grant


def check_dataset(grant: Grant | None, organization: str, dataset: str) -> None:
    """403 unless ``grant`` covers the dataset (whether or not it exists: absent and forbidden look alike)."""
    if grant is not None and not grant.allows(organization, dataset):
        raise HttpError(403, f"the token does not grant access to {organization}/{dataset}")


def check_files(grant: Grant | None, organization: str, dataset: str, owners: Iterable[tuple[str, str]]) -> None:
    """403, as for the URL, unless ``grant`` covers every dataset whose directory holds files that the dataset
    ``organization/dataset`` reads (its layers' ``owners``): authorization follows the files, not only the URL."""
    if grant is not None and not all(grant.allows(org, name) for org, name in owners):
        raise HttpError(
            403,
            f"the token does not grant access to {organization}/{dataset} (or to every dataset whose files it reads)",
        )


def granted_names(grant: Grant | None, organization: str, names: list[str]) -> list[str]:
    """The datasets of ``names`` (those of ``organization``) that ``grant`` covers."""
    return names if grant is None else [name for name in names if grant.allows(organization, name)]


def check_organization(grant: Grant | None, organization: str, names: list[str]) -> None:
    """A token sees an organization only where it is granted a dataset there: 403 otherwise, absent or not."""
    if grant is not None and not granted_names(grant, organization, names):
        raise HttpError(403, f"the token does not grant access to organization {organization}")
