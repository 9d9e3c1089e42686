"""Generated requests against a running gateway with tokens (issue 16: "how it is checked").

Hypothesis sends paths, methods, headers, byte ranges and mixes of tokens (header, query, both, several,
UTF-8, wrong, granting another dataset) to a gateway over a data root with WKW, Zarr v2, Zarr v3, N5 and
precomputed layers, in which a lab member has planted symlinks out of the root: chunk files pointing at a
canary file and at the tokens file, a dataset directory, an organization directory and a properties file.
The canary's bytes are unique to this run and the tokens file grants a token that is the canary itself.

Every answer must be a well-formed HTTP response (parsed by ``http.client`` from a raw socket) with a
status of the set ``docs/security.md`` documents, a JSON ``error`` body for every error, and no body may
hold the canary or the server's absolute paths (the data root, the directory outside it).
"""

import http.client
import json
import os
import re
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import numpy as np
import pytest
import tensorstore as ts
import wkw
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.servers import Server

SECURITY_DOC = Path(__file__).resolve().parents[1] / "docs" / "security.md"
CANARY = f"canary{secrets.token_hex(12)}"  # a valid name and token, and bytes no other file holds
GOOD, NARROW, UTF8 = "hostile-good-token", "hostile-narrow-token", "hostile-tök-ünï"
ORG, OTHER_ORG = "lab", "other"
EDGE, CHUNK = 64, 32
LINKED_CHUNK = (1, 1, 1)  # the source chunk of every layer that is a symlink to the canary
TOKENS_CHUNK = (1, 0, 0)  # the Zarr v2 chunk that is a symlink to the tokens file
HARDLINKED_CHUNK = (0, 1, 0)  # the Zarr v2 chunk that is a hard link to the tokens file


def documented_statuses() -> set[int]:
    """The statuses the gateway may answer, as ``docs/security.md`` lists them (its "Statuses" section)."""
    section = SECURITY_DOC.read_text().split("\n## Statuses\n", 1)[1].split("\n## ", 1)[0]
    return {int(code) for code in re.findall(r"`([1-5][0-9][0-9])`", section)}


# --- the data root ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Planted:
    server: Server
    root: Path
    outside: Path

    @property
    def secrets(self) -> list[bytes]:
        """What no answer may contain: the canary, and where the server keeps things."""
        paths = {str(self.root), os.path.realpath(self.root), str(self.outside), os.path.realpath(self.outside)}
        return [CANARY.encode(), *(p.encode() for p in paths)]


def _layer(name: str, data_format: str, category: str = "color") -> dict[str, Any]:
    entry = {
        "name": name,
        "category": category,
        "boundingBox": {"topLeft": [0, 0, 0], "width": EDGE, "height": EDGE, "depth": EDGE},
        "elementClass": "uint8",
        "dataFormat": data_format,
        "mags": [{"mag": [1, 1, 1], "path": f"./{name}/1"}],
    }
    return {**entry, "largestSegmentId": 255} if category == "segmentation" else entry


def _properties(dataset: Path, layers: list[dict[str, Any]]) -> None:
    dataset.mkdir(parents=True, exist_ok=True)
    document = {"id": {"name": dataset.name, "team": ""}, "scale": {"factor": [1, 1, 1], "unit": "nanometer"}}
    (dataset / "datasource-properties.json").write_text(json.dumps({**document, "dataLayers": layers}))


def _link(path: Path, target: Path) -> None:
    assert path.exists(), path  # the link replaces a file the layer really has
    path.unlink()
    path.symlink_to(target)


