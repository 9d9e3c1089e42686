"""Sign-in with OpenID Connect against a real provider (oidc-provider, run with node): Bearer access tokens read
through every client that can send a header, the browser's sign-in (code flow with PKCE) as an HTTP client walks
it, and every forged, expired, misdirected or replayed credential refused with the reason."""

import html
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urljoin, urlsplit

import numpy as np
import pytest
import requests
import wkw
from support.clients import read_tensorstore, read_zarr_python
from support.datasets import ORG, TOKEN, WrittenDataset
from support.oidc import AUDIENCE, Provider, SigningKey, provider_at
from support.oidc import signin_settings as support_settings
from support.servers import Server

DATASET = f"/data/zarr3/{ORG}/wk_dataset"
CHUNK = f"{DATASET}/color_u8/1/c/0/2/2/1"
OTHER = "/data/zarr3/other_org/theirs/color_u8/1/zarr.json"
POLICY = {
    "tokens": {TOKEN: [f"{ORG}/*"]},
    "claims": {"groups": {"lab-a": [f"{ORG}/*"]}, "email": {"bob@elsewhere.example": ["other_org/theirs"]}},
}


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provider]:
    """The provider's address and keys; started by ``signin``, once the gateway's callback is known."""
    made = provider_at(tmp_path_factory.mktemp("oidc"))
    yield made
    made.stop()


def signin_settings(provider: Provider, directory: Path) -> dict[str, object]:
    # a rotated key counts at the first token that names it
    return {**support_settings(provider, directory, POLICY), "oidc_jwks_refresh_seconds": 0}


@pytest.fixture(scope="module")
def signin(
    provider: Provider,
    test_data: WrittenDataset,
    server_factory: Callable[..., Server],
    tmp_path_factory: pytest.TempPathFactory,
) -> Server:
    server = server_factory(test_data.root, **signin_settings(provider, tmp_path_factory.mktemp("signin")))
    provider.redirect_uris = [server.url + "/callback"]
    provider.start()
    return server


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def error_of(response: requests.Response) -> str:
    message: str = response.json()["error"]
    return message


# --- scripts: Bearer access tokens ------------------------------------------------------------------------------


@pytest.mark.slow  # tensorstore, zarr-python and webknossos-libs read with a Bearer token
def test_bearer_access_token_reads_with_every_client_that_sends_headers(
    signin: Server, provider: Provider, test_data: WrittenDataset
) -> None:
    import webknossos as wk
    from upath import UPath

    headers = bearer(provider.client_token())
    url = signin.url + f"{DATASET}/color_u8/1"
    with wkw.Dataset.open(str(test_data.root / ORG / "wk_dataset" / "color_u8" / "1")) as stored:
        truth = stored.read((0, 0, 0), (32, 32, 32))[0]
    region = (slice(0, 1), slice(0, 32), slice(0, 32), slice(0, 32))
    for name, read in (("tensorstore", read_tensorstore), ("zarr-python", read_zarr_python)):
        got = read(url, 3, headers, region)
        assert np.array_equal(got[0], truth), name
    dataset = wk.Dataset.open(UPath(signin.url + DATASET, headers=headers))
    assert "color_u8" in dataset.layers
    mag = dataset.get_layer("color_u8").get_mag(1)
    assert np.array_equal(mag.read(absolute_offset=(0, 0, 0), size=(32, 32, 32))[0], truth)


def test_claims_grant_only_their_datasets(signin: Server, provider: Provider) -> None:
    lab = bearer(provider.client_token())  # groups: lab-a
    outsider = bearer(provider.client_token("outsider", "outsider-secret"))  # groups: visitors, no email
    assert requests.get(signin.url + CHUNK, headers=lab, timeout=10).status_code == 200
    assert requests.get(signin.url + OTHER, headers=lab, timeout=10).status_code == 403
    refused = requests.get(signin.url + CHUNK, headers=outsider, timeout=10)
    assert refused.status_code == 403
    by_email = bearer(provider.forged(email="bob@elsewhere.example", groups=None))
    assert requests.get(signin.url + OTHER, headers=by_email, timeout=10).status_code == 200
    assert requests.get(signin.url + CHUNK, headers=by_email, timeout=10).status_code == 403


