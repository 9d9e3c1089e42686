"""The answer cache: chunk answers kept per worker under the versions of the files they were made from.

Real gateway processes on loopback, data written by the ``wkw`` package, answers decoded and compared
voxel by voxel with what the package reads. A rewritten file (the same size or another, within the
settle time or after it) is never answered from the cache; the byte budget holds; hits and misses are
counted in ``/metrics``; a matching ``If-None-Match`` is a 304 from the cache; a token without a grant
gets no cached answer; with the budget 0 the gateway answers as it did before the cache.
"""

import json
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import numcodecs
import numpy as np
import pytest
import requests
import wkw
from support.datasets import OTHER_TOKEN, TOKEN
from support.metrics import Samples, delta, scrape, value
from support.processes import wait_until
from support.s3 import aws_environment, uploaded_behind_proxy
from support.servers import Server

from gateway.http.answers import AnswerCache, AnswerKey
from gateway.resources import OCTET_STREAM, FileVersions, bytes_resource
from gateway_storage import FileIdentity, LocalStore

ORG, DATASET = "test_org", "cached"
TOP_LEFT = (20, 10, 6)
SIZE = (180, 110, 90)  # to (200, 120, 96): two file cubes of 128^3 per layer, chunks inside and across its border
BOUND = tuple(t + s for t, s in zip(TOP_LEFT, SIZE))
FILE_LEN = 4  # blocks of 32^3 per file edge: files of 128^3
WRITTEN = (256, 128, 128)  # whole file cubes: a compressed file is written whole
LAYERS = {"lz4_u8": ("uint8", wkw.Header.BLOCK_TYPE_LZ4), "raw_u16": ("uint16", wkw.Header.BLOCK_TYPE_RAW)}
WAIT_SECONDS = 60  # bound of every wait for a file to settle (never a measured time)
HEADERS = {"X-Auth-Token": TOKEN}

# Chunks of file cube (0, 0, 0), by the edge of the server's chunks: (tree path below the mag, voxel box).
CHUNKS_32 = {
    "v2 passed through": ("0.1.1.1", (32, 32, 32)),  # one stored block inside the bounding box
    "v2 at the border": ("0.0.1.1", (0, 32, 32)),  # masked to the bounding box and encoded
    "v3 passed through": ("c/0/1/1/1", (32, 32, 32)),
    "v3 at the border": ("c/0/0/1/1", (0, 32, 32)),
}
CHUNKS_64 = {  # 64^3 chunks are read from eight blocks and encoded again
    "v2 64^3": ("0.1.1.0", (64, 64, 0)),
    "v3 64^3": ("c/0/1/1/0", (64, 64, 0)),
}


@pytest.fixture
def serve(server_factory: Callable[..., Server]) -> Iterator[Callable[..., Server]]:
    """Gateways for one test, stopped when it ends (each holds its own cache)."""
    started: list[Server] = []

    def make(root: Path | str, **settings: object) -> Server:
        started.append(server_factory(root, **settings))
        return started[-1]

    yield make
    for server in started:
        server.process.terminate()
    for server in started:
        server.process.wait(10)


@dataclass(frozen=True)
class Chunk:
    """One chunk URL and the voxel box it answers."""

    url: str
    corner: tuple[int, int, int]
    edge: int


def data_file(root: Path, layer: str) -> Path:
    return root / ORG / DATASET / layer / "1" / "z0" / "y0" / "x0.wkw"


def write_dataset(root: Path, layer_data: dict[str, np.ndarray]) -> None:
    """The dataset, its layers written by the ``wkw`` package from the origin; each first data file back-dated,
    so that the version the gateway first reads is trusted at once under a settle time, and any later
    write of it stamps a time of its own."""
    dataset = root / ORG / DATASET
    layers = []
    for name, (dtype, block_type) in LAYERS.items():
        with wkw.Dataset.create(
            str(dataset / name / "1"), wkw.Header(np.dtype(dtype), block_type=block_type, file_len=FILE_LEN)
        ) as ds:
            ds.write((0, 0, 0), layer_data[name])
        layers.append(
            {
                "name": name,
                "category": "color",
                "boundingBox": {"topLeft": list(TOP_LEFT), "width": SIZE[0], "height": SIZE[1], "depth": SIZE[2]},
                "elementClass": dtype,
                "dataFormat": "wkw",
                "mags": [{"mag": [1, 1, 1], "path": f"./{name}/1"}],
            }
        )
        back_date(data_file(root, name))
    document = {"id": {"name": DATASET, "team": ""}, "scale": [1.0, 1.0, 1.0], "dataLayers": layers}
    (dataset / "datasource-properties.json").write_text(json.dumps(document))