def _write_layers(dataset: Path, data: np.ndarray) -> dict[str, Path]:
    """A layer of every format, uncompressed where the format allows (a leaked byte would show as itself);
    returns each layer's file of source chunk ``LINKED_CHUNK``."""
    with wkw.Dataset.create(str(dataset / "wkw" / "1"), wkw.Header(np.uint8, block_len=CHUNK, file_len=1)) as ds:
        ds.write((0, 0, 0), data)
    for name, driver in (("zarr2", "zarr"), ("zarr3", "zarr3")):
        metadata: dict[str, Any] = {"shape": [EDGE] * 3, "dtype": "|u1"} if driver == "zarr" else {"shape": [EDGE] * 3}
        if driver == "zarr":
            metadata.update(chunks=[CHUNK] * 3, compressor=None)
        else:
            grid = {"name": "regular", "configuration": {"chunk_shape": [CHUNK] * 3}}
            metadata.update(data_type="uint8", chunk_grid=grid, dimension_names=list("xyz"))
        spec = {"driver": driver, "kvstore": {"driver": "file", "path": str(dataset / name / "1")}}
        ts.open({**spec, "metadata": metadata}, create=True).result()[...] = data
    n5 = {"dimensions": [EDGE] * 3, "blockSize": [CHUNK] * 3, "dataType": "uint8", "compression": {"type": "raw"}}
    spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(dataset / "n5" / "1")}, "metadata": n5}
    ts.open(spec, create=True).result()[...] = data
    scale = {"key": "1", "size": [EDGE] * 3, "resolution": [1, 1, 1], "chunk_size": [CHUNK] * 3, "encoding": "raw"}
    spec = {
        "driver": "neuroglancer_precomputed",
        "kvstore": {"driver": "file", "path": str(dataset / "pc")},
        "multiscale_metadata": {"type": "segmentation", "data_type": "uint8", "num_channels": 1},
        "scale_metadata": scale,
    }
    ts.open(spec, create=True, open=True).result()[...] = data[..., None]
    x, y, z = LINKED_CHUNK
    return {
        "wkw": dataset / "wkw" / "1" / f"z{z}" / f"y{y}" / f"x{x}.wkw",
        "zarr2": dataset / "zarr2" / "1" / f"{x}.{y}.{z}",
        "zarr3": dataset / "zarr3" / "1" / "c" / str(x) / str(y) / str(z),
        "n5": dataset / "n5" / "1" / str(x) / str(y) / str(z),
        "pc": dataset / "pc" / "1" / "_".join(f"{c * CHUNK}-{(c + 1) * CHUNK}" for c in LINKED_CHUNK),
    }


LAYERS = {"wkw": "wkw", "zarr2": "zarr", "zarr3": "zarr3", "n5": "n5", "pc": "neuroglancerPrecomputed"}


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory, server_factory: Callable[..., Server]) -> Planted:
    base = tmp_path_factory.mktemp("hostile-requests")
    root, outside = base / "root", base / "outside"
    outside.mkdir()
    canary = outside / "canary.bin"
    canary.write_bytes(CANARY.encode() * 4096)  # any window of a chunk's size holds it whole
    tokens = outside / "tokens.json"
    grants = {GOOD: [f"{ORG}/*", f"{OTHER_ORG}/*"], NARROW: [f"{ORG}/narrow"], UTF8: [f"{ORG}/*"], CANARY: ["x/y"]}
    tokens.write_text(json.dumps({"tokens": grants}, ensure_ascii=False))
    data = np.random.default_rng(16).integers(1, 200, (EDGE,) * 3).astype(np.uint8)
    dataset = root / ORG / "ds"
    files = _write_layers(dataset, data)
    layers = [_layer(name, kind, "segmentation" if name in ("wkw", "pc") else "color") for name, kind in LAYERS.items()]
    _properties(dataset, layers)
    for path in files.values():
        _link(path, canary)
    x, y, z = TOKENS_CHUNK
    _link(dataset / "zarr2" / "1" / f"{x}.{y}.{z}", tokens)
    hardlinked = dataset / "zarr2" / "1" / ".".join(map(str, HARDLINKED_CHUNK))
    hardlinked.unlink()
    os.link(tokens, hardlinked)  # what the kernel's protected_hardlinks allows the file's owner
    # a dataset, a properties file and an organization out of the root, each naming the canary
    _properties(outside / "dataset", [_layer(CANARY, "wkw")])
    (root / ORG / "linked").symlink_to(outside / "dataset")
    (root / ORG / "props_link").mkdir()
    (root / ORG / "props_link" / "datasource-properties.json").symlink_to(
        outside / "dataset" / "datasource-properties.json"
    )
    _properties(outside / "org" / CANARY, [_layer(CANARY, "wkw")])
    (root / "evil").symlink_to(outside / "org")
    for name in ("narrow", "other_ds"):
        _properties(root / ORG / name, [_layer("wkw", "wkw")])
        (root / ORG / name / "wkw").symlink_to(dataset / "wkw")
    _properties(root / OTHER_ORG / "ds", [_layer("wkw", "wkw")])
    (root / OTHER_ORG / "ds" / "wkw").symlink_to(dataset / "wkw")
    return Planted(server_factory(root, tokens_file=tokens), root, outside)


# --- one raw request, one parsed answer --------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: bytes


