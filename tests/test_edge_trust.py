"""The HTTP edge against hostile requests (issue 16): a token is one token, nothing leaks, the log cannot
be forged, and a server reached directly has limits. Real gateways on loopback, raw sockets where a client
library would tidy the request up; the proxy's side of the same promises is in test_deploy.py.
"""

import json
import os
import pty
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import hypothesis.strategies as st
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from support.datasets import ORG, OTHER_TOKEN, TOKEN, TOKEN_SPELLINGS, Spelling, WrittenDataset
from support.processes import free_port, raw_exchange, receive_until_closed, stop_process
from support.servers import Server

DATASET = f"/data/zarr/{ORG}/wk_dataset"
ZARRAY = f"{DATASET}/color_u8/1/.zarray"
UNICODE_TOKEN = "jeton-été-トークン"
PUBLIC_ONLY = "token-for-public-datasets"
NOTHING_GRANTED = "token-that-matches-no-dataset"


def exchange(server: Server, head: str | bytes, timeout: float = 15) -> bytes:
    """Send a raw request on a fresh connection; everything the server answers until it closes it."""
    raw = head if isinstance(head, bytes) else head.encode("latin-1")
    return raw_exchange(server.url, raw, timeout, tolerated=(TimeoutError,))


def get(path: str, tokens: list[bytes] | None = None, extra: str = "") -> bytes:
    """A raw GET of ``path`` with one X-Auth-Token line per token and the ``extra`` header lines."""
    lines = b"".join(b"X-Auth-Token: " + token + b"\r\n" for token in tokens or [])
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n".encode() + lines + f"{extra}Connection: close\r\n\r\n".encode()


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def body_of(answer: bytes) -> bytes:
    return answer.partition(b"\r\n\r\n")[2]


@pytest.fixture(scope="module")
def hostile_root(tmp_path_factory: pytest.TempPathFactory, test_data: WrittenDataset) -> Path:
    """Two organizations: one with a public dataset and a damaged one, one with a private dataset only."""
    root = tmp_path_factory.mktemp("hostile-root")
    source = test_data.root / ORG / "wk_dataset"
    shutil.copytree(source, root / "lab_a" / "public_scan")
    shutil.copytree(source, root / "lab_a" / "damaged")
    shutil.copytree(source, root / "lab_b" / "private_scan")
    for data_file in (root / "lab_a" / "damaged" / "color_u8" / "1").rglob("x*.wkw"):
        data_file.write_bytes(b"WKW\x01")  # shorter than a header: a storage fault naming the file
    properties = root / "lab_a" / "damaged" / "datasource-properties.json"
    document = json.loads(properties.read_text())
    ghost = {**document["dataLayers"][0], "name": "ghost", "dataFormat": "zarr"}
    ghost["mags"] = [{"mag": [1, 1, 1], "path": str(root / "lab_a" / "damaged" / "ghost" / "1")}]
    (root / "lab_a" / "damaged" / "ghost" / "1").mkdir(parents=True)  # a layer without a Zarr array
    properties.write_text(json.dumps({**document, "dataLayers": [*document["dataLayers"], ghost]}))
    return root


@pytest.fixture(scope="module")
def hostile_tokens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hostile-tokens") / "tokens.json"
    grants = {
        TOKEN: [f"{ORG}/*", "lab_a/*"],
        OTHER_TOKEN: ["other_org/*"],
        UNICODE_TOKEN: [f"{ORG}/*"],
        PUBLIC_ONLY: ["*/public_*"],
        NOTHING_GRANTED: ["*/nothing_is_called_this"],
    }
    path.write_text(json.dumps({"tokens": grants}, ensure_ascii=False))
    return path


@pytest.fixture(scope="module")
def edge(test_data: WrittenDataset, hostile_tokens: Path, server_factory: Callable[..., Server]) -> Server:
    return server_factory(test_data.root, tokens_file=hostile_tokens)


@pytest.fixture(scope="module")
def lab(hostile_root: Path, hostile_tokens: Path, server_factory: Callable[..., Server]) -> Server:
    return server_factory(hostile_root, tokens_file=hostile_tokens)


# --- a token is one token -----------------------------------------------------------------------------------

