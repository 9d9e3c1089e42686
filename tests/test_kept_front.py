"""A kept chunk answer given before dispatch (``gateway.http.kept.KeptAnswers``) is the answer the full path gives.

In-process: the composition root's application, called with ASGI scopes on one event loop, answers every kind of
chunk request (plain, HEAD, If-None-Match, ranges, If-Range, CORS, tokens in each carrier, refusals) exactly as the
same application with the front taken out of its middleware stack does, and as one that keeps no answers; and the
requests it answers from kept answers never reach dispatch. On real gateways over data the ``wkw`` package writes:
a file rewritten again and again while it is read is never answered torn, and its last version is answered once
the settle time has passed (by a replica too, under the same ETag); on an object store, which reports no change,
a kept answer's object is looked at once per settle time and a new one is answered after it; a revoked token or
a narrowed grant is refused on the next request despite kept answers. The per-token decisions hold no token they
were not given, and nothing once the tokens change.
"""

import asyncio
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import requests
import wkw
from starlette.applications import Starlette
from support.asgi import call
from support.datasets import ORG, OTHER_TOKEN, TOKEN, WrittenDataset
from support.metrics import delta, scrape
from support.processes import wait_until
from support.s3 import aws_environment, uploaded_behind_proxy
from support.servers import Server

from gateway.http.app import create_app
from gateway.http.auth import Decisions, ReloadingTokens
from gateway.http.kept import KeptAnswers
from gateway.settings import Settings

DS = f"{ORG}/wk_dataset"
AUTH = [(b"x-auth-token", TOKEN.encode())]
ORIGIN = [(b"origin", b"https://viewer.example")]
CHUNK = f"/data/zarr/{DS}/color_u8/1/0.1.1.0"
CHUNK3 = f"/data/zarr3/{DS}/color_u8/1/c/0/2/1/1"
SETTLE = 30.0  # in-process: long enough that a look at a kept answer's files holds through the test
WAIT_SECONDS = 60  # bound of every wait (never a measured time)


def front_of(app: Starlette) -> tuple[Any, KeptAnswers]:
    """The kept answers' layer of ``app``'s middleware stack, and the layer in front of it (the path tokens)."""
    if app.middleware_stack is None:
        app.middleware_stack = app.build_middleware_stack()
    layer: Any = app.middleware_stack
    while not isinstance(layer.app, KeptAnswers):
        layer = layer.app
    return layer, layer.app


