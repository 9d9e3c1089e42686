"""Operations: /healthz, /readyz, /metrics, the proxy's /auth, draining on SIGTERM, settings and logs."""

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from support import auth_walk
from support.datasets import ORG, OTHER_TOKEN, TOKEN, WrittenDataset
from support.metrics import delta, scrape, value
from support.processes import free_port, wait_until
from support.servers import TEST_SERVER_ENV, Server

from gateway.settings import Settings

DATASET = f"/data/zarr/{ORG}/wk_dataset"


# --- /auth: the proxy's token check -----------------------------------------------------------------------

AUTH_CASES = [
    # (X-Auth-Token, X-Original-URI, status)
    (None, f"{DATASET}/color_u8/1/0.2.2.1", 401),
    ("not-a-token", f"{DATASET}/color_u8/1/0.2.2.1", 401),
    (TOKEN, f"{DATASET}/color_u8/1/0.2.2.1", 204),
    (TOKEN, f"/data/zarr3/{ORG}/wk_dataset/color_u8/1/c/0/2/2/1", 204),
    (TOKEN, f"{DATASET}/", 204),
    (TOKEN, f"{DATASET}", 204),
    (TOKEN, f"/data/zarr/{ORG}/", 204),
    (TOKEN, "/data/zarr/", 204),
    (TOKEN, "/data/zarr", 204),
    (TOKEN, "/", 204),
    (TOKEN, "/data/zarr/other_org/theirs/.zgroup", 403),
    (TOKEN, "/data/zarr/other_org/", 403),
    (TOKEN, "/data/zarr/other_org", 403),
    (OTHER_TOKEN, f"{DATASET}/color_u8/1/.zarray", 403),
    (OTHER_TOKEN, "/data/zarr/other_org/theirs/.zgroup", 204),
    (OTHER_TOKEN, "/data/zarr/", 204),
    # the token in the original URI's query string
    (None, f"{DATASET}/.zgroup?token={TOKEN}", 204),
    (None, f"{DATASET}/.zgroup?x=1&token={OTHER_TOKEN}", 403),
    (None, f"{DATASET}/.zgroup?token=wrong", 401),
    (None, f"{DATASET}/.zgroup?token=", 401),
    # paths decoded as the gateway decodes them
    (TOKEN, "/data/zarr/other%5Forg/theirs/.zgroup", 403),
    (TOKEN, "/data/zarr//other_org//theirs/.zgroup", 403),
    # what the data routes refuse themselves (dot segments: 400) is let through to their answer, with a
    # 202 that no proxy caches; a path outside the data routes needs only a valid token (as the index)
    (TOKEN, f"{DATASET}/../../other_org/theirs/.zgroup", 202),
    (TOKEN, f"{DATASET}/%2e%2e/%2E%2E/other_org/theirs/.zgroup", 202),
    (TOKEN, "//data/zarr/other_org/theirs/.zgroup", 204),
    (TOKEN, "http://evil/data/zarr/test_org/wk_dataset/.zgroup", 403),
]


@pytest.mark.parametrize(("token", "original", "status"), AUTH_CASES)
def test_auth_answers_for_the_original_uri(gateway: Server, token: str | None, original: str, status: int) -> None:
    headers = {"X-Original-URI": original}
    if token is not None:
        headers["X-Auth-Token"] = token
    for method in ("GET", "HEAD"):
        response = requests.request(method, gateway.url + "/auth", headers=headers, timeout=10)
        assert response.status_code == status, (method, original)
        # A grant may be cached by the proxy for its configured time; a refusal never is.
        assert response.headers.get("Cache-Control") == (None if status == 204 else "no-store")


def test_auth_agrees_with_the_data_routes(gateway: Server) -> None:
    for token, original, status in AUTH_CASES:
        if "?" in original or "://" in original or original.startswith("//"):
            continue
        headers = {"X-Auth-Token": token} if token else {}
        # sent as written: an HTTP client library would resolve the dot segments itself
        connection = http.client.HTTPConnection(gateway.url.removeprefix("http://"), timeout=10)
        try:
            connection.request("GET", original, headers=headers)
            answer = connection.getresponse()
            answered, body = answer.status, answer.read()
        finally:
            connection.close()
        if status == 204:
            assert answered < 400, original
        elif status == 202:  # refused by the routes themselves, never for the token
            assert answered in (400, 404) and b"token" not in body, original
        else:
            assert answered in (status, 400, 404), original


