"""A token in the path, ``/t/{token}/data/...``: for viewers that can send neither a header nor a query kept on
every file (Neuroglancer's zarr sources). Below the token everything serves exactly as the plain path does,
the token is read and judged as a header or query token is, and no log line shows it."""

import http.client
import re
from urllib.parse import quote, urlsplit

import hypothesis.strategies as st
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from support.datasets import ORG, OTHER_TOKEN, TOKEN, TOKEN_PATH_SPELLINGS
from support.processes import wait_until
from support.servers import Server

DATASET = f"{ORG}/wk_dataset"
PLAIN = {
    "v2_chunk": f"/data/zarr/{DATASET}/color_u8/1/0.2.2.1",
    "v3_chunk": f"/data/zarr3/{DATASET}/color_u8/1/c/0/2/2/1",
    "zarray": f"/data/zarr/{DATASET}/color_u8/1/.zarray",
    "zattrs": f"/data/zarr/{DATASET}/color_u8/.zattrs",
    "zarr_json": f"/data/zarr3/{DATASET}/color_u8/zarr.json",
    "v3_array": f"/data/zarr3/{DATASET}/segmentation/1/zarr.json",
    "xarray": f"/data/xarray/{DATASET}/zarr.json",
    "properties": f"/data/zarr/{DATASET}/datasource-properties.json",
    "dataset_listing": f"/data/zarr/{DATASET}/",
    "layer_listing": f"/data/zarr3/{DATASET}/color_u8/",
    "organization_listing": f"/data/zarr/{ORG}/",
    "root_listing": "/data/zarr3/",
    "mesh_info": f"/data/meshes/{DATASET}/segmentation/multires/info",
    "segment_properties": f"/data/meshes/{DATASET}/segmentation/multires/segment_properties/info",
    "preview": f"/preview/{DATASET}/color_u8.png",
    "missing_chunk": f"/data/zarr/{DATASET}/color_u8/1/99.99.99.0",
    "missing_dataset": f"/data/zarr/{ORG}/no_such_dataset/",
}
COMPARED_HEADERS = ("content-type", "content-length", "etag", "content-range", "cache-control")


