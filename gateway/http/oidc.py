"""Sign-in with OpenID Connect: who a request is, proved by the issuer's signed tokens.

Two carriers, both ending in verified claims (what they may read is decided from the tokens file's
``"claims"`` by :mod:`gateway.http.auth`, never here):

- scripts send ``Authorization: Bearer <access token>``, a JWT of the issuer, checked on every request against
  the issuer's published keys (signature, ``iss``, ``aud``, ``exp``, ``nbf``; an asymmetric ``alg`` only);
- browsers sign in at ``/login`` (the authorization code flow with PKCE, ``state`` and ``nonce``); ``/callback``
  checks the issuer's ID token and sets a login cookie, a JWT the gateway signs itself (HS256, its own key), so
  a signed-in browser needs the issuer again only to sign in anew; ``/logout`` records the sign-in as ended.

The discovery document is read once; the keys (JWKS) are kept and read again when a token names a key they
lack (at most every ``oidc_jwks_refresh_seconds``) and when they are an hour old, so keys the issuer rotates
in count at once and keys it drops stop counting. An issuer that does not answer is a 503 for whatever needs
it (a new sign-in, a token signed by a key not yet seen); a failed refresh keeps the keys read before.

PyJWT (the ``oidc`` extra) is imported where it is used, as every extra's library is (:mod:`gateway.extras`).
"""

import base64
import hashlib
import json
import logging
import math
import os
import re
import secrets
import tempfile
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit

import anyio

from .messages import Answer, HttpError, Request, raw_headers
from .origin import PublicOrigin
from .urls import CALLBACK_PATH

if TYPE_CHECKING:
    import jwt

log = logging.getLogger("gateway")

# Asymmetric algorithms only: never "none", never HMAC (a shared secret is no proof that the issuer signed).
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
LOGIN_COOKIE = "zg_login"  # the signed-in browser's cookie (the proxy's token-check cache keys on it too)
FLOW_COOKIE = "zg_login_flow"  # state, nonce, PKCE verifier and next path of a sign-in under way
FLOW_SECONDS = 600  # a sign-in must come back from the issuer within this long
KEYS_MAX_AGE = 3600.0  # keys older than this are read again before use (a key the issuer dropped stops counting)
FETCH_SECONDS = 5.0
DISCOVERY_RETRY_SECONDS = 5.0  # an issuer whose discovery document could not be read is asked again after this
FETCH_BYTES = 1 << 20
LEEWAY_SECONDS = 5  # clock skew allowed on exp and nbf
VERIFIED_ENTRIES = 4096  # tokens and cookies kept verified per worker (a few MiB at most)
COOKIE_BYTES = 3800  # a browser keeps a cookie of up to 4096 bytes, name and attributes included
_COOKIE_ISSUER = "zarr-gateway"
# Claims about the token itself, not the person: not kept in the login cookie.
_REGISTERED = frozenset(
    {"iss", "aud", "exp", "nbf", "iat", "jti", "nonce", "at_hash", "c_hash", "s_hash", "auth_time", "azp", "sid"}
)
_SID = re.compile(r"[0-9a-f]{32}")
NO_STORE = {"Cache-Control": "no-store"}


def _unavailable(what: str, reason: object) -> HttpError:
    message = f"the OpenID issuer cannot be reached ({what}: {reason}); try again later"
    return HttpError(503, message, {"Retry-After": "30"})


def _fetch_json(url: str, form: Mapping[str, str] | None = None, secret: tuple[str, str] | None = None) -> Any:
    """A JSON document from the issuer (a POST of ``form`` when given): 503 when it cannot be had, the issuer's
    own error (``error``, ``error_description``) as a 401."""
    data = None if form is None else urlencode(form).encode()
    request = urllib.request.Request(url, data=data, headers={"Accept": "application/json"})
    if secret is not None:
        pair = ":".join(map(_form_quote, secret)).encode()
        request.add_header("Authorization", "Basic " + base64.b64encode(pair).decode())
    try:
        with urllib.request.urlopen(request, timeout=FETCH_SECONDS) as response:
            body = response.read(FETCH_BYTES + 1)
    except urllib.error.HTTPError as exc:
        if 400 <= exc.code < 500 and form is not None:
            raise HttpError(401, f"the OpenID issuer refused the sign-in: {_issuer_error(exc)}") from None
        raise _unavailable(url, f"HTTP {exc.code}") from None
    except (OSError, ValueError) as exc:
        raise _unavailable(url, getattr(exc, "reason", exc)) from None
    if len(body) > FETCH_BYTES:
        raise _unavailable(url, "the answer is larger than 1 MiB")
    try:
        document = json.loads(body)
    except ValueError:
        raise _unavailable(url, "the answer is not JSON") from None
    if not isinstance(document, dict):
        raise _unavailable(url, "the answer is not a JSON object")
    return document