def back_date(path: Path) -> None:
    past = path.stat().st_mtime_ns - 100 * 10**9
    os.utime(path, ns=(past, past))


def random_data(dtype: str, seed: int, high: int | None = None) -> np.ndarray:
    """Voxels of the file cubes around the bounding box, never 0, so no chunk reads like the fill value; below
    ``high``, if given (a few values compress well, so the file gets another size)."""
    top = np.iinfo(dtype).max if high is None else high
    return np.random.default_rng(seed).integers(1, top, size=(1, *WRITTEN), dtype=dtype)


def first_versions() -> dict[str, np.ndarray]:
    return {name: random_data(dtype, seed) for seed, (name, (dtype, _)) in enumerate(LAYERS.items())}


def expected(root: Path, layer: str, chunk: Chunk) -> np.ndarray:
    """What the chunk must hold: the ``wkw`` package's voxels, fill value (0) outside the bounding box."""
    with wkw.Dataset.open(str(root / ORG / DATASET / layer / "1")) as ds:
        data: np.ndarray = ds.read(chunk.corner, (chunk.edge,) * 3)
    lo = [max(0, t - c) for t, c in zip(TOP_LEFT, chunk.corner)]
    hi = [min(chunk.edge, b - c) for b, c in zip(BOUND, chunk.corner)]
    out = np.zeros_like(data)
    inside = (slice(None), *(slice(a, b) for a, b in zip(lo, hi)))
    out[inside] = data[inside]
    return out


def voxels(response: requests.Response, layer: str, edge: int) -> np.ndarray:
    """A chunk's voxels: Blosc in both trees, x fastest (v2 order F, v3 transposed to z, y, x, c)."""
    assert response.status_code == 200, (response.url, response.status_code, response.text[:300])
    dtype = np.dtype(LAYERS[layer][0]).newbyteorder("<")
    raw = numcodecs.Blosc().decode(response.content)
    return np.frombuffer(raw, dtype=dtype).reshape((1, edge, edge, edge), order="F")


def chunks(server: Server, layer: str, table: dict[str, tuple[str, tuple[int, int, int]]], edge: int) -> list[Chunk]:
    out = []
    for name, (key, corner) in table.items():
        tree = "zarr3" if name.startswith("v3") else "zarr"
        out.append(Chunk(f"{server.url}/data/{tree}/{ORG}/{DATASET}/{layer}/1/{key}", corner, edge))
    return out


def answers(samples: Samples, result: str) -> float:
    return value(samples, "zarr_gateway_cache_lookups_total", cache="answers", result=result)


def held(server: Server) -> float:
    return value(scrape(server), "zarr_gateway_cache_bytes", cache="answers")


def counted(server: Server, before: Samples) -> tuple[float, float]:
    """Hits and misses of the answer cache since ``before``."""
    after = scrape(server)
    hits = delta(before, after, "zarr_gateway_cache_lookups_total", cache="answers", result="hit")
    misses = delta(before, after, "zarr_gateway_cache_lookups_total", cache="answers", result="miss")
    return hits, misses


# --- a rewritten file is never answered from the cache ---------------------------------------------------


def constant(dtype: str, voxel: int) -> np.ndarray:
    """Voxels of one value: every block compresses to the same length whatever the value."""
    return np.full((1, *WRITTEN), voxel, dtype=dtype)


@dataclass(frozen=True)
class Rewrite:
    """A layer's data file written once more: its first version (None: random), the second, and whether the
    file keeps its size."""

    layer: str
    first: Callable[[], np.ndarray] | None
    second: Callable[[], np.ndarray]
    same_size: bool