def raw_get(server: Server, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """A GET of ``path`` exactly as written: no client normalizes its dot segments or escapes."""
    connection = http.client.HTTPConnection(urlsplit(server.url).netloc, timeout=30)
    try:
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def in_path(path: str, token: str = TOKEN) -> str:
    return f"/t/{quote(token, safe='')}{path}"


def in_path_form(page: bytes, token: str = TOKEN) -> bytes:
    """``page`` (opened with ``?token=``) as opened below ``/t/{token}/``: each link below the token path."""
    encoded = quote(token, safe="").encode()
    query_link = re.compile(rb'(href *= *"|src=")(/[^"?]*)\?token=' + re.escape(encoded) + rb'"')
    return query_link.sub(lambda m: m[1] + b"/t/" + encoded + m[2] + b'"', page)


def assert_no_token_logged(server: Server, *tokens: str) -> None:
    log = server.log()
    for token in tokens:
        assert token not in log and quote(token, safe="") not in log, f"a token reached the log:\n{log[-3000:]}"


@pytest.mark.parametrize("route", list(PLAIN))
@pytest.mark.parametrize("ranged", [False, True])
def test_a_path_token_serves_exactly_the_plain_path(gateway: Server, route: str, ranged: bool) -> None:
    range_header = {"Range": "bytes=3-40"} if ranged else {}
    # compared with the token in the query: a dataset page opened with a token in its address carries it on
    plain = requests.get(gateway.url + PLAIN[route], params={"token": TOKEN}, headers=range_header, timeout=30)
    tokened = requests.get(gateway.url + in_path(PLAIN[route]), headers=range_header, timeout=30)
    assert plain.status_code in ((404,) if route.startswith("missing") else (200, 206)), plain.text[:300]
    page = plain.headers["content-type"].startswith("text/html")
    # a page's links keep its credential form: the query's below the query, the path's below the path
    expected = in_path_form(plain.content) if page else plain.content
    assert (tokened.status_code, tokened.content) == (plain.status_code, expected)
    for name in COMPARED_HEADERS if not page else ("content-type", "cache-control"):
        assert tokened.headers.get(name) == plain.headers.get(name), name
    assert tokened.headers["referrer-policy"] == "no-referrer"
    if ranged and plain.status_code == 200 and "bytes" in plain.headers.get("accept-ranges", ""):
        assert tokened.status_code == 206


def test_every_character_of_the_path_token_may_be_percent_encoded(gateway: Server) -> None:
    encoded = "".join(f"%{byte:02X}" for byte in TOKEN.encode())
    status, body = raw_get(gateway, f"/t/{encoded}{PLAIN['v3_chunk']}")
    plain = requests.get(gateway.url + PLAIN["v3_chunk"], headers={"X-Auth-Token": TOKEN}, timeout=30)
    assert (status, body) == (200, plain.content)


def test_the_access_log_shows_the_path_without_its_token(gateway: Server) -> None:
    # The lines are found by request id: access lines are written in batches, so an earlier test's may
    # still be on their way when this one starts.
    ids = [f"path-token-log-{n}" for n in range(4)]
    for request_id, route in zip(ids[:3], ("v3_chunk", "dataset_listing", "preview")):
        answer = requests.get(gateway.url + in_path(PLAIN[route]), headers={"X-Request-Id": request_id}, timeout=30)
        assert answer.status_code == 200
    wrong = requests.get(
        gateway.url + in_path(PLAIN["v3_chunk"], "wrong-" + TOKEN), headers={"X-Request-Id": ids[3]}, timeout=30
    )
    assert wrong.status_code == 401

    def ours() -> list[dict[str, str]]:
        lines = [line for line in gateway.access_lines() if line["request_id"] in ids]
        return lines if len(lines) == len(ids) else []

    paths = [line["path"] for line in wait_until(ours)]
    assert paths == [f"/t/***{PLAIN[r]}" for r in ("v3_chunk", "dataset_listing", "preview", "v3_chunk")]
    assert_no_token_logged(gateway, TOKEN, "wrong-" + TOKEN)


def test_a_path_token_is_judged_as_any_token(gateway: Server) -> None:
    url = gateway.url + in_path(PLAIN["v2_chunk"], "not-a-token")
    response = requests.get(url, timeout=30)
    assert response.status_code == 401 and response.json()["error"] == "the token is not valid"
    response = requests.get(gateway.url + in_path(PLAIN["v2_chunk"], OTHER_TOKEN), timeout=30)
    assert response.status_code == 403
    own = PLAIN["v2_chunk"].replace(f"/{DATASET}/", "/other_org/theirs/")
    assert requests.get(gateway.url + in_path(own, OTHER_TOKEN), timeout=30).status_code == 200
    # a listing with a path token lists what the token may see, as with a header
    listing = requests.get(gateway.url + in_path("/data/zarr/", OTHER_TOKEN), timeout=30)
    assert listing.status_code == 200 and ORG not in listing.text and "other_org" in listing.text


@pytest.mark.parametrize("other", ["header", "query", "same header", "same query", "header list"])
def test_a_path_token_and_another_token_are_a_400(gateway: Server, other: str) -> None:
    token = TOKEN if other.startswith("same") else OTHER_TOKEN
    headers = {"X-Auth-Token": token} if "header" in other else {}
    if other == "header list":
        headers = {"X-Auth-Token": f"{TOKEN}, {OTHER_TOKEN}"}
    params = {"token": token} if "query" in other else {}
    response = requests.get(gateway.url + in_path(PLAIN["v3_chunk"]), headers=headers, params=params, timeout=30)
    assert response.status_code == 400, response.text
    assert ("no list" if other == "header list" else "more than one token") in response.json()["error"]
    assert_no_token_logged(gateway, TOKEN, OTHER_TOKEN)


@pytest.mark.parametrize("segment", ["", ".", "..", "%2E", "%2e%2E"])
def test_an_empty_or_dot_path_token_is_a_400(gateway: Server, segment: str) -> None:
    status, body = raw_get(gateway, f"/t/{segment}{PLAIN['v3_chunk']}")
    assert status == 400 and b"the token in the path" in body, body


def test_a_path_token_with_bytes_that_are_not_utf8_is_a_400(gateway: Server) -> None:
    status, body = raw_get(gateway, f"/t/%FF%FE{PLAIN['v3_chunk']}")
    assert status == 400 and b"not UTF-8" in body, body


@pytest.mark.parametrize(
    "path",
    [
        "/t/{token}",  # nothing below the token
        "/t/{token}/healthz",
        "/t/{token}/metrics",
        "/t/{token}/auth",
        "/t/{token}/t/{token}" + PLAIN["v3_chunk"],  # a token path below a token path
        "/%74/{token}" + PLAIN["v3_chunk"],  # the prefix written with an escape
        "/t%2F{token}" + PLAIN["v3_chunk"],
        "/t/{token}/data",
    ],
)
def test_a_token_path_that_names_nothing_is_a_404_that_shows_no_token(gateway: Server, path: str) -> None:
    status, body = raw_get(gateway, path.format(token=TOKEN))
    assert status == 404, body
    assert TOKEN.encode() not in body
    assert_no_token_logged(gateway, TOKEN)


def test_dot_segments_below_a_path_token_are_a_400(gateway: Server) -> None:
    status, body = raw_get(gateway, in_path(f"/data/zarr/{ORG}/../other_org/theirs/"))
    assert status == 400, body


def test_the_proxy_check_reads_a_path_token(gateway: Server) -> None:
    """/auth decides on ``/t/{token}/...`` of the original URI as the routes do."""

    def auth(uri: str, **headers: str) -> int:
        return requests.get(gateway.url + "/auth", headers={"X-Original-URI": uri, **headers}, timeout=30).status_code

    assert auth(in_path(PLAIN["v3_chunk"])) == 204
    assert auth(in_path(PLAIN["v3_chunk"], OTHER_TOKEN)) == 403
    assert auth(in_path(PLAIN["v3_chunk"], "not-a-token")) == 401
    assert auth(in_path(PLAIN["v3_chunk"]), **{"X-Auth-Token": TOKEN}) == 202  # the routes' 400
    assert auth(in_path(PLAIN["v3_chunk"]) + "?token=" + TOKEN) == 202
    assert auth(f"/t/{PLAIN['v3_chunk']}") == 202  # empty: the routes' 400
    assert auth(f"/t/{TOKEN}/healthz") == 202  # names nothing: the routes' 404


SEPARATORS = st.sampled_from(["/", "//", "/./", "%2F", "/%2e/"])


def assert_no_token_anywhere(server: Server, path: str, token: str) -> None:
    status, body = raw_get(server, path)
    assert status in (400, 404), (path, status)
    assert token.encode() not in body, body


@pytest.mark.parametrize("spelling", TOKEN_PATH_SPELLINGS)
@pytest.mark.parametrize("below", ["", PLAIN["v3_chunk"], "/data/zarr/"])
def test_no_spelling_of_a_token_path_logs_the_token(gateway: Server, spelling: str, below: str) -> None:
    token = f"logged-never-{abs(hash((spelling, below))):x}"
    assert_no_token_anywhere(gateway, spelling.format(token=token) + below, token)
    assert_no_token_logged(gateway, token)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    before=st.lists(st.sampled_from(["", ".", "..", "x", "%2e", "data"]), max_size=3),
    t=st.sampled_from(["t", "T", "%74", "%54"]),
    separator=SEPARATORS,
    after=SEPARATORS,
)
def test_generated_spellings_of_a_token_path_log_no_token(
    gateway: Server, before: list[str], t: str, separator: str, after: str
) -> None:
    token = f"generated-{abs(hash((tuple(before), t, separator, after))):x}"
    path = "/" + "/".join(before) + separator + t + after + token + PLAIN["v3_chunk"]
    if path.startswith(f"/t/{token}/"):
        return  # the token path itself: served, and logged as /t/***/... (tested above)
    assert_no_token_anywhere(gateway, path, token)
    assert_no_token_logged(gateway, token)