class Dispatched:
    """What is behind the front, noting each path it is handed."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.paths: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.paths.append(scope["path"])
        await self.app(scope, receive, send)


# (method, path, headers, query): each asked of the application with kept answers, of the same one with the front
# taken out, and of one that keeps none. The first three warm an answer: made, looked at (its
# files' directories watched), then given by the front.
WARM = [("GET", CHUNK, AUTH, b"")] * 3 + [("GET", CHUNK3, AUTH, b"")] * 3
ETAG_OF_CHUNK = "<etag of CHUNK>"  # replaced by the ETag the warm-up saw
REQUESTS: list[tuple[str, str, list[tuple[bytes, bytes]], bytes]] = [
    ("GET", CHUNK, AUTH, b""),
    ("GET", CHUNK, [*AUTH, *ORIGIN], b""),
    ("HEAD", CHUNK, AUTH, b""),
    ("GET", CHUNK, [*AUTH, (b"if-none-match", ETAG_OF_CHUNK.encode())], b""),  # 304
    ("HEAD", CHUNK, [*AUTH, (b"if-none-match", ETAG_OF_CHUNK.encode())], b""),
    ("GET", CHUNK, [*AUTH, (b"if-none-match", b'"other", ' + ETAG_OF_CHUNK.encode())], b""),
    ("GET", CHUNK, [*AUTH, (b"if-none-match", b'"other"')], b""),  # 200
    ("GET", CHUNK, [*AUTH, (b"if-match", b'"other"')], b""),
    ("GET", CHUNK, [*AUTH, (b"if-modified-since", b"Fri, 01 Jan 2100 00:00:00 GMT")], b""),
    ("GET", CHUNK, [*AUTH, (b"if-modified-since", b"Thu, 01 Jan 1970 00:00:00 GMT")], b""),
    ("GET", CHUNK, [*AUTH, (b"range", b"bytes=3-40")], b""),  # 206
    ("GET", CHUNK, [*AUTH, (b"range", b"bytes=-10")], b""),
    ("GET", CHUNK, [*AUTH, (b"range", b"bytes=0-1,5-9")], b""),  # multipart
    ("GET", CHUNK, [*AUTH, (b"range", b"bytes=3-40"), (b"if-range", b'"other"')], b""),  # whole
    ("GET", CHUNK, [*AUTH, (b"range", b"bytes=3-40"), (b"if-range", ETAG_OF_CHUNK.encode())], b""),
    ("GET", CHUNK, [*AUTH, (b"range", b"bytes=999999-")], b""),  # 416
    ("GET", CHUNK, [], f"token={TOKEN}".encode()),
    ("GET", f"/t/{TOKEN}{CHUNK}", [], b""),
    ("GET", CHUNK, [], b""),  # no token: 401
    ("GET", CHUNK, [(b"x-auth-token", OTHER_TOKEN.encode())], b""),  # 403
    ("GET", CHUNK, [(b"x-auth-token", b"not-a-token")], b""),  # 401
    ("GET", CHUNK, [*AUTH, (b"x-auth-token", TOKEN.encode())], b""),  # two: 400
    ("GET", CHUNK, AUTH, f"token={TOKEN}".encode()),  # two carriers: 400
    ("GET", CHUNK3, [*AUTH, *ORIGIN], b""),
    ("HEAD", CHUNK3, AUTH, b""),
]


@pytest.fixture(scope="module")
def settled_root(test_data: WrittenDataset, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the test data, every file back-dated: trusted at once under the settle time SETTLE."""
    root = tmp_path_factory.mktemp("settled") / "root"
    shutil.copytree(test_data.root, root, symlinks=True)
    past = time.time() - 10 * SETTLE
    for directory, _, files in os.walk(root):
        for name in files:
            os.utime(os.path.join(directory, name), (past, past), follow_symlinks=False)
    return root


@pytest.fixture(scope="module")
def edges(settled_root: Path, tokens_file: Path) -> tuple[Starlette, Starlette]:
    """The application with kept answers (a look at their files holding for SETTLE), and one that keeps none."""
    settings = Settings(root=str(settled_root), tokens_file=str(tokens_file), settle_seconds=SETTLE)
    return create_app(settings), create_app(settings.model_copy(update={"answer_cache_bytes": 0}))


def test_a_kept_answer_is_given_before_dispatch_as_the_full_path_gives_it(edges: tuple[Starlette, Starlette]) -> None:
    edge, plain = edges
    holder, front = front_of(edge)
    behind = front.app
    dispatched = front.app = Dispatched(behind)
    try:

        async def without_front(method: str, path: str, headers: list[tuple[bytes, bytes]], query: bytes) -> Any:
            holder.app = dispatched
            try:
                return await call(edge, method, path, headers, query)
            finally:
                holder.app = front

        async def run() -> list[tuple[dict[str, Any], dict[str, Any], dict[str, Any], list[str]]]:
            etag = b""
            for method, path, headers, query in WARM:
                answer = await call(edge, method, path, headers, query)
                assert answer["status"] == 200, answer
                etag = dict(answer["headers"])[b"etag"] if path == CHUNK else etag
            warm = await call(edge, "GET", CHUNK, AUTH)
            etag = dict(warm["headers"])[b"etag"]
            results = []
            for method, path, headers, query in REQUESTS:
                headers = [(n, v.replace(ETAG_OF_CHUNK.encode(), etag)) for n, v in headers]
                dispatched.paths.clear()
                kept = await call(edge, method, path, headers, query)
                through = list(dispatched.paths)
                results.append(
                    (
                        kept,
                        await without_front(method, path, headers, query),
                        await call(plain, method, path, headers, query),
                        through,
                    )
                )
            return results

        results = asyncio.run(run())
    finally:
        front.app = behind
        holder.app = front
    statuses = set()
    for (method, path, headers, query), (kept, dispatched_only, made, dispatched_paths) in zip(REQUESTS, results):
        where = f"{method} {path} {headers} {query!r}"
        assert kept == dispatched_only, where
        assert kept == made, where
        statuses.add(kept["status"])
        if kept["status"] in (200, 206, 304):
            assert dispatched_paths == [], f"{where}: a kept answer went on to dispatch"
    assert {200, 206, 304, 400, 401, 403, 412, 416} <= statuses, statuses