REWRITES = {
    "lz4, another size": Rewrite("lz4_u8", None, lambda: random_data("uint8", 7, high=5), False),
    "lz4, the same size": Rewrite("lz4_u8", lambda: constant("uint8", 11), lambda: constant("uint8", 200), True),
    "raw, the same size": Rewrite("raw_u16", None, lambda: random_data("uint16", 8), True),
}


@pytest.mark.parametrize("case", list(REWRITES))
def test_a_rewritten_file_is_never_answered_from_the_cache(
    case: str, tmp_path: Path, serve: Callable[..., Server]
) -> None:
    """Every chunk of a file, in both trees, passed through, masked at the border and encoded as 64^3,
    is answered from the cache while the file is unchanged, and made again from the new file once it is
    rewritten with the same size or with another."""
    rewrite = REWRITES[case]
    layer = rewrite.layer
    data = first_versions()
    if rewrite.first is not None:
        data[layer] = rewrite.first()
    write_dataset(tmp_path, data)
    servers = [serve(tmp_path), serve(tmp_path, chunk_edge=64)]
    targets = [
        (servers[0], chunks(servers[0], layer, CHUNKS_32, 32)),
        (servers[1], chunks(servers[1], layer, CHUNKS_64, 64)),
    ]
    before = [scrape(server) for server in servers]
    first_answers = {}
    for (server, listed), scraped in zip(targets, before):
        for chunk in listed:
            made = requests.get(chunk.url)
            kept = requests.get(chunk.url)
            assert kept.content == made.content and kept.headers["ETag"] == made.headers["ETag"], chunk.url
            np.testing.assert_array_equal(voxels(kept, layer, chunk.edge), expected(tmp_path, layer, chunk))
            first_answers[chunk.url] = made
        assert counted(server, scraped) == (len(listed), len(listed))  # made once, then kept

    path = data_file(tmp_path, layer)
    old = path.stat()
    with wkw.Dataset.open(str(path.parent.parent.parent)) as ds:
        ds.write((0, 0, 0), rewrite.second())
    new = path.stat()
    assert (new.st_size == old.st_size) == rewrite.same_size, (old.st_size, new.st_size)
    assert (new.st_mtime_ns, new.st_ctime_ns) != (old.st_mtime_ns, old.st_ctime_ns)

    before = [scrape(server) for server in servers]
    for (server, listed), scraped in zip(targets, before):
        for chunk in listed:
            made = requests.get(chunk.url)
            want = expected(tmp_path, layer, chunk)
            assert not np.array_equal(want, voxels(first_answers[chunk.url], layer, chunk.edge)), chunk.url
            np.testing.assert_array_equal(voxels(made, layer, chunk.edge), want, err_msg=chunk.url)
            assert made.headers["ETag"] != first_answers[chunk.url].headers["ETag"], chunk.url
            kept = requests.get(chunk.url)
            assert kept.content == made.content and kept.headers["ETag"] == made.headers["ETag"], chunk.url
        assert counted(server, scraped) == (len(listed), len(listed))  # made again, then kept again


@pytest.mark.slow  # waits out a settle time of 10 s
def test_a_file_rewritten_within_the_settle_time_is_not_answered_from_the_cache(
    tmp_path: Path, serve: Callable[..., Server]
) -> None:
    """Within the settle time a rewritten file's chunks are 503s (the cache's answer of the old version is
    never given), and once the file is quiet, its new voxels."""
    data = first_versions()
    write_dataset(tmp_path, data)
    # long enough that every chunk is asked for within it on a busy machine, short against WAIT_SECONDS
    server = serve(tmp_path, settle_seconds=10)
    layer = "lz4_u8"
    listed = chunks(server, layer, CHUNKS_32, 32)
    for chunk in listed:
        for _ in range(2):
            np.testing.assert_array_equal(voxels(requests.get(chunk.url), layer, 32), expected(tmp_path, layer, chunk))
    with wkw.Dataset.open(str(tmp_path / ORG / DATASET / layer / "1")) as ds:
        ds.write((0, 0, 0), random_data("uint8", 9))

    before = scrape(server)
    for chunk in listed:
        response = requests.get(chunk.url)
        # The storage kernel trusts a file at once whose ctime moved past its mtime after the last write (its
        # writer had finished: the wkw library's writes now and then end so); then the answer is the new voxels.
        if response.status_code == 200:
            np.testing.assert_array_equal(voxels(response, layer, 32), expected(tmp_path, layer, chunk))
        else:
            assert response.status_code == 503, (chunk.url, response.status_code)
            assert "Retry-After" in response.headers
    assert counted(server, before) == (0, len(listed)), "a kept answer of the old version was given"

    def settled() -> requests.Response | None:
        response = requests.get(listed[0].url)
        return response if response.status_code == 200 else None

    assert wait_until(settled, WAIT_SECONDS, 0.2) is not None
    for chunk in listed:
        np.testing.assert_array_equal(voxels(requests.get(chunk.url), layer, 32), expected(tmp_path, layer, chunk))