MANY = [
    (f"{ZARRAY}?token={TOKEN}&token={TOKEN}", []),
    (f"{ZARRAY}?token=decoy&token={TOKEN}", []),
    (f"{ZARRAY}?token={TOKEN}", [TOKEN.encode()]),
    (ZARRAY, [TOKEN.encode(), TOKEN.encode()]),
    (ZARRAY, [b"decoy", TOKEN.encode()]),
    (f"/preview/{ORG}/wk_dataset/color_u8.png?token={TOKEN}&token={TOKEN}", []),
    (f"/?token={TOKEN}", [TOKEN.encode()]),
]


@pytest.mark.parametrize(("path", "tokens"), MANY)
def test_more_than_one_token_is_a_400(edge: Server, path: str, tokens: list[bytes]) -> None:
    answer = exchange(edge, get(path, tokens))
    assert status_of(answer) == 400, answer[:200]
    assert "more than one token" in json.loads(body_of(answer))["error"]


def test_a_cached_or_earlier_grant_does_not_carry_a_second_token(edge: Server) -> None:
    """The first line grants, the second names a token of another organization: refused, not served."""
    theirs = "/data/zarr/other_org/theirs/.zgroup"
    assert status_of(exchange(edge, get(theirs, [OTHER_TOKEN.encode()]))) == 200
    for lines in ([TOKEN.encode(), OTHER_TOKEN.encode()], [OTHER_TOKEN.encode(), TOKEN.encode()]):
        assert status_of(exchange(edge, get(theirs, lines))) == 400


@pytest.mark.parametrize("spelling", TOKEN_SPELLINGS.values(), ids=TOKEN_SPELLINGS.keys())
def test_a_token_has_one_spelling_per_carrier(edge: Server, spelling: Spelling) -> None:
    """Each spelling is read as exactly TOKEN (200: no other token grants this dataset) or refused with a
    400 that says why; the proxy's /auth decides as the route does, letting the route's 400 through."""
    answer = exchange(edge, spelling.request(ZARRAY))
    assert status_of(answer) in spelling.at_gateway, answer[:300]
    if status_of(answer) == 200:
        assert json.loads(body_of(answer))["zarr_format"] == 2
    else:
        assert "token" in json.loads(body_of(answer))["error"]
    lines = [line.encode() for line in spelling.lines]
    auth = exchange(edge, get("/auth", lines, f"X-Original-URI: {spelling.uri(ZARRAY)}\r\n"))
    assert status_of(auth) == (204 if status_of(answer) == 200 else 202), auth[:300]


def test_auth_lets_a_request_with_two_tokens_through_to_the_routes_400(edge: Server) -> None:
    """An auth subrequest can refuse only with 401 or 403; the route's own 400 then reaches the client."""
    extra = f"X-Original-URI: {ZARRAY}?token={TOKEN}\r\n"
    answer = exchange(edge, get("/auth", [TOKEN.encode()], extra))
    assert status_of(answer) == 202, "let through, and never cached by a proxy (they cache 204 only)"
    assert b"cache-control: no-store" in answer.lower()
    assert status_of(exchange(edge, get(f"{ZARRAY}?token={TOKEN}", [TOKEN.encode()]))) == 400


def test_a_utf8_token_works_as_the_header_and_as_the_query(edge: Server) -> None:
    assert status_of(exchange(edge, get(ZARRAY, [UNICODE_TOKEN.encode()]))) == 200
    assert status_of(exchange(edge, get(f"{ZARRAY}?token={quote(UNICODE_TOKEN)}"))) == 200
    raw_query = f"GET {ZARRAY}?token={UNICODE_TOKEN} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    assert status_of(exchange(edge, raw_query)) in (200, 400)  # raw bytes in a query: a server may refuse them
    auth = exchange(edge, get("/auth", [UNICODE_TOKEN.encode()], f"X-Original-URI: {ZARRAY}\r\n"))
    assert status_of(auth) == 204
    # the same characters in another encoding are another token; bytes that are not UTF-8 are a 400
    assert status_of(exchange(edge, get(ZARRAY, [UNICODE_TOKEN.encode("utf-16-le")]))) in (400, 401)
    assert status_of(exchange(edge, get(ZARRAY, [b"\xff\xfe-not-utf8"]))) == 400
    response = requests.get(edge.url + ZARRAY, headers={"X-Auth-Token": UNICODE_TOKEN.encode()}, timeout=10)
    assert response.status_code == 200, "requests sends bytes as they are"


