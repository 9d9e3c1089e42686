"""Tokens: who may read what, what the server logs, and start-up refusing unusable settings."""

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from support.datasets import ORG, OTHER_TOKEN, TOKEN, WrittenDataset
from support.processes import free_port
from support.servers import Server

from gateway.http.auth import Tokens

DATASET = f"/data/zarr/{ORG}/wk_dataset"
PROTECTED = {
    "chunk": f"{DATASET}/color_u8/1/0.2.2.1",
    "v3_chunk": f"/data/zarr3/{ORG}/wk_dataset/color_u8/1/c/0/2/2/1",
    "zarray": f"{DATASET}/color_u8/1/.zarray",
    "properties": f"{DATASET}/datasource-properties.json",
    "dataset_listing": f"{DATASET}/",
    "layer_listing": f"{DATASET}/color_u8/",
    "organization_listing": f"/data/zarr/{ORG}/",
    "root_listing": "/data/zarr/",
    "v3_root_listing": "/data/zarr3/",
}


def _links(page: str) -> set[str]:
    return set(re.findall(r'href="([^"]+)"', page))


@pytest.mark.parametrize("method", ["GET", "HEAD"])
@pytest.mark.parametrize("route", list(PROTECTED))
def test_no_token_is_401(gateway: Server, route: str, method: str) -> None:
    response = requests.request(method, gateway.url + PROTECTED[route], timeout=10)
    assert response.status_code == 401
    if method == "GET":
        assert "token" in response.json()["error"]
        assert "wk_dataset" not in response.text


@pytest.mark.parametrize("method", ["GET", "HEAD"])
@pytest.mark.parametrize("route", list(PROTECTED))
def test_wrong_token_is_401(gateway: Server, route: str, method: str) -> None:
    for token in ("not-a-token", TOKEN[:-1], TOKEN + "x"):
        response = requests.request(method, gateway.url + PROTECTED[route], headers={"X-Auth-Token": token}, timeout=10)
        assert response.status_code == 401
    response = requests.request(method, gateway.url + PROTECTED[route], params={"token": "nope"}, timeout=10)
    assert response.status_code == 401


@pytest.mark.parametrize("route", ["chunk", "v3_chunk", "zarray", "properties", "dataset_listing", "layer_listing"])
def test_token_of_another_organization_is_403(gateway: Server, route: str) -> None:
    response = requests.get(gateway.url + PROTECTED[route], headers={"X-Auth-Token": OTHER_TOKEN}, timeout=10)
    assert response.status_code == 403
    assert "error" in response.json()
    head = requests.head(gateway.url + PROTECTED[route], headers={"X-Auth-Token": OTHER_TOKEN}, timeout=10)
    assert head.status_code == 403
    # and the same token does read its own organization's copy
    own = PROTECTED[route].replace(f"/{ORG}/wk_dataset", "/other_org/theirs")
    assert requests.get(gateway.url + own, headers={"X-Auth-Token": OTHER_TOKEN}, timeout=10).status_code == 200


@pytest.mark.parametrize("tree", ["zarr", "zarr3"])
def test_organization_listing_of_another_organization_is_403(gateway: Server, tree: str) -> None:
    response = requests.get(gateway.url + f"/data/{tree}/{ORG}/", headers={"X-Auth-Token": OTHER_TOKEN}, timeout=10)
    assert response.status_code == 403
    assert "wk_dataset" not in response.text
    # an organization that does not exist is no different: nothing tells the caller whether it does
    absent = requests.get(gateway.url + f"/data/{tree}/no_such_org/", headers={"X-Auth-Token": TOKEN}, timeout=10)
    assert absent.status_code == 403


@pytest.mark.parametrize("route", list(PROTECTED))
def test_token_as_query_parameter(gateway: Server, route: str) -> None:
    with_header = requests.get(gateway.url + PROTECTED[route], headers={"X-Auth-Token": TOKEN}, timeout=10)
    with_query = requests.get(gateway.url + PROTECTED[route], params={"token": TOKEN}, timeout=10)
    assert with_header.status_code == with_query.status_code == 200
    if with_header.headers["content-type"].startswith("text/html"):
        # A page asked for with ?token= (a listing, a dataset page, a tree root's landing page) carries it in its
        # links, image and viewer URLs (they cannot send headers), so only what it lists is the same.
        def listed(page: str, suffix: str) -> set[str]:
            return {link.removesuffix(suffix) for link in _links(page) if link.startswith("/data/")}

        assert listed(with_header.text, "") == listed(with_query.text, f"?token={TOKEN}")
        assert TOKEN not in with_header.text
    else:
        assert with_header.content == with_query.content


def test_listings_show_only_what_the_token_may_see(gateway: Server) -> None:
    def links(path: str, token: str) -> set[str]:
        response = requests.get(gateway.url + path, headers={"X-Auth-Token": token}, timeout=10)
        assert response.status_code == 200
        return _links(response.text)

    for tree in ("zarr", "zarr3"):
        mine = links(f"/data/{tree}/", TOKEN)
        assert f"/data/{tree}/{ORG}/" in mine
        assert not any("other_org" in link for link in mine)
        theirs = links(f"/data/{tree}/", OTHER_TOKEN)
        assert f"/data/{tree}/other_org/" in theirs
        assert not any(ORG in link for link in theirs)
        assert f"/data/{tree}/other_org/theirs/" in links(f"/data/{tree}/other_org/", OTHER_TOKEN)
        assert f"/data/{tree}/{ORG}/wk_dataset/" in links(f"/data/{tree}/{ORG}/", TOKEN)


