"""The browser path with no dead ends (issue 44, items 3 and 4): a browser that follows a link gets a page, never
raw JSON, from the gateway and from the proxy in front of it, while API clients keep their JSON errors exactly;
every link of a page keeps the page's credential form; and the frictions a new user met are gone.

Real gateways on loopback ports (the session's data root with tokens, and the sample), Debian's nginx with
deploy/nginx.conf in front of one, headless Chromium clicking through the pages, and the Accept headers that
zarr-python and tensorstore really send, captured from them.
"""

import html
import json
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote, unquote

import pytest
import requests
import yaml
from support.browser import Browser
from support.datasets import ORG, OTHER_TOKEN, TOKEN, WrittenDataset
from support.processes import wait_until
from support.proxy import Proxy, address, start_proxy
from support.servers import Server
from support.viewer import state_sources

from deploy.render import COMPOSE, DEPLOY
from gateway.http.errors import prefers_html
from gateway.http.pages.snippets import CLIENTS, INSTALL
from gateway.sample import DATASET as SAMPLE_DATASET
from gateway.sample import ORGANIZATION as SAMPLE_ORG

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
# What Chromium sends when it follows a link to a page.
BROWSER_ACCEPT = (
    "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,image/apng,*/*;q=0.8,"
    "application/signed-exchange;v=b3;q=0.7"
)
HTML_HEADERS = {"Accept": BROWSER_ACCEPT}
DATASET = f"{ORG}/wk_dataset"
ENCODED = quote(TOKEN, safe="")
# A refusal of each kind, with what an API client gets for it (the gateway's JSON, as before this change).
REFUSALS = {
    "no token": (f"/data/zarr/{DATASET}/", {}, 401),
    "unknown token": (f"/data/zarr/{DATASET}/color_u8/1/.zarray", {"X-Auth-Token": "not-a-token"}, 401),
    "not granted": (f"/data/zarr3/{DATASET}/zarr.json", {"X-Auth-Token": OTHER_TOKEN}, 403),
    "missing dataset": (f"/data/zarr/{ORG}/no_such_dataset/", {"X-Auth-Token": TOKEN}, 404),
    "missing chunk": (f"/data/zarr/{DATASET}/color_u8/1/0.99.99.0", {"X-Auth-Token": TOKEN}, 404),
    "two tokens": (f"/data/zarr/{DATASET}/?token={ENCODED}", {"X-Auth-Token": TOKEN}, 400),
    "no route": ("/nothing-here", {}, 404),
}