def test_an_answer_made_from_watched_files_is_given_by_the_front_from_its_next_request(
    settled_root: Path, tokens_file: Path, tmp_path: Path
) -> None:
    """An answer made from a file whose directories are watched already (since the first answer made from it) is
    answered before dispatch from its next request on (with its token), with no look at its file in between; the
    first, read before the watch, is looked at once. Once the file is rewritten the answer goes to dispatch
    again, and the kept bytes are not given."""
    root = tmp_path / "root"
    shutil.copytree(settled_root, root, symlinks=True)  # its own: a file rewritten here is unsettled for a while
    edge = create_app(Settings(root=str(root), tokens_file=str(tokens_file), settle_seconds=SETTLE))
    _, front = front_of(edge)
    behind = front.app
    dispatched = front.app = Dispatched(behind)
    first, second = (f"/data/zarr/{DS}/color_u8/1/{key}" for key in ("0.2.1.1", "0.2.2.1"))  # in one file cube

    async def run() -> tuple[list[list[str]], dict[str, Any], dict[str, Any], list[str]]:
        seen = []
        for path in (first, second, second, first, first):  # made (watched); made; front; looked at; front
            dispatched.paths.clear()
            assert (await call(edge, "GET", path, AUTH))["status"] == 200
            seen.append(list(dispatched.paths))
        kept = await call(edge, "GET", second, AUTH)
        with wkw.Dataset.open(str(root / ORG / "wk_dataset" / "color_u8" / "1")) as ds:
            cube = ds.read((0, 0, 0), (128, 128, 128))  # a compressed file is written whole
            ds.write((0, 0, 0), cube + 1)
        await asyncio.sleep(0.1)  # the loop turns, as it does before a request that arrives after the write
        dispatched.paths.clear()
        after = await call(edge, "GET", second, AUTH)
        return seen, kept, after, list(dispatched.paths)

    try:
        seen, kept, after, through = asyncio.run(run())
    finally:
        front.app = behind
    assert seen[:2] == [[first], [second]]
    assert seen[2] == [], "an answer made from watched files was looked at before the front gave it"
    assert seen[3:] == [[first], []], "an answer read before its file was watched was not looked at once"
    assert through == [second], "a kept answer was given by the front after its file was rewritten"
    assert after["status"] in (200, 503) and after["body"] != kept["body"]


# --- on real gateways -------------------------------------------------------------------------------------------

FILE_LEN = 2  # blocks of 32^3 per file edge: files of 64^3
EDGE = 64
LAYER = "color"


def write_version(root: Path, value: int) -> None:
    """The layer's one file cube, every voxel ``value`` (every version compresses to the same size)."""
    with wkw.Dataset.open(str(root / ORG / "kept" / LAYER / "1")) as ds:
        ds.write((0, 0, 0), np.full((1, EDGE, EDGE, EDGE), value, dtype="uint8"))


def write_dataset(root: Path) -> None:
    dataset = root / ORG / "kept"
    header = wkw.Header(np.dtype("uint8"), block_type=wkw.Header.BLOCK_TYPE_LZ4, file_len=FILE_LEN)
    with wkw.Dataset.create(str(dataset / LAYER / "1"), header):
        pass
    write_version(root, 1)
    data_file = dataset / LAYER / "1" / "z0" / "y0" / "x0.wkw"
    past = data_file.stat().st_mtime_ns - 100 * 10**9  # trusted at once under the settle time
    os.utime(data_file, ns=(past, past))
    layer = {
        "name": LAYER,
        "category": "color",
        "boundingBox": {"topLeft": [0, 0, 0], "width": EDGE, "height": EDGE, "depth": EDGE},
        "elementClass": "uint8",
        "dataFormat": "wkw",
        "mags": [{"mag": [1, 1, 1], "path": f"./{LAYER}/1"}],
    }
    document = {"id": {"name": "kept", "team": ""}, "scale": [1.0, 1.0, 1.0], "dataLayers": [layer]}
    (dataset / "datasource-properties.json").write_text(json.dumps(document))