def test_proxy_auth_accepts_a_bearer_token(signin: Server, provider: Provider) -> None:
    token = provider.client_token()
    for headers, status in ((bearer(token), 204), (bearer(provider.forged(groups=["nobody"])), 403), ({}, 401)):
        answer = requests.get(signin.url + "/auth", headers={"X-Original-URI": CHUNK, **headers}, timeout=10)
        assert answer.status_code == status, answer.text


BAD_TOKENS: dict[str, tuple[Callable[[Provider], str], int, str]] = {
    "expired": (lambda p: p.forged(exp=int(time.time()) - 120), 401, "expired"),
    "not yet valid": (lambda p: p.forged(nbf=int(time.time()) + 600), 401, "not valid yet"),
    "other issuer": (lambda p: p.forged(iss="https://issuer.example"), 401, "another issuer"),
    "other audience": (lambda p: p.forged(aud="someone-else"), 401, "another audience"),
    "no exp": (lambda p: p.forged(exp=None), 401, "exp"),
    "key not published": (lambda p: p.forged(key=SigningKey("first")), 401, "signature does not verify"),
    "kid not published": (lambda p: p.forged(key=SigningKey("stranger")), 401, "does not publish"),
    "alg none": (lambda p: _unsigned(p), 401, "alg 'none' is not allowed"),
    "alg HS256 with the public key": (lambda p: _hmac_with_public_key(p), 401, "alg 'HS256' is not allowed"),
    "tampered claims": (lambda p: _tampered(p), 401, "signature does not verify"),
    "not a JWT": (lambda p: "opaque-access-token", 401, "not a JSON Web Token"),
    "groups a number": (lambda p: p.forged(groups=7), 401, "'groups' is neither a string nor a list"),
    "groups an object": (lambda p: p.forged(groups={"lab-a": True}), 401, "'groups' is neither"),
    "groups holds a list": (lambda p: p.forged(groups=[["lab-a"]]), 401, "'groups' is neither"),
}


def _b64(document: dict[str, Any]) -> str:
    import base64

    return base64.urlsafe_b64encode(json.dumps(document).encode()).rstrip(b"=").decode()


def _unsigned(provider: Provider) -> str:
    body = {"iss": provider.issuer, "aud": AUDIENCE, "exp": int(time.time()) + 300, "groups": ["lab-a"]}
    return f"{_b64({'alg': 'none', 'typ': 'JWT', 'kid': 'first'})}.{_b64(body)}."