def _form_quote(value: str) -> str:
    """A client id or secret as HTTP Basic carries it for OAuth (RFC 6749, 2.3.1: form-encoded first)."""
    return urlencode({"": value})[1:]


def _issuer_error(exc: urllib.error.HTTPError) -> str:
    try:
        document = json.loads(exc.read(4096))
        return f"{document.get('error')}: {document.get('error_description', '')}"[:300]
    except ValueError:
        return f"HTTP {exc.code}"


class Issuer:
    """The issuer's discovery document and keys, kept by this worker, and the check of its tokens."""

    def __init__(self, url: str, refresh_seconds: float) -> None:
        self.url = url
        self.refresh_seconds = refresh_seconds
        self._metadata: dict[str, Any] | None = None
        self._keys: dict[str, jwt.PyJWK] = {}
        self._keys_at = -math.inf  # monotonic time of the last read of the keys, answered or not
        self._failed: HttpError | None = None  # why the last read of the keys failed, if it did
        self._discovery_failed: tuple[HttpError | None, float] = (None, -math.inf)
        self._lock = anyio.Lock()

    async def metadata(self) -> dict[str, Any]:
        """The discovery document, read once (503 until it can be; asked again at most every
        ``DISCOVERY_RETRY_SECONDS``, so that a burst of requests while the issuer is away waits for no fetch)."""
        if self._metadata is None:
            async with self._lock:
                if self._metadata is None:
                    failed, at = self._discovery_failed
                    if failed is not None and time.monotonic() - at < DISCOVERY_RETRY_SECONDS:
                        raise failed
                    try:
                        document = await self._get(f"{self.url}/.well-known/openid-configuration")
                        self._metadata = self._checked(document)
                    except HttpError as exc:
                        self._discovery_failed = (exc, time.monotonic())
                        raise
        return self._metadata

    def _checked(self, document: dict[str, Any]) -> dict[str, Any]:
        if document.get("issuer") != self.url:
            raise _unavailable("discovery", f"it names issuer {str(document.get('issuer'))[:200]!r}, not {self.url!r}")
        for name in ("jwks_uri", "authorization_endpoint", "token_endpoint"):
            value = document.get(name)
            if not isinstance(value, str) or urlsplit(value).scheme not in ("https", "http"):
                raise _unavailable("discovery", f"it has no {name} URL")
        return document

    @staticmethod
    async def _get(url: str) -> dict[str, Any]:
        document: dict[str, Any] = await anyio.to_thread.run_sync(_fetch_json, url)
        return document

    async def _read_keys(self, jwks_uri: str) -> None:
        """Read the keys again; a failure keeps the keys read before (and says so), unless there are none."""
        import jwt

        self._keys_at = time.monotonic()
        try:
            document = await self._get(jwks_uri)
            keys = {}
            for entry in document.get("keys", []):
                if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
                    continue
                try:
                    key = jwt.PyJWK(entry)
                except jwt.PyJWTError:
                    continue  # a key of a type this gateway cannot use: the issuer may publish more
                keys[str(entry.get("kid", ""))] = key
        except HttpError as exc:
            self._failed = exc
            if not self._keys:
                raise
            log.warning("the OpenID issuer's keys could not be read again; those read before stay: %s", exc.message)
            return
        self._keys, self._failed = keys, None

    async def key(self, kid: str) -> "jwt.PyJWK":
        """The issuer's key ``kid``: 401 when the issuer does not publish it (also after reading its keys again)."""
        if time.monotonic() - self._keys_at >= KEYS_MAX_AGE or kid not in self._keys:
            jwks_uri = (await self.metadata())["jwks_uri"]
            async with self._lock:  # one read for a burst of requests; those after it find its keys
                age = time.monotonic() - self._keys_at
                if age >= KEYS_MAX_AGE or (kid not in self._keys and age >= self.refresh_seconds):
                    await self._read_keys(jwks_uri)
        found = self._keys.get(kid)
        if found is None and self._failed is not None:
            raise self._failed  # whether the issuer publishes it now cannot be known: 503, not 401
        if found is None:
            raise HttpError(401, "the token is signed with a key the OpenID issuer does not publish")
        return found

    async def claims(self, token: str, audience: str, what: str) -> dict[str, Any]:
        """The claims of ``token``, a JWT this issuer signed for ``audience``; 401 with the reason otherwise."""
        import jwt

        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise HttpError(401, f"the {what} is not a JSON Web Token") from None
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            raise HttpError(401, f"the {what}'s alg {str(alg)[:20]!r} is not allowed; allowed: {', '.join(ALGORITHMS)}")
        kid = header.get("kid", "")
        if not isinstance(kid, str):
            raise HttpError(401, f"the {what}'s kid is not a string")
        key = await self.key(kid)
        if key.algorithm_name != alg and not (key.algorithm_name.startswith("RS") and alg.startswith("PS")):
            raise HttpError(401, f"the {what}'s alg {alg} does not fit the issuer's key {kid!r}")
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key.key,
                algorithms=[alg],
                audience=audience,
                issuer=self.url,
                leeway=LEEWAY_SECONDS,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.PyJWTError as exc:
            raise HttpError(401, f"the {what} is not valid: {_reason(exc)}") from None
        return claims


