"""The compose proxy's answer cache (deploy/nginx.conf, "answers, cached"), run by a real nginx.

deploy/nginx.conf is rendered as docker-compose.yml renders it (deploy/render.py) and run by Debian's nginx in
front of real gateways on loopback, as in test_deploy.py; each test starts its own proxy, so its cache starts
empty. What reached a gateway is read from the gateway's access log, what the cache did from the proxy's
("cache": HIT, MISS, REVALIDATED, EXPIRED, BYPASS).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import numpy as np
import pytest
import requests
import wkw
import yaml
from support.datasets import ORG, OTHER_TOKEN, TOKEN, WrittenDataset
from support.layers import layer_entry, write_properties
from support.processes import raw_exchange, wait_until
from support.proxy import Proxy, address, nginx_version, start_proxy
from support.servers import Server

from deploy.render import AUTH_SCOPE, TEMPLATE, compose_defaults, render

pytestmark = pytest.mark.nginx

DATASET = f"/data/zarr/{ORG}/wk_dataset"
CHUNK = f"{DATASET}/color_u8/1/0.2.2.1"
ZARRAY = f"{DATASET}/color_u8/1/.zarray"
SECOND_TOKEN = "a-second-token-of-test-org"  # granted what TOKEN is granted
LONG = "60s"  # a window no test outlasts: what is cached is still fresh when the test looks again
WAIT_SECONDS = 30  # bound of every wait for a change to show through the proxy (never a measured time)


# --- gateways, proxies and what their logs say -------------------------------------------------------------


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cache-auth") / "tokens.json"
    grants = {TOKEN: [f"{ORG}/*"], SECOND_TOKEN: [f"{ORG}/*"], OTHER_TOKEN: ["other_org/*"]}
    path.write_text(json.dumps({"tokens": grants}))
    return path


@pytest.fixture(scope="module")
def upstream(test_data: WrittenDataset, tokens: Path, server_factory: Callable[..., Server]) -> Server:
    """One gateway: every request the proxy passes on is in its log."""
    return server_factory(test_data.root, tokens_file=tokens)


def proxy_for(server: Server, directory: Path, **settings: str) -> Proxy:
    return start_proxy(directory, [address(server)], **settings)


@pytest.fixture
def proxy(upstream: Server, tmp_path: Path) -> Iterator[Proxy]:
    """The shipped defaults but a long window, with an empty cache."""
    started = proxy_for(upstream, tmp_path / "nginx", PROXY_ANSWER_CACHE_TIME=LONG)
    yield started
    started.stop()


class Marks:
    """Request ids of one test, numbered, and what the proxy's and the gateway's logs say about them."""

    def __init__(self, proxy: Proxy, server: Server, prefix: str) -> None:
        self.proxy, self.server, self.prefix = proxy, server, prefix
        self.count = 0

    def next(self) -> str:
        self.count += 1
        return f"{self.prefix}-{self.count}"

    def get(self, path: str, token: str | None = TOKEN, method: str = "GET", **headers: str) -> requests.Response:
        """``path`` through the proxy with ``token`` as the header (None: no token)."""
        sent = {**headers, "X-Request-Id": self.next()}
        if token is not None:
            sent["X-Auth-Token"] = token
        return requests.request(method, self.proxy.url + path, headers=sent, timeout=30)

    def verdict(self, request_id: str) -> str:
        """The cache's verdict on one request, from the proxy's access log (written just after the answer)."""

        def logged() -> list[dict[str, Any]]:
            return [line for line in self.proxy.access_log() if line["request_id"] == request_id]

        wait_until(logged)
        [line] = logged()
        return str(line["cache"])

    def verdicts(self) -> list[str]:
        self.verdict(self.last())  # every line up to the last request's is written
        return [str(line["cache"]) for line in self.proxy.access_log() if line["request_id"].startswith(self.prefix)]

    def reached(self, request_id: str, settle: float = 0.3) -> list[dict[str, Any]]:
        """The gateway's access lines of one request but its token check, once the gateway has written them."""
        time.sleep(settle)  # a gateway writes its access lines once per event-loop turn, after the answer
        lines = [line for line in self.server.access_lines() if line["request_id"] == request_id]
        return [line for line in lines if line["path"] != "/auth"]

    def last(self) -> str:
        return f"{self.prefix}-{self.count}"


def cache_files(proxy: Proxy) -> list[Path]:
    return [path for path in (proxy.directory / "answer-cache").rglob("*") if path.is_file()]


