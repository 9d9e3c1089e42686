"""Share links: a URL prefix ``/s/{capability}/`` that carries a signed, expiring, read-only grant of one dataset.

Browser viewers and many clients cannot send a header, and a person outside the tokens file needs no token of
their own: a capability in the path reaches every file below it (as ``/t/{token}/`` does), and it is checked
here without any state but the signing key and the revocation list, so replicas that share the key accept each
other's links.

A capability is ``s1.{id}.r.{expires}.{dataset}.{signature}``, every part of URL-safe characters (no ``%``,
so a proxy counts and caches it under the spelling read here):

- ``id``: 16 random characters (``[A-Za-z0-9_-]``), the name a link is revoked and logged by;
- ``r``: read-only, the one right a link can carry;
- ``expires``: Unix seconds, decimal, no sign or leading zero;
- ``dataset``: base64url (unpadded) of the compact UTF-8 JSON ``["{organization}", "{dataset}"]``;
- ``signature``: base64url (unpadded) of HMAC-SHA256 with the key of ``share_key_file`` over
  :data:`DOMAIN` followed by the capability up to its last ``.``.

Only the canonical spelling of each part is accepted (it must encode back to the very bytes received), so one
grant has one capability and nothing can ride along in a part. The id is logged; the signature never is.
"""

import base64
import binascii
import functools
import hashlib
import hmac
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gateway_storage.faults import Malformed

from .filestamp import file_stamp
from .messages import HttpError

log = logging.getLogger("gateway")
VERSION = "s1"
READ = "r"
DOMAIN = b"zarr-gateway share link\n"  # signatures of this kind, never mistaken for any other use of the key
MIN_KEY_BYTES = 32
CHECKED_LINKS = 4096  # links whose signature each worker remembers having checked (about 1 MiB)
_ID = re.compile(r"[A-Za-z0-9_-]{16}")
_EXPIRES = re.compile(r"[1-9][0-9]{0,11}")
_B64 = re.compile(r"[A-Za-z0-9_-]+")
# What a log line may show of a capability that does not even parse: nothing but that it was one.
UNREADABLE_ID = "***"


class ShareKeyError(Malformed, ValueError):
    """The signing key cannot be used; the message names the problem."""


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes | None:
    """The bytes of canonical unpadded base64url ``text``, or None."""
    if not _B64.fullmatch(text):
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
    return raw if _b64(raw) == text else None


def _dataset_part(organization: str, dataset: str) -> str:
    """The names as compact JSON in UTF-8; a name that is not UTF-8 on disk (a surrogate escape) is kept as is."""
    names = json.dumps([organization, dataset], separators=(",", ":"), ensure_ascii=False)
    return _b64(names.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True, slots=True)
class Capability:
    """What a link grants: read access to one dataset until ``expires`` (Unix seconds); ``id`` names it."""

    id: str
    organization: str
    dataset: str
    expires: int

    @property
    def signed_part(self) -> str:
        """The capability up to its signature: the canonical encoding that is signed."""
        return ".".join((VERSION, self.id, READ, str(self.expires), _dataset_part(self.organization, self.dataset)))


def _new_id() -> str:
    """A fresh random id (72 bits) that does not start with ``-``: a command line reads that as an option, so
    ``share --revoke ID`` would fail for one link in 64."""
    while (drawn := secrets.token_urlsafe(12)).startswith("-"):
        pass
    return drawn


def link_id(capability: str) -> str:
    """The id of a capability as a log line shows it: read without checking the signature (a forged link's
    claimed id, of safe characters only), or ``***`` when the text is not a capability at all."""
    parts = capability.split(".")
    return parts[1] if len(parts) == 6 and parts[0] == VERSION and _ID.fullmatch(parts[1]) else UNREADABLE_ID


def _parse(capability: str) -> tuple[Capability, bytes] | None:
    """The claims and the signature of a capability in its canonical spelling, unchecked; None otherwise."""
    parts = capability.split(".")
    if len(parts) != 6 or parts[0] != VERSION or parts[2] != READ:
        return None
    _, id_, _, expires, dataset, signature = parts
    names = _unb64(dataset)
    mac = _unb64(signature)
    if not _ID.fullmatch(id_) or not _EXPIRES.fullmatch(expires) or names is None or mac is None:
        return None
    try:
        decoded = json.loads(names.decode("utf-8", "surrogatepass"))
    except ValueError:
        return None
    if not (isinstance(decoded, list) and len(decoded) == 2 and all(isinstance(n, str) and n for n in decoded)):
        return None
    claims = Capability(id_, decoded[0], decoded[1], int(expires))
    return (claims, mac) if claims.signed_part == ".".join(parts[:5]) else None