def _hmac_with_public_key(provider: Provider) -> str:
    import hashlib
    import hmac

    from cryptography.hazmat.primitives import serialization

    public = (
        provider.keys[0]
        .private.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    body = {"iss": provider.issuer, "aud": AUDIENCE, "exp": int(time.time()) + 300, "groups": ["lab-a"]}
    signing = f"{_b64({'alg': 'HS256', 'typ': 'JWT', 'kid': 'first'})}.{_b64(body)}"
    import base64

    mac = base64.urlsafe_b64encode(hmac.new(public, signing.encode(), hashlib.sha256).digest()).rstrip(b"=").decode()
    return f"{signing}.{mac}"


def _tampered(provider: Provider) -> str:
    header, _, signature = provider.forged(groups=["visitors"]).split(".")
    body = {"iss": provider.issuer, "aud": AUDIENCE, "exp": int(time.time()) + 300, "groups": ["lab-a"]}
    return f"{header}.{_b64(body)}.{signature}"


@pytest.mark.parametrize("case", list(BAD_TOKENS))
def test_bad_bearer_tokens_are_401_with_the_reason(signin: Server, provider: Provider, case: str) -> None:
    make, status, words = BAD_TOKENS[case]
    answer = requests.get(signin.url + CHUNK, headers=bearer(make(provider)), timeout=10)
    assert answer.status_code == status, answer.text
    assert words in error_of(answer)
    asked = {"X-Original-URI": CHUNK, **bearer(make(provider))}
    checked = requests.get(signin.url + "/auth", headers=asked, timeout=10)
    assert checked.status_code == status


@pytest.mark.slow  # waits for a token to expire
def test_a_token_checked_once_is_refused_once_it_expires(signin: Server, provider: Provider) -> None:
    """Verified tokens are kept (one signature check for a script's many requests), never past their exp."""
    token = provider.forged(exp=int(time.time()) + 1)
    assert requests.get(signin.url + CHUNK, headers=bearer(token), timeout=10).status_code == 200
    time.sleep(1 + 5 + 1)  # past exp and the 5 s of clock skew a fresh check allows
    expired = requests.get(signin.url + CHUNK, headers=bearer(token), timeout=10)
    assert expired.status_code == 401 and "expired" in error_of(expired)


def test_two_credentials_or_a_malformed_authorization_header_are_400(signin: Server, provider: Provider) -> None:
    token = provider.client_token()
    cases = {
        "bearer and header token": {**bearer(token), "X-Auth-Token": TOKEN},
        "basic scheme": {"Authorization": "Basic dXNlcjpwYXNz"},
        "two tokens in one header": {"Authorization": f"Bearer {token}, Bearer {token}"},
        "bearer without token": {"Authorization": "Bearer "},
    }
    for case, headers in cases.items():
        answer = requests.get(signin.url + CHUNK, headers=headers, timeout=10)
        assert answer.status_code == 400, case
        assert "token" in error_of(answer).lower() or "authorization" in error_of(answer).lower()
    query = requests.get(signin.url + CHUNK, params={"token": TOKEN}, headers=bearer(token), timeout=10)
    assert query.status_code == 400
    assert "more than one token" in error_of(query)


def test_a_rotated_key_counts_at_once(signin: Server, provider: Provider) -> None:
    """The provider restarts with a new key first and the old one after it: a token of the new key is accepted
    (the gateway reads the keys again for its unknown kid), and one of the old key still is."""
    old = provider.keys[0]
    assert requests.get(signin.url + CHUNK, headers=bearer(provider.client_token()), timeout=10).status_code == 200
    provider.restart([SigningKey("second"), old])
    try:
        fresh = provider.client_token()
        assert '"kid":"second"' in _header_json(fresh)
        assert requests.get(signin.url + CHUNK, headers=bearer(fresh), timeout=10).status_code == 200
        assert requests.get(signin.url + CHUNK, headers=bearer(provider.forged(key=old)), timeout=10).status_code == 200
    finally:
        provider.restart([old])


def _header_json(token: str) -> str:
    import base64

    part = token.split(".")[0]
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)).decode().replace(" ", "")


# --- browsers: /login, /callback, /logout -----------------------------------------------------------------------


def sign_in(server: Server, account: str, next_path: str = "/") -> requests.Session:
    """Sign in as a browser would, with the provider's own login form: a session holding the login cookie."""
    session = requests.Session()
    form_page = session.get(server.url + "/login", params={"next": next_path}, timeout=30)
    assert form_page.status_code == 200, form_page.text
    action = html.unescape(re.search(r'<form[^>]*action="([^"]+)"', form_page.text)[1])  # type: ignore[index]
    landed = session.post(urljoin(form_page.url, action), data={"prompt": "login", "login": account, "password": "x"})
    assert landed.status_code == 200, landed.text
    assert landed.url == server.url + next_path
    return session


def login_value(session: requests.Session) -> str:
    value = session.cookies.get("zg_login")
    assert value is not None
    return value


def test_sign_in_sets_a_login_cookie_that_reads_pages_and_data(signin: Server) -> None:
    session = sign_in(signin, "ada", f"{DATASET}/")
    cookie = next(c for c in session.cookies if c.name == "zg_login")
    assert cookie.has_nonstandard_attr("HttpOnly") and cookie.path == "/" and not cookie.secure
    assert cookie.expires is not None and cookie.expires > time.time()
    assert session.get(signin.url + CHUNK, timeout=10).status_code == 200
    assert session.get(signin.url + OTHER, timeout=10).status_code == 403
    landing = session.get(signin.url + "/", timeout=10).text
    assert "wk_dataset" in landing and "token=" not in landing and "/t/" not in landing
    checked = session.get(signin.url + "/auth", headers={"X-Original-URI": CHUNK}, timeout=10)
    assert checked.status_code == 204