def cache_keys(proxy: Proxy) -> set[str]:
    """The keys nginx wrote into its cache files (in clear, after "KEY: ")."""
    keys = set()
    for path in cache_files(proxy):
        found = re.search(rb"\nKEY: ([^\n]*)\n", path.read_bytes())
        if found:
            keys.add(found.group(1).decode())
    return keys


# --- the key holds no token --------------------------------------------------------------------------------


def test_one_token_warms_the_cache_for_every_token_granted_the_dataset(proxy: Proxy, upstream: Server) -> None:
    marks = Marks(proxy, upstream, "warm")
    first = marks.get(CHUNK)
    assert first.status_code == 200 and first.content
    assert marks.verdict(marks.last()) == "MISS" and len(marks.reached(marks.last())) == 1
    warmed = marks.last()
    # another token granted the dataset, in each way a token is carried: answered from the cache
    for path, header_token in (
        (CHUNK, SECOND_TOKEN),
        (f"{CHUNK}?token={SECOND_TOKEN}", None),
        (f"/t/{SECOND_TOKEN}{CHUNK}", None),
        (f"{CHUNK}?token={TOKEN}", None),
    ):
        answer = marks.get(path, header_token)
        assert (answer.status_code, answer.content) == (200, first.content), path
        assert answer.headers["ETag"] == first.headers["ETag"]
        assert answer.headers["X-Request-Id"] == marks.last(), "a cached answer carries its own request's id"
        assert marks.verdict(marks.last()) == "HIT", path
        assert marks.reached(marks.last(), settle=0) == [], "a hit reaches no gateway's data route"
    time.sleep(0.3)
    data_lines = [
        line for line in upstream.access_lines() if line["request_id"].startswith("warm-") and line["path"] != "/auth"
    ]
    assert [line["request_id"] for line in data_lines] == [warmed], "one gateway request made the chunk"
    # what nginx keys the answer by: the method and the path, no token in any spelling
    assert f"GET {CHUNK}" in cache_keys(proxy)
    for cached in cache_files(proxy):
        content = cached.read_bytes()
        assert TOKEN.encode() not in content and SECOND_TOKEN.encode() not in content, cached


def test_metadata_and_heads_are_cached_each_under_their_own_method(proxy: Proxy, upstream: Server) -> None:
    marks = Marks(proxy, upstream, "meta")
    document = marks.get(ZARRAY)
    assert document.status_code == 200 and document.json()["zarr_format"] == 2
    again = marks.get(ZARRAY, SECOND_TOKEN)
    assert (again.content, marks.verdict(marks.last())) == (document.content, "HIT")
    head = marks.get(CHUNK, method="HEAD")
    assert head.status_code == 200 and head.content == b""
    assert marks.verdict(marks.last()) == "MISS"
    [line] = marks.reached(marks.last())
    assert line["method"] == "HEAD", "a HEAD is passed on as a HEAD, never as a GET of the whole object"
    head_again = marks.get(CHUNK, SECOND_TOKEN, method="HEAD")
    assert head_again.headers["ETag"] == head.headers["ETag"] and marks.verdict(marks.last()) == "HIT"
    assert {f"HEAD {CHUNK}", f"GET {ZARRAY}"} <= cache_keys(proxy)
    # a client's own validators are answered from the cache too
    unchanged = marks.get(ZARRAY, SECOND_TOKEN, **{"If-None-Match": again.headers["ETag"]})
    assert (unchanged.status_code, unchanged.content, marks.verdict(marks.last())) == (304, b"", "HIT")
    other = marks.get(ZARRAY, SECOND_TOKEN, **{"If-None-Match": '"another-version"'})
    assert (other.status_code, other.content) == (200, document.content)


# --- a token not granted never reads it --------------------------------------------------------------------


def _raw_get(proxy: Proxy, path: str, lines: list[str], request_id: str) -> bytes:
    headers = "".join(f"X-Auth-Token: {line}\r\n" for line in lines)
    head = f"GET {path} HTTP/1.1\r\nHost: x\r\n{headers}X-Request-Id: {request_id}\r\nConnection: close\r\n\r\n"
    return raw_exchange(proxy.url, head.encode())