def value_of(response: requests.Response) -> int:
    """The one value every voxel of a chunk holds; a chunk of two versions holds two, and fails here."""
    voxels = np.frombuffer(numcodecs.Blosc().decode(response.content), dtype="uint8")
    values = np.unique(voxels)
    assert len(values) == 1 and voxels.size == 32**3, f"a torn chunk: values {values[:10]}"
    return int(values[0])


def test_rewrites_are_never_answered_torn_and_the_last_appears_within_the_settle_time(
    tmp_path: Path, server_factory: Callable[..., Server]
) -> None:
    """A file rewritten again and again while its chunk is read: every 200 is one whole version under its own
    ETag, none after the first rewrite is the kept answer of the version before it (the change is reported), and
    once the settle time has passed after the last write the last version is answered, by a replica that kept
    the first version too, under the same ETag."""
    write_dataset(tmp_path)
    settle = 1.0
    server, replica = (server_factory(tmp_path, settle_seconds=settle) for _ in range(2))
    url = f"{server.url}/data/zarr/{ORG}/kept/{LAYER}/1/0.1.0.1"
    replica_url = url.replace(server.url, replica.url)
    with requests.Session() as session:
        for _ in range(3):
            assert value_of(session.get(replica_url, timeout=30)) == 1
        first = [session.get(url, timeout=30) for _ in range(5)]
        assert {value_of(r) for r in first} == {1} and len({r.headers["ETag"] for r in first}) == 1
        before = scrape(server)
        kept = [session.get(url, timeout=30) for _ in range(20)]
        assert all(r.headers["ETag"] == first[0].headers["ETag"] and value_of(r) == 1 for r in kept)
        hits = delta(before, scrape(server), "zarr_gateway_cache_lookups_total", cache="answers", result="hit")
        assert hits == 20

        stop = threading.Event()
        last = [1]

        def rewrite() -> None:
            value = 1
            while not stop.is_set():
                value = value % 200 + 2
                write_version(tmp_path, value)
                last[0] = value
                time.sleep(0.01)

        writer = threading.Thread(target=rewrite)
        etags: dict[str, int] = {first[0].headers["ETag"]: 1}
        writer.start()
        try:
            while last[0] == 1:
                time.sleep(0.001)
            answered = []
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                answered.append(session.get(url, timeout=30))
        finally:
            stop.set()
            writer.join()
        written = time.time()
        for response in answered:
            if response.status_code == 503:
                assert "Retry-After" in response.headers
                continue
            assert response.status_code == 200, (response.status_code, response.text[:300])
            value = value_of(response)
            assert value != 1, "the kept answer of the version before the rewrites was given"
            assert etags.setdefault(response.headers["ETag"], value) == value, "one ETag, two versions"

        # The promise: once the last write is settle_seconds old, its version is answered, and only it.
        time.sleep(max(0.0, written + settle - time.time()))
        final = [session.get(where, timeout=30) for where in (url, replica_url) for _ in range(3)]
        for response in final:
            assert response.status_code == 200, (response.status_code, response.text[:300])
            assert value_of(response) == last[0]
            assert etags.setdefault(response.headers["ETag"], last[0]) == last[0]
        assert len({r.headers["ETag"] for r in final}) == 1


def write_tokens(path: Path, tokens: dict[str, list[str]]) -> None:
    """The tokens file, written whole in one rename (as an operator's tool does), with a time of its own."""
    temporary = path.with_suffix(".new")
    temporary.write_text(json.dumps({"tokens": tokens}))
    os.replace(temporary, path)