def test_the_401_page_offers_sign_in_first(signin: Server, tmp_path: Path) -> None:
    """With an issuer, a browser refused for want of a credential is offered the sign-in, back to this very page,
    beside a token in each form (no share link: this gateway has no key); through the proxy too."""
    from support.proxy import address, start_proxy

    proxy = start_proxy(tmp_path / "nginx", [address(signin)])
    try:
        for base in (signin.url, proxy.url):
            page = requests.get(base + DATASET + "/", headers={"Accept": "text/html"}, timeout=30)
            assert page.status_code == 401 and page.headers["content-type"].startswith("text/html"), page.text[:300]
            ways = html.unescape(page.text.split('<ul class="sign-in">', 1)[1].split("</ul>", 1)[0])
            login = f'<a class="login" href = "/login?next={DATASET}/">Sign in</a>'
            assert ways.startswith(f"<li>{login}"), ways
            assert f"{DATASET}/?token=YOUR_TOKEN" in ways and f"/t/YOUR_TOKEN{DATASET}/" in ways, ways
            assert "share link" not in ways
        followed = requests.get(signin.url + f"/login?next={DATASET}/", allow_redirects=False, timeout=30)
        assert followed.status_code == 303 and followed.headers["location"].startswith(signin.url.split(":")[0])
    finally:
        proxy.stop()


@pytest.mark.slow  # a crawl of every page, listing and document
def test_every_link_a_signed_in_browser_reaches_opens_with_the_cookie_alone(signin: Server) -> None:
    """From the start page, every page, listing (the precomputed tree's too), file, preview and viewer address a
    signed-in browser can click answers with the login cookie the browser sends, and none carries a token."""
    from support.crawl import walk

    session = sign_in(signin, "ada")
    seen = walk(session, signin.url, ["/"])
    assert not seen.failures(), seen.failures()
    carrying = [address for address in seen.statuses if "token=" in address or "/t/" in address or "/s/" in address]
    assert not carrying, carrying
    reached = {address.split("/data/", 1)[-1] for address in seen.statuses}
    deep = {
        f"precomputed/{ORG}/wk_dataset/segmentation/mesh/",
        f"precomputed/{ORG}/wk_dataset/color_u8/1/",
        f"zarr3/{ORG}/wk_dataset/color_u8/1/zarr.json",
        f"zarr/{ORG}/wk_dataset/segmentation/2-2-1/.zarray",
    }
    assert deep <= reached, sorted(reached)
    assert "other_org" not in " ".join(reached), "the claims grant lab-a's datasets only"


def test_the_landing_page_without_a_credential_says_where_to_sign_in(signin: Server) -> None:
    page = requests.get(signin.url + "/", timeout=10)
    assert page.status_code == 200 and "wk_dataset" not in page.text
    assert "Sign in at /login" in html.unescape(page.text)
    refused = requests.get(signin.url + CHUNK, timeout=10)
    assert refused.status_code == 401 and "sign in at /login" in error_of(refused)


def test_the_login_redirect_carries_pkce_state_and_nonce(signin: Server) -> None:
    answer = requests.get(signin.url + "/login", params={"next": "/data/"}, allow_redirects=False, timeout=30)
    assert answer.status_code == 303
    query = parse_qs(urlsplit(answer.headers["Location"]).query)
    assert query["code_challenge_method"] == ["S256"] and len(query["code_challenge"][0]) == 43
    assert query["state"][0] and query["nonce"][0] and query["redirect_uri"] == [signin.url + "/callback"]
    flow = answer.headers["Set-Cookie"]
    assert "zg_login_flow=" in flow and "HttpOnly" in flow and "SameSite=Lax" in flow and "Path=/callback" in flow
    assert query["state"][0] not in flow and query["nonce"][0] not in flow  # the cookie is signed, not plain


