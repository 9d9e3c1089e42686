"""The docker compose deployment, checked without Docker.

deploy/nginx.conf, the very file docker-compose.yml mounts as the nginx image's template, is rendered
the way the image's envsubst renders it and run by Debian's nginx (installed by
scripts/install-system-packages) in front of two gateway processes on loopback. docker-compose.yml is
validated by Debian's docker-compose, which needs no engine.
"""

import json
import os
import re
import select
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import yaml
from support import auth_walk
from support.clients import read_webknossos_mags
from support.datasets import (
    ORG,
    OTHER_TOKEN,
    REPEATED_TOKENS,
    TOKEN,
    TOKEN_PATH_SPELLINGS,
    TOKEN_SPELLINGS,
    Spelling,
    WrittenDataset,
    mag_name,
    v2_chunk_paths,
)
from support.processes import free_port, raw_exchange, wait_until
from support.proxy import TMPFS, Proxy, address, nginx_version, start_proxy, tool
from support.servers import Server

from deploy.render import (
    COMPOSE,
    DEPLOY,
    TEMPLATE,
    TEMPLATES,
    compose,
    compose_defaults,
    render,
    write_proxy_config,
)
from gateway.settings import Settings

ENV_EXAMPLE = DEPLOY / ".env.example"
DATASET = f"/data/zarr/{ORG}/wk_dataset"
THEIRS = "/data/zarr/other_org/theirs"
HEADERS = {"X-Auth-Token": TOKEN}


def template_names() -> set[str]:
    """The PROXY_* names of every template the proxy renders (nginx.conf and what it includes)."""
    return {name for path in TEMPLATES.values() for name in re.findall(r"\$\{?(PROXY_[A-Z0-9_]+)\}?", path.read_text())}


# --- nginx in front of gateways --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pair(test_data: WrittenDataset, tokens_file: Path, server_factory: Callable[..., Server]) -> list[Server]:
    return [server_factory(test_data.root, tokens_file=tokens_file) for _ in range(2)]