def send(server: Server, method: str, target: str, headers: list[tuple[str, str]]) -> Answer:
    """``method target`` with exactly these header lines (duplicates and all) on a fresh connection; the answer
    parsed by ``http.client``, which refuses a malformed status line, header block or body length."""
    address = urlsplit(server.url)
    head = f"{method} {target} HTTP/1.1\r\nHost: {address.netloc}\r\nConnection: close\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers)
    with socket.create_connection((address.hostname, address.port), timeout=60) as connection:
        connection.sendall(head.encode("utf-8") + b"\r\n")
        response = http.client.HTTPResponse(connection, method=method)
        response.begin()
        body = response.read()
        length = response.getheader("Content-Length")
        if length is not None and method != "HEAD":
            assert int(length) == len(body), (target, length, len(body))
        return Answer(response.status, response.msg, body)


def check(planted: Planted, method: str, target: str, headers: list[tuple[str, str]]) -> Answer:
    answer = send(planted.server, method, target, headers)
    where = (method, target, headers, answer.status, answer.body[:300])
    assert answer.status in documented_statuses(), where
    if answer.status >= 400 and method != "HEAD":
        assert answer.headers.get_content_type() == "application/json", where
        error = json.loads(answer.body)["error"]
        assert isinstance(error, str) and error and "internal error" not in error, where
    for secret in planted.secrets:
        assert secret not in answer.body, (where, secret)
        assert all(secret.decode() not in value for value in answer.headers.values()), (where, secret)
    return answer


# --- the planted links are reached, and refused -----------------------------------------------------------


def _served_key(tree: str, coords: tuple[int, int, int]) -> str:
    if tree == "precomputed":
        return "_".join(f"{c * CHUNK}-{(c + 1) * CHUNK}" for c in coords)
    return ".".join(map(str, (0, *coords))) if tree == "zarr" else "c/" + "/".join(map(str, (0, *coords)))


@pytest.mark.parametrize("tree", ["zarr", "zarr3", "precomputed"])
@pytest.mark.parametrize("layer", list(LAYERS))
def test_every_planted_chunk_link_is_reached_and_refused(planted: Planted, layer: str, tree: str) -> None:
    """The generated requests below can reach the links: read directly, each is the storage-fault status."""
    answer = check(
        planted, "GET", f"/data/{tree}/{ORG}/ds/{layer}/1/{_served_key(tree, LINKED_CHUNK)}", [("X-Auth-Token", GOOD)]
    )
    assert answer.status == 500 and b"outside the data root" in answer.body, answer.body[:300]
    fine = check(
        planted, "GET", f"/data/{tree}/{ORG}/ds/{layer}/1/{_served_key(tree, (0, 0, 0))}", [("X-Auth-Token", GOOD)]
    )
    assert fine.status == 200 and fine.body


def test_the_linked_tokens_file_and_directories_are_refused(planted: Planted) -> None:
    answer = check(
        planted, "GET", f"/data/zarr/{ORG}/ds/zarr2/1/{_served_key('zarr', TOKENS_CHUNK)}", [("X-Auth-Token", GOOD)]
    )
    assert answer.status == 500 and b"outside the data root" in answer.body
    for target in (f"/data/zarr/{ORG}/", f"/data/zarr/{ORG}/linked/", f"/data/zarr/{ORG}/props_link/", "/data/zarr/"):
        check(planted, "GET", target, [("X-Auth-Token", GOOD)])


def test_a_hard_link_to_the_tokens_file_is_never_served(planted: Planted) -> None:
    key = _served_key("zarr", HARDLINKED_CHUNK)
    answer = check(planted, "GET", f"/data/zarr/{ORG}/ds/zarr2/1/{key}", [("X-Auth-Token", GOOD)])
    assert answer.status == 500 and b"hard link to one of the server's own files" in answer.body, answer.body
    assert GOOD.encode() not in answer.body


# --- generated requests -------------------------------------------------------------------------------------