def test_auth_decides_every_place_of_the_url_table_as_its_route_does(gateway: Server) -> None:
    """Every place of the URL table, and hostile spellings of paths to it (escaped slashes and dot segments, doubled
    slashes, query tricks, overlong, not UTF-8, a public prefix followed by a data path), asked of /auth and of the
    route with the same credential: /auth grants only what the route serves, refuses what the route refuses, and
    leaves to the route what it refuses for another reason."""
    walked = list(auth_walk.cases())
    found: Counter[tuple[int, int]] = Counter()
    disagreements = []
    for case in walked:
        auth = auth_walk.auth_of(gateway.url, case).status
        route = auth_walk.exchange(gateway.url, case.method, case.uri, case.headers)
        found[auth, route.status] += 1
        why = auth_walk.disagreement(case, auth, route)
        if why is not None:
            disagreements.append(why)
    assert not disagreements, f"{len(disagreements)} of {len(walked)}:\n" + "\n".join(disagreements[:20])
    # the walk met every decision: granted and served, refused alike, left to the route's 400, 404 and 405
    assert {(204, 200), (401, 401), (403, 403), (202, 400), (202, 404), (202, 405)} <= set(found), found


def test_auth_needs_the_original_uri(gateway: Server) -> None:
    response = requests.get(gateway.url + "/auth", headers={"X-Auth-Token": TOKEN}, timeout=10)
    assert response.status_code == 400
    assert "X-Original-URI" in response.json()["error"]


def test_auth_of_an_open_gateway_lets_everything_through(sharded_gateway: Server) -> None:
    response = requests.get(sharded_gateway.url + "/auth", headers={"X-Original-URI": f"{DATASET}/"}, timeout=10)
    assert response.status_code == 204


# --- health --------------------------------------------------------------------------------------------------


def test_healthz_and_readyz(gateway: Server) -> None:
    for path, body in (("/healthz", {"status": "ok"}), ("/readyz", {"status": "ready"})):
        response = requests.get(gateway.url + path, timeout=10)  # no token: for the internal network
        assert response.status_code == 200 and response.json() == body
        assert requests.head(gateway.url + path, timeout=10).status_code == 200