@pytest.mark.parametrize(
    ("change", "refused"),
    [
        ("revoked", 401),  # the token is gone from the file
        ("narrowed", 403),  # its grant no longer covers the organization
    ],
)
def test_a_changed_token_is_refused_on_the_next_request_despite_kept_answers(
    change: str, refused: int, settled_root: Path, tmp_path: Path, server_factory: Callable[..., Server]
) -> None:
    tokens = tmp_path / "tokens.json"
    write_tokens(tokens, {TOKEN: [f"{ORG}/*"], OTHER_TOKEN: ["other_org/*"]})
    server = server_factory(settled_root, tokens_file=tokens, tokens_reload_seconds=0.1, settle_seconds=SETTLE)
    headers = {"X-Auth-Token": TOKEN}
    chunk, other_chunk = server.url + CHUNK, server.url + CHUNK3
    with requests.Session() as session:
        before = scrape(server)
        for _ in range(5):
            assert session.get(chunk, headers=headers, timeout=30).status_code == 200
            assert session.get(other_chunk, headers=headers, timeout=30).status_code == 200
        hits = delta(before, scrape(server), "zarr_gateway_cache_lookups_total", cache="answers", result="hit")
        assert hits >= 6  # kept answers were given

        granted = ["other_org/*"] if change == "narrowed" else None
        write_tokens(tokens, {OTHER_TOKEN: ["other_org/*"], **({TOKEN: granted} if granted else {})})
        # Once the gateway has seen the new file (asked on one chunk), the other chunk's kept answer is refused
        # on the very next request, and every one after it.
        seen = wait_until(
            lambda: session.get(other_chunk, headers=headers, timeout=30).status_code == refused, WAIT_SECONDS
        )
        assert seen, "the gateway never read the changed tokens file"
        for _ in range(5):
            response = session.get(chunk, headers=headers, timeout=30)
            assert response.status_code == refused, (response.status_code, response.text[:300])
            assert response.json()["error"]


def test_the_decisions_hold_no_token_they_were_not_given(tmp_path: Path) -> None:
    """Only tokens offered and granted are remembered, under a keyed hash; a changed file drops them all."""
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tokens": {"alpha": ["o/*"], "beta": ["o/*"], "gamma": ["p/d"]}}))
    decisions = Decisions(ReloadingTokens(path, 0.01))
    assert len(decisions) == 0 and not decisions.holds("alpha")
    assert decisions.grant("alpha") is not None
    assert decisions.grant("unknown") is None
    assert decisions.grant("alpha") is not None
    assert len(decisions) == 1
    assert decisions.holds("alpha") and not decisions.holds("beta") and not decisions.holds("gamma")
    assert not decisions.holds("unknown")

    path.write_text(json.dumps({"tokens": {"beta": ["o/*"], "gamma": ["p/d"], "delta": ["q/*"]}}))
    stamp = time.time() + 5
    os.utime(path, (stamp, stamp))
    time.sleep(0.02)
    assert decisions.grant("alpha") is None  # revoked: refused on the next decision
    assert len(decisions) == 0 and not decisions.holds("alpha")


def test_on_an_object_store_a_kept_answer_is_looked_at_once_per_settle_time_and_a_new_object_follows(
    tmp_path: Path, server_factory: Callable[..., Server]
) -> None:
    """No change is reported by S3 (moto): each object a kept answer was made from is looked at (a HEAD) at most
    once per settle time, never read again, and an object uploaded anew is answered once the settle time has
    passed since it was."""
    local = tmp_path / "local"
    write_dataset(local)
    settle = 2.0
    with uploaded_behind_proxy(tmp_path, local, "kept", "root") as (client, proxy):
        with aws_environment(proxy.endpoint):
            server = server_factory("s3://kept/root", settle_seconds=settle)
        url = f"{server.url}/data/zarr/{ORG}/kept/{LAYER}/1/0.1.0.1"
        with requests.Session() as session:
            first = [session.get(url, timeout=60) for _ in range(3)]
            assert {value_of(r) for r in first} == {1}
            proxy.take()
            started = time.monotonic()
            kept = [session.get(url, timeout=60) for _ in range(30)]
            elapsed = time.monotonic() - started
            assert all(r.headers["ETag"] == first[0].headers["ETag"] and value_of(r) == 1 for r in kept)
            fetches = proxy.take()
            assert {fetch.method for fetch in fetches} <= {"HEAD"}, "a kept answer was read again"
            assert len(fetches) <= 1 + elapsed // settle, (len(fetches), elapsed)

            write_version(local, 7)
            data_file = local / ORG / "kept" / LAYER / "1" / "z0" / "y0" / "x0.wkw"
            client.upload_file(str(data_file), "kept", f"root/{data_file.relative_to(local).as_posix()}")
            uploaded = time.monotonic()
            time.sleep(max(0.0, uploaded + settle - time.monotonic()))
            after = [session.get(url, timeout=60) for _ in range(3)]
            assert all(r.status_code == 200 and value_of(r) == 7 for r in after), [r.status_code for r in after]
            assert len({r.headers["ETag"] for r in after}) == 1
            assert after[0].headers["ETag"] != first[0].headers["ETag"]