TREES = ["zarr", "zarr3", "xarray", "meshes", "precomputed", "precomputed_raw"]
NAMES = [
    ORG, OTHER_ORG, "evil", "ds", "narrow", "other_ds", "linked", "props_link", "missing", *LAYERS, "1", "2-2-1",
    ".zarray", ".zattrs", ".zgroup", ".zmetadata", "zarr.json", "datasource-properties.json", "header.wkw",
    "attributes.json", "info", "c", "0", "multires", "legacy", "segment_properties", "7:0", "7.index",
    "mesh", "0-32_0-32_0-32", "32-64_32-64_32-64", "32-64_0-32_0-31",
    "..", ".", "%2e%2e", "%2E%2e%2f", "%2F", "%00", "%ff", "%C3%A9", "~", "\\", ";", "z1", "x1.wkw", "tokens.json",
]  # fmt: skip
KEYS = [_served_key(tree, coords) for tree in ("zarr", "zarr3") for coords in (LINKED_CHUNK, TOKENS_CHUNK, (0, 0, 0))]
TOKENS = [GOOD, NARROW, UTF8, "wrong-token", "", f"{GOOD} ", f"{GOOD},{NARROW}"]
segment = st.one_of(st.sampled_from(NAMES), st.text(max_size=12).map(lambda t: quote(t, safe="")))
structured = st.tuples(
    st.sampled_from(TREES),
    st.sampled_from([ORG, ORG, OTHER_ORG, "evil", "missing"]),
    st.sampled_from(["ds", "ds", "ds", "narrow", "other_ds", "linked", "props_link", "missing"]),
    st.sampled_from([*LAYERS, "missing"]),
    st.sampled_from(["1", "1", "2-2-1"]),
    st.one_of(
        st.sampled_from(KEYS), st.sampled_from(KEYS), st.sampled_from(NAMES), st.sampled_from(["7:0", "7.index"])
    ),
    st.sampled_from([6, 6, 6, 6, 5, 4, 3, 2, 1]),  # how many of the components the path keeps
    st.booleans(),
).map(lambda p: "/data/" + "/".join(p[: p[6]]) + ("/" if p[7] else ""))
free = st.lists(segment, max_size=7).map(lambda parts: "/" + "/".join(parts))
fixed = st.sampled_from(["/", "/healthz", "/readyz", "/metrics", "/auth", "/data/", "/preview/lab/ds/wkw.png"])
paths = st.one_of(structured, structured, free, fixed, st.just("/preview/").map(lambda p: p + f"{ORG}/ds/pc.png"))
token_mix = st.one_of(
    st.just([("header", GOOD)]),
    st.just([("query", GOOD)]),
    st.lists(st.tuples(st.sampled_from(["header", "query"]), st.sampled_from(TOKENS)), max_size=3),
)
numbers = st.one_of(st.integers(0, 200_000), st.integers(0, 2**70))
one_range = st.one_of(
    st.tuples(numbers, numbers).map(lambda r: f"{r[0]}-{r[1]}"),
    numbers.map(lambda n: f"{n}-"),
    numbers.map(lambda n: f"-{n}"),
    st.text(alphabet="0123456789-, =abx", max_size=10),
)
ranges = st.one_of(
    st.lists(one_range, min_size=1, max_size=4).map(lambda parts: "bytes=" + ",".join(parts)),
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30),
)
header_value = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40).map(str.strip)
extra_headers = st.lists(
    st.one_of(
        st.tuples(st.just("Range"), ranges),
        st.tuples(st.sampled_from(["If-None-Match", "If-Match"]), st.sampled_from(['"x"', "*", 'W/"y"', ""])),
        st.tuples(st.sampled_from(["X-Forwarded-Host", "X-Forwarded-Proto", "Forwarded"]), header_value),
        st.tuples(st.sampled_from(["X-Request-Id", "Accept-Encoding", "Origin", "Referer", "Accept"]), header_value),
        st.tuples(st.just("X-Original-URI"), paths),
    ),
    max_size=4,
)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    method=st.sampled_from(["GET"] * 6 + ["HEAD", "HEAD", "OPTIONS", "POST"]),
    path=paths,
    tokens=token_mix,
    query=st.lists(st.sampled_from(["x=1", "token", "format=raw", "%00=%ff", "a=%2F"]), max_size=2),
    headers=extra_headers,
)
def test_every_generated_request_gets_a_documented_well_formed_answer_that_leaks_nothing(
    planted: Planted,
    method: str,
    path: str,
    tokens: list[tuple[str, str]],
    query: list[str],
    headers: list[tuple[str, str]],
) -> None:
    parameters = [*query, *(f"token={quote(value, safe='')}" for where, value in tokens if where == "query")]
    target = quote(path, safe="/%:;~.-_") + ("?" + "&".join(parameters) if parameters else "")
    lines = [*headers, *(("X-Auth-Token", value) for where, value in tokens if where == "header")]
    check(planted, method, target, lines)
    log = planted.server.log()
    assert "unexpected error" not in log and "Traceback" not in log, log[-3000:]