def test_readyz_fails_while_the_data_root_is_unreadable_and_names_no_path(
    server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    server = server_factory(root)
    assert requests.get(server.url + "/readyz", timeout=10).status_code == 200
    root.rename(tmp_path / "elsewhere")
    try:
        response = requests.get(server.url + "/readyz", timeout=10)
        assert response.status_code == 503
        assert response.json()["problem"].startswith("the data root is not readable: "), response.text
        assert str(tmp_path) not in response.text and not re.search(r"(^|[^\w.])/\w", response.text), "no path"
        assert requests.get(server.url + "/healthz", timeout=10).status_code == 200, "alive, only not ready"
    finally:
        (tmp_path / "elsewhere").rename(root)
    assert requests.get(server.url + "/readyz", timeout=10).status_code == 200


# --- metrics -------------------------------------------------------------------------------------------------


def chunk_paths(count: int, layer: str = "color_u8") -> list[str]:
    keys = [f"0.{x}.{y}.{z}" for x in range(1, 6) for y in range(0, 5) for z in range(0, 3)]
    return [f"{DATASET}/{layer}/1/{key}" for key in keys[:count]]


def test_metrics_count_what_was_sent(server_factory: Callable[..., Server], test_data: WrittenDataset) -> None:
    server = server_factory(test_data.root)
    before = scrape(server)
    sent = 0
    with requests.Session() as session:
        for path in chunk_paths(25):
            response = session.get(server.url + path, timeout=10)
            assert response.status_code == 200
            sent += len(response.content)
        for path in chunk_paths(5, "color_u16"):
            assert session.head(server.url + path, timeout=10).status_code == 200
        for _ in range(3):
            assert session.get(f"{server.url}{DATASET}/color_u8/1/0.0.0.0", timeout=10).status_code == 404
        zarray = session.get(f"{server.url}{DATASET}/color_u8/1/.zarray", timeout=10)
    after = scrape(server)

    requests_total = "zarr_gateway_requests_total"
    assert delta(before, after, requests_total, route="chunk", method="GET", status="200") == 25
    assert delta(before, after, requests_total, route="chunk", method="HEAD", status="200") == 5
    assert delta(before, after, requests_total, route="chunk", method="GET", status="404") == 3
    assert delta(before, after, requests_total, route="metadata", method="GET", status="200") == 1
    assert delta(before, after, requests_total, route="metrics", method="GET", status="200") == 1  # the first scrape
    assert delta(before, after, "zarr_gateway_response_body_bytes_total", route="chunk") >= sent
    error_bytes = delta(before, after, "zarr_gateway_response_body_bytes_total", route="chunk") - sent
    assert 0 < error_bytes < 3 * 1000, "only the three 404 bodies besides the chunks"
    assert delta(before, after, "zarr_gateway_response_body_bytes_total", route="metadata") == len(zarray.content)
    assert delta(before, after, "zarr_gateway_request_duration_seconds_count", route="chunk") == 33
    assert delta(before, after, "zarr_gateway_request_duration_seconds_bucket", route="chunk", le="+Inf") == 33
    lookups = sum(
        delta(before, after, "zarr_gateway_cache_lookups_total", cache="files", result=result)
        for result in ("hit", "miss")
    )
    assert lookups >= 30
    assert value(after, "zarr_gateway_cache_lookups_total", cache="files", result="hit") > 0
    assert value(after, "zarr_gateway_cache_lookups_total", cache="files", result="miss") > 0
    assert value(after, "zarr_gateway_cache_bytes", cache="files") > 0
    assert value(after, "zarr_gateway_storage_errors_total", kind="fault") == 0
    assert value(after, "zarr_gateway_requests_in_flight") == 1  # the scrape itself


def test_metrics_count_storage_errors(
    server_factory: Callable[..., Server], test_data: WrittenDataset, tmp_path: Path
) -> None:
    shutil.copytree(test_data.root / ORG / "wk_dataset", tmp_path / ORG / "wk_dataset")
    data_file = tmp_path / ORG / "wk_dataset" / "color_u16" / "1" / "z0" / "y0" / "x0.wkw"
    with open(data_file, "r+b") as f:
        f.write(b"XYZ")  # no longer WKW: a storage fault, not a missing chunk
    server = server_factory(tmp_path, settle_seconds=0)  # the fault itself, not its freshness
    before = scrape(server)
    for _ in range(2):
        response = requests.get(f"{server.url}{DATASET}/color_u16/1/0.2.2.1", timeout=10)
        assert response.status_code == 500
    after = scrape(server)
    assert delta(before, after, "zarr_gateway_storage_errors_total", kind="fault") == 2
    assert delta(before, after, "zarr_gateway_requests_total", route="chunk", method="GET", status="500") == 2


def test_metrics_add_up_over_workers(
    server_factory: Callable[..., Server], test_data: WrittenDataset, tmp_path: Path
) -> None:
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    (metrics_dir / "counter_1.db").write_bytes(b"stale")  # a previous run's file is removed at start-up
    server = server_factory(test_data.root, workers=2, metrics_dir=metrics_dir)
    for path in chunk_paths(30):
        response = requests.get(server.url + path, headers={"Connection": "close"}, timeout=10)
        assert response.status_code == 200
    time.sleep(1.5)  # a worker adds its tally to the shared metrics within a second
    counts = []
    for _ in range(6):
        samples = requests.get(server.url + "/metrics", headers={"Connection": "close"}, timeout=10)
        parsed = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(samples.text)
            for s in family.samples
        }
        counts.append(value(parsed, "zarr_gateway_requests_total", route="chunk", method="GET", status="200"))
    assert counts == [30.0] * 6, "every worker's scrape adds up the samples of both"
    pids = {p.stem.rsplit("_", 1)[1] for p in metrics_dir.glob("counter_*.db")}
    assert "1" not in pids
    assert len(pids) == 2, f"both workers answered: {pids}"


# --- draining on SIGTERM ---------------------------------------------------------------------------------------