def test_a_cookie_after_logout_is_refused(signin: Server) -> None:
    session = sign_in(signin, "ada")
    value = login_value(session)
    assert requests.get(signin.url + CHUNK, cookies={"zg_login": value}, timeout=10).status_code == 200
    out = session.get(signin.url + "/logout", allow_redirects=False, timeout=10)
    assert out.status_code == 303 and "zg_login=;" in out.headers["Set-Cookie"]
    replayed = requests.get(signin.url + CHUNK, cookies={"zg_login": value}, timeout=10)
    assert replayed.status_code == 401
    assert "/logout" in error_of(replayed)
    checked = requests.get(signin.url + "/auth", headers={"X-Original-URI": CHUNK}, cookies={"zg_login": value})
    assert checked.status_code == 401


OTHER_KEY = "not-the-gateway-key-but-long-enough-for-hs256"


def test_forged_and_expired_cookies_are_refused(signin: Server, provider: Provider) -> None:
    import jwt

    session = sign_in(signin, "ada")
    value = login_value(session)
    header, body, signature = value.split(".")
    claims = json.loads(_header_json(f"{body}.x"))
    claims["claims"]["groups"] = ["lab-a", "other"]
    cases = {
        "tampered": f"{header}.{_b64(claims)}.{signature}",
        "signed by another key": jwt.encode(claims, OTHER_KEY, algorithm="HS256"),
        "expired": jwt.encode({**claims, "exp": int(time.time()) - 10}, OTHER_KEY, algorithm="HS256"),
        "an access token": provider.client_token(),
        "garbage": "x",
    }
    for case, cookie in cases.items():
        answer = requests.get(signin.url + CHUNK, cookies={"zg_login": cookie}, timeout=10)
        assert answer.status_code == 401, case
        assert "sign in again at /login" in error_of(answer), case


def test_an_explicit_token_wins_over_the_login_cookie(signin: Server, provider: Provider) -> None:
    """The browser sends the cookie unasked; a token in the request is the one that counts (see the README)."""
    session = sign_in(signin, "bob")  # bob's email grants other_org/theirs only
    assert session.get(signin.url + CHUNK, timeout=10).status_code == 403
    assert session.get(signin.url + CHUNK, params={"token": TOKEN}, timeout=10).status_code == 200
    assert session.get(signin.url + OTHER, params={"token": TOKEN}, timeout=10).status_code == 403
    assert session.get(signin.url + CHUNK, headers=bearer(provider.client_token()), timeout=10).status_code == 200
    twice = requests.get(signin.url + CHUNK, headers={"Cookie": "zg_login=a; zg_login=b"}, timeout=10)
    assert twice.status_code == 400


@pytest.mark.parametrize(
    "next_path", ["//evil.example/", "https://evil.example/", "/\\evil.example", "evil.example", "/\r\nSet-Cookie:x"]
)
def test_login_next_is_a_path_of_this_site_only(signin: Server, next_path: str) -> None:
    answer = requests.get(signin.url + "/login", params={"next": next_path}, allow_redirects=False, timeout=10)
    assert answer.status_code == 400, next_path
    assert "path of this site" in error_of(answer)
    assert "Location" not in answer.headers


def test_callback_without_a_started_sign_in_another_state_or_a_refusal_is_refused(signin: Server) -> None:
    answer = requests.get(signin.url + "/callback", params={"code": "x", "state": "y"}, timeout=10)
    assert answer.status_code == 400 and "start again at /login" in error_of(answer)
    session = requests.Session()
    session.get(signin.url + "/login", allow_redirects=False, timeout=30)
    wrong = session.get(signin.url + "/callback", params={"code": "x", "state": "not-the-state"}, timeout=10)
    assert wrong.status_code == 400 and "state does not match" in error_of(wrong)
    started = session.get(signin.url + "/login", allow_redirects=False, timeout=30)
    denied = session.get(signin.url + "/callback", params={"error": "access_denied", "state": _state(started)})
    assert denied.status_code == 401 and "refused the sign-in: access_denied" in error_of(denied)
    unknown_code = session.get(signin.url + "/callback", params={"code": "forged", "state": _state(started)})
    assert unknown_code.status_code == 401 and "refused the sign-in" in error_of(unknown_code)