def test_a_tokens_file_with_a_token_a_header_cannot_carry_stops_start_up(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": {"two,tokens": [f"{ORG}/*"]}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZARR_GATEWAY_")}
    command = [sys.executable, "-m", "gateway", "serve", "--root", str(tmp_path), "--tokens-file", str(tokens)]
    result = subprocess.run([*command, "--port", str(free_port())], capture_output=True, text=True, timeout=30, env=env)
    assert result.returncode != 0
    assert "comma" in result.stderr and "two,tokens" not in result.stderr


POOL = [TOKEN, OTHER_TOKEN, UNICODE_TOKEN, "decoy", ""]
EXPECTED = {TOKEN: 200, UNICODE_TOKEN: 200, OTHER_TOKEN: 403, "decoy": 401}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    header_lines=st.lists(st.lists(st.sampled_from(POOL), min_size=1, max_size=3), max_size=3),
    parameters=st.lists(
        st.tuples(st.sampled_from(["token", "TOKEN", "Token", "to%6Ben", "x"]), st.sampled_from(POOL)), max_size=3
    ),
)
def test_any_mix_of_tokens_is_one_token_or_a_400(
    edge: Server, header_lines: list[list[str]], parameters: list[tuple[str, str]]
) -> None:
    """Generated mixes of header lines, lists in them and query parameters (plain, misspelt and encoded
    names): the gateway reads the one token there is, spelt the one way, or refuses with 400."""
    lines = [", ".join(elements).encode() for elements in header_lines]
    query = "&".join(f"{name}={quote(value)}" for name, value in parameters)
    names = [name for name, _ in parameters if name != "x"]
    offered = [line.decode() for line in lines if line]
    offered += [value for name, value in parameters if name == "token" and value]
    answer = exchange(edge, get(f"{ZARRAY}?{query}" if query else ZARRAY, lines))
    if len(lines) > 1 or any(b"," in line for line in lines) or set(names) - {"token"} or names.count("token") > 1:
        expected = 400
    elif not offered:
        expected = 401
    elif len(offered) == 1:
        expected = EXPECTED[offered[0]]
    else:
        expected = 400
    assert status_of(answer) == expected, (lines, query, answer[:200])
    if expected != 200:
        assert json.loads(body_of(answer))["status"] == expected


# --- nothing leaks ------------------------------------------------------------------------------------------


def test_a_token_sees_only_organizations_where_it_is_granted_a_dataset(lab: Server) -> None:
    def listing(path: str, token: str) -> requests.Response:
        return requests.get(lab.url + path, headers={"X-Auth-Token": token}, timeout=10)

    for tree in ("zarr", "zarr3"):
        root = listing(f"/data/{tree}/", PUBLIC_ONLY)
        assert root.status_code == 200
        assert f"/data/{tree}/lab_a/" in root.text and "lab_b" not in root.text
        assert "lab_" not in listing(f"/data/{tree}/", NOTHING_GRANTED).text
        public = listing(f"/data/{tree}/lab_a/", PUBLIC_ONLY)
        assert public.status_code == 200 and "public_scan" in public.text and "damaged" not in public.text
        # absent and forbidden organizations cannot be told apart: same status, same message shape
        answers = {
            name: listing(f"/data/{tree}/{name}/", token)
            for name, token in (("lab_b", PUBLIC_ONLY), ("no_such_lab", PUBLIC_ONLY), ("lab_a", NOTHING_GRANTED))
        }
        assert {name: a.status_code for name, a in answers.items()} == dict.fromkeys(answers, 403)
        messages = {a.json()["error"].replace(name, "<org>") for name, a in answers.items()}
        assert len(messages) == 1, messages
        # and the proxy's check agrees, parsed and decided by the same code
        for name, answer in answers.items():
            token = PUBLIC_ONLY if name != "lab_a" else NOTHING_GRANTED
            check = requests.get(
                lab.url + "/auth",
                headers={"X-Auth-Token": token, "X-Original-URI": f"/data/{tree}/{name}/"},
                timeout=10,
            )
            assert check.status_code == answer.status_code, name
        check = requests.get(
            lab.url + "/auth", headers={"X-Auth-Token": PUBLIC_ONLY, "X-Original-URI": f"/data/{tree}/lab_a/"}
        )
        assert check.status_code == 204


def test_datasets_of_an_absent_and_of_a_forbidden_organization_look_alike(lab: Server) -> None:
    def status(path: str) -> tuple[int, str]:
        answer = requests.get(lab.url + path, headers={"X-Auth-Token": PUBLIC_ONLY}, timeout=10)
        return answer.status_code, answer.json()["error"]

    forbidden, absent = status("/data/zarr/lab_b/private_scan/"), status("/data/zarr/no_such_lab/private_scan/")
    assert forbidden[0] == absent[0] == 403
    assert forbidden[1].replace("lab_b", "X") == absent[1].replace("no_such_lab", "X")
    granted_but_absent = [status(f"/data/zarr/{org}/public_nothing/") for org in ("lab_b", "no_such_lab")]
    assert {code for code, _ in granted_but_absent} == {404}
    assert len({message.replace("lab_b", "X").replace("no_such_lab", "X") for _, message in granted_but_absent}) == 1


def test_error_bodies_and_pages_name_no_server_path(lab: Server, hostile_root: Path) -> None:
    chunk = requests.get(lab.url + "/data/zarr/lab_a/damaged/color_u8/1/0.2.2.1", headers={"X-Auth-Token": TOKEN})
    assert chunk.status_code == 500
    message = chunk.json()["error"]
    assert "lab_a/damaged/color_u8/1/" in message, "the file is named, relative to the data root"
    page = requests.get(lab.url + "/data/zarr/lab_a/damaged/", headers={"X-Auth-Token": TOKEN}, timeout=10)
    assert page.status_code == 200
    [reason] = re.findall(r"<li>ghost/ &mdash; unavailable: ([^<]*)</li>", page.text)
    assert "lab_a/damaged/ghost/1" in reason, reason
    ghost = requests.get(lab.url + "/data/zarr/lab_a/damaged/ghost/1/.zarray", headers={"X-Auth-Token": TOKEN})
    assert ghost.status_code == 404 and "lab_a/damaged/ghost/1" in ghost.json()["error"]
    for location in {str(hostile_root), os.path.realpath(hostile_root)}:
        for answer in (chunk, page, ghost):
            assert location not in answer.text
            assert location.lstrip("/") not in answer.text


def test_every_answer_sends_no_referrer_and_a_token_page_says_its_links_carry_the_token(edge: Server) -> None:
    for path in (f"{DATASET}/", ZARRAY, f"{DATASET}/color_u8/1/0.0.0.0", "/", "/data/zarr/nowhere/"):
        answer = requests.get(edge.url + path, headers={"X-Auth-Token": TOKEN}, timeout=10)
        assert answer.headers["Referrer-Policy"] == "no-referrer", path
    with_header = requests.get(edge.url + f"{DATASET}/", headers={"X-Auth-Token": TOKEN}, timeout=10).text
    with_query = requests.get(edge.url + f"{DATASET}/", params={"token": TOKEN}, timeout=10).text
    assert 'class="token-note"' not in with_header
    assert 'class="token-note"' in with_query and "carry that token" in with_query
    assert '<meta name="referrer" content="no-referrer">' in with_query
    links = re.findall(r'<a class="open-neuroglancer"[^>]*>', with_query)
    assert links and all('rel="noopener noreferrer"' in link for link in links)


def test_forwarded_headers_count_only_from_trusted_proxies_and_a_public_url_wins(
    test_data: WrittenDataset, server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    forged = {"X-Forwarded-Host": "attacker.example", "X-Forwarded-Proto": "https"}
    page = f"{DATASET}/"

    def served(**settings: object) -> str:
        settings_file = tmp_path / f"settings-{len(list(tmp_path.iterdir()))}.json"
        settings_file.write_text(json.dumps({"settle_seconds": 0, **settings}))
        server = server_factory(test_data.root, settings_file=settings_file)
        try:
            return requests.get(server.url + page, headers=forged, timeout=10).text
        finally:
            stop_process(server.process)

    untrusted = served()
    assert "attacker.example" not in untrusted and "http:&#47;&#47;127.0.0.1:" in untrusted
    assert "https:&#47;&#47;attacker.example&#47;data" in served(trusted_proxies="127.0.0.0/8")
    public = served(trusted_proxies="127.0.0.0/8", public_url="https://zarr.example.org/zarr/")
    assert "attacker.example" not in public
    assert "https:&#47;&#47;zarr.example.org&#47;zarr&#47;data&#47;zarr3&#47;" in public
    assert 'src="/zarr/preview/' in public


# --- logs nobody can forge ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def text_logs(test_data: WrittenDataset, server_factory: Callable[..., Server]) -> Server:
    return server_factory(test_data.root, log_format="text")


ACCESS_LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO gateway\.access: (\S+) (\S+) (\d{3}) (\d+)B \S+ id=(\S+)$"
)


def test_a_path_or_request_id_cannot_forge_a_text_log_line(text_logs: Server) -> None:
    forged_line = "2026-01-01T00:00:00.000Z INFO gateway.access: GET /forged 200 0B 0.1ms id=x"
    hostile_path = f"/data/zarr/{quote(ORG)}/x%0a{quote(forged_line)}%0d%0a%1b[31m"
    exchange(text_logs, get(hostile_path, extra="X-Request-Id: a b status=200 id=forged\r\n"))
    exchange(text_logs, get("/healthz", extra="X-Request-Id: good-id.42\r\n"))
    deadline = time.monotonic() + 10
    while "good-id.42" not in text_logs.log():
        assert time.monotonic() < deadline, text_logs.log()[-2000:]
        time.sleep(0.1)
    access = [line for line in text_logs.log().splitlines() if "gateway.access" in line]
    assert all(ACCESS_LINE.match(line) for line in access), [line for line in access if not ACCESS_LINE.match(line)]
    hostile = [m for m in map(ACCESS_LINE.match, access) if m and m.group(2).startswith(f"/data/zarr/{ORG}/x")]
    assert len(hostile) == 1
    assert "%0A" in hostile[0].group(2) and "%1B" in hostile[0].group(2)
    assert hostile[0].group(5) != "a", "an id with blanks is replaced"
    assert not any(line.startswith("2026-01-01") for line in text_logs.log().splitlines())
    assert "\x1b" not in text_logs.log()
    kept = [m for m in map(ACCESS_LINE.match, access) if m and m.group(5) == "good-id.42"]
    assert len(kept) == 1, "a plain id is kept"


def test_json_access_lines_escape_everything_a_client_sent(edge: Server) -> None:
    exchange(edge, get("/data/zarr/x%0a%22%7d%0a{}", extra='X-Request-Id: "}\r\n'))
    exchange(edge, get("/healthz", extra="X-Request-Id: json-marker\r\n"))
    deadline = time.monotonic() + 10
    while not any(line["request_id"] == "json-marker" for line in edge.access_lines()):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    records = edge.access_lines()
    assert any(line["path"] == '/data/zarr/x\n"}\n{}' for line in records)
    for line in edge.log().splitlines():
        if "gateway.access" in line:
            assert isinstance(json.loads(line), dict), line


def test_log_format_auto_writes_text_to_a_terminal(test_data: WrittenDataset, tmp_path: Path) -> None:
    """``scripts/serve-sample`` at a terminal: lines for a person, not JSON (log collectors get JSON)."""
    port = free_port()
    primary, secondary = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZARR_GATEWAY_")}
    command = [sys.executable, "-m", "gateway", "serve", "--root", str(test_data.root), "--port", str(port)]
    process = subprocess.Popen([*command, "--workers", "1"], stdout=secondary, stderr=secondary, env=env)
    os.close(secondary)
    output = b""
    try:
        deadline = time.monotonic() + 30
        while b"Application startup complete" not in output:
            assert time.monotonic() < deadline and process.poll() is None, output.decode(errors="replace")
            if select.select([primary], [], [], 0.5)[0]:
                try:
                    output += os.read(primary, 65536)
                except OSError:
                    break
        while True:  # the lifespan has started; the listener follows
            try:
                requests.get(f"http://127.0.0.1:{port}/healthz", timeout=10)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        while b"/healthz" not in output:
            assert time.monotonic() < deadline, output.decode(errors="replace")
            if select.select([primary], [], [], 0.5)[0]:
                output += os.read(primary, 65536)
    finally:
        stop_process(process, stop_signal=signal.SIGINT)
        os.close(primary)
    lines = [line for line in output.decode(errors="replace").splitlines() if line.strip()]
    assert not any(line.lstrip().startswith("{") for line in lines), lines[:5]
    assert any(re.search(r" INFO gateway\.access: GET /healthz 200 ", line) for line in lines), lines


# --- limits when reached directly -----------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["uvicorn", "granian"])
def limited(
    request: pytest.FixtureRequest,
    test_data: WrittenDataset,
    server_factory: Callable[..., Server],
    tmp_path_factory: pytest.TempPathFactory,
) -> Server:
    settings_file = tmp_path_factory.mktemp("limits") / "settings.json"
    settings_file.write_text(json.dumps({"settle_seconds": 0, "max_header_bytes": 16384, "header_timeout": 2}))
    return server_factory(test_data.root, settings_file=settings_file, server=request.param)


def test_an_oversized_request_head_is_a_431(limited: Server) -> None:
    fits = get(ZARRAY, extra=f"X-Filler: {'a' * 8000}\r\n")
    assert status_of(exchange(limited, fits)) == 200
    host, port = limited.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=15) as connection:
        connection.sendall(f"GET {ZARRAY} HTTP/1.1\r\nHost: x\r\n".encode())
        try:
            for number in range(16 << 10):  # 16 MiB of headers, as the probe sent
                connection.sendall(f"X-Filler-{number}: {'a' * 1000}\r\n".encode())
        except OSError:
            pass  # the server stopped reading: it has answered
        answer = receive_until_closed(connection, tolerated=(OSError,))
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]


@pytest.mark.parametrize("dribble", [False, True], ids=["idle", "dribbling"])
def test_a_connection_that_sends_no_whole_head_is_closed(limited: Server, dribble: bool) -> None:
    """header_timeout is 2 s here; the issue saw such connections still open after 30 s."""
    host, port = limited.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=1) as connection:
        if dribble:
            connection.sendall(b"GET / HTTP/1.1\r\n")
        started = time.monotonic()
        closed = False
        while not closed and time.monotonic() - started < 30:
            try:
                data = connection.recv(4096)
                closed = not data or data.startswith(b"HTTP/1.1 408")
                if data and not closed:
                    pytest.fail(f"unexpected answer {data[:100]!r}")
            except TimeoutError:
                if dribble:
                    try:
                        connection.sendall(b"X-Dribble: 1\r\n")
                    except OSError:
                        closed = True
            except OSError:
                closed = True
        assert closed, "still open after 30 s"


@pytest.mark.slow  # seconds of requests past the head timeout, then of idling
def test_a_connection_busy_past_the_head_timeout_stays_open_and_is_closed_once_idle(limited: Server) -> None:
    """Each request moves the head clock on: requests half a second apart for longer than header_timeout (2 s) are all
    answered on one connection, and once it is idle it is closed."""
    host, port = limited.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        started = time.monotonic()
        while time.monotonic() - started < 3:
            connection.sendall(f"HEAD {ZARRAY} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            answer = b""
            while b"\r\n\r\n" not in answer:
                received = connection.recv(65536)
                assert received, "closed while requests kept coming"
                answer += received
            assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
            time.sleep(0.5)
        connection.settimeout(30)
        try:
            after = connection.recv(65536)
        except TimeoutError:
            pytest.fail("still open 30 s after its last request")
        except OSError:  # reset: closed too
            after = b""
        assert after == b"", after[:200]


def test_a_kept_alive_connection_still_serves_its_next_request(limited: Server) -> None:
    host, port = limited.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        for _ in range(3):
            connection.sendall(f"GET {ZARRAY} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            answer = b""
            while b"\r\n\r\n" not in answer:
                answer += connection.recv(65536)
            head, _, body = answer.partition(b"\r\n\r\n")
            declared = re.search(rb"content-length: (\d+)", head, re.IGNORECASE)
            assert declared, head
            length = int(declared.group(1))
            while len(body) < length:
                body += connection.recv(65536)
            assert head.startswith(b"HTTP/1.1 200 ")
            time.sleep(0.5)  # well within header_timeout