def _slow_request(url: str, path: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    sock.connect((host, int(port)))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    return sock


def _read_response(sock: socket.socket, first: bytes) -> tuple[int, bytes]:
    chunks = [first]
    while True:
        data = sock.recv(1 << 16)
        if not data:
            break
        chunks.append(data)
    sock.close()
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_sigterm_fails_readiness_first_and_lets_in_flight_requests_finish(
    server_factory: Callable[..., Server], test_data: WrittenDataset
) -> None:
    server = server_factory(test_data.root, v3_layout="sharded", drain_seconds=1.5)
    shards = [f"/data/zarr3/{ORG}/wk_dataset/{layer}/1/c/0/0/0/0" for layer in ("color_f32", "segmentation")]
    expected = {path: requests.get(server.url + path, timeout=30).content for path in shards}
    assert all(len(body) > 4_000_000 for body in expected.values())
    slow = [_slow_request(server.url, path) for path in shards]
    first = [sock.recv(1024) for sock in slow]
    assert all(f.startswith(b"HTTP/1.1 200") for f in first)  # the answers are under way

    server.process.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    ready = requests.get(server.url + "/readyz", timeout=5)
    assert ready.status_code == 503 and ready.json()["status"] == "draining"
    assert requests.get(server.url + "/healthz", timeout=5).status_code == 200
    assert requests.get(server.url + f"{DATASET}/color_u8/1/.zarray", timeout=5).status_code == 200

    time.sleep(1.8)  # past drain_seconds: the listener is closed
    with pytest.raises(requests.ConnectionError):
        requests.get(server.url + "/healthz", timeout=5)
    assert server.process.poll() is None, "the server waits for the requests in flight"

    for sock, start, path in zip(slow, first, shards):
        status, body = _read_response(sock, start)
        assert status == 200
        assert body == expected[path]
    assert server.process.wait(15) in (0, -signal.SIGTERM)
    stopping = {"uvicorn": "Waiting for connections to close", "granian": "Stopping worker-1"}
    assert stopping[os.environ.get(TEST_SERVER_ENV) or "uvicorn"] in server.log()


# --- settings: file, environment, flags; refusing what is unknown ---------------------------------------------------


def test_settings_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("ZARR_GATEWAY_")]:
        monkeypatch.delenv(name)
    settings_file = tmp_path / "gateway.json"
    settings_file.write_text(
        json.dumps({"root": str(tmp_path), "cache_control": "max-age=1", "port": 1111, "workers": 3})
    )
    from_file = Settings(settings_file=settings_file)
    assert (from_file.cache_control, from_file.port, from_file.workers, from_file.chunk_edge) == (
        "max-age=1",
        1111,
        3,
        32,
    )
    monkeypatch.setenv("ZARR_GATEWAY_PORT", "2222")
    monkeypatch.setenv("ZARR_GATEWAY_CACHE_CONTROL", "max-age=2")
    from_env = Settings(settings_file=settings_file)
    assert (from_env.cache_control, from_env.port, from_env.workers) == ("max-age=2", 2222, 3)
    from_flags = Settings(settings_file=settings_file, port=3333)
    assert (from_flags.cache_control, from_flags.port) == ("max-age=2", 3333)
    monkeypatch.setenv("ZARR_GATEWAY_SETTINGS_FILE", str(settings_file))
    assert Settings().workers == 3

    dotenv = tmp_path / "gateway.env"
    dotenv.write_text(f"# comment\nZARR_GATEWAY_ROOT={tmp_path}\nexport threads='7'\nZARR_GATEWAY_METRICS_DIR=\n")
    monkeypatch.delenv("ZARR_GATEWAY_SETTINGS_FILE")
    from_dotenv = Settings(settings_file=dotenv)
    assert (from_dotenv.threads, from_dotenv.metrics_dir) == (7, None)


def test_a_settings_file_and_flags_start_a_server(
    server_factory: Callable[..., Server], test_data: WrittenDataset, tmp_path: Path
) -> None:
    settings_file = tmp_path / "gateway.json"
    settings_file.write_text(json.dumps({"cache_control": "max-age=11", "v3_layout": "sharded"}))
    server = server_factory(test_data.root, settings_file=settings_file, cache_control="max-age=33")
    zarr_json = requests.get(f"{server.url}/data/zarr3/{ORG}/wk_dataset/color_u8/1/zarr.json", timeout=10)
    assert zarr_json.headers["Cache-Control"] == "max-age=33", "the flag over the file"
    assert zarr_json.json()["codecs"][0]["name"] == "sharding_indexed", "the file over the default"


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ZARR_GATEWAY_")}
    command = [sys.executable, "-m", "gateway", "serve", "--port", str(free_port()), *args]
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=30, env={**base, **(env or {})})
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the gateway started instead of refusing: {args}") from exc