def _reason(exc: "jwt.PyJWTError") -> str:
    """What was wrong with a token, in the words of the claim that failed (never the token itself)."""
    import jwt

    reasons: dict[type[jwt.PyJWTError], str] = {
        jwt.ExpiredSignatureError: "it has expired (exp)",
        jwt.ImmatureSignatureError: "it is not valid yet (nbf)",
        jwt.InvalidAudienceError: "it is for another audience (aud)",
        jwt.InvalidIssuerError: "it is from another issuer (iss)",
        jwt.InvalidSignatureError: "its signature does not verify",
    }
    return reasons.get(type(exc), str(exc)[:200])


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def same_origin_path(next_path: str | None, home: str = "/") -> str:
    """Where to go after signing in: a path of this origin only (``/x``), never ``//host``, ``/\\host``, a scheme
    or a control character, any of which a browser could follow to another site: 400 for those."""
    if next_path is None or next_path == "":
        return home
    parts = urlsplit(next_path)
    if (
        not next_path.startswith("/")
        or next_path.startswith(("//", "/\\"))
        or "\\" in next_path
        or not next_path.isprintable()
        or parts.scheme
        or parts.netloc
    ):
        raise HttpError(400, "next must be a path of this site (starting with one '/'), not another site's address")
    return next_path


def _cookie_values(request: Request, name: str) -> list[str]:
    """Every value of cookie ``name`` in the request's Cookie lines."""
    values = []
    for line in request.header_lines(b"cookie"):
        for pair in line.decode("latin-1").split(";"):
            key, equals, value = pair.strip().partition("=")
            if equals and key == name:
                values.append(value.strip())
    return values


def login_cookie(request: Request) -> str | None:
    """The login cookie's value, if the request carries one; 400 for two (two sign-ins the browser kept apart)."""
    values = [value for value in _cookie_values(request, LOGIN_COOKIE) if value]
    if len(values) > 1:
        raise HttpError(400, f"the request carries more than one {LOGIN_COOKIE} cookie: sign out at /logout")
    return values[0] if values else None


class Verified:
    """Tokens and cookies whose signature was checked, with their claims, until their ``exp`` (a bounded
    LRU): a script's or a viewer's thousands of requests with one token cost one signature check, not
    thousands. Only what verified is kept, so a forged token is checked (and refused) every time."""

    def __init__(self, entries: int) -> None:
        self.entries = entries
        self._kept: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def get(self, credential: str) -> dict[str, Any] | None:
        claims = self._kept.get(credential)
        if claims is None:
            return None
        if claims["exp"] <= time.time():
            del self._kept[credential]
            return None
        self._kept.move_to_end(credential)
        return claims

    def put(self, credential: str, claims: dict[str, Any]) -> None:
        self._kept[credential] = claims
        if len(self._kept) > self.entries:
            self._kept.popitem(last=False)