class Links(HTMLParser):
    """Every link (``<a href>``, whatever its spacing) and image of a page, its title and its error message."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.hrefs: list[str] = []
        self.images: list[str] = []
        self.styled = False
        self.message = ""
        self._in_message = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {name: value or "" for name, value in attrs}
        if tag == "a" and "href" in found:
            self.hrefs.append(found["href"])
        elif tag == "img":
            self.images.append(found["src"])
        elif tag == "style":
            self.styled = True
        elif tag == "p" and "error-message" in found.get("class", ""):
            self._in_message = True

    def handle_endtag(self, tag: str) -> None:
        self._in_message = self._in_message and tag != "p"

    def handle_data(self, data: str) -> None:
        if self._in_message:
            self.message += data


def parsed(text: str) -> Links:
    page = Links()
    page.feed(text)
    return page


def own_links(page: Links) -> list[str]:
    """The links and images of a page that lead to the gateway itself (not the viewer's state in a fragment)."""
    return [link for link in page.hrefs + page.images if link.startswith("/") and "#!" not in link]


# --- the Accept headers real clients send ------------------------------------------------------------------


class _Recorder(BaseHTTPRequestHandler):
    seen: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        type(self).seen.append(self.headers.get("Accept"))
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_HEAD(self) -> None:
        self.do_GET()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def client_accepts() -> list[str | None]:
    """The Accept headers zarr-python (fsspec over aiohttp), tensorstore and requests send, from a server that
    records them and answers 404 to everything."""
    import tensorstore as ts
    import zarr

    with ThreadingHTTPServer(("127.0.0.1", 0), _Recorder) as recorder:
        threading.Thread(target=recorder.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{recorder.server_address[1]}/data/zarr3/org/ds/layer/1"
        with pytest.raises(FileNotFoundError):
            zarr.open_array(url, mode="r")
        with pytest.raises(ValueError):
            ts.open({"driver": "zarr3", "kvstore": {"driver": "http", "base_url": url}}, read=True).result()
        requests.get(url, timeout=10)
        recorder.shutdown()
    assert len(_Recorder.seen) >= 3
    return list(_Recorder.seen)


def test_no_data_client_prefers_html(client_accepts: list[str | None]) -> None:
    assert not any(prefers_html(None if accept is None else accept.encode()) for accept in client_accepts)
    assert prefers_html(BROWSER_ACCEPT.encode())
    for accept in ("*/*", "application/json", "application/json, text/html", "text/html;q=0.5, */*", "image/*"):
        assert not prefers_html(accept.encode()), accept
    assert prefers_html(b"text/html") and prefers_html(b"application/json;q=0.4, text/html")


# --- the gateway: JSON for API clients, a page for a browser -------------------------------------------------


@pytest.mark.parametrize("kind", list(REFUSALS))
def test_api_clients_keep_their_json_errors(gateway: Server, client_accepts: list[str | None], kind: str) -> None:
    path, headers, status = REFUSALS[kind]
    for accept in {*client_accepts, "*/*"}:
        sent = dict(headers) if accept is None else {**headers, "Accept": accept}
        answer = requests.get(gateway.url + path, headers=sent, timeout=30)
        assert answer.status_code == status, answer.text
        assert answer.headers["content-type"] == "application/json"
        body = answer.json()
        assert set(body) == {"error", "status"} and body["status"] == status and body["error"], body
        assert answer.headers["vary"] == "Accept"


@pytest.mark.parametrize("kind", list(REFUSALS))
def test_a_browser_gets_an_error_page_saying_the_same(gateway: Server, kind: str) -> None:
    path, headers, status = REFUSALS[kind]
    as_json = requests.get(gateway.url + path, headers=headers, timeout=30)
    answer = requests.get(gateway.url + path, headers={**headers, **HTML_HEADERS}, timeout=30)
    assert answer.status_code == status == as_json.status_code
    assert answer.headers["content-type"] == "text/html; charset=utf-8"
    assert answer.headers["vary"] == "Accept"
    page = parsed(answer.text)
    assert page.styled, "the pages' style"
    assert page.message == as_json.json()["error"]  # the same message, for a person
    assert "start" in answer.text and any(href.startswith("/") for href in page.hrefs)
    assert TOKEN not in answer.text.replace(f"?token={ENCODED}", ""), "no token but in a link of the page's form"


@pytest.mark.parametrize(
    "accept",
    [
        "text/html;q=abc",
        "text/html;q=nan, */*",
        "text/html;q=inf",
        ";;;text/html,,,;q=",
        "text/html;" * 1000,
        "\xfftext/html",
    ],
)
def test_a_crafted_accept_header_gets_one_of_the_two_answers(gateway: Server, accept: str) -> None:
    answer = requests.get(f"{gateway.url}/data/zarr/{DATASET}/", headers={"Accept": accept}, timeout=30)
    assert answer.status_code == 401
    kind = answer.headers["content-type"]
    assert kind == "application/json" or (kind.startswith("text/html") and parsed(answer.text).message), kind


def test_a_method_refused_is_a_page_for_a_browser_and_json_for_the_rest(gateway: Server) -> None:
    path = f"/data/zarr/{DATASET}/"
    as_json = requests.post(gateway.url + path, timeout=30)
    page = requests.post(gateway.url + path, headers=HTML_HEADERS, timeout=30)
    assert as_json.status_code == page.status_code == 405
    assert as_json.headers["content-type"] == "application/json" and as_json.headers["allow"] == page.headers["allow"]
    assert page.headers["content-type"].startswith("text/html")
    assert parsed(page.text).message == as_json.json()["error"]


def test_the_401_page_says_how_to_use_a_token(gateway: Server) -> None:
    path = f"/data/zarr3/{DATASET}/color_u8/"
    answer = requests.get(gateway.url + path, headers=HTML_HEADERS, timeout=30)
    assert answer.status_code == 401
    text = " ".join(parsed(answer.text).hrefs) + unquote(answer.text).replace("&#47;", "/")
    assert f"{path}?token=YOUR_TOKEN" in text  # the query form, for this very page
    assert f"/t/YOUR_TOKEN{path}" in text  # the path form a viewer needs
    assert "X-Auth-Token" in text
    assert parsed(answer.text).hrefs == ["/"], "the start page, without the refused credential"
    assert "/login" not in text and "share link" not in text, "no sign-in or links on a gateway without them"


def test_error_page_links_keep_the_page_s_credential_form(gateway: Server) -> None:
    missing = f"/data/zarr/{ORG}/no_such_dataset/"
    by_query = requests.get(gateway.url + missing, params={"token": TOKEN}, headers=HTML_HEADERS, timeout=30)
    assert by_query.status_code == 404 and parsed(by_query.text).hrefs == [f"/?token={ENCODED}"]
    in_path = requests.get(f"{gateway.url}/t/{ENCODED}{missing}", headers=HTML_HEADERS, timeout=30)
    assert in_path.status_code == 404 and parsed(in_path.text).hrefs == [f"/t/{ENCODED}/"]
    by_header = requests.get(gateway.url + missing, headers={"X-Auth-Token": TOKEN, **HTML_HEADERS}, timeout=30)
    assert by_header.status_code == 404 and parsed(by_header.text).hrefs == ["/"]  # no link can carry a header


@pytest.fixture
def faulty_gateway(test_data: WrittenDataset, tmp_path: Path, server_factory: Callable[..., Server]) -> Server:
    """A gateway over a copy of the data whose first WKW data file of color_u8 at mag 1 is cut short."""
    root = tmp_path / "root"
    shutil.copytree(test_data.root, root, symlinks=True)
    data = sorted((root / ORG / "wk_dataset" / "color_u8" / "1").rglob("x*.wkw"))[0]
    data.write_bytes(data.read_bytes()[:40])
    return server_factory(root, settle_seconds=0)


def test_a_storage_fault_is_a_5xx_page_for_a_browser(faulty_gateway: Server) -> None:
    listed = requests.get(f"{faulty_gateway.url}/data/zarr/{DATASET}/color_u8/1/", timeout=30)
    assert listed.status_code == 200
    chunks = [f"/data/zarr/{DATASET}/color_u8/1/0.{x}.{y}.{z}" for x in range(2) for y in range(2) for z in range(2)]
    faults = [path for path in chunks if requests.get(faulty_gateway.url + path, timeout=30).status_code >= 500]
    assert faults, "the cut file is read by one of the first chunks"
    as_json = requests.get(faulty_gateway.url + faults[0], timeout=30)
    answer = requests.get(faulty_gateway.url + faults[0], headers=HTML_HEADERS, timeout=30)
    assert answer.status_code == as_json.status_code >= 500
    assert as_json.headers["content-type"] == "application/json"
    assert answer.headers["content-type"] == "text/html; charset=utf-8"
    assert parsed(answer.text).message == as_json.json()["error"] and "X-Request-Id" in answer.text


# --- every link of a page keeps its credential form -----------------------------------------------------------

PAGES = [
    "/",
    "/data/zarr/",
    f"/data/zarr/{ORG}/",
    f"/data/zarr/{DATASET}/",
    f"/data/zarr3/{DATASET}/",
    f"/data/zarr3/{DATASET}/color_u8/",
    f"/data/zarr/{DATASET}/segmentation/1/",
]


@pytest.mark.parametrize("form", ["query", "path"])
def test_every_link_of_every_page_opens_with_the_page_s_credential(gateway: Server, form: str) -> None:
    def address(path: str) -> str:
        return f"{path}?token={ENCODED}" if form == "query" else f"/t/{ENCODED}{path}"

    followed: set[str] = set()
    for path in PAGES:
        answer = requests.get(gateway.url + address(path), headers=HTML_HEADERS, timeout=60)
        assert answer.status_code == 200, (path, answer.text[:300])
        page = parsed(answer.text)
        assert page.styled, f"{path}: the dataset page's style"
        links = own_links(page)
        assert links, path
        for link in links:
            assert link == address(link.removeprefix(f"/t/{ENCODED}").partition("?")[0]), (path, link)
        followed.update(links)
    for link in sorted(followed):  # no header, no cookie: only what the link itself carries
        assert requests.get(gateway.url + link, headers=HTML_HEADERS, timeout=60).status_code == 200, link


def test_a_header_token_puts_no_token_into_links(gateway: Server) -> None:
    for path in PAGES:
        answer = requests.get(gateway.url + path, headers={"X-Auth-Token": TOKEN, **HTML_HEADERS}, timeout=60)
        assert answer.status_code == 200 and TOKEN not in answer.text and ENCODED not in answer.text, path


def test_fsspec_lists_below_a_path_token(gateway: Server) -> None:
    import fsspec

    filesystem = fsspec.filesystem("http", skip_instance_cache=True)
    url = f"{gateway.url}/t/{ENCODED}/data/zarr3/{DATASET}/"
    listed = {entry.removeprefix(url).rstrip("/") for entry in filesystem.ls(url, detail=False)}
    assert {"zarr.json", "color_u8", "segmentation"} <= listed, listed


@pytest.mark.browser
def test_a_browser_clicks_through_the_pages_and_meets_no_json(gateway: Server, browser: Browser) -> None:
    """Chromium opens the dataset page with ?token=, then every page and file it links to, as a click does."""
    with browser.page() as page:
        page.navigate(f"{gateway.url}/data/zarr3/{DATASET}/?token={ENCODED}")
        links = page.evaluate(
            "[...document.querySelectorAll('a')].map(a => a.href).filter(h => h.startsWith(location.origin))"
        )
        assert len(links) > 6, links
        for link in links:
            page.navigate(link)
            kind = page.evaluate("document.contentType")
            text = page.evaluate("document.body.innerText")
            assert not text.lstrip().startswith('{"error"'), (link, text[:200])
            if kind == "application/json":  # a metadata document, opened for what it is
                assert '"zarr_format"' in text or '"dataLayers"' in text, (link, text[:200])
            else:
                assert kind == "text/html", (link, kind)
        page.navigate(f"{gateway.url}/data/zarr3/{DATASET}/color_u8/")  # no token: the 401 page
        assert page.evaluate("document.contentType") == "text/html"
        assert "/t/YOUR_TOKEN/data/zarr3/" in page.evaluate("document.body.innerText")


# --- the proxy: a page for a browser, JSON for the rest ------------------------------------------------------


@pytest.fixture(scope="module")
def proxy(gateway: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    started = start_proxy(tmp_path_factory.mktemp("nginx"), [address(gateway)])
    yield started
    started.stop()


NGINX_JSON = {
    401: "a valid token is required: send it as the X-Auth-Token header or the token query parameter",
    403: "the token does not grant access to this dataset",
}


@pytest.mark.nginx
@pytest.mark.parametrize(("path", "headers", "status"), [(p, h, s) for p, h, s in REFUSALS.values() if s in (401, 403)])
def test_the_proxy_keeps_json_for_api_clients(proxy: Proxy, path: str, headers: dict[str, str], status: int) -> None:
    for accept in (None, "*/*", "application/json"):
        sent = headers if accept is None else {**headers, "Accept": accept}
        answer = requests.get(proxy.url + path, headers=sent, timeout=30)
        assert answer.status_code == status
        assert answer.headers["content-type"] == "application/json"
        assert answer.json() == {"error": NGINX_JSON[status], "status": status}


@pytest.mark.nginx
def test_the_proxy_shows_a_browser_pages(proxy: Proxy) -> None:
    start = requests.get(proxy.url + "/", headers=HTML_HEADERS, timeout=30)  # no token: the gateway's start page
    assert start.status_code == 200 and start.headers["content-type"] == "text/html; charset=utf-8"
    assert "/t/" in unquote(start.text).replace("&#47;", "/"), "the path form a viewer needs"
    assert requests.get(proxy.url + "/", timeout=30).status_code == 401  # an API client: refused, as before
    for path, headers, status in REFUSALS.values():
        if status not in (401, 403):
            continue
        answer = requests.get(proxy.url + path, headers={**headers, **HTML_HEADERS}, timeout=30)
        assert answer.status_code == status and answer.headers["content-type"].startswith("text/html"), path
        assert parsed(answer.text).message, path
    two = requests.get(proxy.url + REFUSALS["two tokens"][0], headers={"X-Auth-Token": TOKEN, **HTML_HEADERS})
    assert two.status_code == 400 and two.headers["content-type"] == "text/html", two.text
    assert "more than one token" in parsed(two.text).message
    assert requests.get(proxy.url + REFUSALS["two tokens"][0], headers={"X-Auth-Token": TOKEN}).json()["status"] == 400
    # pages opened through the proxy with a token in either form: every link opens through it too
    for opened in (f"/data/zarr3/{DATASET}/?token={ENCODED}", f"/t/{ENCODED}/data/zarr3/{DATASET}/"):
        page = requests.get(proxy.url + opened, headers=HTML_HEADERS, timeout=30)
        assert page.status_code == 200, page.text[:300]
        for link in own_links(parsed(page.text)):
            assert requests.get(proxy.url + link, headers=HTML_HEADERS, timeout=30).status_code == 200, link


@pytest.mark.nginx
@pytest.mark.browser
def test_a_browser_through_the_proxy_meets_pages(proxy: Proxy, browser: Browser) -> None:
    """Chromium through nginx: the start page without a token says how to add one, a data page without one is
    the 401 page, and with a token in the path every link of the dataset page opens."""
    with browser.page() as page:
        page.navigate(proxy.url + "/")
        assert page.evaluate("document.contentType") == "text/html"
        assert "/t/" in page.evaluate("document.body.innerText")
        page.navigate(f"{proxy.url}/data/zarr3/{DATASET}/")
        assert page.evaluate("document.contentType") == "text/html"
        assert "YOUR_TOKEN" in page.evaluate("document.body.innerText")
        page.navigate(f"{proxy.url}/t/{ENCODED}/data/zarr3/{DATASET}/")
        links = page.evaluate(
            "[...document.querySelectorAll('a')].map(a => a.href).filter(h => h.startsWith(location.origin))"
        )
        statuses = page.evaluate(f"Promise.all({json.dumps(links)}.map(l => fetch(l).then(r => r.status)))")
    assert links and all(link.startswith(f"{proxy.url}/t/{ENCODED}/") for link in links), links
    assert statuses == [200] * len(links), dict(zip(links, statuses))


@pytest.mark.nginx
def test_the_favicon_is_open_at_the_gateway_and_the_proxy(gateway: Server, proxy: Proxy) -> None:
    from PIL import Image

    for url in (gateway.url, proxy.url):
        answer = requests.get(url + "/favicon.ico", timeout=30)
        assert answer.status_code == 200, (url, answer.text[:200])
        assert answer.headers["content-type"] == "image/x-icon"
        import io

        with Image.open(io.BytesIO(answer.content)) as icon:
            assert icon.format == "ICO" and icon.size == (32, 32)


@pytest.mark.browser
def test_no_console_error_for_the_favicon(gateway: Server, browser: Browser) -> None:
    since = len(gateway.log())
    with browser.page() as page:
        page.navigate(f"{gateway.url}/?token={ENCODED}")
        wait_until(lambda: "/favicon.ico" in gateway.log()[since:], timeout=30, interval=0.2)
        page.evaluate("new Promise(done => setTimeout(done, 200))")  # the icon's answer reaches the console
        console = list(page.console)
    assert not [line for line in console if "favicon" in line or "404" in line or "401" in line], console


# --- the landing page's viewer link selects segments, as the dataset page's does -------------------------------


def viewer_state(page_text: str) -> dict[str, Any]:
    link = next(href for href in parsed(page_text).hrefs if "#!" in href)
    state: dict[str, Any] = json.loads(unquote(link.partition("#!")[2]))
    return state


def selected(state: dict[str, Any]) -> dict[str, list[str]]:
    return {layer["name"]: layer.get("segments", []) for layer in state["layers"] if layer["type"] == "segmentation"}


def test_the_landing_link_selects_the_largest_segments(
    sample_root: Path, server_factory: Callable[..., Server]
) -> None:
    layer = [str(sample_root), f"{SAMPLE_ORG}/{SAMPLE_DATASET}", "segmentation"]
    indexed = subprocess.run(
        [sys.executable, "-m", "gateway", "index-segments", *layer], capture_output=True, timeout=300
    )
    assert indexed.returncode == 0, indexed.stderr
    fresh = server_factory(sample_root)  # no data stamp known yet: the first landing page must wait for it
    landing = requests.get(fresh.url + "/", timeout=120)
    assert landing.status_code == 200
    on_landing = selected(viewer_state(landing.text))
    assert on_landing["segmentation"], on_landing
    dataset = requests.get(f"{fresh.url}/data/zarr/{SAMPLE_ORG}/{SAMPLE_DATASET}/", timeout=120)
    assert on_landing == selected(viewer_state(dataset.text))
    assert all(
        f"/data/{'zarr'}/" in source or "/data/meshes/" in source
        for source in state_sources(viewer_state(landing.text))
    )


# --- the frictions ------------------------------------------------------------------------------------------


def test_compose_publishes_the_tls_port_on_loopback_unless_told() -> None:
    ports = yaml.safe_load(COMPOSE.read_text())["services"]["proxy"]["ports"]
    tls = next(port for port in ports if str(port).endswith(":8443"))
    assert tls == "${PUBLIC_TLS_PORT:-127.0.0.1:8443}:8443"
    env = (DEPLOY / ".env.example").read_text()
    assert re.search(r"^PUBLIC_TLS_PORT=127\.0\.0\.1:8443$", env, re.M)
    assert "127.0.0.1:8080" in env and "127.0.0.1:8443" in env  # both loopback forms shown


def test_compose_config_resolves_the_tls_port_to_loopback(tmp_path: Path) -> None:
    tool = shutil.which("docker-compose")
    if tool is None:
        pytest.fail("docker-compose is missing: run scripts/install-system-packages")
    env = tmp_path / ".env"
    env.write_text(f"DATA_ROOT={tmp_path}\n")
    done = subprocess.run(
        [tool, "--env-file", str(env), "-f", str(COMPOSE), "config"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    published = yaml.safe_load(done.stdout)["services"]["proxy"]["ports"]
    # (host address, container port) of each: docker-compose 1.29 writes "HOST:PUBLISHED:TARGET/tcp", v2 a mapping
    pairs = [
        (port.get("host_ip", ""), int(port["target"]))
        if isinstance(port, dict)
        else (
            str(port).rsplit(":", 2)[0] if str(port).count(":") == 2 else "",
            int(str(port).split(":")[-1].split("/")[0]),
        )
        for port in published
    ]
    assert ("127.0.0.1", 8443) in pairs and [host for host, target in pairs if target == 8443] == ["127.0.0.1"], pairs


def test_start_works_without_a_registry_as_written() -> None:
    start = README[README.index("### Start") : README.index("### Change the token file")]
    commands = [line.split("  #")[0].strip() for line in start.split("```sh\n")[1].split("```")[0].splitlines()]
    stand_ins = next(i for i, line in enumerate(commands) if "scripts/docker-stand-ins" in line)
    build = next(i for i, line in enumerate(commands) if line.startswith("docker build"))
    up = next(i for i, line in enumerate(commands) if " up -d" in line)
    assert stand_ins < build < up
    assert "|| sudo scripts/docker-stand-ins" in commands[stand_ins], "pulls, or makes stand-ins when it cannot"
    assert "--network host" in commands[build] and "-t zarr-gateway:latest" in commands[build]
    assert "--build" not in commands[up], "compose's own build has no host network"
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim-bookworm$", dockerfile, re.M)
    assert (
        "${PROXY_IMAGE:-nginx:1.27-alpine}" in COMPOSE.read_text()
        and "${GATEWAY_IMAGE:-zarr-gateway:latest}" in COMPOSE.read_text()
    )
    assert (REPO / "scripts" / "docker-stand-ins").stat().st_mode & 0o111


def test_a_root_at_a_dataset_says_so(test_data: WrittenDataset, server_factory: Callable[..., Server]) -> None:
    for root, levels in (
        (test_data.root / ORG / "wk_dataset", "two levels up"),
        (test_data.root / ORG, "one level up"),
    ):
        server = server_factory(root)
        assert levels in server.log(), server.log()[-2000:]
        landing = requests.get(server.url + "/", timeout=60)
        assert landing.status_code == 200 and levels in landing.text


def test_the_page_s_snippets_start_with_their_install_line(gateway: Server) -> None:
    page = requests.get(f"{gateway.url}/data/zarr/{DATASET}/", headers={"X-Auth-Token": TOKEN}, timeout=60).text
    codes = dict(re.findall(r'<pre class="snippet" id="snippet-([\w-]+)" data-client="[\w-]+">(.*?)</pre>', page, re.S))
    assert set(codes) == set(CLIENTS)
    for client, code in codes.items():
        first = html.unescape(code.splitlines()[0])
        assert first == f"# {INSTALL[client]}", (client, first)
        assert INSTALL[client] in README, f"the README's install line of {client}"


def test_serve_help_names_root_as_required() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0
    assert done.stdout.startswith("usage: zarr-gateway serve --root ROOT [OPTIONS]"), done.stdout[:200]
    assert re.search(r"--root ROOT\s.*?REQUIRED", done.stdout, re.S)


def test_the_readme_says_what_serve_sample_installs() -> None:
    script = (REPO / "scripts" / "serve-sample").read_text()
    extras = re.search(r"^EXTRAS=([\w,]+)", script, re.M)
    assert extras and "precomputed" in extras.group(1).split(","), "the README's compressed_segmentation needs it"
    try_it = README[README.index("### Try it on the sample") : README.index("## Reading data")]
    for extra in extras.group(1).split(","):
        assert f"`{extra}`" in try_it, extra


def test_webknossos_libs_reports_a_wrong_token_as_the_readme_says(gateway: Server) -> None:
    import webknossos as wk
    from upath import UPath

    url = f"{gateway.url}/data/zarr/{DATASET}"
    with pytest.raises(FileNotFoundError) as raised:
        wk.Dataset.open(UPath(url, headers={"X-Auth-Token": "not-a-token"}))
    assert "datasource-properties.json" in str(raised.value) and "not found" in str(raised.value).lower(), raised
    assert "*datasource-properties.json not found*" in README