def test_a_token_not_granted_never_reads_a_cached_answer(proxy: Proxy, upstream: Server) -> None:
    marks = Marks(proxy, upstream, "refused")
    cached = {path: marks.get(path).content for path in (CHUNK, ZARRAY)}
    assert all(cached.values())
    for path, body in cached.items():
        for token, query, status in (
            (OTHER_TOKEN, "", 403),  # granted another organization
            ("not-a-token", "", 401),
            (None, "", 401),
            (None, f"?token={OTHER_TOKEN}", 403),
            (None, "?token=", 401),  # an empty parameter carries no token
        ):
            answer = marks.get(path + query, token)
            assert answer.status_code == status, (path, token, query)
            assert answer.content != body and answer.json()["status"] == status
            assert marks.verdict(marks.last()) == "", "refused before the cache was asked"
        by_path = requests.get(f"{proxy.url}/t/{OTHER_TOKEN}{path}", headers={"X-Request-Id": marks.next()})
        assert by_path.status_code == 403 and by_path.content != body
        # more than one token: refused by the proxy, or let through undecided by the token check (a 202:
        # the first line it sees is no token) to a gateway, which refuses it; never the cached answer
        for query, lines in ((f"?token={TOKEN}", [OTHER_TOKEN]), ("", ["decoy", TOKEN]), ("", ["", TOKEN])):
            request_id = marks.next()
            raw = _raw_get(proxy, path + query, lines, request_id)
            assert raw.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 401 ")), raw[:200]
            assert body not in raw
            assert marks.verdict(request_id) in ("", "BYPASS"), (query, lines)


def test_a_repeated_header_token_is_never_answered_as_another_token(proxy: Proxy, upstream: Server) -> None:
    """nginx 1.23 and later (the compose image's) join repeated header lines and refuse them before any check.
    An older nginx sees only the first line: when that one is granted, the request may be answered from the
    cache as that token's request (its limits counted that token), and otherwise it is refused."""
    marks = Marks(proxy, upstream, "lines")
    body = marks.get(CHUNK).content
    for lines in ([TOKEN, TOKEN], [TOKEN, ""], [TOKEN, OTHER_TOKEN], [OTHER_TOKEN, TOKEN], ["decoy", TOKEN]):
        request_id = marks.next()
        answer = _raw_get(proxy, CHUNK, lines, request_id)
        if nginx_version() >= (1, 23) or lines[0] != TOKEN:
            assert answer.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 401 ", b"HTTP/1.1 403 ")), (lines, answer[:200])
            assert body not in answer
        else:
            assert answer.startswith((b"HTTP/1.1 200 ", b"HTTP/1.1 400 ")), (lines, answer[:200])
            assert answer.startswith(b"HTTP/1.1 400 ") or answer.endswith(body)


# --- freshness by the gateway's validators ------------------------------------------------------------------

EDGE = 128  # one WKW file of 4 x 4 x 4 blocks of 32^3 per side


def _voxels(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 255, size=(1, EDGE, EDGE, EDGE), dtype=np.uint8)