def default_logout_dir(issuer: str, client_id: str) -> Path:
    """One directory per issuer and client in the system's temporary directory: every worker finds the same."""
    name = hashlib.sha256(f"{issuer}\0{client_id}".encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"zarr-gateway-logouts-{os.getuid()}-{name}"


class SignIn:
    """The issuer, the client and the login cookies: what :mod:`gateway.http.auth` asks for claims."""

    def __init__(
        self,
        issuer: Issuer,
        client_id: str,
        client_secret: str | None,
        audience: str,
        cookie_key: bytes,
        login_seconds: float,
        logout_dir: Path,
        origin: PublicOrigin,
        scope: str = "openid email profile",
    ) -> None:
        self.issuer = issuer
        self.client_id = client_id
        self.client_secret = client_secret
        self.audience = audience
        self.cookie_key = cookie_key
        self.login_seconds = login_seconds
        self.logout_dir = logout_dir
        self.origin = origin
        self.scope = scope
        self._verified = Verified(VERIFIED_ENTRIES)
        logout_dir.mkdir(mode=0o700, parents=True, exist_ok=True)

    # --- the checks auth.py asks for -------------------------------------------------------------

    async def bearer_claims(self, token: str) -> Mapping[str, Any]:
        """The claims of an access token the issuer signed for this gateway (each token checked once, then
        taken from :class:`Verified` until its ``exp``)."""
        known = self._verified.get(token)
        if known is None:
            known = await self.issuer.claims(token, self.audience, "bearer token")
            self._verified.put(token, known)
        return known

    def login_claims(self, cookie: str) -> Mapping[str, Any]:
        """The claims a login cookie holds: 401 if it is not one this gateway signed, has expired or was logged out."""
        session = self._verified.get(cookie)
        if session is None:
            session = self._session(cookie)
            self._verified.put(cookie, session)
        if (self.logout_dir / session["sid"]).exists():
            raise HttpError(401, "this sign-in has ended (/logout): sign in again at /login")
        claims: Mapping[str, Any] = session["claims"]
        return claims

    def _session(self, cookie: str) -> dict[str, Any]:
        import jwt

        try:
            session: dict[str, Any] = jwt.decode(
                cookie,
                self.cookie_key,
                algorithms=["HS256"],
                audience="login",
                issuer=_COOKIE_ISSUER,
                options={"require": ["exp", "iss", "aud", "sid"]},
            )
        except jwt.ExpiredSignatureError:
            raise HttpError(401, "the sign-in has expired: sign in again at /login") from None
        except jwt.PyJWTError:
            raise HttpError(401, "the login cookie is not valid: sign in again at /login") from None
        if not _SID.fullmatch(str(session["sid"])) or not isinstance(session.get("claims"), dict):
            raise HttpError(401, "the login cookie is not valid: sign in again at /login")
        return session

    @staticmethod
    def login_cookie(request: Request) -> str | None:
        return login_cookie(request)

    # --- the browser's routes ----------------------------------------------------------------------

    def _cookie(self, request: Request, name: str, value: str, path: str, max_age: int) -> str:
        """A ``Set-Cookie`` value: HttpOnly, SameSite=Lax, Secure when the site is reached over TLS; its path
        below the public URL's own path (a gateway at ``https://host/zarr`` keeps its cookies to ``/zarr/``)."""
        base, root_path = self.origin.of(request.headers, request.client)
        secure = "; Secure" if base.startswith("https://") else ""
        return f"{name}={value}; Path={root_path}{path}; Max-Age={max_age}; HttpOnly; SameSite=Lax{secure}"

    def _home(self, request: Request) -> str:
        """The gateway's landing page as the browser reaches it (below the public URL's path)."""
        return self.origin.of(request.headers, request.client)[1] + "/"

    def _redirect_uri(self, request: Request) -> str:
        base, _ = self.origin.of(request.headers, request.client)
        return base + CALLBACK_PATH

    async def login(self, request: Request) -> Answer:
        """``/login?next=PATH``: off to the issuer, with PKCE, state and nonce kept in a short-lived signed cookie."""
        import jwt

        next_path = same_origin_path(request.query("next"), self._home(request))
        metadata = await self.issuer.metadata()
        state, nonce, verifier = secrets.token_urlsafe(24), secrets.token_urlsafe(24), secrets.token_urlsafe(48)
        flow = jwt.encode(
            {
                "iss": _COOKIE_ISSUER,
                "aud": "login-flow",
                "exp": int(time.time()) + FLOW_SECONDS,
                "state": state,
                "nonce": nonce,
                "verifier": verifier,
                "next": next_path,
            },
            self.cookie_key,
            algorithm="HS256",
        )
        query = urlencode(
            {
                "response_type": "code",
                "client_id": self.client_id,
                "redirect_uri": self._redirect_uri(request),
                "scope": self.scope,
                "state": state,
                "nonce": nonce,
                "code_challenge": _b64(hashlib.sha256(verifier.encode()).digest()),
                "code_challenge_method": "S256",
            }
        )
        endpoint = metadata["authorization_endpoint"]
        location = f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"
        cookie = self._cookie(request, FLOW_COOKIE, flow, CALLBACK_PATH, FLOW_SECONDS)
        return Answer(303, raw_headers({**NO_STORE, "Location": location, "Set-Cookie": cookie}))

    def _flow(self, request: Request) -> dict[str, Any]:
        import jwt

        values = _cookie_values(request, FLOW_COOKIE)
        try:
            if len(values) != 1:
                raise jwt.InvalidTokenError("no single flow cookie")
            flow: dict[str, Any] = jwt.decode(
                values[0], self.cookie_key, algorithms=["HS256"], audience="login-flow", issuer=_COOKIE_ISSUER
            )
        except jwt.PyJWTError:
            raise HttpError(
                400, "this sign-in was not started here, or took longer than 10 minutes: start again at /login"
            ) from None
        return flow

    async def callback(self, request: Request) -> Answer:
        """``/callback``: the issuer's answer; the code exchanged (with the PKCE verifier), the ID token checked
        (and its nonce), then the login cookie and off to the path the sign-in started for."""
        import jwt

        flow = self._flow(request)
        error = request.query("error")
        if error is not None:
            raise HttpError(401, f"the OpenID issuer refused the sign-in: {error[:100]}")
        state, code = request.query("state"), request.query("code")
        if state is None or not secrets.compare_digest(state.encode(), str(flow["state"]).encode()):
            raise HttpError(400, "the sign-in's state does not match: start again at /login")
        if not code:
            raise HttpError(400, "the issuer's answer carries no code: start again at /login")
        metadata = await self.issuer.metadata()
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": self._redirect_uri(request),
            "code_verifier": str(flow["verifier"]),
            "client_id": self.client_id,
        }
        secret = None if self.client_secret is None else (self.client_id, self.client_secret)
        tokens = await anyio.to_thread.run_sync(_fetch_json, metadata["token_endpoint"], form, secret)
        id_token = tokens.get("id_token")
        if not isinstance(id_token, str):
            raise HttpError(401, "the OpenID issuer's answer holds no ID token")
        claims = await self.issuer.claims(id_token, self.client_id, "ID token")
        if not secrets.compare_digest(str(claims.get("nonce", "")).encode(), str(flow["nonce"]).encode()):
            raise HttpError(401, "the ID token's nonce is not this sign-in's")
        kept = {name: value for name, value in claims.items() if name not in _REGISTERED}
        now = int(time.time())
        value = jwt.encode(
            {
                "iss": _COOKIE_ISSUER,
                "aud": "login",
                "iat": now,
                "exp": now + int(self.login_seconds),
                "sid": secrets.token_hex(16),
                "claims": kept,
            },
            self.cookie_key,
            algorithm="HS256",
        )
        if len(value) > COOKIE_BYTES:
            raise HttpError(502, "the OpenID issuer's claims are too large for a login cookie")
        headers = [
            (b"cache-control", b"no-store"),
            (b"location", str(flow["next"]).encode("latin-1", "replace")),
            (b"set-cookie", self._cookie(request, LOGIN_COOKIE, value, "/", int(self.login_seconds)).encode()),
            (b"set-cookie", self._cookie(request, FLOW_COOKIE, "", CALLBACK_PATH, 0).encode()),
        ]
        return Answer(303, headers)

    async def logout(self, request: Request) -> Answer:
        """``/logout?next=PATH``: the sign-in ended for good (its cookie, replayed, is refused) and the cookie cleared.

        The issuer's own session is left alone: signing in again may not ask for a password there."""
        next_path = same_origin_path(request.query("next"), self._home(request))
        cookie = login_cookie(request)
        if cookie is not None:
            try:
                session = self._session(cookie)
            except HttpError:
                session = None  # expired or forged: nothing to end, the cookie is cleared all the same
            if session is not None:
                self._record_logout(str(session["sid"]), float(session["exp"]))
        cookie_line = self._cookie(request, LOGIN_COOKIE, "", "/", 0)
        return Answer(303, raw_headers({**NO_STORE, "Location": next_path, "Set-Cookie": cookie_line}))

    def _record_logout(self, sid: str, expires: float) -> None:
        """A file per ended sign-in, named by its id, kept until the cookie would have expired anyway."""
        marker = self.logout_dir / sid
        marker.touch()
        os.utime(marker, (expires, expires))
        now = time.time()
        for old in self.logout_dir.iterdir():
            try:
                if old.stat().st_mtime < now:
                    old.unlink()
            except OSError:
                pass  # another worker removed it first