@pytest.mark.parametrize(
    ("case", "named"),
    [
        ("unknown-env", "ZARR_GATEWAY_CACHE_SIZE"),
        ("unknown-json-key", "cache_size"),
        ("unknown-dotenv-key", "ZARR_GATEWAY_TOKEN_FILE"),
        ("settings-file-not-json", "is not JSON"),
        ("settings-file-missing", "absent.json"),
        ("settings-file-bad-line", "line 2"),
        ("bad-value-in-file", "drain_seconds"),
        ("malformed-tokens-file", "tokens file"),
        ("missing-root", "no-such-root"),
    ],
)
def test_bad_settings_stop_start_up_naming_the_problem(tmp_path: Path, case: str, named: str) -> None:
    args = ["--root", str(tmp_path)]
    env = {}
    if case == "unknown-env":
        env["ZARR_GATEWAY_CACHE_SIZE"] = "1"
    elif case == "unknown-json-key":
        (tmp_path / "s.json").write_text(json.dumps({"cache_size": 1}))
        args += ["--settings-file", str(tmp_path / "s.json")]
    elif case == "unknown-dotenv-key":
        (tmp_path / "s.env").write_text("ZARR_GATEWAY_WORKERS=1\nZARR_GATEWAY_TOKEN_FILE=/x\n")
        args += ["--settings-file", str(tmp_path / "s.env")]
    elif case == "settings-file-not-json":
        (tmp_path / "s.json").write_text("{nope")
        args += ["--settings-file", str(tmp_path / "s.json")]
    elif case == "settings-file-missing":
        env["ZARR_GATEWAY_SETTINGS_FILE"] = str(tmp_path / "absent.json")
    elif case == "settings-file-bad-line":
        (tmp_path / "s.env").write_text("ZARR_GATEWAY_WORKERS=1\njust words\n")
        args += ["--settings-file", str(tmp_path / "s.env")]
    elif case == "bad-value-in-file":
        (tmp_path / "s.json").write_text(json.dumps({"drain_seconds": -1}))
        args += ["--settings-file", str(tmp_path / "s.json")]
    elif case == "malformed-tokens-file":
        (tmp_path / "tokens.json").write_text(json.dumps({"tokens": {TOKEN: "test_org/*"}}))
        args += ["--tokens-file", str(tmp_path / "tokens.json")]
    elif case == "missing-root":
        args = ["--root", str(tmp_path / "no-such-root")]
    result = _serve(*args, env=env)
    assert result.returncode != 0
    assert named in result.stderr
    assert TOKEN not in result.stderr + result.stdout


# --- logs ------------------------------------------------------------------------------------------------------------


def test_log_lines_are_json_objects_without_secrets(gateway: Server) -> None:
    requests.get(f"{gateway.url}{DATASET}/color_u8/1/.zarray", params={"token": TOKEN}, timeout=10)
    requests.get(f"{gateway.url}{DATASET}/.zgroup", headers={"X-Auth-Token": TOKEN, "X-Request-Id": "r-77"}, timeout=10)

    def tagged_request_logged() -> bool:
        return any(line.get("request_id") == "r-77" for line in gateway.access_lines())

    assert wait_until(tagged_request_logged), "the access line is written just after the answer: a moment later"
    lines = [json.loads(line) for line in gateway.log().splitlines() if line.strip()]
    assert all({"time", "level", "logger"} <= set(line) for line in lines)
    settings = [line for line in lines if line.get("message", "").startswith("settings: ")]
    assert len(settings) == 1
    shown = json.loads(settings[0]["message"].removeprefix("settings: "))
    assert shown["tokens_file"].endswith("tokens.json") and shown["root"]
    access = [line for line in lines if line["logger"] == "gateway.access"]
    assert {"request_id", "method", "path", "status", "bytes", "ms"} <= set(access[-1])
    assert any(line["request_id"] == "r-77" and line["path"] == f"{DATASET}/.zgroup" for line in access)
    assert TOKEN not in gateway.log() and OTHER_TOKEN not in gateway.log()


def test_text_logs_on_request(server_factory: Callable[..., Server], tmp_path: Path) -> None:
    server = server_factory(tmp_path, log_format="text")
    requests.get(server.url + "/healthz", timeout=10)
    assert " INFO gateway: settings: " in server.log()


# --- a changed tokens file ------------------------------------------------------------------------------------------


def test_a_changed_tokens_file_is_read_again(
    server_factory: Callable[..., Server], test_data: WrittenDataset, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": {"first-token": [f"{ORG}/*"]}}))
    server = server_factory(test_data.root, tokens_file=tokens, tokens_reload_seconds=0.1)
    url = f"{server.url}{DATASET}/.zgroup"

    def status(token: str) -> int:
        return requests.get(url, headers={"X-Auth-Token": token}, timeout=10).status_code

    def auth(token: str) -> int:
        headers = {"X-Auth-Token": token, "X-Original-URI": f"{DATASET}/.zgroup"}
        return requests.get(server.url + "/auth", headers=headers, timeout=10).status_code

    assert (status("first-token"), status("second-token")) == (200, 401)
    replacement = tmp_path / "tokens.json.new"
    replacement.write_text(json.dumps({"tokens": {"second-token": [f"{ORG}/*"]}}))
    replacement.replace(tokens)  # as an editor or `mv` replaces it
    time.sleep(0.3)
    assert (status("first-token"), status("second-token")) == (401, 200)
    assert (auth("first-token"), auth("second-token")) == (401, 204)

    tokens.write_text("{broken")
    time.sleep(0.3)
    assert status("second-token") == 200, "a broken file keeps the tokens read before"
    assert "stay in force" in server.log()
    assert "second-token" not in server.log() and "first-token" not in server.log()