@pytest.fixture
def rewritable(tmp_path: Path, tokens: Path, server_factory: Callable[..., Server]) -> tuple[Path, Server]:
    """A dataset of one raw WKW file that the test rewrites in place, and a gateway over it (settle time 0)."""
    root = tmp_path / "root"
    write_properties(root / ORG / "rewritten", [layer_entry("color", "wkw", (2 * EDGE, EDGE, EDGE))])
    header = wkw.Header(np.uint8, block_type=wkw.Header.BLOCK_TYPE_RAW, file_len=EDGE // 32)
    with wkw.Dataset.create(str(root / ORG / "rewritten" / "color" / "1"), header) as dataset:
        dataset.write((0, 0, 0), _voxels(1))
    return root / ORG / "rewritten" / "color" / "1", server_factory(root, tokens_file=tokens)


REWRITTEN = f"/data/zarr/{ORG}/rewritten/color/1"


def test_a_revalidation_is_a_304_without_a_body(rewritable: tuple[Path, Server], tmp_path: Path) -> None:
    _, server = rewritable
    proxy = proxy_for(server, tmp_path / "nginx", PROXY_ANSWER_CACHE_TIME="1s")
    marks = Marks(proxy, server, "revalidated")
    try:
        first = marks.get(f"{REWRITTEN}/0.1.2.3")
        assert first.status_code == 200 and marks.verdict(marks.last()) == "MISS"
        time.sleep(2.2)  # past the window (nginx counts whole seconds)
        again = marks.get(f"{REWRITTEN}/0.1.2.3")
        assert (again.status_code, again.content) == (200, first.content), "the client gets the whole answer"
        assert marks.verdict(marks.last()) == "REVALIDATED"
        [line] = marks.reached(marks.last())
        assert (line["status"], line["bytes"]) == (304, 0), "the gateway sent no body"
        [logged] = [line for line in proxy.access_log() if line["request_id"] == marks.last()]
        assert logged["upstream_status"] == "304"
        # within the renewed window the answer is a hit again
        assert marks.get(f"{REWRITTEN}/0.1.2.3").content == first.content
        assert marks.verdict(marks.last()) == "HIT"
    finally:
        proxy.stop()


def test_a_rewritten_chunk_shows_within_the_window_and_never_goes_back(
    rewritable: tuple[Path, Server], tmp_path: Path
) -> None:
    """The data file is rewritten in place; through the proxy the new chunk shows within the window, and once
    it has, the old one never again. Each body is what the gateway itself serves for that version."""
    mag, server = rewritable
    proxy = proxy_for(server, tmp_path / "nginx", PROXY_ANSWER_CACHE_TIME="1s")
    marks = Marks(proxy, server, "late")
    key = "0.3.2.1"
    try:
        old = marks.get(f"{REWRITTEN}/{key}")
        assert old.status_code == 200
        assert requests.get(f"{server.url}{REWRITTEN}/{key}", headers={"X-Auth-Token": TOKEN}).content == old.content
        with wkw.Dataset.open(str(mag)) as dataset:  # in place: the same file, new bytes
            dataset.write((0, 0, 0), _voxels(2))
        new = requests.get(f"{server.url}{REWRITTEN}/{key}", headers={"X-Auth-Token": TOKEN}, timeout=30)
        assert new.status_code == 200 and new.content != old.content and new.headers["ETag"] != old.headers["ETag"]
        seen: list[bytes] = []

        def shows() -> bool:
            answer = marks.get(f"{REWRITTEN}/{key}")
            assert answer.status_code == 200, answer.text
            seen.append(answer.content)
            return answer.content == new.content

        assert wait_until(shows, timeout=WAIT_SECONDS, interval=0.1), "the rewrite never showed through the proxy"
        for _ in range(15):  # past the next revalidation: still the new chunk, never the old one again
            shows()
            time.sleep(0.1)
        switched = seen.index(new.content)
        assert all(body == old.content for body in seen[:switched]), "only the old or the new chunk"
        assert all(body == new.content for body in seen[switched:]), "never the stale chunk once it changed"
        assert "EXPIRED" in marks.verdicts(), "the change was found by revalidating the cached answer"
        assert "HIT" in marks.verdicts()[-15:], "and the new chunk is cached in turn"
    finally:
        proxy.stop()


def test_a_chunk_that_appears_late_shows_within_the_window(rewritable: tuple[Path, Server], tmp_path: Path) -> None:
    """A 404 (a chunk of a file not written yet) is cached no longer than the window either."""
    mag, server = rewritable
    proxy = proxy_for(server, tmp_path / "nginx", PROXY_ANSWER_CACHE_TIME="1s")
    marks = Marks(proxy, server, "appears")
    key = "0.5.1.1"  # in the second file along x, which is not there yet
    try:
        absent = marks.get(f"{REWRITTEN}/{key}")
        assert absent.status_code == 404, absent.text
        assert marks.get(f"{REWRITTEN}/{key}").status_code == 404 and marks.verdict(marks.last()) == "HIT"
        with wkw.Dataset.open(str(mag)) as dataset:
            dataset.write((EDGE, 0, 0), _voxels(3))
        direct = requests.get(f"{server.url}{REWRITTEN}/{key}", headers={"X-Auth-Token": TOKEN}, timeout=30)
        assert direct.status_code == 200
        assert wait_until(lambda: marks.get(f"{REWRITTEN}/{key}").content == direct.content, timeout=WAIT_SECONDS)
    finally:
        proxy.stop()


# --- the access log names what the cache did ------------------------------------------------------------------


def test_the_access_log_says_hit_miss_revalidated_and_bypass(proxy: Proxy, upstream: Server, tmp_path: Path) -> None:
    marks = Marks(proxy, upstream, "log")
    marks.get(f"{DATASET}/color_u8/1/0.1.1.1")
    marks.get(f"{DATASET}/color_u8/1/0.1.1.1", SECOND_TOKEN)
    marks.get(f"{DATASET}/color_u8/1/0.1.1.1", Range="bytes=0-9")
    marks.get(f"{DATASET}/")
    assert marks.verdicts() == ["MISS", "HIT", "BYPASS", "BYPASS"]
    short = proxy_for(upstream, tmp_path / "short", PROXY_ANSWER_CACHE_TIME="1s")
    try:
        revalidating = Marks(short, upstream, "log-short")
        revalidating.get(f"{DATASET}/color_u8/1/0.1.1.1")
        time.sleep(2.2)
        revalidating.get(f"{DATASET}/color_u8/1/0.1.1.1")
        assert revalidating.verdicts() == ["MISS", "REVALIDATED"]
    finally:
        short.stop()


# --- ranges of large objects stay ranges --------------------------------------------------------------------


@pytest.fixture(scope="module")
def sharded(test_data: WrittenDataset, tokens: Path, server_factory: Callable[..., Server]) -> Server:
    return server_factory(test_data.root, tokens_file=tokens, v3_layout="sharded")


def test_a_range_of_a_virtual_shard_is_not_a_whole_object_fetch(sharded: Server, tmp_path: Path) -> None:
    proxy = proxy_for(sharded, tmp_path / "nginx", PROXY_ANSWER_CACHE_TIME=LONG)
    marks = Marks(proxy, sharded, "ranges")
    shard = f"/data/zarr3/{ORG}/wk_dataset/color_u8/1/c/0/0/0/0"
    size = int(
        requests.head(sharded.url + shard, headers={"X-Auth-Token": TOKEN}, timeout=30).headers["Content-Length"]
    )
    assert size > 100_000, "a shard far larger than the ranges read of it"
    try:
        for spec, length in (("bytes=-1028", 1028), ("bytes=100-199", 100), ("bytes=0-9, 1000-1009", None)):
            for attempt in range(2):  # the second time too: nothing of it was cached as a whole object
                answer = marks.get(shard, Range=spec)
                assert answer.status_code == 206, (spec, answer.status_code)
                if length is not None:
                    assert len(answer.content) == length
                else:
                    assert answer.headers["Content-Type"].startswith("multipart/byteranges")
                assert marks.verdict(marks.last()) == "BYPASS", (spec, attempt)
                [line] = marks.reached(marks.last())
                assert (line["method"], line["status"]) == ("GET", 206)
                assert line["bytes"] == len(answer.content) < size, "the gateway sent the range, not the shard"
        head = marks.get(shard, method="HEAD")
        assert int(head.headers["Content-Length"]) == size
        [line] = marks.reached(marks.last())
        assert (line["method"], line["bytes"]) == ("HEAD", 0)
    finally:
        proxy.stop()


# --- only what is safe ----------------------------------------------------------------------------------------


def test_pages_listings_errors_and_odd_requests_are_not_cached(proxy: Proxy, upstream: Server) -> None:
    marks = Marks(proxy, upstream, "unsafe")
    for path, token, status in (
        (f"{DATASET}/", TOKEN, 200),  # the dataset page
        (f"{DATASET}/color_u8", TOKEN, 200),  # a listing without the trailing "/": HTML, and not stored
        (f"{DATASET}/color_u8/1", TOKEN, 200),
        (f"/t/{TOKEN}{DATASET}/", None, 200),  # a page whose links carry the token
        ("/data/zarr/", TOKEN, 200),  # a listing that differs per token
        (f"/data/zarr/{ORG}/", TOKEN, 200),
        (f"{DATASET}/color_u8/1/0.2.2.1?probe=1", TOKEN, 200),  # a query beside the token
        (f"{DATASET}/color_u8/1/x.y", TOKEN, 400),  # a malformed key: the gateway's refusal
        (f"{DATASET}/color_u8/1/0.0.0", TOKEN, 400),
    ):
        for _ in range(2):
            answer = marks.get(path, token)
            assert answer.status_code == status, (path, answer.status_code, answer.text[:200])
            assert marks.verdict(marks.last()) != "HIT", path
            assert len(marks.reached(marks.last(), settle=0.1)) == 1, f"{path}: asked of a gateway each time"
    page = marks.get(f"/t/{TOKEN}{DATASET}/", None)
    assert TOKEN in page.text, "the page's links do carry the token"
    for cached in cache_files(proxy):
        assert TOKEN.encode() not in cached.read_bytes(), cached
        assert b"text/html" not in cached.read_bytes().partition(b"\r\n\r\n")[0], cached
    # a 404 is cached (for the window): every granted token gets the same 404, and a refused token none
    missing = f"{DATASET}/color_u8/1/0.90.90.90"
    assert marks.get(missing).status_code == 404
    assert marks.get(missing, SECOND_TOKEN).status_code == 404 and marks.verdict(marks.last()) == "HIT"
    assert marks.get(missing, OTHER_TOKEN).status_code == 403


def test_the_internal_routes_are_neither_reached_nor_cached(proxy: Proxy, upstream: Server) -> None:
    marks = Marks(proxy, upstream, "internal")
    for path in ("/auth", "/metrics", "/readyz"):
        for _ in range(2):
            answer = marks.get(path)
            assert answer.status_code == 404 and b"zarr_gateway" not in answer.content, path
            assert marks.verdict(marks.last()) == "", path
    assert not [key for key in cache_keys(proxy) if "/auth" in key or "/metrics" in key]


def test_a_window_of_0_caches_nothing(upstream: Server, tmp_path: Path) -> None:
    proxy = proxy_for(upstream, tmp_path / "nginx", PROXY_ANSWER_CACHE_TIME="0")
    marks = Marks(proxy, upstream, "uncached")
    try:
        bodies = {marks.get(CHUNK).content for _ in range(3)}
        assert len(bodies) == 1
        assert "HIT" not in marks.verdicts()
        time.sleep(0.3)
        reached = [line for line in upstream.access_lines() if line["request_id"].startswith("uncached-")]
        assert len([line for line in reached if line["path"] == CHUNK]) == 3
    finally:
        proxy.stop()


# --- the settings -------------------------------------------------------------------------------------------------


def test_the_cache_s_place_size_and_window_are_rendered_from_the_settings() -> None:
    values = {**compose_defaults(), "PROXY_ANSWER_CACHE_SIZE": "7g", "PROXY_ANSWER_CACHE_TIME": "3s"}
    rendered = render(TEMPLATE.read_text(), values)
    [path_line] = [line for line in rendered.splitlines() if "keys_zone=zarr_gateway_answers" in line]
    assert path_line.startswith(f"proxy_cache_path {values['PROXY_ANSWER_CACHE_DIR']} ")
    assert " max_size=7g " in path_line
    assert "proxy_cache_valid 200 404 3s;" in rendered, "200 and 404 alone, for the window"
    assert compose_defaults()["PROXY_ANSWER_CACHE_DIR"] != compose_defaults()["PROXY_AUTH_CACHE_DIR"]


# --- Kubernetes: the same proxy as a Deployment in front of the gateways (components/proxy-cache) -------------

KUBERNETES = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes"
COMPONENT = KUBERNETES / "components" / "proxy-cache"
PROXY_DOC = Path(__file__).resolve().parent.parent / "docs" / "deploy-proxy-cache.md"


@pytest.fixture(scope="module")
def cached_overlay(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The shared-filesystem overlay with the component, rendered by kubectl's kustomize from a copy of the tree
    with what an operator adds: the tokens file, and the proxy's templates copied into the component."""
    copy = tmp_path_factory.mktemp("kubernetes") / "kubernetes"
    shutil.copytree(
        KUBERNETES, copy, ignore=shutil.ignore_patterns("tokens.json", "*.env", "nginx.conf", "auth-scope.conf")
    )
    (copy / "overlays" / "shared-filesystem" / "tokens.json").write_text(json.dumps({"tokens": {TOKEN: [f"{ORG}/*"]}}))
    for template in (TEMPLATE, AUTH_SCOPE):
        shutil.copy(template, copy / "components" / "proxy-cache" / template.name)
    overlay = copy / "overlays" / "cached"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": ["../shared-filesystem"],
                "components": ["../../components/proxy-cache"],
            }
        )
    )
    kubectl = Path(sys.executable).parent / "kubectl"
    built = subprocess.run([str(kubectl), "kustomize", str(overlay)], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    return [doc for doc in yaml.safe_load_all(built.stdout) if doc]


def _named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The object of ``kind`` named ``name``, or ``name`` and the hash kustomize adds to a generated one."""
    [found] = [
        doc
        for doc in docs
        if doc["kind"] == kind and re.fullmatch(re.escape(name) + r"(-[a-z0-9]{10})?", doc["metadata"]["name"])
    ]
    return found


def test_the_kubernetes_proxy_is_valid_for_current_kubernetes(cached_overlay: list[dict[str, Any]]) -> None:
    for version in ("1.30.0", kubernetes_validate.latest_version()):
        for doc in cached_overlay:
            kubernetes_validate.validate(doc, version, strict=True)
    namespaces = {doc["metadata"].get("namespace") for doc in cached_overlay if doc["kind"] != "Namespace"}
    assert namespaces == {"zarr-gateway"}, "the proxy's objects sit in the gateways' namespace"


def test_the_kubernetes_proxy_runs_the_compose_templates_in_front_of_the_gateways(
    cached_overlay: list[dict[str, Any]],
) -> None:
    templates = _named(cached_overlay, "ConfigMap", "zarr-gateway-proxy-templates")["data"]
    assert templates == {
        "default.conf.template": TEMPLATE.read_text(),
        "auth-scope.conf.template": AUTH_SCOPE.read_text(),
    }
    settings = _named(cached_overlay, "ConfigMap", "zarr-gateway-proxy-settings")["data"]
    named = {name for text in templates.values() for name in re.findall(r"\$\{?(PROXY_[A-Z0-9_]+)\}?", text)}
    assert named == {name for name in settings if name.startswith("PROXY_")}, "every name the templates use, no other"
    gateways = _named(cached_overlay, "Service", "zarr-gateway")
    assert settings["PROXY_UPSTREAM_SERVERS"] == (
        f"server {gateways['metadata']['name']}.{gateways['metadata']['namespace']}.svc.cluster.local:"
        f"{gateways['spec']['ports'][0]['port']};"
    )
    proxy_service = _named(cached_overlay, "Service", "zarr-gateway-proxy")
    for name in ("zarr-gateway", "zarr-gateway-open"):  # the data paths, and sign-in, the viewer and the favicon
        ingress = _named(cached_overlay, "Ingress", name)
        backends = {path["backend"]["service"]["name"] for path in ingress["spec"]["rules"][0]["http"]["paths"]}
        assert backends == {proxy_service["metadata"]["name"]}, f"every path {name} routes goes through the proxy"
    pod = _named(cached_overlay, "Deployment", "zarr-gateway-proxy")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert volumes[mounts[settings["PROXY_AUTH_CACHE_DIR"]]]["emptyDir"]["medium"] == "Memory", "token keys in memory"
    assert mounts[settings["PROXY_ANSWER_CACHE_DIR"]] in volumes
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert not [
        mount for mount in container["volumeMounts"] if not mount.get("readOnly") and mount["name"] == "templates"
    ]
    # the gateways' policy lets the proxy's pods in
    policy = _named(cached_overlay, "NetworkPolicy", "zarr-gateway")["spec"]
    pod_labels = _named(cached_overlay, "Deployment", "zarr-gateway-proxy")["spec"]["template"]["metadata"]["labels"]
    peers = [peer.get("podSelector", {}).get("matchLabels") for rule in policy["ingress"] for peer in rule["from"]]
    assert pod_labels in peers


def test_the_kubernetes_proxy_s_settings_serve_from_the_cache(
    cached_overlay: list[dict[str, Any]], upstream: Server, tmp_path: Path
) -> None:
    """The settings ConfigMap as the pod's environment, with the pod's places and the Service's name swapped for
    this machine's: a real nginx from them caches as the compose proxy does."""
    settings = _named(cached_overlay, "ConfigMap", "zarr-gateway-proxy-settings")["data"]
    pod_values = {name: value for name, value in settings.items() if name.startswith("PROXY_")}
    for local in ("PROXY_LISTEN", "PROXY_UPSTREAM_SERVERS", "PROXY_AUTH_CACHE_DIR", "PROXY_ANSWER_CACHE_DIR"):
        pod_values.pop(local)  # start_proxy's: a loopback port, the test gateway, temporary directories
    proxy = proxy_for(upstream, tmp_path / "nginx", **pod_values)
    marks = Marks(proxy, upstream, "pod")
    try:
        first = marks.get(CHUNK)
        again = marks.get(CHUNK, SECOND_TOKEN)
        assert first.status_code == again.status_code == 200 and first.content == again.content
        assert marks.verdicts()[0] == "MISS" and marks.verdicts()[1] in ("HIT", "REVALIDATED")
        assert marks.get(CHUNK, OTHER_TOKEN).status_code == 403
    finally:
        proxy.stop()


def _accepted_checks() -> dict[str, str]:
    """The checkov checks docs/deploy-proxy-cache.md accepts for the component, with the reason given for each."""
    rows = re.findall(r"^\| `(CKV\w+)` \| [^|]+ \| ([^|]+) \|$", PROXY_DOC.read_text(), re.MULTILINE)
    return {check: reason.strip() for check, reason in rows}


@pytest.mark.checkov
def test_checkov_fails_no_check_on_the_kubernetes_proxy_but_those_its_doc_accepts(
    cached_overlay: list[dict[str, Any]], tmp_path: Path
) -> None:
    (tmp_path / "proxy.yaml").write_text(
        yaml.safe_dump_all([doc for doc in cached_overlay if doc["metadata"]["name"].startswith("zarr-gateway-proxy")])
    )
    installed = subprocess.run(
        [str(KUBERNETES.parent.parent / "scripts" / "security-tools")], capture_output=True, text=True
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    checkov = installed.stdout.strip().splitlines()[-1]
    command = [
        checkov,
        "-d",
        str(tmp_path),
        "--framework",
        "kubernetes",
        "--skip-download",
        "--output",
        "json",
        "--quiet",
    ]
    run = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "BC_SKIP_MAPPING": "TRUE"}, timeout=600
    )
    assert run.returncode in (0, 1), run.stderr[-3000:]
    report = json.loads(run.stdout)
    assert report["summary"]["passed"] > 50, "checkov ran hardly any check"
    failed = {check["check_id"] for check in report["results"]["failed_checks"]}
    accepted = _accepted_checks()
    assert all(accepted.values()), "every accepted check needs its reason"
    assert failed == set(accepted), f"failed {sorted(failed)}, accepted {sorted(accepted)}"