def test_token_never_logged(gateway: Server) -> None:
    chunk = gateway.url + PROTECTED["chunk"]
    requests.get(chunk, headers={"X-Auth-Token": TOKEN}, timeout=10)
    requests.get(chunk, params={"token": TOKEN}, timeout=10)
    requests.get(chunk + "?token=" + TOKEN + "&x=1", timeout=10)
    requests.head(gateway.url + PROTECTED["properties"], params={"token": TOKEN}, timeout=10)
    requests.get(gateway.url + f"{DATASET}/color_u8/1/0.x.0.0", params={"token": TOKEN}, timeout=10)  # 400
    requests.get(gateway.url + f"{DATASET}/nope/1/.zarray", params={"token": TOKEN}, timeout=10)  # 404
    requests.get(chunk, params={"token": OTHER_TOKEN}, timeout=10)  # 403
    requests.get(chunk, params={"token": TOKEN + "-wrong"}, timeout=10)  # 401
    requests.get(chunk, headers={"X-Auth-Token": TOKEN + "-wrong"}, timeout=10)  # 401
    log = gateway.log()
    assert "0.x.0.0" in log, "the requests above were not logged at all"
    for secret in (TOKEN, OTHER_TOKEN, TOKEN[5:20]):
        assert secret not in log


def test_open_server_says_it_is_open(test_data: WrittenDataset, server_factory: Callable[..., Server]) -> None:
    server = server_factory(test_data.root)
    assert re.search(r"\bopen\b", server.log(), re.IGNORECASE)
    response = requests.get(server.url + PROTECTED["chunk"], timeout=10)
    assert response.status_code == 200


def test_gateway_with_tokens_does_not_say_it_is_open(gateway: Server) -> None:
    assert not re.search(r"\bopen\b", gateway.log(), re.IGNORECASE)


# --- start-up refuses unusable settings -----------------------------------------------------------


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZARR_GATEWAY_")}
    command = [sys.executable, "-m", "gateway", "serve", "--port", str(free_port()), *args]
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=30, env=env)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the gateway started instead of refusing: {args}") from exc


SECRET_TOKEN = "s3cr3t-t0k3n-value"


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ("{not json", "is not JSON"),
        ("", "is not JSON"),
        (json.dumps(["a", "b"]), "top level: Input should be a valid dictionary"),
        (json.dumps({"tokenz": {}}), "tokens: Field required"),
        (json.dumps({"tokens": ["a"]}), "tokens: Input should be a valid dictionary"),
        (json.dumps({"tokens": {SECRET_TOKEN: "test_org/*"}}), "tokens.<token>: Input should be a valid list"),
        (json.dumps({"tokens": {SECRET_TOKEN: ["test_org/*", 5]}}), "tokens.<token>.1: Input should be a valid string"),
        (json.dumps({"tokens": {SECRET_TOKEN: ["no-slash"]}}), "pattern 'no-slash'"),
        (json.dumps({"tokens": {"": ["test_org/*"]}}), "token #1 is empty"),
    ],
    ids=[
        "broken",
        "empty",
        "list",
        "no-tokens",
        "tokens-list",
        "patterns-string",
        "pattern-int",
        "bad-pattern",
        "empty",
    ],
)
def test_malformed_tokens_file_stops_start_up(tmp_path: Path, content: str, named: str) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(content)
    result = _serve("--root", str(tmp_path), "--tokens-file", str(tokens))
    assert result.returncode != 0
    assert f"tokens file {str(tokens)!r}" in result.stderr
    assert named in result.stderr
    assert SECRET_TOKEN not in result.stderr + result.stdout


def test_missing_tokens_file_stops_start_up(tmp_path: Path) -> None:
    result = _serve("--root", str(tmp_path), "--tokens-file", str(tmp_path / "absent.json"))
    assert result.returncode != 0
    assert "absent.json" in result.stderr


def test_missing_root_stops_start_up(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-root"
    result = _serve("--root", str(missing))
    assert result.returncode != 0
    assert "root" in result.stderr and str(missing) in result.stderr


def test_unsupported_codec_stops_start_up(tmp_path: Path) -> None:
    result = _serve("--root", str(tmp_path), "--codec", "lz4")
    assert result.returncode != 0
    assert "codec" in result.stderr
    for allowed in ("blosc-lz4", "zstd", "gzip"):
        assert allowed in result.stderr


def test_unsupported_chunk_edge_stops_start_up(tmp_path: Path) -> None:
    result = _serve("--root", str(tmp_path), "--chunk-edge", "48")
    assert result.returncode != 0
    assert "chunk_edge" in result.stderr or "chunk-edge" in result.stderr
    assert "48" in result.stderr
    for allowed in ("32", "64", "128", "256"):
        assert allowed in result.stderr


@pytest.mark.parametrize(
    ("pattern", "granted", "refused"),
    [
        ("lab/ds[1]", ["ds[1]"], ["ds1", "ds[2]"]),
        ("lab/ds?", ["ds?"], ["ds1", "dsx"]),
        ("lab/[!a]*", ["[!a]x"], ["bx", "ax"]),
        ("lab/public_*", ["public_", "public_[1]", "public_a*b"], ["private_a", "xpublic_a"]),
        ("*/*", ["ds1", "ds[1]"], []),
    ],
)
def test_only_a_star_is_a_wildcard_in_a_grant_pattern(
    tmp_path: Path, pattern: str, granted: list[str], refused: list[str]
) -> None:
    """Dataset names hold brackets and question marks: in a pattern they stand for themselves."""
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tokens": {"t": [pattern]}}))
    grant = Tokens.load(path).grant("t")
    assert grant is not None
    for name in granted:
        assert grant.allows("lab", name), (pattern, name)
    for name in refused:
        assert not grant.allows("lab", name), (pattern, name)
    assert grant.allows("lab", "ds1") == (pattern == "*/*")  # fnmatch read "ds[1]" as a set: it granted ds1