class ShareKey:
    """The HMAC-SHA256 key that signs and checks links, read from ``share_key_file``."""

    def __init__(self, key: bytes) -> None:
        if len(key) < MIN_KEY_BYTES:
            raise ShareKeyError(f"the share key holds {len(key)} bytes; it needs at least {MIN_KEY_BYTES}")
        self._key = key

    @classmethod
    def load(cls, path: Path) -> "ShareKey":
        """The key of a file: its bytes, without trailing blanks and newlines (as an editor or ``echo`` leaves)."""
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ShareKeyError(f"share key file {str(path)!r} cannot be read: {exc.strerror}") from exc
        try:
            return cls(raw.rstrip(b" \t\r\n"))
        except ShareKeyError as exc:
            raise ShareKeyError(f"share key file {str(path)!r}: {exc}") from None

    def _mac(self, signed_part: str) -> bytes:
        return hmac.new(self._key, DOMAIN + signed_part.encode("ascii"), hashlib.sha256).digest()

    def sign(self, claims: Capability) -> str:
        """The capability text of ``claims``."""
        return f"{claims.signed_part}.{_b64(self._mac(claims.signed_part))}"

    def issue(self, organization: str, dataset: str, seconds: int, now: float | None = None) -> tuple[Capability, str]:
        """A new link's claims (a fresh random id) and capability, valid for ``seconds`` from now."""
        if seconds <= 0:
            raise ValueError("a link must be valid for at least one second")
        expires = int(time.time() if now is None else now) + seconds
        claims = Capability(_new_id(), organization, dataset, expires)
        return claims, self.sign(claims)

    def check(self, capability: str) -> Capability:
        """The claims of a capability whose signature is this key's; 401 saying why otherwise."""
        parsed = _parse(capability)
        if parsed is None:
            raise HttpError(401, "the share link is malformed (not a capability this gateway issues)")
        claims, mac = parsed
        if not hmac.compare_digest(mac, self._mac(claims.signed_part)):
            raise HttpError(401, f"the share link {claims.id} is tampered with or forged: its signature does not match")
        return claims


def read_revocations(path: Path) -> frozenset[str]:
    """The ids of a revocation list: one a line; blank lines and ``#`` comments are skipped. A missing file is
    an empty list (nothing revoked yet); an unreadable one raises OSError."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return frozenset()
    return frozenset(line.split("#", 1)[0].strip() for line in text.splitlines()) - {""}


def revoke(path: Path, link: str) -> bool:
    """Add ``link`` to the revocation list at ``path``; False when it was already there."""
    if not _ID.fullmatch(link):
        raise ValueError(f"{link!r} is not a share link id (16 characters of A-Z, a-z, 0-9, '_', '-')")
    if link in read_revocations(path):
        return False
    existing = path.read_bytes() if path.exists() else b""
    separator = b"\n" if existing and not existing.endswith(b"\n") else b""  # an operator's last line may lack one
    with path.open("ab") as file:
        file.write(separator + f"{link}\n".encode())
    return True


class Revocations:
    """The revoked ids of a file, read again when it changes (checked at most every ``interval`` s), as the
    tokens file is. A changed file that cannot be read is reported and the ids read before stay revoked."""

    def __init__(self, path: Path, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.interval = interval
        self._clock = clock
        self._stamp = file_stamp(path)
        self._ids = read_revocations(path)
        self._checked = clock()
        self._lock = threading.Lock()

    def __contains__(self, link: str) -> bool:
        if self.interval > 0 and self._clock() - self._checked >= self.interval:
            with self._lock:
                self._checked = self._clock()
                stamp = file_stamp(self.path)
                if stamp != self._stamp:
                    self._stamp = stamp
                    try:
                        self._ids = read_revocations(self.path)
                    except (OSError, UnicodeDecodeError) as exc:
                        log.error(
                            "share revocation list %r cannot be read (%s): the ids read before stay revoked",
                            str(self.path),
                            exc,
                        )
        return link in self._ids


class ShareLinks:
    """The links this gateway accepts: signed with its key, not expired, not revoked.

    A link's signature is checked once per worker while it is among the last :data:`CHECKED_LINKS` used
    (parsing and checking cost about thirty times a token's look-up, on every chunk); its expiry and the
    revocation list are checked on every request. A link that fails is never remembered.
    """

    def __init__(self, key: ShareKey, revoked: Revocations | None, clock: Callable[[], float] = time.time) -> None:
        self.key = key
        self.revoked = revoked
        self._clock = clock
        self._signed = functools.lru_cache(maxsize=CHECKED_LINKS)(key.check)

    def check(self, capability: str) -> Capability:
        """The claims of a link in force; 401 saying whether it is malformed, forged, expired or revoked."""
        claims = self._signed(capability)
        if claims.expires <= self._clock():
            raise HttpError(401, f"the share link {claims.id} has expired: ask for a new one")
        if self.revoked is not None and claims.id in self.revoked:
            raise HttpError(401, f"the share link {claims.id} has been revoked")
        return claims