def test_provider_unreachable_keeps_signed_in_users_and_refuses_new_sign_ins_with_503(
    signin: Server, provider: Provider
) -> None:
    session = sign_in(signin, "ada")
    token = provider.client_token()
    assert requests.get(signin.url + CHUNK, headers=bearer(token), timeout=10).status_code == 200
    keys = provider.keys
    provider.stop()
    try:
        assert session.get(signin.url + CHUNK, timeout=10).status_code == 200  # the cookie needs no provider
        assert requests.get(signin.url + CHUNK, headers=bearer(token), timeout=10).status_code == 200  # a known key
        unknown = requests.get(signin.url + CHUNK, headers=bearer(provider.forged(key=SigningKey("new"))), timeout=10)
        assert unknown.status_code == 503  # the keys read before stay; whether the issuer has this one is unknown
        fresh = requests.Session()
        started = fresh.get(signin.url + "/login", allow_redirects=False, timeout=30)
        assert started.status_code == 303  # the discovery document is kept: off to the issuer, which is away
        code = fresh.get(signin.url + "/callback", params={"code": "c", "state": _state(started)}, timeout=30)
        assert code.status_code == 503 and "cannot be reached" in error_of(code)
        assert code.headers["Retry-After"]
    finally:
        provider.restart(keys)


def _state(answer: requests.Response) -> str:
    return parse_qs(urlsplit(answer.headers["Location"]).query)["state"][0]


def test_a_gateway_that_never_reached_the_provider_answers_503_for_sign_in(
    test_data: WrittenDataset, server_factory: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory
) -> None:
    directory = tmp_path_factory.mktemp("away")
    away = provider_at(directory)  # never started
    server = server_factory(test_data.root, **signin_settings(away, directory))
    login = requests.get(server.url + "/login", allow_redirects=False, timeout=30)
    assert login.status_code == 503 and "cannot be reached" in error_of(login)
    token = requests.get(server.url + CHUNK, headers=bearer(away.forged()), timeout=30)
    assert token.status_code == 503
    assert requests.get(server.url + CHUNK, headers={"X-Auth-Token": TOKEN}, timeout=10).status_code == 200


# --- the proxy in front (deploy/nginx.conf) ----------------------------------------------------------------------


@pytest.mark.nginx
def test_the_proxy_checks_and_caches_sign_in_credentials_apart(
    signin: Server, provider: Provider, tmp_path: Path
) -> None:
    """Through the compose proxy, with its token-check cache on: a Bearer token and a login cookie read, and a
    request with another credential never reuses their cached grant (the key holds each credential)."""
    from support.proxy import address, start_proxy

    proxy = start_proxy(tmp_path / "nginx", [address(signin)], PROXY_AUTH_CACHE_TIME="60s")
    try:
        token = provider.client_token()
        cookie = login_value(sign_in(signin, "ada"))
        for _ in range(2):  # the second time from the proxy's cache
            assert requests.get(proxy.url + CHUNK, headers=bearer(token), timeout=10).status_code == 200
            assert requests.get(proxy.url + CHUNK, cookies={"zg_login": cookie}, timeout=10).status_code == 200
        others = {
            "forged bearer": bearer(provider.forged(key=SigningKey("first"))),
            "no groups": bearer(provider.forged(groups=None)),
            "forged cookie": {"Cookie": f"zg_login={cookie[:-2]}xx"},
            "nothing": {},
        }
        for case, headers in others.items():
            answer = requests.get(proxy.url + CHUNK, headers=headers, timeout=10)
            assert answer.status_code in (400, 401, 403), case
        assert requests.get(proxy.url + CHUNK, headers=bearer(token), timeout=10).status_code == 200
        spaced = {"Authorization": f"Bearer  {token}"}  # the same token (RFC 6750 allows blanks), a key of its own
        assert requests.get(proxy.url + CHUNK, headers=spaced, timeout=10).status_code == 200
        # sign-in's own routes pass the proxy unchecked
        started = requests.get(proxy.url + "/login", allow_redirects=False, timeout=30)
        assert started.status_code == 303 and started.headers["Location"].startswith(provider.issuer)
        assert requests.get(proxy.url + "/logout", allow_redirects=False, timeout=10).status_code == 303
        back = requests.get(proxy.url + "/callback", params={"code": "x", "state": "y"}, timeout=10)
        assert back.status_code == 400 and "start again at /login" in error_of(back), back.text  # the gateway's
    finally:
        proxy.stop()