# --- the budget, the counters, conditional requests, tokens, the cache off ---------------------------------


def all_chunk_urls(server: Server, layer: str) -> list[str]:
    grid = [-(-b // 32) for b in BOUND]
    return [
        f"{server.url}/data/zarr/{ORG}/{DATASET}/{layer}/1/0.{x}.{y}.{z}"
        for x in range(grid[0])
        for y in range(grid[1])
        for z in range(grid[2])
        if x * 32 + 32 > TOP_LEFT[0] and y * 32 + 32 > TOP_LEFT[1] and z * 32 + 32 > TOP_LEFT[2]
    ]


BUDGET = 768 << 10  # about 20 of the lz4 layer's 32^3 chunks; a raw_u16 one (64 KiB) is more than its share


def test_the_budget_holds(tmp_path: Path, serve: Callable[..., Server]) -> None:
    """Many distinct chunks: the bytes held never pass the budget, the least recently used go first, and an
    answer larger than its share of the budget is not kept."""
    write_dataset(tmp_path, first_versions())
    server = serve(tmp_path, answer_cache_bytes=BUDGET)
    urls = all_chunk_urls(server, "lz4_u8")
    assert len(urls) > 60
    sent = 0
    for number, url in enumerate(urls, 1):
        response = requests.get(url)
        assert response.status_code == 200
        sent += len(response.content)
        if number % 8 == 0:
            assert 0 < held(server) <= BUDGET
    assert sent > 2 * BUDGET
    assert BUDGET / 2 < held(server) <= BUDGET  # full, and within its bound

    before = scrape(server)
    requests.get(urls[-1])  # the most recent: kept
    assert counted(server, before) == (1, 0)
    before = scrape(server)
    requests.get(urls[0])  # the first: long gone
    assert counted(server, before) == (0, 1)

    large = f"{server.url}/data/zarr/{ORG}/{DATASET}/raw_u16/1/0.1.1.1"  # 64 KiB passed through
    before = scrape(server)
    for _ in range(2):
        assert len(requests.get(large).content) > BUDGET // 16
    assert counted(server, before) == (0, 2)  # made each time: larger than a sixteenth of the budget
    assert held(server) <= BUDGET


def test_kept_answers_count_against_the_worker_s_memory_budget(tmp_path: Path, serve: Callable[..., Server]) -> None:
    """The answers kept are bounded by ``chunk_memory_bytes`` too, the one budget of what a worker builds, when it
    is far below ``answer_cache_bytes``: many distinct chunks never keep more than it, and those kept are given."""
    write_dataset(tmp_path, first_versions())
    server = serve(tmp_path, answer_cache_bytes=64 * BUDGET, chunk_memory_bytes=BUDGET)
    urls = all_chunk_urls(server, "lz4_u8")
    sent = 0
    for number, url in enumerate(urls, 1):
        response = requests.get(url)
        assert response.status_code == 200, response.text[:300]
        sent += len(response.content)
        if number % 8 == 0:
            assert 0 < held(server) <= BUDGET, (number, held(server))
    assert sent > 2 * BUDGET  # the cache's own bound would have kept them all
    assert BUDGET / 4 < held(server) <= BUDGET
    before = scrape(server)
    requests.get(urls[-1])  # the most recent: kept
    assert counted(server, before) == (1, 0)


def test_a_matching_if_none_match_is_a_304_from_the_cache(tmp_path: Path, serve: Callable[..., Server]) -> None:
    """A revalidation of a kept answer is a hit: the 304 is given without making the chunk again."""
    write_dataset(tmp_path, first_versions())
    server = serve(tmp_path)
    for chunk in chunks(server, "lz4_u8", CHUNKS_32, 32):
        before = scrape(server)
        made = requests.get(chunk.url)
        etag = made.headers["ETag"]
        for method in (requests.get, requests.head):
            revalidated = method(chunk.url, headers={"If-None-Match": etag})
            assert revalidated.status_code == 304, chunk.url
            assert revalidated.content == b"" and revalidated.headers["ETag"] == etag
        other = requests.get(chunk.url, headers={"If-None-Match": '"another"'})
        assert other.status_code == 200 and other.content == made.content
        assert counted(server, before) == (3, 1), chunk.url  # made once; two 304s and a 200 from the cache


def test_a_token_without_a_grant_gets_no_cached_answer(
    tmp_path: Path, serve: Callable[..., Server], tokens_file: Path
) -> None:
    """Authorization comes before the cache: once a granted token's request has filled it, no token, a
    wrong one or one granted another organization still gets 401 or 403, in every place a token goes."""
    write_dataset(tmp_path, first_versions())
    server = serve(tmp_path, tokens_file=tokens_file)
    path = f"/data/zarr/{ORG}/{DATASET}/lz4_u8/1/0.1.1.1"
    granted = [requests.get(server.url + path, headers=HEADERS) for _ in range(2)]
    assert granted[0].status_code == granted[1].status_code == 200
    before = scrape(server)
    refused = {
        "no token": (requests.get(server.url + path), 401),
        "wrong token": (requests.get(server.url + path, headers={"X-Auth-Token": "not-a-token"}), 401),
        "other organization": (requests.get(server.url + path, headers={"X-Auth-Token": OTHER_TOKEN}), 403),
        "other in the query": (requests.get(f"{server.url}{path}?token={OTHER_TOKEN}"), 403),
        "other in the path": (requests.get(f"{server.url}/t/{OTHER_TOKEN}{path}"), 403),
        "other, conditional": (
            requests.get(
                server.url + path, headers={"X-Auth-Token": OTHER_TOKEN, "If-None-Match": granted[0].headers["ETag"]}
            ),
            403,
        ),
    }
    for name, (response, status) in refused.items():
        assert response.status_code == status, (name, response.status_code)
        assert granted[0].content not in response.content and "ETag" not in response.headers, name
    assert counted(server, before) == (0, 0)  # the cache was never consulted
    assert requests.get(server.url + path, headers=HEADERS).content == granted[0].content


def test_with_the_budget_0_nothing_is_kept_and_answers_are_the_same(
    tmp_path: Path, serve: Callable[..., Server]
) -> None:
    """``answer_cache_bytes`` 0: no lookups, no bytes held, and the same answers, headers and all, as a
    gateway with the cache gives, from its cache or not."""
    write_dataset(tmp_path, first_versions())
    cached, off = serve(tmp_path), serve(tmp_path, answer_cache_bytes=0)
    compared = ("ETag", "Last-Modified", "Content-Type", "Content-Length", "Cache-Control")
    for layer in LAYERS:
        for key, _ in CHUNKS_32.values():
            tree = "zarr3" if key.startswith("c/") else "zarr"
            path = f"/data/{tree}/{ORG}/{DATASET}/{layer}/1/{key}"
            for _ in range(2):
                with_cache, without = requests.get(cached.url + path), requests.get(off.url + path)
                assert with_cache.status_code == without.status_code == 200
                assert with_cache.content == without.content, path
                assert {h: with_cache.headers[h] for h in compared} == {h: without.headers[h] for h in compared}
    samples = scrape(off)
    assert answers(samples, "hit") == answers(samples, "miss") == 0
    assert value(samples, "zarr_gateway_cache_bytes", cache="answers") == 0
    assert answers(scrape(cached), "hit") == len(LAYERS) * len(CHUNKS_32)  # the second round, from the cache


def test_a_file_swapped_for_a_link_into_another_dataset_is_refused_however_warm(
    tmp_path: Path, serve: Callable[..., Server]
) -> None:
    """The very file a kept answer was made from, moved into another organization's dataset (the same inode)
    and linked back: the cache's version check is the kernel's lookup, which refuses it, so the chunk is
    the storage fault (500) and never the kept voxels."""
    write_dataset(tmp_path, first_versions())
    server = serve(tmp_path)
    listed = chunks(server, "lz4_u8", CHUNKS_32, 32)
    kept = {chunk.url: [requests.get(chunk.url) for _ in range(2)][1] for chunk in listed}
    path = data_file(tmp_path, "lz4_u8")
    elsewhere = tmp_path / "other_org" / "secret" / "x0.wkw"
    elsewhere.parent.mkdir(parents=True)
    path.rename(elsewhere)
    path.symlink_to(elsewhere)
    before = scrape(server)
    for chunk in listed:
        response = requests.get(chunk.url)
        assert response.status_code == 500, (chunk.url, response.status_code)
        assert "outside its dataset's directory" in response.json()["error"]
        assert kept[chunk.url].content not in response.content
    assert counted(server, before) == (0, len(listed))


def test_answers_from_an_object_store_are_checked_by_the_object_s_version(
    tmp_path: Path, serve: Callable[..., Server]
) -> None:
    """On S3 (moto) a kept chunk is checked with a HEAD in a chunk thread, never read again; an object
    uploaded anew has another version, and its chunks are made from it."""
    local = tmp_path / "local"
    write_dataset(local, first_versions())
    with uploaded_behind_proxy(tmp_path, local, "answers", "root") as (client, proxy):
        with aws_environment(proxy.endpoint):
            server = serve("s3://answers/root")
        listed = chunks(server, "lz4_u8", CHUNKS_32, 32)
        made = {chunk.url: requests.get(chunk.url, timeout=60) for chunk in listed}
        before = scrape(server)
        proxy.take()
        for chunk in listed:
            kept = requests.get(chunk.url, timeout=60)
            assert kept.content == made[chunk.url].content and kept.headers["ETag"] == made[chunk.url].headers["ETag"]
        assert {fetch.method for fetch in proxy.take()} == {"HEAD"}  # checked, not read
        assert counted(server, before) == (len(listed), 0)

        with wkw.Dataset.open(str(local / ORG / DATASET / "lz4_u8" / "1")) as ds:
            ds.write((0, 0, 0), random_data("uint8", 21, high=5))
        path = data_file(local, "lz4_u8")
        client.upload_file(str(path), "answers", f"root/{path.relative_to(local).as_posix()}")
        before = scrape(server)
        for chunk in listed:
            response = requests.get(chunk.url, timeout=60)
            np.testing.assert_array_equal(voxels(response, "lz4_u8", 32), expected(local, "lz4_u8", chunk))
            assert response.headers["ETag"] != made[chunk.url].headers["ETag"]
        assert counted(server, before) == (0, len(listed))


class _ThreadNotingStore(LocalStore):
    """A real local store that notes the thread of every identity it looks up."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.threads: set[int] = set()

    def identity(self, path: str) -> FileIdentity | None:
        self.threads.add(threading.get_ident())
        return super().identity(path)


@pytest.mark.parametrize("files", [1, 8, 9, 512])
def test_a_kept_answer_is_checked_off_the_event_loop(tmp_path: Path, files: int) -> None:
    """An answer made of small WKW file cubes names hundreds of files, one of a large file cube one: however few,
    their stats run in a chunk thread, never on the event loop (512 stats on the loop held /healthz at a p95 of
    553 ms)."""
    store = _ThreadNotingStore(str(tmp_path))
    sources = []
    for n in range(files):
        path = tmp_path / f"z{n}.wkw"
        path.write_bytes(b"x")
        sources.append((str(path), store.identity(str(path))))
    answers = AnswerCache(16 << 20)  # an answer naming 512 files holds 128 KiB of their names
    key = AnswerKey("zarr", ("o", "d", "l", "1"), "made-as", (0, 0, 0, 0))
    answers.keep(key, bytes_resource(b"chunk", OCTET_STREAM, made_from=FileVersions(store, tuple(sources))))
    store.threads.clear()

    async def current() -> tuple[bool, int]:
        found = await answers.current(key, anyio.CapacityLimiter(2))
        return found is not None, threading.get_ident()

    found, loop_thread = anyio.run(current)
    assert found and store.threads
    assert loop_thread not in store.threads, (files, store.threads, loop_thread)