@pytest.fixture(scope="module")
def proxy(pair: list[Server], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    # These tests count what reaches the gateways: no answer cache (tests/test_proxy_cache.py tests it).
    started = start_proxy(tmp_path_factory.mktemp("nginx"), [address(s) for s in pair], PROXY_ANSWER_CACHE_TIME="0")
    yield started
    started.stop()


# --- authentication at the proxy ----------------------------------------------------------------------

PROTECTED = [
    f"{DATASET}/color_u8/1/0.2.2.1",
    f"/data/zarr3/{ORG}/wk_dataset/color_u8/1/c/0/2/2/1",
    f"{DATASET}/color_u8/1/.zarray",
    f"{DATASET}/datasource-properties.json",
    f"{DATASET}/",
    f"/data/zarr/{ORG}/",
    "/data/zarr/",
    "/",
]


@pytest.mark.nginx
def test_requests_without_a_valid_token_never_reach_a_data_route(proxy: Proxy, pair: list[Server]) -> None:
    before = [len(s.access_lines()) for s in pair]
    cases: list[tuple[str, dict[str, Any], dict[str, Any], int]] = []
    for path in PROTECTED:
        cases.append((path, {}, {}, 401))
        cases.append((path, {"X-Auth-Token": "not-a-token"}, {}, 401))
        cases.append((path, {}, {"token": TOKEN[:-1]}, 401))
    for path in PROTECTED[:6]:  # dataset and organization level of test_org
        cases.append((path, {"X-Auth-Token": OTHER_TOKEN}, {}, 403))
        cases.append((path, {}, {"token": OTHER_TOKEN}, 403))
    for path in (f"{THEIRS}/color_u8/1/0.2.2.1", f"{THEIRS}/datasource-properties.json"):
        cases.append((path, HEADERS, {}, 403))
        cases.append((path, {}, {"token": TOKEN}, 403))
    for path, headers, params, status in cases:
        for method in ("GET", "HEAD"):
            response = requests.request(method, proxy.url + path, headers=headers, params=params, timeout=10)
            assert response.status_code == status, (method, path, headers, params)
            if method == "GET":
                assert response.json()["status"] == status

    def seen() -> list[dict[str, Any]]:
        return [line for s, n in zip(pair, before) for line in s.access_lines()[n:]]

    assert wait_until(lambda: len(seen()) > 0), "the requests were checked by a gateway's /auth"
    time.sleep(0.2)
    assert {line["path"] for line in seen()} == {"/auth"}, "a refused request reached a gateway route"
    assert len(seen()) < 2 * len(cases), "refusals are cached: repeated requests are not checked again"


@pytest.mark.nginx
def test_a_valid_token_passes_in_the_header_or_the_query(proxy: Proxy) -> None:
    chunk = f"{DATASET}/color_u8/1/0.2.2.1"
    direct = requests.get(proxy.url + chunk, headers=HEADERS, timeout=10)
    assert direct.status_code == 200 and len(direct.content) > 0
    query = requests.get(proxy.url + chunk, params={"token": TOKEN}, timeout=10)
    assert query.status_code == 200 and query.content == direct.content
    theirs = requests.get(f"{proxy.url}{THEIRS}/color_u8/1/0.2.2.1", params={"token": OTHER_TOKEN}, timeout=10)
    assert theirs.status_code == 200
    listing = requests.get(proxy.url + "/data/zarr/", headers={"X-Auth-Token": OTHER_TOKEN}, timeout=10)
    assert listing.status_code == 200
    assert "other_org" in listing.text and ORG not in listing.text  # the gateway filters listings per token


@pytest.mark.nginx
@pytest.mark.parametrize(
    "path", ["/auth", "/auth?token=x", "/metrics", "/readyz", "/%61uth", "//auth", "/data/../auth", "/x/../metrics"]
)
def test_internal_endpoints_are_not_reachable_through_the_proxy(proxy: Proxy, path: str) -> None:
    response = requests.get(proxy.url + path, headers=HEADERS, timeout=10)
    # a token in the header and one in the query are two tokens: refused before any route
    assert response.status_code == (400 if "token=" in path else 404)
    assert b"zarr_gateway_requests" not in response.content


@pytest.mark.nginx
def test_dot_segments_cannot_reach_another_organization(proxy: Proxy) -> None:
    for path in (
        f"{DATASET}/../../other_org/theirs/datasource-properties.json",
        f"{DATASET}/%2e%2e/%2e%2e/other_org/theirs/datasource-properties.json",
        f"{DATASET}/..%2F..%2Fother_org/theirs/datasource-properties.json",
        f"/data/zarr/{ORG}/%2e%2e/other_org/theirs/datasource-properties.json",
    ):
        response = requests.get(proxy.url + path, headers=HEADERS, timeout=10)
        assert response.status_code in (400, 403, 404), path
        assert b"dataLayers" not in response.content


@pytest.mark.nginx
def test_the_proxy_decides_every_place_of_the_url_table_as_the_gateway_does(
    test_data: WrittenDataset, tokens_file: Path, server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    """The walk of tests/test_ops.py (every place of the URL table, hostile spellings of paths to it) through nginx:
    what the proxy lets through is what the gateway's /auth lets through, answered by the route as it answers
    directly; what it refuses for the credential, /auth refuses alike. A gateway and a proxy of its own: the walk's
    paths that are not UTF-8 stay out of the logs the other tests read."""
    gateway = server_factory(test_data.root, tokens_file=tokens_file)
    proxy = start_proxy(tmp_path / "nginx", [address(gateway)], PROXY_ANSWER_CACHE_TIME="0")
    walked = [case for case in auth_walk.cases() if case.method == "GET"]  # nginx answers a POST but /share/ itself
    found: Counter[int] = Counter()
    disagreements = []
    try:
        for case in walked:
            auth = auth_walk.auth_of(gateway.url, case).status
            route = auth_walk.exchange(gateway.url, case.method, case.uri, case.headers)
            through = auth_walk.exchange(proxy.url, case.method, case.uri, case.headers)
            found[through.status] += 1
            why = auth_walk.proxy_disagreement(case, auth, route, through)
            if why is not None:
                disagreements.append(why)
    finally:
        proxy.stop()
    assert not disagreements, f"{len(disagreements)} of {len(walked)}:\n" + "\n".join(disagreements[:20])
    assert {200, 400, 401, 403, 404} <= set(found), found  # the walk met every kind of answer


@pytest.mark.nginx
def test_the_proxy_health_check_needs_no_token(proxy: Proxy) -> None:
    response = requests.get(proxy.url + "/healthz", timeout=10)
    assert response.status_code == 200 and response.json() == {"status": "ok"}


# --- token checks cached at the proxy ---------------------------------------------------------------------


def _data_and_auth(servers: list[Server], marker: str) -> tuple[int, int]:
    """How many requests whose id starts with ``marker`` reached the gateways' data routes, and /auth."""
    lines = [line for s in servers for line in s.access_lines() if line["request_id"].startswith(marker)]
    return sum(line["path"] != "/auth" for line in lines), sum(line["path"] == "/auth" for line in lines)


@pytest.mark.nginx
def test_a_data_request_costs_one_gateway_request(pair: list[Server], tmp_path: Path) -> None:
    # the shipped defaults, an empty cache, no answer cache (each path is asked for twice)
    fresh = start_proxy(tmp_path, [address(s) for s in pair], PROXY_ANSWER_CACHE_TIME="0")
    cache_seconds = int(compose_defaults()["PROXY_AUTH_CACHE_TIME"].removesuffix("s"))
    paths = v2_chunk_paths(DATASET, ("color_u8", "rgb"))
    started = time.monotonic()
    try:
        with requests.Session() as session:
            for number, path in enumerate(paths):
                for params, headers in (({}, HEADERS), ({"token": TOKEN}, {})):
                    request_id = f"steady-{number}-{len(params)}"
                    response = session.get(
                        fresh.url + path, params=params, headers={**headers, "X-Request-Id": request_id}, timeout=10
                    )
                    assert response.status_code == 200, path
    finally:
        fresh.stop()
    # each way of sending the token is checked once, and again each time its cached answer expires
    checks_allowed = 2 * (1 + int((time.monotonic() - started) // cache_seconds))
    data_requests = 2 * len(paths)
    assert wait_until(lambda: _data_and_auth(pair, "steady-")[0] == data_requests)
    time.sleep(0.2)
    data, checks = _data_and_auth(pair, "steady-")
    assert data == data_requests and 2 <= checks <= checks_allowed, (data, checks)


@pytest.mark.nginx
def test_the_token_never_lands_on_disk(proxy: Proxy) -> None:
    for params, headers in (({"token": TOKEN}, {}), ({}, HEADERS)):
        assert (
            requests.get(f"{proxy.url}{DATASET}/.zgroup", params=params, headers=headers, timeout=10).status_code == 200
        )
    cached = [path for path in proxy.auth_cache.rglob("*") if path.is_file()]
    assert cached and any(TOKEN.encode() in path.read_bytes() for path in cached), "nginx keeps its keys in clear"
    mounts = {line.split()[1]: line.split()[2] for line in Path("/proc/mounts").read_text().splitlines()}
    assert mounts[str(TMPFS)] == "tmpfs", "the cache with the tokens in its keys lives in memory"
    for path in proxy.directory.rglob("*"):  # the proxy's logs and temporary files, on disk
        assert not path.is_file() or TOKEN.encode() not in path.read_bytes(), path


@pytest.fixture
def editable_tokens(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tokens": {TOKEN: [f"{ORG}/*"]}}))
    return path


def _write_tokens(path: Path, tokens: dict[str, list[str]] | str) -> None:
    """Replace the file as an editor or a deploy script does: a new file renamed over the old one."""
    staged = path.with_suffix(".new")
    staged.write_text(tokens if isinstance(tokens, str) else json.dumps({"tokens": tokens}))
    staged.replace(path)


AUTH_CACHE_TIME = 2  # seconds, for the tests that wait for cached decisions to expire


@pytest.mark.nginx
def test_cached_token_checks_follow_the_tokens_file(
    test_data: WrittenDataset, editable_tokens: Path, server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    gateway = server_factory(test_data.root, tokens_file=editable_tokens, tokens_reload_seconds=0.2)
    proxy = start_proxy(tmp_path / "nginx", [address(gateway)], PROXY_AUTH_CACHE_TIME=f"{AUTH_CACHE_TIME}s")
    chunk = f"{proxy.url}{DATASET}/color_u8/1/0.2.2.1"
    newcomer = "a-token-granted-later"
    counter = iter(range(10**6))

    def get(token: str, marker: str) -> int:
        headers = {"X-Auth-Token": token, "X-Request-Id": f"{marker}-{next(counter)}"}
        return requests.get(chunk, headers=headers, timeout=10).status_code

    try:
        assert get(TOKEN, "first") == 200
        assert get(newcomer, "refused") == 401
        # granted: accepted once the gateway has re-read the file and the proxy's cached 401 has expired
        _write_tokens(editable_tokens, {TOKEN: [f"{ORG}/*"], newcomer: [f"{ORG}/*"]})
        assert wait_until(lambda: get(newcomer, "granted") == 200, timeout=AUTH_CACHE_TIME + 10)
        # revoked: refused by the gateway at once, and after the cache time by the proxy itself
        _write_tokens(editable_tokens, {newcomer: [f"{ORG}/*"]})
        assert wait_until(lambda: get(TOKEN, "revoked") == 401, timeout=AUTH_CACHE_TIME + 10)
        time.sleep(AUTH_CACHE_TIME + 1.2)  # nginx counts whole seconds
        assert get(TOKEN, "after-expiry") == 401
        assert wait_until(lambda: _data_and_auth([gateway], "after-expiry") == (0, 1)), _data_and_auth(
            [gateway], "after-expiry"
        )
        # a file that no longer parses: the gateway keeps the last good tokens, the proxy asks it again
        _write_tokens(editable_tokens, "{not json")
        time.sleep(AUTH_CACHE_TIME + 1.2)  # nginx counts whole seconds
        assert get(newcomer, "broken-file") == 200
        assert wait_until(lambda: _data_and_auth([gateway], "broken-file") == (1, 1)), "checked afresh, and passed"
        assert get(TOKEN, "broken-file-revoked") == 401
    finally:
        proxy.stop()


@pytest.mark.nginx
def test_token_checks_can_be_switched_off(proxy: Proxy, pair: list[Server], tmp_path: Path) -> None:
    uncached = start_proxy(tmp_path, [address(s) for s in pair], PROXY_AUTH_CACHE_TIME="0", PROXY_ANSWER_CACHE_TIME="0")
    try:
        for number in range(5):
            headers = {**HEADERS, "X-Request-Id": f"uncached-{number}"}
            assert requests.get(f"{uncached.url}{DATASET}/.zgroup", headers=headers, timeout=10).status_code == 200
        assert wait_until(lambda: _data_and_auth(pair, "uncached-") == (5, 5))
    finally:
        uncached.stop()


@pytest.mark.nginx
@pytest.mark.parametrize(
    "path",
    [
        f"{DATASET}/%2e%2e/%2e%2e/other_org/theirs/.zgroup",
        f"{DATASET}/./.zgroup",
        f"{DATASET}//.zgroup",
        "/data/zarr/other_org/theirs/.zgroup?probe=x|y",
    ],
)
def test_unusual_uris_are_checked_afresh(proxy: Proxy, pair: list[Server], path: str) -> None:
    """No cache entry is shared by two URIs the gateway might judge differently: odd ones are not cached."""
    marker = f"odd-{abs(hash(path))}-"
    for number in range(3):  # raw: an HTTP client library would normalize the path
        head = f"GET {path} HTTP/1.1\r\nHost: x\r\nX-Auth-Token: {OTHER_TOKEN}\r\nX-Request-Id: {marker}{number}\r\n"
        assert _raw_exchange(proxy.url, head + "Connection: close\r\n\r\n").startswith(b"HTTP/1.1 ")
    assert wait_until(lambda: _data_and_auth(pair, marker)[1] == 3), _data_and_auth(pair, marker)


# --- real clients through the proxy ---------------------------------------------------------------------


@pytest.mark.nginx
def test_zarr_python_reads_through_the_proxy(proxy: Proxy, pair: list[Server], test_data: WrittenDataset) -> None:
    import zarr

    for tree, layer, mag in (("zarr", "color_u8", (1, 1, 1)), ("zarr3", "rgb", (2, 2, 1))):
        path = f"/data/{tree}/{ORG}/wk_dataset/{layer}/{mag_name(mag)}"
        through = zarr.open_array(proxy.url + path, mode="r", storage_options={"headers": HEADERS})[...]
        direct = zarr.open_array(pair[0].url + path, mode="r", storage_options={"headers": HEADERS})[...]
        assert np.array_equal(through, direct)
        assert np.array_equal(through, test_data.expected(layer, mag))


@pytest.mark.nginx
def test_tensorstore_reads_through_the_proxy(proxy: Proxy, pair: list[Server], test_data: WrittenDataset) -> None:
    import tensorstore as ts

    def read(base: str, driver: str, path: str) -> np.ndarray:
        kvstore = {"driver": "http", "base_url": base + path + "/", "headers": [f"X-Auth-Token: {TOKEN}"]}
        return ts.open({"driver": driver, "kvstore": kvstore}).result().read().result()

    for driver, tree, layer, mag in (
        ("zarr", "zarr", "segmentation", (1, 1, 1)),
        ("zarr3", "zarr3", "color_f32", (4, 4, 2)),
    ):
        path = f"/data/{tree}/{ORG}/wk_dataset/{layer}/{mag_name(mag)}"
        through = read(proxy.url, driver, path)
        assert np.array_equal(through, read(pair[1].url, driver, path))
        assert np.array_equal(through, test_data.expected(layer, mag))


@pytest.mark.nginx
def test_webknossos_libs_reads_through_the_proxy(proxy: Proxy, test_data: WrittenDataset) -> None:
    import webknossos as wk
    from upath import UPath

    dataset = wk.Dataset.open(UPath(proxy.url + DATASET, headers=HEADERS))
    for name in ("color_u16", "rgb"):
        layer = dataset.get_layer(name)
        for mag, data, region in read_webknossos_mags(layer):
            assert np.array_equal(data, test_data.expected(name, mag)[region])


@pytest.mark.nginx
def test_requests_are_spread_over_both_gateways(proxy: Proxy, pair: list[Server]) -> None:
    with requests.Session() as session:
        for i in range(60):
            path = f"{DATASET}/color_u8/1/0.{1 + i % 5}.{i % 4}.{i % 3}"
            headers = {**HEADERS, "X-Request-Id": f"spread-{i}"}
            assert session.get(proxy.url + path, headers=headers, timeout=10).status_code == 200

    def served() -> list[int]:  # by request id: a late line of an earlier test is not counted
        return [
            sum(
                line["path"].startswith("/data/") and line["request_id"].startswith("spread-")
                for line in s.access_lines()
            )
            for s in pair
        ]

    assert wait_until(lambda: sum(served()) == 60)
    assert min(served()) >= 10, f"requests per gateway: {served()}"
    upstreams = {line["upstream_addr"] for line in proxy.access_log() if line["path"].startswith("/data/")}
    assert {address(s) for s in pair} <= upstreams


# --- CORS for browser viewers ---------------------------------------------------------------------------


@pytest.mark.nginx
def test_cors_preflight_is_answered_by_the_proxy_without_a_token(proxy: Proxy, pair: list[Server]) -> None:
    before = [len(s.access_lines()) for s in pair]
    response = requests.options(
        f"{proxy.url}{DATASET}/color_u8/1/.zarray",
        headers={
            "Origin": "https://viewer.example.org",
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "x-auth-token, range, if-none-match",
        },
        timeout=10,
    )
    assert response.status_code == 204
    assert response.headers["Access-Control-Allow-Origin"] == "*"
    assert "GET" in response.headers["Access-Control-Allow-Methods"]
    allowed = {h.strip().lower() for h in response.headers["Access-Control-Allow-Headers"].split(",")}
    assert {"x-auth-token", "range", "if-none-match"} <= allowed
    assert int(response.headers["Access-Control-Max-Age"]) > 0
    assert [len(s.access_lines()) for s in pair] == before, "a preflight reached a gateway"


@pytest.mark.nginx
def test_cors_headers_on_every_answer(proxy: Proxy) -> None:
    origin = {"Origin": "https://viewer.example.org"}
    for headers, status in ((HEADERS, 200), ({}, 401), ({"X-Auth-Token": OTHER_TOKEN}, 403)):
        response = requests.get(f"{proxy.url}{DATASET}/color_u8/1/0.2.2.1", headers={**origin, **headers}, timeout=10)
        assert response.status_code == status
        assert response.headers["Access-Control-Allow-Origin"] == "*"  # once: the gateway's is replaced
        exposed = {h.strip().lower() for h in response.headers["Access-Control-Expose-Headers"].split(",")}
        assert {"content-range", "content-length", "etag"} <= exposed
        assert "Access-Control-Allow-Methods" not in response.headers  # preflight headers only on OPTIONS
    ranged = requests.get(
        f"{proxy.url}{DATASET}/color_u8/1/0.2.2.1", headers={**origin, **HEADERS, "Range": "bytes=0-9"}, timeout=10
    )
    assert ranged.status_code == 206 and len(ranged.content) == 10 and "Content-Range" in ranged.headers


# --- request ids and logs -------------------------------------------------------------------------------


@pytest.mark.nginx
def test_request_ids_pass_from_the_proxy_to_the_gateway(proxy: Proxy, pair: list[Server]) -> None:
    response = requests.get(
        f"{proxy.url}{DATASET}/color_u8/1/.zarray", headers={**HEADERS, "X-Request-Id": "trace-42.a"}, timeout=10
    )
    assert response.status_code == 200 and response.headers["X-Request-Id"] == "trace-42.a"

    def paths(request_id: str) -> set[str]:
        return {line["path"] for s in pair for line in s.access_lines() if line["request_id"] == request_id}

    # the token check carries the id too when it is not answered from the proxy's cache
    assert wait_until(lambda: f"{DATASET}/color_u8/1/.zarray" in paths("trace-42.a")), paths("trace-42.a")
    assert paths("trace-42.a") <= {"/auth", f"{DATASET}/color_u8/1/.zarray"}
    assert wait_until(lambda: any(line["request_id"] == "trace-42.a" for line in proxy.access_log()))

    generated = requests.get(f"{proxy.url}{DATASET}/color_u8/1/.zarray", headers=HEADERS, timeout=10)
    request_id = generated.headers["X-Request-Id"]
    assert re.fullmatch(r"[0-9a-f]{32}", request_id), "nginx's own $request_id"
    assert wait_until(lambda: f"{DATASET}/color_u8/1/.zarray" in paths(request_id))

    hostile = requests.get(
        f"{proxy.url}{DATASET}/color_u8/1/.zarray", headers={**HEADERS, "X-Request-Id": 'a"b' + "x" * 300}, timeout=10
    )
    assert re.fullmatch(r"[0-9a-f]{32}", hostile.headers["X-Request-Id"]), "an unusable id is replaced"


@pytest.mark.nginx
def test_no_token_in_any_log_line(proxy: Proxy, pair: list[Server]) -> None:
    for params, headers in (
        ({"token": TOKEN}, {}),
        ({"token": OTHER_TOKEN}, {}),
        ({}, HEADERS),
        ({"token": TOKEN}, HEADERS),
    ):
        for path in (f"{DATASET}/color_u8/1/0.2.2.1", f"{THEIRS}/color_u8/1/0.2.2.1", "/nope", "/auth", "/metrics"):
            requests.get(proxy.url + path, params=params, headers=headers, timeout=10)
    requests.get(proxy.url + f"{DATASET}/?token={TOKEN}&" + "x" * 9000, timeout=10)  # 414, logged by nginx
    logs = proxy.logs() + "".join(s.log() for s in pair)
    assert "/data/zarr/" in logs
    for secret in (TOKEN, OTHER_TOKEN, TOKEN[4:16]):
        assert secret not in logs


# --- limits -------------------------------------------------------------------------------------------------


@pytest.mark.nginx
def test_oversized_urls_and_headers_are_refused_at_the_proxy(proxy: Proxy, pair: list[Server]) -> None:
    before = [len(s.access_lines()) for s in pair]
    long_url = requests.get(f"{proxy.url}{DATASET}/{'x' * 9000}", headers=HEADERS, timeout=10)
    assert long_url.status_code == 414
    long_header = requests.get(f"{proxy.url}{DATASET}/", headers={**HEADERS, "X-Padding": "y" * 9000}, timeout=10)
    assert long_header.status_code == 400
    many_headers = {f"X-Pad-{i}": "z" * 4000 for i in range(12)}
    too_many = requests.get(f"{proxy.url}{DATASET}/", headers={**HEADERS, **many_headers}, timeout=10)
    assert too_many.status_code == 400
    post = requests.post(f"{proxy.url}{DATASET}/", headers=HEADERS, data=b"x" * 10, timeout=10)
    assert post.status_code == 405
    assert [len(s.access_lines()) for s in pair] == before


SMUGGLED = "GET /data/zarr/other_org/theirs/.zgroup HTTP/1.1\r\nHost: x\r\nX-Request-Id: smuggled\r\n\r\n"


def _raw_exchange(url: str, raw: str) -> bytes:
    """Send ``raw`` on one connection; everything the proxy answers until it closes the connection."""
    return raw_exchange(url, raw.encode())


@pytest.mark.nginx
@pytest.mark.parametrize(
    "framing, status",
    [
        (f"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{SMUGGLED}", 400),
        (f"Transfer-Encoding: chunked\r\n\r\n{len(SMUGGLED):x}\r\n{SMUGGLED}\r\n0\r\n\r\n", 400),
        (f"Content-Length: {len(SMUGGLED)}\r\n\r\n{SMUGGLED}", 400),
        (f"Content-Length: 0\r\nContent-Length: {len(SMUGGLED)}\r\n\r\n{SMUGGLED}", 400),
        (f"Transfer-Encoding: xchunked\r\n\r\n{SMUGGLED}", 501),
    ],
    ids=["content-length-and-transfer-encoding", "chunked-body", "body", "two-content-lengths", "unknown-encoding"],
)
def test_request_smuggling_is_refused_at_the_proxy(proxy: Proxy, pair: list[Server], framing: str, status: int) -> None:
    request_id = f"smuggler-{abs(hash(framing))}"
    head = f"GET {DATASET}/.zgroup HTTP/1.1\r\nHost: x\r\nX-Auth-Token: {TOKEN}\r\nX-Request-Id: {request_id}\r\n"
    answer = _raw_exchange(proxy.url, head + framing)
    assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer[:200]
    assert answer.count(b"HTTP/1.1 ") == 1, (
        "one answer, and the connection is closed: nothing is read as a second request"
    )
    # a well-formed request on the same path passes, and reaches a gateway: the refusal was the framing
    fine = _raw_exchange(proxy.url, head + "Content-Length: 0\r\nConnection: close\r\n\r\n")
    assert fine.startswith(b"HTTP/1.1 200 ")
    assert wait_until(lambda: any(line["request_id"] == request_id for s in pair for line in s.access_lines()))
    time.sleep(0.2)
    reached = [line for s in pair for line in s.access_lines() if line["request_id"] in (request_id, "smuggled")]
    # the well-formed request's token check reaches a gateway too unless a check within the cache's time did
    data = [line["path"] for line in reached if line["path"] != "/auth"]
    assert data == [f"{DATASET}/.zgroup"], "only the well-formed request reached a gateway"
    assert not [line for line in reached if line["request_id"] == "smuggled"], "nothing smuggled reached a gateway"


# Requests nginx refuses while it reads them, before it has a URL to route: each gets the gateways' JSON error
# shape and a 4xx (nginx's error page cannot be a named location for them: it answered 500).
UNREADABLE = {
    "dot-segments-above-the-root": (b"GET /data/../../etc/passwd HTTP/1.1\r\nHost: x\r\n", 400),
    "escaped-dot-segments-above-the-root": (b"GET /%2e%2e/%2e%2e/x HTTP/1.1\r\nHost: x\r\n", 400),
    "encoded-nul": (b"GET /data/zarr/%00/x HTTP/1.1\r\nHost: x\r\n", 400),
    "a-blank-in-the-path": (b"GET /data/zarr/a b/x HTTP/1.1\r\nHost: x\r\n", 400),
    "a-control-byte-in-the-path": (b"GET /data/zarr/a\x01b/x HTTP/1.1\r\nHost: x\r\n", 400),
    "a-delete-byte-in-the-path": (b"GET /data/zarr/a\x7fb/x HTTP/1.1\r\nHost: x\r\n", 400),
    "a-relative-target": (b"GET ../x HTTP/1.1\r\nHost: x\r\n", 400),
    "no-request-line": (b"GARBAGE\r\nHost: x\r\n", 400),
    "a-browser-above-the-root": (b"GET /data/../../x HTTP/1.1\r\nHost: x\r\nAccept: text/html\r\n", 400),
    "with-a-token": (f"GET /data/../../x?token={TOKEN} HTTP/1.1\r\nHost: x\r\n".encode(), 400),
    "a-path-token-and-a-nul": (f"GET /t/{TOKEN}%00/data/zarr/ HTTP/1.1\r\nHost: x\r\n".encode(), 400),
    "a-post-above-the-root": (b"POST /share/../../x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n", 400),
    "an-over-long-url": (b"GET /data/zarr/" + b"x" * 9000 + b" HTTP/1.1\r\nHost: x\r\n", 414),
    "an-over-long-header": (f"GET {DATASET}/.zgroup HTTP/1.1\r\nHost: x\r\nX-Pad: {'y' * 9000}\r\n".encode(), 400),
    "an-unknown-http-version": (b"GET /x HTTP/9.9\r\nHost: x\r\n", 505),
}


@pytest.mark.nginx
@pytest.mark.parametrize("head, status", UNREADABLE.values(), ids=UNREADABLE.keys())
def test_a_request_nginx_cannot_read_is_a_json_refusal_not_a_500(
    proxy: Proxy, pair: list[Server], head: bytes, status: int
) -> None:
    """The proxy's own refusal, in the gateways' JSON shape, logged with its status; it reaches no gateway, and the
    proxy answers the next request as ever. (505 is HTTP's own answer to a version it does not speak.)"""
    before = len(proxy.access_log()), [len(s.access_lines()) for s in pair]
    answer = raw_exchange(proxy.url, head + b"Connection: close\r\n\r\n")
    fields, _, body = answer.partition(b"\r\n\r\n")
    assert status_of(answer) == status, answer[:300]
    assert b"\r\ncontent-type: application/json" in fields.lower(), fields
    assert json.loads(body)["status"] == status and json.loads(body)["error"], body
    assert TOKEN.encode() not in answer

    def logged() -> list[str]:
        return [line["status"] for line in proxy.access_log()[before[0] :]]

    assert wait_until(lambda: str(status) in logged()), "logged with the status it was answered"
    assert "500" not in logged()
    assert [len(s.access_lines()) for s in pair] == before[1], "the refused request reached no gateway"
    fine = requests.get(f"{proxy.url}{DATASET}/.zgroup", headers=HEADERS, timeout=10)
    assert fine.status_code == 200 and fine.json()["zarr_format"] == 2
    internal = requests.get(f"{proxy.url}/.zarr-gateway/unreadable/{status}", headers=HEADERS, timeout=10)
    assert internal.status_code == 404, "where nginx sends these internally, a client cannot go"


@pytest.mark.nginx
def test_a_browser_s_over_long_header_is_a_page(proxy: Proxy) -> None:
    """Where nginx read the Accept header before the one it cannot hold, a browser gets the page, as for every 400."""
    head = f"GET {DATASET}/ HTTP/1.1\r\nHost: x\r\nAccept: text/html,*/*\r\nX-Pad: {'y' * 9000}\r\n"
    answer = raw_exchange(proxy.url, (head + "Connection: close\r\n\r\n").encode())
    fields, _, body = answer.partition(b"\r\n\r\n")
    assert status_of(answer) == 400 and b"\r\ncontent-type: text/html" in fields.lower(), answer[:300]
    assert b'<p class="error-message">a request header is longer than this proxy accepts' in body


PROXY_HEAD_TIMEOUT = 10  # client_header_timeout of deploy/nginx.conf
SLOW_LINE_EVERY = 3.0  # the first round's probe: one header line every 3 s, each well inside the timeout


@pytest.mark.nginx
def test_a_head_sent_one_line_every_three_seconds_is_closed_by_the_proxy(proxy: Proxy, pair: list[Server]) -> None:
    """The first round saw such a head held open past 15 s. nginx's header timeout runs from the head's first
    byte, and no line that arrives restarts it; nothing of the request reaches a gateway."""
    assert f"client_header_timeout {PROXY_HEAD_TIMEOUT}s;" in (DEPLOY / "nginx.conf").read_text()
    host, port = proxy.url.removeprefix("http://").rsplit(":", 1)
    limit = PROXY_HEAD_TIMEOUT + 2 * SLOW_LINE_EVERY + 3  # the timer's granularity and a busy machine
    with socket.create_connection((host, int(port)), timeout=limit) as connection:
        started = time.monotonic()
        connection.sendall(f"GET {DATASET}/.zgroup HTTP/1.1\r\nHost: x\r\nX-Request-Id: slow-head\r\n".encode())
        closed = None
        while closed is None and time.monotonic() - started < limit:
            readable, _, _ = select.select([connection], [], [], SLOW_LINE_EVERY)
            try:
                if readable:
                    connection.recv(65536)  # nginx closes without an answer: an orderly close (or a reset)
                    closed = time.monotonic() - started
                else:
                    connection.sendall(b"X-Slow: 1\r\n")
            except OSError:
                closed = time.monotonic() - started
    assert closed is not None and closed < limit, f"open for {closed or limit:.1f} s"
    assert closed >= PROXY_HEAD_TIMEOUT - 1, f"closed after {closed:.1f} s: before its timeout, for another reason"
    assert not [line for s in pair for line in s.access_lines() if line["request_id"] == "slow-head"]


def _hammer(url: str, headers: list[dict[str, str]], at_least: int = 10) -> list[int]:
    """The statuses of one request per headers, checked against what a 10-burst, 5r/s limit allows in the time."""
    started = time.monotonic()
    with requests.Session() as session:
        statuses = [session.get(url, headers=h, timeout=10).status_code for h in headers]
    assert at_least <= statuses.count(200) <= 11 + 5 * (time.monotonic() - started), statuses  # burst and rate
    return statuses


def _first_refusal(url: str, **request: Any) -> requests.Response:
    """The first 429 of up to 5 requests, fewer than the burst of 10 that a client's fresh bucket would let pass:
    a busy machine may leave a 5r/s bucket a token between two requests, but not five."""
    for _ in range(5):
        response = requests.get(url, timeout=10, **request)
        if response.status_code == 429:
            return response
        assert response.status_code == 200, (response.status_code, response.text[:200])
    raise AssertionError(f"5 requests after the burst and none refused: {url}")


def _rate_limited_proxy(
    pair: list[Server], tmp_path: Path, per: str, rate: str = "5r/s", burst: str = "10", **settings: str
) -> Proxy:
    """A proxy before the pair that lets a burst pass, then `rate` requests for each `per` (client or token)."""
    return start_proxy(
        tmp_path,
        [address(s) for s in pair],
        PROXY_RATE_LIMIT_PER=per,
        PROXY_RATE_LIMIT=rate,
        PROXY_RATE_BURST=burst,
        **settings,
    )


@pytest.mark.nginx
def test_request_rates_are_limited_at_the_proxy(pair: list[Server], tmp_path: Path) -> None:
    # the test client stands for a TLS terminator on loopback, whose X-Forwarded-For names the client
    strict = _rate_limited_proxy(pair, tmp_path, "client")
    try:
        url = f"{strict.url}{DATASET}/color_u8/1/.zarray"
        statuses = _hammer(url, [HEADERS] * 100)
        assert statuses[:10] == [200] * 10, "the burst passes"
        assert set(statuses) == {200, 429}
        refused = _first_refusal(url, headers=HEADERS)
        assert refused.json()["status"] == 429
        assert refused.headers["Retry-After"] == "1"
        assert refused.headers["Access-Control-Allow-Origin"] == "*"
        other_client = requests.get(url, headers={**HEADERS, "X-Forwarded-For": "198.51.100.7"}, timeout=10)
        assert other_client.status_code == 200, "the limit is per client"
        time.sleep(1.2)
        assert requests.get(url, headers=HEADERS, timeout=10).status_code == 200, "the limit is a rate, not a ban"
    finally:
        strict.stop()
    lines = [line for line in strict.access_log() if line["path"].endswith(".zarray")]
    assert any(line["remote_addr"] == "198.51.100.7" for line in lines)


@pytest.mark.nginx
def test_the_rate_can_be_limited_per_token(pair: list[Server], tmp_path: Path) -> None:
    strict = _rate_limited_proxy(pair, tmp_path, "token")
    try:
        url = f"{strict.url}{DATASET}/color_u8/1/.zarray"
        _hammer(url, [HEADERS] * 40)
        refused = _first_refusal(url, params={"token": TOKEN})  # the same token in the query counts alike
        assert refused.headers["Retry-After"] == "1"
        other = requests.get(
            f"{strict.url}{THEIRS}/color_u8/1/.zarray", headers={"X-Auth-Token": OTHER_TOKEN}, timeout=10
        )
        assert other.status_code == 200, "another token from the same address is not held back"
    finally:
        strict.stop()


@pytest.mark.nginx
def test_an_untrusted_client_cannot_dodge_the_rate_limit(pair: list[Server], tmp_path: Path) -> None:
    strict = _rate_limited_proxy(pair, tmp_path, "client", PROXY_REAL_IP_FROM="192.0.2.1/32")
    try:
        url = f"{strict.url}{DATASET}/color_u8/1/.zarray"
        _hammer(url, [{**HEADERS, "X-Forwarded-For": f"198.51.100.{i}"} for i in range(60)], at_least=0)
    finally:
        strict.stop()


@pytest.mark.nginx
def test_no_gateway_is_a_502_not_a_hang(tmp_path: Path) -> None:
    down = start_proxy(tmp_path, [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"])
    try:
        response = requests.get(f"{down.url}{DATASET}/.zgroup", headers=HEADERS, timeout=30)
        assert response.status_code == 502
        assert response.json()["status"] == 502
        assert response.headers["Retry-After"] == "2"
    finally:
        down.stop()


# --- the compose file, the proxy template and .env.example agree ---------------------------------------------


@pytest.mark.docker
def test_docker_compose_validates_the_compose_file(tmp_path: Path) -> None:
    env = {**os.environ, "DATA_ROOT": str(tmp_path)}
    (tmp_path / "empty.env").write_text("")  # not deploy/.env, whatever a checkout holds
    command = [tool("docker-compose"), "-f", str(COMPOSE), "--env-file", str(tmp_path / "empty.env"), "config"]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    gateway = config["services"]["gateway"]
    assert gateway["deploy"]["replicas"] == 2
    assert f"{tmp_path}:/data:ro" in gateway["volumes"]
    assert any(v.endswith(":/etc/zarr-gateway:ro") for v in gateway["volumes"])
    assert "ports" not in gateway, "only the proxy is published"
    proxy = config["services"]["proxy"]
    mounted = {str(v).split(":")[1]: str(v).split(":")[0] for v in proxy["volumes"]}
    for name, template in TEMPLATES.items():  # each template the tests and the bench render is mounted
        assert mounted.get(f"/etc/nginx/templates/{name}.template") == str(template), proxy["volumes"]
    assert proxy["depends_on"]["gateway"]["condition"] == "service_healthy"


def _compose_proxy_environment(env_text: str, directory: Path) -> dict[str, str]:
    """The proxy's PROXY_* environment as docker-compose makes it from ``env_text`` as deploy/.env."""
    env_file = directory / ".env"
    env_file.write_text(re.sub(r"^DATA_ROOT=.*$", f"DATA_ROOT={directory}", env_text, flags=re.M))
    env = {k: v for k, v in os.environ.items() if k != "DATA_ROOT"}
    command = [tool("docker-compose"), "-f", str(COMPOSE), "--env-file", str(env_file), "config"]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    assert services["gateway"]["environment"]["ZARR_GATEWAY_CODEC"] == "blosc-lz4"
    return {k: str(v) for k, v in services["proxy"]["environment"].items() if k.startswith("PROXY_")}


def _nginx_command(values: dict[str, str], directory: Path) -> list[str]:
    """The template rendered from ``values`` into ``directory``; what starts nginx on it."""
    values = {
        **values,
        "PROXY_LISTEN": f"127.0.0.1:{free_port()}",
        "PROXY_UPSTREAM_SERVERS": "server 127.0.0.1:9;",  # the image resolves the service name; here a literal
        "PROXY_AUTH_CACHE_DIR": str(directory / "auth-cache"),
        "PROXY_ANSWER_CACHE_DIR": str(directory / "answer-cache"),
    }
    write_proxy_config(directory, values)
    return [tool("nginx"), "-c", str(directory / "nginx.conf"), "-p", str(directory)]


@pytest.mark.docker
@pytest.mark.nginx
def test_the_env_example_makes_a_valid_deployment(tmp_path: Path) -> None:
    """.env.example -> docker-compose config -> the proxy's environment -> the rendered template -> nginx -t."""
    values = _compose_proxy_environment(ENV_EXAMPLE.read_text(), tmp_path)
    assert values["PROXY_AUTH_CACHE_DIR"].startswith(f"{TMPFS}/")
    check = subprocess.run([*_nginx_command(values, tmp_path), "-t"], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


@pytest.mark.docker
@pytest.mark.nginx
@pytest.mark.parametrize(
    "setting, message",
    [
        ("PROXY_RATE_LIMIT=fast", 'invalid rate "rate=fast"'),
        ("PROXY_RATE_BURST=lots", 'invalid burst value "burst=lots"'),
        ("PROXY_CONN_LIMIT=0", 'invalid number of connections "0"'),
        ("PROXY_RATE_LIMIT_PER=clients", 'unknown "zg_limit_per_clients" variable'),
        ("PROXY_AUTH_CACHE_TIME=10x", 'invalid time value "10x"'),
    ],
)
def test_a_setting_nginx_refuses_stops_the_proxy_with_nginx_s_message(
    tmp_path: Path, setting: str, message: str
) -> None:
    name = setting.partition("=")[0]
    env_text = re.sub(rf"^{name}=.*$", setting, ENV_EXAMPLE.read_text(), flags=re.M)
    assert setting in env_text
    command = _nginx_command(_compose_proxy_environment(env_text, tmp_path), tmp_path)
    check = subprocess.run([*command, "-t"], capture_output=True, text=True)
    assert check.returncode != 0 and message in check.stderr, check.stderr
    started = subprocess.run(command, capture_output=True, text=True, timeout=30)  # as the image starts it
    assert started.returncode != 0 and message in started.stderr, started.stderr


@pytest.mark.docker
def test_docker_compose_names_a_missing_data_root(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DATA_ROOT"}
    (tmp_path / "empty.env").write_text("")
    result = subprocess.run(
        [tool("docker-compose"), "-f", str(COMPOSE), "--env-file", str(tmp_path / "empty.env"), "config"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode != 0
    assert "DATA_ROOT" in result.stderr


def _env_example() -> tuple[set[str], str]:
    text = ENV_EXAMPLE.read_text()
    assigned = set(re.findall(r"^([A-Z][A-Z0-9_]*)=", text, re.MULTILINE))
    return assigned, text


def test_compose_nginx_and_env_example_name_the_same_settings() -> None:
    services = compose()["services"]
    compose_text = COMPOSE.read_text()
    interpolated = set(re.findall(r"\$\{(\w+)", compose_text))
    assigned, env_text = _env_example()
    # every variable the compose file reads is documented in .env.example, and nothing else is
    # (but docker compose's own COMPOSE_* variables)
    assert interpolated == {name for name in assigned if not name.startswith("COMPOSE_")}
    # the proxy's environment supplies exactly the template's names
    proxy_env = set(services["proxy"]["environment"]) - {"NGINX_ENVSUBST_FILTER", "NGINX_ENTRYPOINT_QUIET_LOGS"}
    assert template_names() == proxy_env
    assert services["proxy"]["environment"]["NGINX_ENVSUBST_FILTER"] == "^PROXY_"
    # every gateway setting is passed by the compose file and documented in .env.example
    fields = {f"ZARR_GATEWAY_{name.upper()}" for name in Settings.model_fields}
    gateway_env = set(services["gateway"]["environment"])
    assert gateway_env == fields - {"ZARR_GATEWAY_SETTINGS_FILE"}
    for name in fields | template_names():
        assert name in env_text, f"{name} is not documented in .env.example"
    assert {n for n in assigned if n.startswith("ZARR_GATEWAY_")} <= fields
    # each gateway setting read from .env is passed through under its own name
    for name, value in services["gateway"]["environment"].items():
        match = re.fullmatch(r"\$\{(\w+):-.*\}", str(value))
        assert match is None or match.group(1) == name


def test_every_setting_has_a_flag_and_a_readme_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The serve flags are made from the settings model: every setting has its flag, with the setting's own
    description as help and its Literal values as choices, and a row in the README's settings table."""
    import typing

    from gateway.cli import build_parser
    from gateway.cli.flags import settings_from
    from gateway.cli.servers import SERVERS

    values = Settings(root=str(tmp_path)).model_dump(mode="json")  # a valid value of every setting
    for name, field in Settings.model_fields.items():
        assert field.description, f"setting {name} has no description (its flag's help)"
        value = values[name]
        if value in (None, ""):  # unset by default: a number where the setting takes one, else a path
            value = 1 if int in typing.get_args(field.annotation) else tmp_path
        given = [] if isinstance(value, bool) else [str(value)]
        args = build_parser().parse_args(["serve", f"--{name.replace('_', '-')}", *given])
        assert getattr(args, name) is not None, name
        if typing.get_origin(field.annotation) is typing.Literal:
            with pytest.raises(SystemExit):
                build_parser().parse_args(["serve", f"--{name.replace('_', '-')}", "not-a-choice"])
    monkeypatch.setenv("COLUMNS", "10000")  # argparse wraps help at the terminal's width, hyphens included
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for name, field in Settings.model_fields.items():
        assert " ".join((field.description or "").split()) in help_text, name
    assert "--server {" + ",".join(SERVERS) + "}" in help_text
    # a flag reaches the settings (neuroglancer_url had none when the flags were a hand-kept copy)
    args = build_parser().parse_args(
        ["serve", "--root", str(tmp_path), "--neuroglancer-url", "https://ng.example/", "--drain-seconds", "2.5"]
    )
    settings = settings_from(args)
    assert settings.neuroglancer_url == "https://ng.example/" and settings.drain_seconds == 2.5

    readme = (DEPLOY.parent / "README.md").read_text()
    table = readme.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    documented = [name for cell in rows for name in re.findall(r"`(\w+)`", cell)]
    assert sorted(documented) == sorted(Settings.model_fields), "the README's settings table and Settings differ"


def test_env_example_values_are_valid_settings(tmp_path: Path) -> None:
    text = _env_example()[1]
    lines = [line for line in text.splitlines() if line.startswith("ZARR_GATEWAY_")]
    settings_file = tmp_path / "deploy.env"
    settings_file.write_text("\n".join([f"ZARR_GATEWAY_ROOT={tmp_path}", *lines]) + "\n")
    settings = Settings(settings_file=settings_file)
    assert settings.workers == 1 and settings.log_format == "json"


def test_the_rendered_template_names_every_compose_value() -> None:
    values = compose_defaults()
    rendered = render(TEMPLATE.read_text(), values)
    assert not re.search(r"\$\{?PROXY_[A-Z0-9_]", rendered)
    assert "server gateway:8000;" in rendered
    assert "limit_req_zone $zg_limit_per_off " in rendered, "no request rate limit by default"
    assert "limit_conn_zone $zg_limit_per_client " in rendered
    assert "proxy_cache_path /dev/shm/" in rendered, "token checks are cached on a tmpfs"
    assert "$request_uri" in rendered and "$request_method" in rendered, "nginx's own variables are left alone"


def test_dockerfile_is_slim_non_root_multi_stage_with_a_health_check() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+(\S+)", text, re.MULTILINE)
    assert len(stages) >= 2, "multi-stage"
    assert "slim" in text
    users = re.findall(r"^USER\s+(\S+)", text, re.MULTILINE)
    assert users and not users[-1].startswith(("root", "0")), "runs as a non-root user"
    assert re.search(r"^HEALTHCHECK .*\n?.*gateway\.probe", text, re.MULTILINE)
    assert re.search(r'^ENTRYPOINT \["zarr-gateway"\]', text, re.MULTILINE)
    assert re.search(r'^CMD \["serve"\]', text, re.MULTILINE)
    # the build context is the repository root: everything is ignored but what the image copies
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    assert "*" in ignore
    copied = [src for line in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.MULTILINE) for src in line.split()]
    assert copied and all(f"!{src}" in ignore for src in copied), copied
    assert all((DEPLOY.parent / src).exists() for src in copied)


def test_the_health_probe_of_the_image(pair: list[Server]) -> None:
    import sys

    port = pair[0].url.rsplit(":", 1)[1]
    env = {**os.environ, "ZARR_GATEWAY_PORT": port}
    for endpoint, code in (("readyz", 0), ("healthz", 0), ("nope", 1)):
        result = subprocess.run([sys.executable, "-m", "gateway.probe", endpoint], env=env, capture_output=True)
        assert result.returncode == code, (endpoint, result.stderr)
    env["ZARR_GATEWAY_PORT"] = str(free_port())
    assert subprocess.run([sys.executable, "-m", "gateway.probe"], env=env, capture_output=True).returncode == 1


# --- a token is one token, and nothing the client says sets the page's host (issue 16) ------------------


@pytest.mark.nginx
@pytest.mark.parametrize(("query", "tokens"), REPEATED_TOKENS)
def test_more_than_one_token_is_a_400_at_the_proxy(
    proxy: Proxy, pair: list[Server], query: str, tokens: list[str]
) -> None:
    """Also once a grant for the real token is cached for the dataset (it must not apply to these)."""
    path = f"{DATASET}/color_u8/1/.zarray"
    assert requests.get(proxy.url + path, headers=HEADERS, timeout=10).status_code == 200
    marker = f"many-{abs(hash((query, tuple(tokens))))}"
    lines = "".join(f"X-Auth-Token: {token}\r\n" for token in tokens)
    head = f"GET {path}{query} HTTP/1.1\r\nHost: x\r\n{lines}X-Request-Id: {marker}\r\nConnection: close\r\n\r\n"
    answer = _raw_exchange(proxy.url, head)
    if len(tokens) > 1 and nginx_version() < (1, 23):
        # This nginx sees only the first of two header lines: the request is refused with that token's
        # (cached) answer, or, when that one grants, by the gateway's own 400. It is never served.
        assert answer.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 401 ")), answer[:300]
    else:
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:300]
        assert b"more than one token" in answer
    time.sleep(0.3)
    # (nginx before 1.23 sees only the first of two header lines: /auth lets the request through, and the
    # gateway refuses it itself)
    lines_seen = [line for s in pair for line in s.access_lines() if line["request_id"] == marker]
    assert [line for line in lines_seen if line["path"] != "/auth" and line["status"] != 400] == [], "none served"
    # and what the proxy asked about it was cached for nobody: the decoy alone is still refused at the proxy
    alone_header: dict[str, dict[str, str]] = {"headers": {"X-Auth-Token": "decoy"}}
    alone_query: dict[str, dict[str, str]] = {"params": {"token": "decoy"}}
    for alone in (alone_header, alone_query):
        refused = requests.get(proxy.url + path, timeout=10, headers=alone.get("headers"), params=alone.get("params"))
        assert refused.status_code == 401 and "a valid token is required" in refused.json()["error"], "by nginx"


@pytest.mark.nginx
def test_the_per_token_rate_limit_cannot_be_dodged_with_a_second_token(pair: list[Server], tmp_path: Path) -> None:
    limited = _rate_limited_proxy(pair, tmp_path, "token", rate="1r/m", burst="2")
    try:
        chunk = f"{limited.url}{DATASET}/color_u8/1/.zarray"
        dodges = [requests.get(f"{chunk}?token=decoy-{n}&token={TOKEN}", timeout=10).status_code for n in range(6)]
        assert set(dodges) == {400}, dodges
        plain = [requests.get(chunk, params={"token": TOKEN}, timeout=10).status_code for _ in range(6)]
        assert plain.count(200) <= 3 and plain.count(429) >= 3, plain
    finally:
        limited.stop()


@pytest.mark.nginx
def test_a_client_s_forwarded_host_never_reaches_a_page(
    test_data: WrittenDataset, tokens_file: Path, server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    """The gateway behind the proxy trusts it (as docker-compose.yml sets trusted_proxies); the proxy sets the
    forwarded headers itself, so a client's own X-Forwarded-Host does not become the host of a page."""
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"tokens_file": str(tokens_file), "trusted_proxies": "127.0.0.1/32"}))
    gateway = server_factory(test_data.root, settings_file=settings)
    proxy = start_proxy(tmp_path / "nginx", [address(gateway)])
    try:
        page_path = f"{DATASET}/"
        forged = {**HEADERS, "X-Forwarded-Host": "attacker.example", "X-Forwarded-Proto": "https"}
        direct = requests.get(gateway.url + page_path, headers=forged, timeout=10)
        assert "attacker.example" in direct.text, "the gateway does believe a trusted peer"
        through = requests.get(proxy.url + page_path, headers={**forged, "Forwarded": "host=attacker.example"})
        assert through.status_code == 200
        assert "attacker.example" not in through.text
        host = proxy.url.removeprefix("http://")  # with its port: the stack listens on :8080, not :80
        assert f"http:&#47;&#47;{host}&#47;data&#47;zarr&#47;" in through.text, "the proxy's own view of the host"
        assert through.headers["Referrer-Policy"] == "no-referrer"
    finally:
        proxy.stop()


# --- a token in the path (/t/{token}/data/...) at the proxy ---------------------------------------------


def _in_path(path: str, token: str = TOKEN) -> str:
    return f"/t/{token}{path}"


@pytest.mark.nginx
def test_a_path_token_is_checked_at_the_proxy(proxy: Proxy, pair: list[Server]) -> None:
    chunk = f"{DATASET}/color_u8/1/0.2.2.1"
    plain = requests.get(proxy.url + chunk, headers=HEADERS, timeout=10)
    tokened = requests.get(proxy.url + _in_path(chunk), timeout=10)
    assert (tokened.status_code, tokened.content) == (200, plain.content)
    assert requests.get(proxy.url + _in_path(f"{THEIRS}/color_u8/1/0.2.2.1", OTHER_TOKEN), timeout=10).ok
    # access lines are written in batches: count from after the allowed request's own line, not before it
    allowed = f"/t/***{THEIRS}/color_u8/1/0.2.2.1"
    wait_until(lambda: any(line["path"] == allowed for s in pair for line in s.access_lines()), timeout=10)
    before = [len(s.access_lines()) for s in pair]
    for path, status in (
        (_in_path(chunk, "not-a-token"), 401),
        (_in_path(chunk, OTHER_TOKEN), 403),
        (_in_path(f"{THEIRS}/color_u8/1/0.2.2.1"), 403),
        (_in_path(f"/data/zarr/{ORG}/", OTHER_TOKEN), 403),
        (chunk, 401),  # a grant cached for the path token is not one for a request without a token
    ):
        answer = requests.get(proxy.url + path, timeout=10)
        assert answer.status_code == status and answer.json()["status"] == status, path
    time.sleep(0.3)
    reached = [line["path"] for s, n in zip(pair, before) for line in s.access_lines()[n:]]
    assert set(reached) <= {"/auth"}, f"a refused request reached a gateway route: {reached}"


@pytest.mark.nginx
def test_a_path_token_check_is_cached_per_token_and_dataset(pair: list[Server], tmp_path: Path) -> None:
    fresh = start_proxy(tmp_path, [address(s) for s in pair])  # the shipped defaults, an empty cache
    cache_seconds = int(compose_defaults()["PROXY_AUTH_CACHE_TIME"].removesuffix("s"))
    paths = [f"{DATASET}/color_u8/1/0.{x}.{y}.{z}" for x in range(1, 6) for y in range(4) for z in range(3)]
    started = time.monotonic()
    try:
        with requests.Session() as session:
            for number, path in enumerate(paths):
                headers = {"X-Request-Id": f"path-token-{number}"}
                assert session.get(fresh.url + _in_path(path), headers=headers, timeout=10).status_code == 200
            # another dataset of the same token, and another token for the same dataset: checked apart
            other = session.get(
                fresh.url + _in_path(f"{THEIRS}/color_u8/1/.zarray"), headers={"X-Request-Id": "path-token-x"}
            )
            assert other.status_code == 403
            refused = session.get(
                fresh.url + _in_path(paths[0], OTHER_TOKEN), headers={"X-Request-Id": "path-token-y"}, timeout=10
            )
            assert refused.status_code == 403, "a grant cached for one token is not another token's"
    finally:
        fresh.stop()
    checks_allowed = 1 + int((time.monotonic() - started) // cache_seconds)
    assert wait_until(lambda: _data_and_auth(pair, "path-token-")[0] == len(paths))
    time.sleep(0.2)
    data, checks = _data_and_auth(pair, "path-token-")
    assert data == len(paths) and 1 + 2 <= checks <= checks_allowed + 2, (data, checks)
    # the cache key holds the token as the path carries it: the proxy's access log shows it as /t/***
    logged = [line["path"] for line in fresh.access_log() if line["request_id"].startswith("path-token-")]
    assert logged and all(path.startswith("/t/***/data/") for path in logged), logged


@pytest.mark.nginx
@pytest.mark.parametrize(
    ("query", "headers"),
    [(f"?token={TOKEN}", {}), ("?token=decoy", {}), ("", HEADERS), ("", {"X-Auth-Token": "decoy"})],
    ids=["same-query", "decoy-query", "same-header", "decoy-header"],
)
def test_a_path_token_and_another_token_are_a_400_at_the_proxy(
    proxy: Proxy, pair: list[Server], query: str, headers: dict[str, str]
) -> None:
    path = _in_path(f"{DATASET}/color_u8/1/.zarray")
    assert requests.get(proxy.url + path, timeout=10).status_code == 200  # a grant for the path token is cached
    marker = f"path-many-{abs(hash((query, tuple(headers.items()))))}"
    answer = requests.get(proxy.url + path + query, headers={**headers, "X-Request-Id": marker}, timeout=10)
    assert answer.status_code == 400 and "more than one token" in answer.json()["error"], answer.text
    time.sleep(0.3)
    assert not [line for s in pair for line in s.access_lines() if line["request_id"] == marker], "refused by nginx"


@pytest.mark.nginx
@pytest.mark.parametrize(
    ("path", "status"),
    [
        (f"/t/{DATASET}/color_u8/1/.zarray", 400),  # empty: the gateway's own 400 (an auth check cannot say it)
        (f"/t/not-a-token{DATASET}/color_u8/1/.zarray", 401),
        (f"/t/{TOKEN}/metrics", 404),  # a token path that names nothing
        (f"/t/{TOKEN}/auth", 404),
    ],
)
def test_hostile_path_tokens_at_the_proxy(proxy: Proxy, pair: list[Server], path: str, status: int) -> None:
    head = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"  # raw: a client would normalize
    answer = _raw_exchange(proxy.url, head)
    assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer[:300]


@pytest.mark.nginx
def test_the_rate_can_be_limited_per_path_token(pair: list[Server], tmp_path: Path) -> None:
    strict = _rate_limited_proxy(pair, tmp_path, "token")
    try:
        url = f"{strict.url}{_in_path(f'{DATASET}/color_u8/1/.zarray')}"
        _hammer(url, [{}] * 40)
        for alike in ({"headers": HEADERS}, {"params": {"token": TOKEN}}):
            refused = requests.get(f"{strict.url}{DATASET}/color_u8/1/.zarray", timeout=10, **alike)  # type: ignore[arg-type]
            assert refused.status_code == 429, f"the same token as {alike} counts alike"
        other = requests.get(f"{strict.url}{_in_path(f'{THEIRS}/color_u8/1/.zarray', OTHER_TOKEN)}", timeout=10)
        assert other.status_code == 200, "another token from the same address is not held back"
    finally:
        strict.stop()


@pytest.mark.nginx
def test_no_path_token_in_any_log_line(proxy: Proxy, pair: list[Server]) -> None:
    chunk = f"{DATASET}/color_u8/1/0.2.2.1"
    for token in (TOKEN, OTHER_TOKEN):
        for path in (chunk, f"{THEIRS}/color_u8/1/0.2.2.1", "/nope", "/auth", "/metrics", ""):
            requests.get(proxy.url + _in_path(path, token), timeout=10)
            requests.get(proxy.url + _in_path(path, token), headers=HEADERS, timeout=10)  # two tokens: 400
    for raw in (f"/%74/{TOKEN}{chunk}", f"/t%2F{TOKEN}{chunk}", f"//t/{TOKEN}{chunk}", f"/x/../t/{TOKEN}{chunk}"):
        _raw_exchange(proxy.url, f"GET {raw} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    requests.get(proxy.url + _in_path(chunk) + "?" + "x" * 9000, timeout=10)  # 414, logged by nginx
    time.sleep(0.3)
    logs = proxy.logs() + "".join(s.log() for s in pair)
    assert f"/t/***{chunk}" in logs
    for secret in (TOKEN, OTHER_TOKEN, TOKEN[4:16]):
        assert secret not in logs


# --- one token, one spelling: the limits count the token the gateways read (issue 24) ----------------------


def _served(pair: list[Server], request_id: str) -> list[dict[str, Any]]:
    """The gateways' access lines of ``request_id`` that served it: neither the token check nor a 400."""
    lines = [line for s in pair for line in s.access_lines() if line["request_id"] == request_id]
    return [line for line in lines if line["path"] != "/auth" and line["status"] != 400]


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def _refused_by_the_gateway_only(spelling: Spelling) -> bool:
    """Repeated header lines, of which nginx before 1.23 sees only the first: it counts and checks that one,
    and the gateways refuse the request (400) if nginx lets it through."""
    return len(spelling.lines) > 1 and nginx_version() < (1, 23)


@pytest.mark.nginx
@pytest.mark.parametrize("spelling", TOKEN_SPELLINGS.values(), ids=TOKEN_SPELLINGS.keys())
def test_each_spelling_of_a_token_is_passed_on_or_refused_at_the_proxy(
    proxy: Proxy, pair: list[Server], spelling: Spelling
) -> None:
    zarray = f"{DATASET}/color_u8/1/.zarray"
    plain = requests.get(proxy.url + zarray, headers=HEADERS, timeout=10)
    marker = f"spelling-{abs(hash(spelling)):x}"
    answer = _raw_exchange(proxy.url, spelling.request(zarray, marker).decode())
    if spelling.at_proxy == 200:
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(plain.content), answer[:300]
        return
    assert b"token" in answer.partition(b"\r\n\r\n")[2]
    time.sleep(0.3)
    assert _served(pair, marker) == [], "none served"
    if _refused_by_the_gateway_only(spelling):  # with the first line's (cached) answer, or the gateway's 400
        assert status_of(answer) in (400, 401), answer[:300]
    else:
        assert status_of(answer) == 400, answer[:300]
        assert not [line for s in pair for line in s.access_lines() if line["request_id"] == marker], "by nginx"


@pytest.mark.nginx
def test_of_rapid_requests_in_every_spelling_of_one_token_no_more_than_the_burst_pass(
    pair: list[Server], tmp_path: Path
) -> None:
    """A per-token limit of a burst of 2 (and 1 a minute): 30 requests in the spellings the proxy passes on,
    every refused spelling between them; 3 pass at most, whichever spelling they use."""
    limited = _rate_limited_proxy(pair, tmp_path, "token", rate="1r/m", burst="2")
    spellings = list(TOKEN_SPELLINGS.values())
    passed_on = [s for s in spellings if s.at_proxy == 200]
    refused = [s for s in spellings if s.at_proxy == 400]
    zarray = f"{DATASET}/color_u8/1/.zarray"
    try:
        statuses: list[int] = []
        for number in range(30):
            answer = _raw_exchange(limited.url, passed_on[number % len(passed_on)].request(zarray).decode())
            statuses.append(status_of(answer))
            spelling = refused[number % len(refused)]
            refusal = status_of(_raw_exchange(limited.url, spelling.request(zarray).decode()))
            assert refusal in ((400, 401, 429) if _refused_by_the_gateway_only(spelling) else (400,)), spelling
    finally:
        limited.stop()
    assert set(statuses) <= {200, 429} and 1 <= statuses.count(200) <= 3, statuses


@pytest.mark.nginx
def test_no_spelling_of_a_token_reaches_a_log_line_at_the_proxy(proxy: Proxy, pair: list[Server]) -> None:
    chunk = f"{DATASET}/color_u8/1/0.2.2.1"
    secrets = []
    for number, token_path in enumerate(TOKEN_PATH_SPELLINGS):
        for below in ("", chunk, "/data/zarr/"):
            secret = f"never-logged-{number}-{len(below)}"
            secrets.append(secret)
            path = token_path.format(token=secret) + below
            _raw_exchange(proxy.url, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    for spelling in TOKEN_SPELLINGS.values():
        _raw_exchange(proxy.url, spelling.request(chunk).decode())
    time.sleep(0.3)
    logs = proxy.logs() + "".join(s.log() for s in pair)
    assert "/t/***" in logs
    for secret in (*secrets, TOKEN, TOKEN[4:16]):
        assert secret not in logs, secret