def test_cookies_are_secure_behind_tls_and_kept_below_the_public_path(
    signin: Server,
    provider: Provider,
    test_data: WrittenDataset,
    server_factory: Callable[..., Server],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    directory = tmp_path_factory.mktemp("tls")
    behind_tls = server_factory(
        test_data.root, public_url="https://zarr.example.org/lab", **signin_settings(provider, directory)
    )
    started = requests.get(behind_tls.url + "/login", allow_redirects=False, timeout=30)
    assert started.status_code == 303, started.text
    assert "; Secure" in started.headers["Set-Cookie"]
    assert "; Path=/lab/callback;" in started.headers["Set-Cookie"]  # below the public URL's path
    redirect = parse_qs(urlsplit(started.headers["Location"]).query)["redirect_uri"]
    assert redirect == ["https://zarr.example.org/lab/callback"]
    plain = requests.get(signin.url + "/login", allow_redirects=False, timeout=30)
    assert "Secure" not in plain.headers["Set-Cookie"]


@pytest.mark.parametrize(
    "settings, words",
    [
        ({"oidc_issuer": "http://idp.example.org"}, "https URL"),
        ({"oidc_issuer": "https://idp.example.org"}, "needs oidc_client_id and tokens_file"),
        ({"oidc_issuer": "https://idp.example.org", "oidc_client_id": "c", "tokens_file": "t.json"}, "public"),
    ],
)
def test_incomplete_sign_in_settings_are_refused(tmp_path: Path, settings: dict[str, str], words: str) -> None:
    from pydantic import ValidationError

    from gateway.settings import Settings

    with pytest.raises(ValidationError, match=words):
        Settings.model_validate({"root": str(tmp_path), **settings})


def test_start_up_refuses_an_unreadable_or_empty_secret_file(tmp_path: Path, test_data: WrittenDataset) -> None:
    import subprocess
    import sys

    from support.processes import free_port

    settings = support_settings(provider_at(tmp_path), tmp_path, POLICY)
    (tmp_path / "empty").write_text("\n")
    for secret, words in ((tmp_path / "absent", "cannot be read"), (tmp_path / "empty", "is empty")):
        flags = [f"--{name.replace('_', '-')}={value}" for name, value in settings.items()]
        command = [sys.executable, "-m", "gateway", "serve", "--root", str(test_data.root), "--port", str(free_port())]
        command += [*flags, f"--oidc-client-secret-file={secret}"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZARR_GATEWAY_")}
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode != 0 and "oidc_client_secret_file" in done.stderr and words in done.stderr, done.stderr


@pytest.mark.nginx
def test_the_proxy_limits_the_rate_per_bearer_token(signin: Server, provider: Provider, tmp_path: Path) -> None:
    """PROXY_RATE_LIMIT_PER=token counts a Bearer token (and a login cookie) as it counts a token: one
    script's burst leaves another's, from the same address, untouched."""
    from support.proxy import address, start_proxy

    proxy = start_proxy(
        tmp_path / "nginx",
        [address(signin)],
        PROXY_RATE_LIMIT_PER="token",
        PROXY_RATE_LIMIT="5r/s",
        PROXY_RATE_BURST="10",
    )
    try:
        busy, other = bearer(provider.client_token()), bearer(provider.forged(sub="another-script"))
        statuses = [requests.get(proxy.url + CHUNK, headers=busy, timeout=10).status_code for _ in range(40)]
        assert 429 in statuses and statuses[:10] == [200] * 10, statuses
        assert requests.get(proxy.url + CHUNK, headers=other, timeout=10).status_code == 200
    finally:
        proxy.stop()


def test_without_sign_in_authorization_and_cookies_are_not_read(gateway: Server) -> None:
    """A gateway with no issuer reads neither (a client may send an Authorization header for its own reasons)."""
    foreign = {"Authorization": "Basic dXNlcjpwYXNz", "Cookie": "zg_login=x; zg_login=y"}
    assert requests.get(gateway.url + CHUNK, headers={**foreign, "X-Auth-Token": TOKEN}, timeout=10).status_code == 200
    alone = requests.get(gateway.url + CHUNK, headers=bearer("a.b.c"), timeout=10)
    assert alone.status_code == 401 and "/login" not in error_of(alone)
    assert requests.get(gateway.url + "/login", timeout=10).status_code == 404


# CloudVolume's middleauth+https protocol (CloudFiles' CaveInterface) sends "Authorization: Bearer <token>" with
# the token of its secrets file; it reads over https only, so it reads through the compose proxy's TLS listener.
CLOUDVOLUME_READ = """
import sys
import numpy as np
from cloudvolume import CloudVolume

url, out = sys.argv[1], sys.argv[2]
volume = CloudVolume(url, mip=0, fill_missing=False, progress=False, parallel=1, cache=False)
np.save(out, np.asarray(volume[40:104, 30:94, 10:42]))
"""


@pytest.mark.nginx
def test_cloudvolume_reads_the_precomputed_tree_with_a_bearer_token_over_middleauth(
    signin: Server, provider: Provider, test_data: WrittenDataset, tmp_path: Path
) -> None:
    """``precomputed://middleauth+https://HOST/data/precomputed/...`` with the issuer's access token in
    CloudVolume's ``{host}-cave-secret.json``: a cut-out voxel for voxel, the gateway asked nothing but the
    precomputed tree (middleauth makes no requests of its own); without the secret the read is refused."""
    import shutil
    import subprocess
    import sys

    from support.https import make_certificate
    from support.processes import free_port, wait_until
    from support.proxy import address, start_proxy

    certificate = make_certificate(tmp_path / "ca")
    tls = tmp_path / "proxy-tls"
    tls.mkdir()
    shutil.copy(certificate.cert, tls / "tls.crt")
    shutil.copy(certificate.key, tls / "tls.key")
    port = free_port()
    proxy = start_proxy(
        tmp_path / "nginx",
        [address(signin)],
        PROXY_TLS="on",
        PROXY_TLS_LISTEN=f"127.0.0.1:{port}",
        PROXY_TLS_DIR=str(tls),
    )
    home = tmp_path / "home"  # CloudVolume's secrets: ~/.cloudvolume/secrets, or $CLOUD_VOLUME_DIR/secrets
    secrets = home / ".cloudvolume" / "secrets"
    secrets.mkdir(parents=True)
    env = {**os.environ, "HOME": str(home), "REQUESTS_CA_BUNDLE": str(certificate.authority)}
    env.pop("CLOUD_VOLUME_DIR", None)
    url = f"precomputed://middleauth+https://127.0.0.1:{port}/data/precomputed/{ORG}/wk_dataset/color_u8"
    out = tmp_path / "cutout.npy"

    def read() -> "subprocess.CompletedProcess[str]":
        command = [sys.executable, "-c", CLOUDVOLUME_READ, url, str(out)]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)

    before = len(signin.access_lines())
    try:
        refused = read()
        assert refused.returncode != 0 and "401" in refused.stderr, refused.stderr[-2000:]
        (secrets / f"127.0.0.1:{port}-cave-secret.json").write_text(json.dumps({"token": provider.client_token()}))
        done = read()
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        proxy.stop()
    with wkw.Dataset.open(str(test_data.root / ORG / "wk_dataset" / "color_u8" / "1")) as stored:
        truth = stored.read((40, 30, 10), (64, 64, 32))
    cutout = np.load(out)
    assert cutout.shape == (64, 64, 32, 1) and cutout.any()
    np.testing.assert_array_equal(cutout[..., 0], truth[0])
    info = f"/data/precomputed/{ORG}/wk_dataset/color_u8/info"
    assert wait_until(lambda: info in [line["path"] for line in signin.access_lines()[before:]], 10)
    asked = {line["path"] for line in signin.access_lines()[before:]}
    assert all(path == "/auth" or path.startswith("/data/precomputed/") for path in asked), asked
