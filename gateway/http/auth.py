"""Tokens that grant access to datasets, compared in constant time and never logged."""

import fnmatch
import hmac
import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ValidationError, field_validator

SHAPE = '{"tokens": {"<token>": ["<organization>/<dataset pattern>", ...]}}'


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
            for pattern in patterns:
                if pattern.count("/") != 1 or not all(pattern.split("/")):
                    raise ValueError(f"token #{number}: pattern {pattern!r} is not '<org>/<dataset pattern>'")
        return tokens


@dataclass(frozen=True, slots=True)
class Grant:
    patterns: tuple[tuple[str, str], ...]

    def allows(self, organization: str, dataset: str) -> bool:
        return any(
            fnmatch.fnmatchcase(organization, org) and fnmatch.fnmatchcase(dataset, ds) for org, ds in self.patterns
        )

    def allows_organization(self, organization: str) -> bool:
        return any(fnmatch.fnmatchcase(organization, org) for org, _ in self.patterns)


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
                token.encode(): Grant(tuple(tuple(p.split("/", 1)) for p in patterns))  # type: ignore[misc]
                for token, patterns in parsed.tokens.items()
            }
        )

    def grant(self, token: str) -> Grant | None:
        """The grant of ``token``; every known token is compared, so timing tells nothing."""
        offered = token.encode()
        found = None
        for known, grant in self._grants:
            if hmac.compare_digest(offered, known):
                found = grant
        return found