# --- a mapped layer follows its mapping file ------------------------------------------------------------------


@pytest.fixture
def mapped(tmp_path: Path, tokens: Path, server_factory: Callable[..., Server]) -> tuple[Path, Server]:
    """A segmentation layer with an agglomerate file that the test rewrites, and a gateway over it."""
    import h5py

    root = tmp_path / "root"
    layer = {**layer_entry("cells", "wkw", (EDGE, EDGE, EDGE)), "category": "segmentation", "elementClass": "uint32"}
    write_properties(root / ORG / "mapped", [layer])
    labels = np.random.default_rng(5).integers(0, 500, size=(1, EDGE, EDGE, EDGE), dtype=np.uint32)
    header = wkw.Header(np.uint32, block_type=wkw.Header.BLOCK_TYPE_RAW, file_len=EDGE // 32)
    with wkw.Dataset.create(str(root / ORG / "mapped" / "cells" / "1"), header) as dataset:
        dataset.write((0, 0, 0), labels)
    path = root / ORG / "mapped" / "cells" / "agglomerates" / "proofread.hdf5"
    path.parent.mkdir()
    with h5py.File(path, "w") as f:
        f.create_dataset("segment_to_agglomerate", data=np.arange(500, dtype=np.uint64) // 10)
    return path, server_factory(root, tokens_file=tokens)


def test_a_rewritten_mapping_shows_through_the_proxy_with_its_etag(mapped: tuple[Path, Server], tmp_path: Path) -> None:
    """Proofreading rewrites the agglomerate file in place: through the proxy (the shipped window) the mapped
    chunk and its ETag become the gateway's new ones within the window, and never go back."""
    import h5py

    path, server = mapped
    proxy = proxy_for(server, tmp_path / "nginx", PROXY_ANSWER_CACHE_TIME="1s")
    marks = Marks(proxy, server, "mapped")
    chunk = f"/data/zarr/{ORG}/mapped/cells__proofread/1/0.1.0.1"
    try:
        old = marks.get(chunk)
        assert old.status_code == 200 and marks.get(chunk).headers["ETag"] == old.headers["ETag"]
        with h5py.File(path, "w") as f:  # in place, as proofreading tools write it: every segment joined
            f.create_dataset("segment_to_agglomerate", data=np.full(500, 7, dtype=np.uint64))
        new = requests.get(f"{server.url}{chunk}", headers={"X-Auth-Token": TOKEN}, timeout=30)
        assert new.status_code == 200 and new.content != old.content and new.headers["ETag"] != old.headers["ETag"]
        seen: list[requests.Response] = []

        def shows() -> bool:
            answer = marks.get(chunk)
            assert answer.status_code == 200, answer.text
            seen.append(answer)
            return answer.content == new.content

        assert wait_until(shows, timeout=WAIT_SECONDS, interval=0.1), "the rewrite never showed through the proxy"
        for _ in range(15):  # past the next revalidation: still the new chunk, never the old one again
            shows()
            time.sleep(0.1)
        switched = next(i for i, answer in enumerate(seen) if answer.content == new.content)
        assert all((a.content, a.headers["ETag"]) == (old.content, old.headers["ETag"]) for a in seen[:switched])
        assert all((a.content, a.headers["ETag"]) == (new.content, new.headers["ETag"]) for a in seen[switched:])
        assert "EXPIRED" in marks.verdicts(), "the change was found by revalidating the cached answer"
    finally:
        proxy.stop()
